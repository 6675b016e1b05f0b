"""vllm-xpu-kernels' MoE path as an image builds it, stood in from data: its
`_moe_C` and `_xpu_C` MoE ops defined with the schemas its C++ registers
(data/xpu_moe_ops.toml), each with a CPU kernel that computes
(moe_kernels.py), and its Python glue, vllm_xpu_kernels.fused_moe_interface
(fused_moe_standin.py), which calls them. For a tree of the image's vLLM
release that loads the image's ESIMD package (its image is known); other
trees get nothing (their MoE path stops where it stopped). No fake: they
run inside vLLM's opaque `vllm::moe_forward`, eagerly, compiled or not."""

import sys
import tomllib

from xpufakes.common import paths
from xpufakes.proof.xpu import defining, fused_moe_standin, moe_kernels

DATA = paths.DATA / "xpu_moe_ops.toml"
MODULE = "vllm_xpu_kernels.fused_moe_interface"


def image_entry(image: str | None, version: str) -> dict:
    """The data's entry of that image commit if the tree is of its vLLM
    release, else {}."""
    entry = tomllib.loads(DATA.read_text()).get("image", {}).get(image or "", {})
    return entry if entry.get("vllm") == version else {}


def define_ops(ops: dict[str, str]) -> list:
    """Define each op ("ns::name" -> schema) not defined yet, with its CPU
    reference for the CPU key. Returns the libraries: keep them referenced."""
    libraries: dict = {}
    for op, schema in ops.items():
        if not defining.defined(op):
            defining.define(libraries, op, schema, moe_kernels.REFERENCES[op])
    return list(libraries.values())


def install(image: str | None, version: str) -> tuple[list, str]:
    """The image's MoE ops and the package's fused_moe_interface stood in,
    for a tree of that vLLM release (after the vllm_xpu_kernels package is
    stood in). Returns (what to keep referenced, what it is: said in the
    report's stand-ins; "" if nothing was)."""
    entry = image_entry(image, version)
    if not entry:
        return [], ""
    libraries = define_ops(entry["ops"])
    sys.modules[MODULE] = fused_moe_standin
    package = sys.modules.get("vllm_xpu_kernels")
    if package is not None:
        package.fused_moe_interface = fused_moe_standin
    names = ", ".join(op.partition("::")[2] for op in entry["ops"])
    return libraries, (
        f"{entry['build']}'s MoE ops ({names}: CPU references, "
        "moe_kernels.py) and fused_moe_interface (fused_moe_standin.py)"
    )
