"""This project's reference kernels (the in-tree test's
xpu_gemm_reference.py): the stand-ins of the XPU GEMMs, which carry the
kernels' schemas, with CPU kernels and no fake (the tree's fakes are what is
tested)."""

from xpufakes.changes.kernels import REFERENCE
from xpufakes.common import bypath
from xpufakes.proof.xpu import image_kernels

# the reference kernels' module name, wherever they are loaded (make e2e's
# plugin loads them under it too)
NAME = "xpu_gemm_reference"


def reference():
    """The reference-kernel module of this project (loaded once)."""
    return bypath.load(NAME, REFERENCE)


def define_standins(kernels: str) -> list:
    """Define stand-in ops for a kernel package release, e.g.
    "vllm-xpu-kernels 0.1.12" or "intel-extension-for-pytorch 2.9.10.post0+xpu",
    or an image's own build of the ops its kernels patch changes
    ("llm-scaler-kernels 25095b4", before the release it builds). Several
    are separated by ";", defined in that order.
    Returns the libraries; keep them referenced."""
    if ";" in kernels:
        return [
            library
            for part in kernels.split(";")
            for library in define_standins(part.strip())
        ]
    package, _, release = kernels.partition(" ")
    if package == image_kernels.PACKAGE:  # before the release's: first
        return [image_kernels.define_image_kernels(release)["library"]]
    ref = reference()
    if package == "intel-extension-for-pytorch":
        return [ref.define_torch_ipex_kernels()]
    if package == "vllm-xpu-kernels":
        return [ref.define_xpu_c_kernels(release)]
    raise ValueError(f"unknown kernel package {package!r}")
