"""Which XPU kernel package a tree's code runs on, as the stand-in kernels
string that verify-xpu, the audit and the proof load ("vllm-xpu-kernels
0.1.15.4", "intel-extension-for-pytorch 2.9.10.post0+xpu"; several joined by
"; "). Read without torch."""

import re
import urllib.parse
from pathlib import Path

from xpufakes.changes import recipes
from xpufakes.common import ops, paths
from xpufakes.trees import images, pins, tree

XPU_KERNELS, IPEX = "vllm-xpu-kernels", "intel-extension-for-pytorch"
# a downstream image's own build of the ops its kernels patch changes
# (proof/xpu/image_kernels.py), named by the image's llm-scaler commit
IMAGE_KERNELS = "llm-scaler-kernels"
REFERENCE = paths.OVERLAY / recipes.TREE_TEST_REFERENCE


def pinned_release(requirements: str, package: str) -> str | None:
    """The release `package==X` pins in a requirements file, or the one
    `package @ <url>/<package>-X-<tags>.whl` names ("2.8.10.post0+xpu"),
    None if it is not pinned to exactly one release. `-` and `_` are the
    same."""
    name = "[-_]".join(re.escape(part) for part in re.split(r"[-_]", package))
    found = re.findall(
        rf"^\s*{name}\s*==\s*([0-9][^\s;#,]*)", requirements, re.M | re.I
    )
    found += [
        urllib.parse.unquote(release)
        for release in re.findall(
            rf"^\s*{name}\s*@\s*\S*/{name}-([0-9][^-/\s]*)-\S*\.whl\b",
            requirements,
            re.M | re.I,
        )
    ]
    return found[0] if len(set(found)) == 1 else None


def from_requirements(text: str) -> str | None:
    """The kernel package a requirements/xpu.txt pins, or None if it names
    none ("intel-extension-for-pytorch xpu": IPEX, no one release)."""
    for package in (XPU_KERNELS, IPEX):
        release = pinned_release(text, package)
        if release:
            return f"{package} {release}"
    if "intel-extension-for-pytorch" in text or "intel_extension" in text:
        return f"{IPEX} xpu"
    return None


def newest_xpu_kernels() -> str:
    """The newest vllm-xpu-kernels release: the newest kernels-era pin's
    (the reference kernels' NEWEST_XPU_KERNELS is its copy, `make ops`)."""
    return pins.load().newest_kernels()


def of_tree(root: Path, pin: pins.Pin | None = None) -> str:
    """The stand-in kernels for a tree: its requirements/xpu.txt, else its
    pinned release's, else the newest release of its era's package; a known
    image's own build of the ops its kernels patch changes first."""
    requirements = root / "requirements" / "xpu.txt"
    if requirements.is_file():
        found = from_requirements(requirements.read_text(errors="replace"))
        if found:
            return with_image(root, found)
    if pin is not None and pin.kernels:
        return with_image(root, pin.kernels)
    era, _ = tree.files_era(root)
    return with_image(
        root,
        f"{XPU_KERNELS} {newest_xpu_kernels()}"
        if era == pins.KERNELS
        else f"{IPEX} xpu",
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


def image_builds(commit: str) -> list[str]:
    """The ops whose schema the image's kernels patch changes
    (data/fakes.toml `also`, by `image`)."""
    return [
        op["name"]
        for op in ops.FAKES
        for also in op.get("also", ())
        if also.get("image") == commit
    ]


def with_image(root: Path, kernels: str) -> str:
    """`kernels`, after the image's own build of the ops its kernels patch
    changes, where the tree is a known image (trees/images.py) that has one:
    the proof then meets the image's schemas."""
    recognised = images.recognise(root)
    if recognised.image and image_builds(recognised.image) and XPU_KERNELS in kernels:
        return f"{IMAGE_KERNELS} {recognised.image}; {kernels}"
    return kernels
