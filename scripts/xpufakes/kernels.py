"""Which XPU kernel package a tree's code runs on, as the stand-in kernels
string that verify-xpu, the audit and the proof load ("vllm-xpu-kernels
0.1.15.4", "intel-extension-for-pytorch 2.9.10.post0+xpu"; several joined by
"; "). Read without torch."""

import re
from pathlib import Path

from . import ops, paths, pins, recipes, tree

XPU_KERNELS, IPEX = "vllm-xpu-kernels", "intel-extension-for-pytorch"
REFERENCE = paths.OVERLAY / recipes.TREE_TEST_REFERENCE

_XPU_KERNELS_PIN = re.compile(r"vllm[_-]xpu[_-]kernels(?:==|.*?-)(\d+(?:\.\d+)+)")
_IPEX_PIN = re.compile(
    r"intel[_-]extension[_-]for[_-]pytorch(?:\s*==\s*|.*?-)([\w.]+?)(?:%2B|\+)xpu"
)


def from_requirements(text: str) -> str | None:
    """The kernel package a requirements/xpu.txt pins (a version, or a wheel
    URL), or None if it names none."""
    match = _XPU_KERNELS_PIN.search(text)
    if match:
        return f"{XPU_KERNELS} {match.group(1)}"
    match = _IPEX_PIN.search(text)
    if match:
        return f"{IPEX} {match.group(1)}+xpu"
    if "intel-extension-for-pytorch" in text or "intel_extension" in text:
        return f"{IPEX} xpu"
    return None


def newest_xpu_kernels() -> str:
    """The newest vllm-xpu-kernels release the reference kernels know
    (read from the file, without importing torch)."""
    match = re.search(r'^NEWEST_XPU_KERNELS = "([^"]+)"', REFERENCE.read_text(), re.M)
    return match.group(1)


def of_tree(root: Path, pin: pins.Pin | None = None) -> str:
    """The stand-in kernels for a tree: its requirements/xpu.txt, else its
    pinned release's, else the newest release of its era's package."""
    requirements = root / "requirements" / "xpu.txt"
    if requirements.is_file():
        found = from_requirements(requirements.read_text(errors="replace"))
        if found:
            return found
    if pin is not None and pin.kernels:
        return pin.kernels
    era, _ = tree.files_era(root)
    return (
        f"{XPU_KERNELS} {newest_xpu_kernels()}"
        if era == pins.KERNELS
        else f"{IPEX} xpu"
    )


def is_mixed(kernels: str, sources: dict[str, str]) -> bool:
    """A mixed tree: of the IPEX era (its kernels are IPEX's), and some of
    its code -- not ours -- calls the _xpu_C GEMMs (sources: path -> text)."""
    return XPU_KERNELS not in kernels and any(
        ops.calls_xpu_c_gemms(text)
        for path, text in sources.items()
        if path not in recipes.OUR_MODULES
    )


def standins(kernels: str, mixed: bool) -> str:
    """`kernels`, plus vllm-xpu-kernels' newest release for a mixed tree."""
    return f"{kernels}; {XPU_KERNELS} {newest_xpu_kernels()}" if mixed else kernels
