"""Where the project's data lives, and the download cache.

VLLM_XPU_FAKES_PATCHES and VLLM_XPU_FAKES_OVERLAY point the tool at another
patches/ (with its pins.toml) and overlay directory, e.g. a packager's own
series or the tests' fixture series.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
