"""Where the project's data lives, and the download cache."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
PINS = PATCHES / "pins.toml"
OVERLAY = REPO / "vllm_overlay"


def cache_dir() -> Path:
    """$VLLM_XPU_FAKES_CACHE, else the user cache directory."""
    override = os.environ.get("VLLM_XPU_FAKES_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-xpu-fakes"
