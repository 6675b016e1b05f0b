"""The Python that runs the proof of the recipe path: it needs torch, and the
tool itself does not, so on a fresh clone with a Python that has no torch
apply sets one up, once, saying so as it goes.

In order: $VLLM_XPU_FAKES_PROOF_PYTHON; the Python running the tool, if it
has torch (a vLLM image's does); this repository's .venv, made by `make
venv` (or by an earlier apply) from requirements-test.txt; otherwise that
.venv is made now, the same way: `python -m venv .venv`, then
requirements-test.txt installed by common/installer.py (uv, from pip's
configured index; pip if uv cannot be had): torch and the import-time
dependencies of vLLM's modules, ~1.3 GB, the installer's progress on
stderr, and the stamp `make venv` leaves (.venv/.installed), so that make
sees it done. A setup that fails or is interrupted leaves .venv without the
stamp, and the next apply resumes it.
"""

import contextlib
import fcntl
import importlib.util
import os
import sys
import time
from collections.abc import Callable

from xpufakes.common import children, installer, paths
from xpufakes.common.errors import Refusal

VENV = paths.REPO / ".venv"
STAMP = VENV / ".installed"  # what `make venv` touches when it is done
REQUIREMENTS = paths.REPO / "requirements-test.txt"


def choose(say: Callable[[str], None]) -> tuple[str, str]:
    """(the proof's Python, why that one), setting up .venv if there is
    none; `say` gets the lines of a setup."""
    override = os.environ.get("VLLM_XPU_FAKES_PROOF_PYTHON")
    if override:
        return override, "$VLLM_XPU_FAKES_PROOF_PYTHON"
    if importlib.util.find_spec("torch") is not None:
        return sys.executable, "the Python running this tool, which has torch"
    python = VENV / "bin" / "python"
    if STAMP.is_file() and python.is_file():
        return str(python), "this repository's .venv"
    with _setup_lock():
        if not (STAMP.is_file() and python.is_file()):  # not done meanwhile
            _set_up(say)
    return str(python), "this repository's .venv, set up just now"


@contextlib.contextmanager
def _setup_lock():
    """One setup at a time: an flock on the repository's directory."""
    fd = os.open(paths.REPO, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _set_up(say: Callable[[str], None]) -> None:
    start = time.monotonic()
    python = VENV / "bin" / "python"
    say(
        f"the proof needs torch, and {sys.executable} has none: setting up "
        f"{VENV} once (python -m venv, then {REQUIREMENTS.name} by uv or pip: "
        "torch and the import-time dependencies of "
        "vLLM's modules, ~1.3 GB; or NO_PROOF=1 to apply without the proof)"
    )
    if not python.is_file():
        _step([sys.executable, "-m", "venv", str(VENV)], "python -m venv")
    say(
        f"installing {REQUIREMENTS.name} into {VENV} (the installer's progress follows)"
    )
    command, env = installer.command(
        python, ["-r", str(REQUIREMENTS)], quiet=False, say=say
    )
    _step(command, f"installing {REQUIREMENTS.name}", env=env)
    STAMP.touch()
    say(f"{VENV} is ready ({time.monotonic() - start:.0f} s)")


def _step(command: list[str], what: str, env: dict | None = None) -> None:
    """Run one step of the setup, its output on stderr (apply's stdout is
    its report)."""
    try:
        done = children.run(command, stdout=sys.stderr, stderr=sys.stderr, env=env)
    except OSError as e:
        raise Refusal(
            f"cannot set up the proof's Python ({what}: {e.strerror}); nothing changed"
        ) from None
    if done.returncode != 0:
        hint = ""
        if what == "python -m venv":
            hint = " (on Debian or Ubuntu: apt-get install python3-venv)"
        raise Refusal(
            f"cannot set up the proof's Python: {what} exited with status "
            f"{done.returncode}{hint}; {VENV} is left as it is, the next apply "
            "resumes it; NO_PROOF=1 applies without the proof; nothing changed"
        )
