"""Where the project's data lives, and the download cache.

VLLM_XPU_FAKES_PATCHES and VLLM_XPU_FAKES_OVERLAY point the tool at another
patches/ (with its pins.toml) and overlay directory, e.g. a packager's own
series or the tests' fixture series.
"""

import contextlib
import fcntl
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# The tool's own data (tables the code reads)
DATA = Path(__file__).resolve().parents[1] / "data"
PATCHES = Path(os.environ.get("VLLM_XPU_FAKES_PATCHES") or REPO / "patches")
PINS = PATCHES / "pins.toml"
OVERLAY = Path(os.environ.get("VLLM_XPU_FAKES_OVERLAY") or REPO / "vllm_overlay")


def cache_dir() -> Path:
    """$VLLM_XPU_FAKES_CACHE, else the user cache directory."""
    override = os.environ.get("VLLM_XPU_FAKES_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-xpu-fakes"


@contextlib.contextmanager
def cache_lock(name: str):
    """One process at a time makes the cache's `name` (an unpacked release,
    the checks' environment): an flock on `locks/<name>.lock` in the cache,
    held until the block ends. Another process waits, then finds it made."""
    lock = cache_dir() / "locks" / f"{name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
