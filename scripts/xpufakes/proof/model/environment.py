"""The proof's Python made an XPU host's, as far as a model proof needs:
the stand-ins (proof/xpu), then vLLM's XPU platform as its current platform,
the tree's own fakes registered as on XPU."""

import importlib
import importlib.machinery
import os
import sys
import tempfile
from pathlib import Path

from xpufakes.proof.model import features
from xpufakes.proof.xpu import (
    device,
    esimd,
    extensions,
    ipex,
    loading_ops,
    packages,
    reference,
    registering,
    sym_int4,
    xpu_kernels,
    xpu_moe,
)

# vLLM's compile cache and AOT compile: off, so that nothing is written to
# the cache directory or read from it (the trace is made here, every time).
os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"

# the stand-ins setup made beside the kernels' (the report names them)
HELPERS: list[str] = []
# the directories setup made (os._exit at the end skips atexit)
TEMPORARY: list[Path] = []


def setup(tree: Path, standins: str, esimd_truthful: bool = False) -> list:
    """The stand-ins, then vLLM's XPU platform as its current platform, as
    the tree's features ask (features.py). Returns what must stay referenced
    (the ops' libraries). `esimd_truthful`: the control in which the ESIMD
    ops whose schemas lie declare their writes (esimd.install)."""
    sys.path.insert(0, str(tree))
    kept: list = []
    # vLLM's ops registered for the XPU run on the CPU's tensors too (eager)
    device.xpu_kernels_run_on_cpu()
    if features.streaming_loader(tree):
        # the weights made on the CPU while loading (none arrive here)
        os.environ[features.OFFLOAD_WEIGHTS] = "1"
    packages.install_torchvision()
    packages.install_downstream_packages()
    # intel/llm-scaler's ESIMD kernel package, from its schemas (data), with
    # CPU kernels that compute (esimd.py): for a tree of an image that loads it
    if _loads_esimd(tree):
        esimd_ops, said = esimd.install(_version(tree), esimd_truthful, tree)
        kept += esimd_ops
        if said:
            HELPERS.append(said)
    kept += [ipex.define_torch_ipex_ops(), loading_ops.define_loading_ops("torch_ipex")]
    # IPEX's WOQ linear module (int4 AWQ / GPTQ: IPEXAWQLinearMethod,
    # IPEXGPTQLinearMethod make it while loading): the reference one, whose
    # forward calls the torch_ipex WOQ ops as IPEX's XPU forward does
    kernels = reference.reference()
    kept.append(kernels.define_torch_ipex_woq_kernels())
    ipex.install_ipex(woq_from_weight=kernels.ReferenceWOQLinear.from_weight)
    if "intel-extension-for-pytorch" in standins:
        # IPEX's MoE module, which the tree's MoE methods run (ipex_moe.py)
        HELPERS.append("IPEX's GatedMLPMOE (ipex_moe.py: 16-bit and fp8 experts)")
    if features.sym_int4_library(tree):
        # intel/llm-scaler's sym_int4 quantizer, a ctypes library
        library = Path(tempfile.mkdtemp(prefix="xpufakes-q4_0-"))
        TEMPORARY.append(library)  # removed when the process ends
        os.environ[features.Q40_LIBRARY] = str(sym_int4.q4_0_library(library))
        HELPERS.append("sym_int4's quantizer library (q4_0_standin.c)")
    extensions.stub_vllm_extensions(tree)
    if features.xpu_kernels_at_start_up(tree) or "vllm-xpu-kernels" in standins:
        xpu_kernels.stub_xpu_kernel_package()
        HELPERS.append(
            "vllm_xpu_kernels.quantization._quantize_convert "
            "(quantize_convert_standin.py)"
        )
        kept.append(loading_ops.define_loading_ops("_C"))  # its _C registers them
        # found by importlib.util.find_spec, as vLLM looks for it
        package = sys.modules["vllm_xpu_kernels"]
        if package.__spec__ is None:
            package.__spec__ = importlib.machinery.ModuleSpec(
                "vllm_xpu_kernels", None, is_package=True
            )
        sys.meta_path.append(xpu_kernels.XPUKernelModules())
        # vllm-xpu-kernels' MoE ops and its fused_moe_interface as the image
        # of an ESIMD-loading tree builds them (xpu_moe.py): the MoE path runs
        if _loads_esimd(tree):
            version = _version(tree)
            moe_ops, said = xpu_moe.install(esimd.commit_for(version, tree)[0], version)
            kept += moe_ops
            if said:
                HELPERS.append(said)
    # before anything of vLLM asks for it (a module that imports
    # current_platform keeps the one it got)
    import vllm.platforms
    from vllm.platforms.xpu import XPUPlatform

    if vllm.platforms._current_platform is not None:
        raise RuntimeError(
            "vLLM chose its platform before the proof: "
            f"{vllm.platforms._current_platform}"
        )
    vllm.platforms._current_platform = XPUPlatform()
    if features.current_device(tree):
        # the device's index, as on a host with one XPU
        import torch

        torch.xpu.current_device = device.current_device
    if features.compute_units(XPUPlatform):
        # an Arc B580's, as device.XPU_DEVICE answers for it
        XPUPlatform.num_compute_units = classmethod(
            lambda cls, device_id=0: device.XPU_COMPUTE_UNITS
        )
    kept += reference.define_standins(standins)
    # vllm-xpu-kernels' _C activations, norms and rotary embedding (the dense
    # path's CustomOps take them in __init__), as the release registers them
    kept += xpu_kernels.define_xpu_kernels_c(standins)
    registering.import_registering_module(None)  # the tree's own fakes, as on XPU
    if features.inline_call_of_torch_28(tree):
        _give_inline_call_its_argument()
    return kept


def _loads_esimd(root: Path) -> bool:
    """Whether the tree's Python names intel/llm-scaler's ESIMD package."""
    name = esimd.ESIMD_PACKAGE.encode()
    return any(name in p.read_bytes() for p in (root / "vllm").rglob("*.py"))


def _version(root: Path) -> str:
    """The tree's vLLM release ("" where it cannot be told)."""
    from xpufakes.common.errors import Refusal
    from xpufakes.trees import tree as trees

    try:
        return trees.detect_version(trees.locate(str(root)))[0]
    except Refusal:
        return ""


def _give_inline_call_its_argument() -> None:
    """The tree's decorator replaces Dynamo's
    InliningInstructionTranslator.inline_call (to record the files it
    traces) with a function of the torch 2.8 signature; this torch passes
    one more argument, allow_nested_graph_breaks, which matters only when
    torch._dynamo.config.nested_graph_breaks is on (off by default, and a
    fullgraph trace has no graph breaks to nest). The replacement is given
    that argument and called without it while it does not matter."""
    import torch
    from torch._dynamo.symbolic_convert import InliningInstructionTranslator

    decorators = importlib.import_module("vllm.compilation.decorators")
    from unittest import mock

    class Patch:
        def object(self, target, name, new, *args, **kwargs):
            if target is InliningInstructionTranslator and name == "inline_call":
                old = new

                def new(parent, func, args_, kwargs_, allow_nested_graph_breaks=False):
                    if torch._dynamo.config.nested_graph_breaks:
                        raise RuntimeError(
                            "vLLM's inline_call replacement cannot pass "
                            "allow_nested_graph_breaks"
                        )
                    return old(parent, func, args_, kwargs_)

            return mock.patch.object(target, name, new, *args, **kwargs)

    decorators.patch = Patch()
