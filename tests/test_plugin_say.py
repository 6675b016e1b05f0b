"""The plugin's line (plugin/vllm_xpu_fakes/say.py) with vLLM's own logging:
vllm/logger.py, vllm/envs.py and vllm/logging_utils/ of a release's sdist,
in a fresh Python per case. vllm/__init__.py is not run (it imports torch,
which vLLM's logging does not use): `vllm` is a package whose path is the
sdist's vllm/.

Two eras of vLLM's logging: 0.14.1 sets it up when vllm.logger is imported
(so before any plugin runs), the newest pin with an explicit call, which
vLLM 0.32's front end makes after it loads the plugins
(vllm/entrypoints/cli/main.py). The call here is the function that call
ends in, `_configure_vllm_root_logger()` (configure_logging also asks the
platform for warnings, which needs torch). Each case's negative control is
the line as the plugin logged it before say.py (to its logger, at once), or
a known-wrong variant. The real front end, engine core and workers: make
e2e (e2e/tests/test_engine.py)."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from support import releases
from xpufakes.common import paths

PLUGIN = paths.REPO / "plugin"
OLD = "vllm-xpu-fakes: OLD"  # as the plugin logged it before say.py
NEW = "vllm-xpu-fakes: NEW (0.012 s)"
WARNED = "vllm-xpu-fakes: WARNED"
VLLM_LINE = "vLLM's first line after it set up logging"

PRELUDE = """
import logging, os, sys, types
vllm = types.ModuleType("vllm")
vllm.__path__ = [{vllm!r}]
sys.modules["vllm"] = vllm
sys.path.insert(0, {plugin!r})
import vllm.logger
from vllm_xpu_fakes.say import say
print("PID", os.getpid(), flush=True)
def old(line):
    logging.getLogger("vllm.vllm_xpu_fakes").info(line)
def set_up():
    vllm.logger._configure_vllm_root_logger()
    vllm.logger.init_logger("vllm.entrypoints.x").info({vllm_line!r})
    print("SET UP", flush=True)
"""


def _run(release: str, script: str, **env: str) -> dict:
    """The script after PRELUDE in a fresh Python; its stdout and stderr,
    and its pid."""
    prelude = PRELUDE.format(
        vllm=str(releases.pristine(release) / "vllm"),
        plugin=str(PLUGIN),
        vllm_line=VLLM_LINE,
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=dict(clean, **env),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    pid = int(re.search(r"^PID (\d+)$", done.stdout, re.M).group(1))
    return {"out": done.stdout, "err": done.stderr, "pid": pid}


def _lines(text: str, message: str) -> list[str]:
    return [line for line in text.splitlines() if line.endswith(message)]


@pytest.fixture(scope="module")
def late() -> str:
    """The newest pin: vLLM's logging is set up by an explicit call
    (importing vllm.logger sets up nothing)."""
    release = releases.newest()
    got = _run(release, "print('HANDLERS', logging.getLogger('vllm').handlers)")
    assert "HANDLERS []" in got["out"], got["out"]
    return release


@pytest.fixture(scope="module")
def early() -> str:
    """0.14.1: vLLM's logging is set up when vllm.logger is imported."""
    got = _run("0.14.1", "print('HANDLERS', logging.getLogger('vllm').handlers)")
    assert "HANDLERS [<StreamHandler <stdout>" in got["out"], got["out"]
    return "0.14.1"


def test_said_before_vllm_sets_up_logging_it_comes_out_after_in_vllms_format(late):
    """vLLM 0.32's front end: the line is said before vLLM sets up logging;
    it comes out once, through vLLM's handler, in vLLM's format (its process
    name and pid, the plugin's file and line), before vLLM's first line.
    The negative control: the line logged at once to the logger (the
    plugin's way before say.py) never comes out."""
    got = _run(
        late,
        f"""
        say({NEW!r})
        say({WARNED!r}, warning=True)
        old({OLD!r})
        set_up()
        """,
    )
    out, pid = got["out"], got["pid"]
    new = _lines(out, NEW)
    assert len(new) == 1, out
    assert re.fullmatch(
        rf"\(MainProcess pid={pid}\) INFO \d\d-\d\d \d\d:\d\d:\d\d "
        rf"\[<string>:\d+\] {re.escape(NEW)}",
        new[0],
    ), new[0]
    assert len(_lines(out, WARNED)) == 1 and " WARNING " in _lines(out, WARNED)[0]
    order = out.splitlines()
    assert order.index(new[0]) < order.index(_lines(out, VLLM_LINE)[0]), out
    assert not _lines(out + got["err"], OLD), out + got["err"]


def test_set_up_before_the_line_it_comes_out_at_once(early):
    """vLLM <= 0.27, and 0.32's engine core and workers: vLLM's logging is
    set up first; the line comes out once, at once, in vLLM's format. (The
    old way works here too: that is where the plugin's line was seen.)"""
    got = _run(
        early,
        f"""
        say({NEW!r})
        print("SAID", flush=True)
        old({OLD!r})
        """,
    )
    out = got["out"]
    new = _lines(out, NEW)
    assert len(new) == 1, out
    assert re.fullmatch(
        rf"INFO \d\d-\d\d [\d:]+ \[<string>:\d+\] {re.escape(NEW)}", new[0]
    )
    assert out.index(NEW) < out.index("SAID"), out
    assert len(_lines(out, OLD)) == 1, out


