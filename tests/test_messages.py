"""Messages that must be true (issue 23, item 7), each on the situation that
made the old one untrue: a read-only mount, a dangling symlink target, a
file with CRLF line endings, `status` on a downstream tree whose recipe
path changes more files than the series names, an export to a file, Ctrl-C
while the tool is still starting, audit without torch, and make's exit
status. Every test here fails on the code before these fixes."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from support import downstream, releases, small_tree, tool

KERNELS = "0.33.0"


@pytest.mark.skipif(small_tree.can_mount() is not None, reason="needs root to mount")
def test_a_read_only_mount_is_named_by_check_and_apply(tmp_path):
    """check does not say "would apply cleanly" where apply must refuse, and
    both name the read-only mount, which chmod cannot fix."""
    mount = tmp_path / "mnt"
    small_tree.mount_tmpfs(mount, "size=4m")
    try:
        root = small_tree.make(KERNELS, mount / "tree")
        before = releases.file_hashes(root)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        for verb in ("check", "apply"):
            result = tool.run(verb, str(root))
            line = tool.refused(
                result,
                "is on a read-only file system",
                f"mounted read-only at {mount}",
                "chmod cannot change that",
            )
            assert "would apply cleanly" not in result.stdout, verb
            assert "file is read-only" not in line
        assert releases.file_hashes(root) == before
    finally:
        small_tree.umount(mount)


def test_a_dangling_symlink_target_is_named_not_missing(tmp_path):
    """A target file that is a symlink to nothing: status, check and apply
    name the symlink and where it points, not a "missing" file."""
    root = small_tree.make("0.14.1", tmp_path / "tree")
    target = root / "vllm" / "model_executor" / "layers" / "quantization"
    target = target / "ipex_quant.py"
    target.unlink()
    target.symlink_to(tmp_path / "gone.py")
    before = sorted(root.rglob("*"))  # file_hashes cannot read a dangling link
    said = f"is a dangling symlink (to {tmp_path / 'gone.py'})"
    status = tool.run("status", str(root))
    assert status.returncode == 0, status.stderr
    line = next(x for x in status.stdout.splitlines() if "ipex_quant.py" in x)
    assert line.endswith(f"ipex_quant.py: a dangling symlink (to {tmp_path}/gone.py)")
    for verb in ("check", "apply"):
        result = tool.run(verb, str(root))
        text = tool.refused(result, f"ipex_quant.py {said}")
        assert "missing" not in text and "proof" not in text
    assert sorted(root.rglob("*")) == before and target.is_symlink()


def _crlf_tree(tmp_path, mixed: bool = False):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    ops = root / "vllm" / "_xpu_ops.py"
    lines = ops.read_bytes().split(b"\n")
    if mixed:  # one line LF, as an editor that inserted a line might leave it
        ops.write_bytes(b"\r\n".join(lines[:5]) + b"\n" + b"\r\n".join(lines[5:]))
    else:
        ops.write_bytes(b"\r\n".join(lines))
    return root, ops


def test_a_crlf_file_keeps_its_line_endings(tmp_path):
    """The recipes edit a CRLF vllm/_xpu_ops.py: every line of the result
    ends in CRLF, none in a bare LF (what apply writes, after its proof)."""
    from xpufakes.changes import base, live
    from xpufakes.trees import tree

    root, ops = _crlf_tree(tmp_path)
    found = tree.locate(str(root))
    detected = base.detect_base(found)
    assert detected.by_recipe  # its sha256 is no release's
    result = live.by_recipe(found, detected.pin, detected.version)
    before, after = result.edited["vllm/_xpu_ops.py"]
    assert before == ops.read_bytes() and after != before
    assert after.count(b"\n") == after.count(b"\r\n")  # no bare LF
    assert b"register_xpu_gemm_fakes" in after


def test_a_file_with_mixed_line_endings_is_refused(tmp_path):
    root, _ = _crlf_tree(tmp_path, mixed=True)
    before = releases.file_hashes(root)
    for verb in ("check", "apply"):
        tool.refused(
            tool.run(verb, str(root)),
            "vllm/_xpu_ops.py has mixed line endings (CRLF, and LF on 1 line(s))",
        )
    assert releases.file_hashes(root) == before


def test_status_lists_every_file_the_recipe_path_would_change(tmp_path):
    """A downstream tree (as llm-scaler's 0.14.0, with its sym_int4.py) goes
    down the recipe path, which wraps the IPEX WOQ module wherever a file
    makes one: status lists those files too, before apply changes them."""
    from xpufakes.changes import base, live
    from xpufakes.trees import tree

    root = small_tree.make("0.14.1", tmp_path / "tree")
    with open(root / "vllm" / "_ipex_ops.py", "a") as f:
        f.write("# a downstream change\n")
    downstream.add_woq_module(root)
    found = tree.locate(str(root))
    detected = base.detect_base(found)
    edited = live.by_recipe(found, detected.pin, detected.version).edited
    sym = downstream.SYM_INT4
    assert sym in edited  # what apply would change
    status = tool.run("status", str(root))
    assert status.returncode == 0, status.stderr
    for path in edited:
        assert f"  {path}: " in status.stdout, (path, status.stdout)
    assert f"  {sym}: would change by recipe (not in the series)" in status.stdout


def test_export_to_a_file_is_one_line(tmp_path):
    out = tmp_path / "series.txt"
    out.write_text("not a directory\n")
    for given in (out, out / "sub"):
        result = subprocess.run(
            ["make", "-s", "-C", str(tool.SCRIPTS.parent), "export", f"OUT={given}"],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        errors = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
        assert len(errors) == 1 and str(out) in errors[0], result.stderr
    assert out.read_text() == "not a directory\n"


def _sigint_blocked():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])


def test_ctrl_c_while_the_tool_starts_is_one_line(tmp_path):
    """Ctrl-C at every moment of the first 0.3 s (the tool's imports, the
    command line, the verb): one line, exit 130, never a traceback. The tool
    is started with SIGINT blocked, as a launcher may, so that a signal sent
    before the interpreter reaches the tool's first line is held until
    then: what is tested is everything from that line on (the interpreter's
    own start-up, ~15 ms, is Python's)."""
    root = small_tree.make(KERNELS, tmp_path / "tree")
    env = dict(os.environ, PYTHONPATH=str(tool.SCRIPTS))
    interrupted = 0
    for step in range(16):
        run = subprocess.Popen(
            [sys.executable, "-m", "xpufakes", "status", str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=_sigint_blocked,
        )
        time.sleep(0.02 * step)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
        assert "Traceback" not in err, err
        if run.returncode == 0:  # it was done before the signal
            assert out.splitlines()[-1].startswith("state: "), out
            continue
        assert run.returncode == 130, (run.returncode, err)
        assert err == "error: interrupted; nothing changed\n", err
        interrupted += 1
    assert interrupted >= 5


def _python_without_torch(where) -> str:
    """A venv of this Python's base interpreter, without pip or torch."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True
    )
    python = where / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    assert probe.returncode != 0  # the control: it really has no torch
    return str(python)


def test_audit_without_torch_names_the_verb_and_the_variable(tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    python = _python_without_torch(tmp_path / "venv")
    result = subprocess.run(
        [python, "-m", "xpufakes", "audit", str(root)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS)),
    )
    line = tool.refused(result, "audit loads the tree's fakes with torch", python)
    assert "make audit VLLM=" in line and "PYTHON=<a Python with torch>" in line
    assert "verify-xpu" not in line


def test_make_turns_every_failure_into_2_as_the_readme_says(tmp_path):
    """The README's exit statuses are the tool's; through make each non-zero
    one is 2, with the tool's named in make's own line, and bin/xpufakes
    gives the tool's. Checked for 1 (a refusal), 2 (a usage error) and 77
    (verify-xpu with a Python that has no torch), and the README says so."""
    repo = tool.SCRIPTS.parent
    readme = (repo / "README.md").read_text()
    note = readme[readme.index("Exit status of the tool") :][:600]
    assert "every status but 0 is make's own\n2**" in note
    assert "`bin/xpufakes <verb> …`" in note and "Error 77" in note
    cases = [  # (make's arguments, the tool's arguments, the tool's status)
        (["apply", f"VLLM={tmp_path / 'none'}"], ["apply", str(tmp_path / "none")], 1),
        (["status", "PATCHES=0001"], ["status", "--patches", "0001"], 2),
        (["verify-xpu"], ["verify-xpu"], 77),
    ]
    python = _python_without_torch(tmp_path / "venv")
    # as at a shell: not inside another make (`make test` would make these
    # "make[1]: ..." lines), nor with the variables given on its command line
    # (`.ci/run`'s ARGS=...: make puts them in its recipes' environment)
    outer = {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"} | set(
        re.findall(
            r"(?:^|\s)(\w+)=", os.environ.get("MAKEFLAGS", "").partition(" -- ")[2]
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in outer} | {"PYTHON": python}
    for make_args, tool_args, status in cases:
        made = subprocess.run(
            ["make", "-C", str(repo), f"PYTHON={python}", *make_args],
            capture_output=True,
            text=True,
            env=env,
        )
        assert made.returncode == 2, (make_args, made.stderr)
        assert re.search(
            rf"make: \*\*\* \[Makefile:\d+: \S+\] Error {status}$", made.stderr, re.M
        ), made.stderr
        direct = subprocess.run(
            [str(repo / "bin" / "xpufakes"), *tool_args],
            capture_output=True,
            text=True,
            env=env,
        )
        assert direct.returncode == status, (tool_args, direct.stderr)


def test_audit_names_the_known_models_for_an_unknown_one(tmp_path):
    """`make audit MODEL=` with a name data/models.toml does not have: one
    line naming the known ones, before anything is imported or traced.
    Control: a known name passes that check (it then needs torch here)."""
    root = small_tree.make(KERNELS, tmp_path / "tree")
    result = tool.run("audit", str(root), "--static", "--model", "qwen3_vl")
    tool.refused(result, "unknown model 'qwen3_vl'", "qwen3_vl_moe, qwen3_moe")
    python = _python_without_torch(tmp_path / "venv")
    known = subprocess.run(
        [python, "-m", "xpufakes", "audit", str(root), "--static"]
        + ["--model", "qwen3_moe"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS)),
    )
    tool.refused(known, "--model traces a model with it", python)