def test_nothing_sets_up_logging_the_line_comes_out_at_exit(late):
    """`python -c "import vllm; ...load_general_plugins()"` on 0.32: no
    handler ever; the line is written at exit in vLLM's layout, once. The
    negative control: the old way prints nothing."""
    got = _run(
        late,
        f"""
        old({OLD!r})
        say({NEW!r})
        print("END", flush=True)
        """,
    )
    out, pid = got["out"], got["pid"]
    new = _lines(out, NEW)
    assert len(new) == 1, out
    assert new[0].startswith(f"(MainProcess pid={pid}) INFO "), new[0]
    assert out.index("END") < out.index(NEW), out
    assert not _lines(out + got["err"], OLD), out + got["err"]


@pytest.mark.parametrize("set_up", [True, False], ids=["set-up", "never-set-up"])
def test_vllm_logging_level_and_stream_apply(late, set_up):
    """VLLM_LOGGING_LEVEL=WARNING: the INFO line does not come out, the
    warning does (the INFO line is the control: same call, same path);
    VLLM_LOGGING_STREAM names where."""
    got = _run(
        late,
        f"""
        say({NEW!r})
        say({WARNED!r}, warning=True)
        {"set_up()" if set_up else ""}
        """,
        VLLM_LOGGING_LEVEL="WARNING",
        VLLM_LOGGING_STREAM="ext://sys.stderr",
    )
    assert not _lines(got["out"] + got["err"], NEW), got
    assert len(_lines(got["err"], WARNED)) == 1, got
    assert not _lines(got["out"], WARNED), got


def test_vllm_configure_logging_0_leaves_the_line_to_the_application(late):
    """VLLM_CONFIGURE_LOGGING=0: vLLM sets up nothing; the line goes to the
    logger at once, as vLLM's own lines do: with no handler, Python prints a
    warning bare on stderr and drops INFO; nothing more at exit. The control:
    the same lines with vLLM's logging on (the case above) come out."""
    got = _run(
        late,
        f"""
        say({NEW!r})
        say({WARNED!r}, warning=True)
        print("SAID", flush=True)
        set_up()
        """,
        VLLM_CONFIGURE_LOGGING="0",
    )
    assert got["err"].splitlines().count(WARNED) == 1, got
    assert not _lines(got["out"] + got["err"], NEW), got
    assert not _lines(got["out"], WARNED), got


@pytest.mark.parametrize("variant", ["as-is", "child-keeps-the-line"])
def test_a_forked_child_does_not_say_its_parents_line(late, variant):
    """A line kept when the process forks is the parent's: it comes out
    once, from the parent. The known-wrong variant (the child given the
    parent's kept line back) shows the count catches a second line."""
    keep = variant == "child-keeps-the-line"
    got = _run(
        late,
        f"""
        import vllm_xpu_fakes.say as s
        say({NEW!r})
        saved = list(s._kept)
        child = os.fork()
        if child == 0:
            if {keep!r}:
                s._kept.extend(saved)
            set_up()
            sys.stdout.flush()
            os._exit(0)
        os.waitpid(child, 0)
        set_up()
        """,
    )
    new = _lines(got["out"], NEW)
    pids = [int(re.search(r"pid=(\d+)", line).group(1)) for line in new]
    if keep:
        assert len(new) == 2, got["out"]
    else:
        assert pids == [got["pid"]], got["out"]


@pytest.mark.parametrize("who", ["vllm", "application"])
def test_the_record_factory_goes_once_the_line_is_out(late, who):
    """The hook lives only while a line is kept. vLLM sets up logging: it
    chains its record factory in front of ours, which then only passes
    records on; an application's handler (logging.basicConfig) instead: the
    line comes out through it, and ours is taken out of the chain. The
    control: the hook is in place while the line is kept."""
    set_up = (
        "set_up()"
        if who == "vllm"
        else (
            "logging.basicConfig(format='APP %(message)s', level=logging.INFO); "
            "logging.getLogger('app').warning('first')"
        )
    )
    got = _run(
        late,
        f"""
        import json
        import vllm_xpu_fakes.say as s
        before = logging.getLogRecordFactory()
        say({NEW!r})
        hooked = logging.getLogRecordFactory()
        {set_up}
        after = logging.getLogRecordFactory()
        print("FACTORIES", json.dumps([
            before is logging.LogRecord, type(hooked).__name__,
            after is logging.LogRecord, type(after).__name__,
            type(getattr(after, "_factory", None)).__name__,
            len(s._kept), len(s._factory)]))
        """,
    )
    line = next(x for x in got["out"].splitlines() if x.startswith("FACTORIES"))
    before, hooked, plain, after, wrapped, kept, ours = json.loads(
        line.split(" ", 1)[1]
    )
    assert before and hooked == "_FlushFirst" and (kept, ours) == (0, 0), line
    if who == "vllm":
        assert (after, wrapped) == ("_VllmLogRecordFactory", "_FlushFirst"), line
        assert len(_lines(got["out"], NEW)) == 1, got["out"]
    else:
        assert plain, line
        assert got["err"].splitlines().count(f"APP {NEW}") == 1, got["err"]


@pytest.mark.parametrize("flush", [True, False], ids=["flush", "no-flush"])
def test_flush_writes_the_kept_line_now_and_once(late, flush):
    """A process that knows nothing will set up logging (the self-check)
    calls flush() after vLLM loaded the plugins: the kept line comes out
    there, and not again at exit. The control: without flush() it comes out
    at exit, after what the process printed."""
    got = _run(
        late,
        f"""
        import vllm_xpu_fakes.say as s
        say({NEW!r})
        if {flush!r}:
            s.flush()
        print("REPORT", flush=True)
        """,
    )
    out = got["out"]
    assert len(_lines(out, NEW)) == 1, out
    assert (out.index(NEW) < out.index("REPORT")) == flush, out
