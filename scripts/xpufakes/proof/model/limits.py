"""What the tree itself cannot run on XPU (a configuration it does not
have or turns off, a `_C` op its vllm-xpu-kernels release lacks, MLA
without an MLA backend, no linear kernel, a layer attribute its method never
makes): "tree limit" with the reason, not a failure."""

import re
import time
import traceback

from xpufakes.proof.model import features
from xpufakes.proof.model.report import TREE_LIMIT
from xpufakes.proof.xpu import xpu_kernels


class TreeLimit(Exception):
    """What the tree itself cannot do on XPU (a configuration it does not
    have, a model its XPU platform cannot run): the reason."""


def tree_limit(reason: TreeLimit, start: float, kind: str = TREE_LIMIT) -> dict:
    """The result of a configuration or model the tree cannot run on XPU
    (or, `kind` NOT_FOR_THIS_TREE, an entry that is for other trees)."""
    return {
        "result": kind,
        "error": str(reason),
        "where": [],
        "graphs": 0,
        "graph_breaks": 0,
        "ops": [],
        "seconds": round(time.monotonic() - start, 1),
    }


def sp_turned_off(vllm_config, configuration: str) -> None:
    """TreeLimit if sequence parallelism was asked for and the tree's
    VllmConfig turned it off again (0.16.0+: it needs TP > 1, and the proof
    runs one process)."""
    if configuration != "sp":
        return
    pass_config = vllm_config.compilation_config.pass_config
    field = features.sp_field(pass_config)
    if field and not getattr(pass_config, field):
        raise TreeLimit(
            f"the tree's VllmConfig turned {field} off (it needs tensor "
            "parallelism > 1; the proof runs one process)"
        )


_MISSING_OP = re.compile(r"'_OpNamespace' '_C' object has no attribute '(\w+)'")


def missing_kernel(error: BaseException, kernels: str) -> str:
    """ "" or the tree's limit: the model's path (its build, weight
    processing or traced forward) calls a `_C` op the tree's
    vllm-xpu-kernels release does not define (on XPU it fails the same)."""
    text = "".join(traceback.format_exception(error))
    for op in dict.fromkeys(_MISSING_OP.findall(text)):
        if xpu_kernels.xpu_kernels_c_has(kernels, op) is False:
            return (
                f"the tree calls torch.ops._C.{op}, which "
                f"{kernels.strip()} does not define (no XPU kernel)"
            )
    return ""


_NO_LINEAR_KERNEL = "Failed to find a kernel that can implement the"
_KERNEL_REASON = re.compile(r"^\s*(\w+Kernel) (?:cannot implement due to: )?(.*)$")


def no_linear_kernel(error: BaseException) -> str:
    """ "" or the tree's limit: vLLM's choice of a mixed-precision linear
    kernel (compressed-tensors / GPTQ int4, `choose_mp_linear_kernel`)
    found none for the platform (0.10.2 has none for XPU: every kernel it
    knows is for CUDA, ROCm or the CPU), so the tree cannot run the layer
    on XPU. The reasons, a line per kernel, are vLLM's own."""
    if not isinstance(error, ValueError) or not str(error).startswith(
        _NO_LINEAR_KERNEL
    ):
        return ""
    lines = str(error).splitlines()
    reasons = [m.groups() for m in map(_KERNEL_REASON.match, lines[1:]) if m]
    said = "; ".join(f"{name}: {why.strip()}" for name, why in reasons)
    first = lines[0].strip()
    return f"the tree has no linear kernel for this layer on XPU ({first} {said})"


# an AttributeError's text, raised in the tree or seen by Dynamo
_NO_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(\w+)'")


def never_made(error: BaseException, frames: list[str], built) -> str:
    """ "" or the tree's limit: the tree's own quantization method reads a
    layer's attribute (its weight or scale) that the method never made for
    this checkpoint, so the layer cannot run on XPU, compiled or eager (the
    0.14.0 llm-scaler tree's XPUFp8LinearMethod makes no weight for an fp8
    checkpoint; 0.10.2's reads weight_scale, which a block-quantized fp8
    layer does not have). Only where the error was raised in the tree's
    quantization/ module (its innermost frame) and no layer of that class
    in the built model has the attribute."""
    found = _NO_ATTRIBUTE.search(str(error))
    raised_there = frames and "/layers/quantization/" in frames[-1]
    if not found or not raised_there or built is None:
        return ""
    kind, name = found.groups()
    layers = [m for m in built.modules() if type(m).__name__ == kind]
    if not layers or any(hasattr(m, name) for m in layers):
        return ""
    method = type(getattr(layers[0], "quant_method", None)).__name__
    return (
        f"the tree's {method} never makes {kind}.{name}, which it reads "
        f"({frames[-1]}: the layer cannot run on XPU, compiled or not)"
    )


# what an MLA layer gives its attention backend and only an MLA backend takes
MLA_ARGUMENTS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "kv_b_proj")


def no_mla_backend(error: BaseException, vllm_config) -> str:
    """ "" or the tree's limit: an MLA model (DeepSeek-V2) whose attention
    backend on the tree's XPU platform has no MLA (0.14's
    XPUPlatform.get_attn_backend_cls returns FLASH_ATTN whatever use_mla
    says, and FlashAttentionImpl refuses the MLA layer's arguments), whose
    platform refuses MLA (llm-scaler b18beee), or whose MLA backend needs
    what an XPU build has not (0.16.0)."""
    if not getattr(vllm_config.model_config, "use_mla", False):
        return ""
    text = " ".join(str(error).split())
    if isinstance(error, RuntimeError) and text.startswith(
        "MLA attention requires FlashAttention"
    ):
        # 0.16.0's MLA prefill imports vllm.vllm_flash_attn, which vLLM's
        # setup.py builds for CUDA and ROCm only
        return (
            "the tree's MLA backend needs vllm.vllm_flash_attn, which vLLM "
            f"builds for CUDA and ROCm only ({text})"
        )
    if isinstance(error, ValueError) and "use_mla: True" in text:
        # intel/llm-scaler b18beee (0.21.0): its XPUPlatform refuses MLA
        return f"the tree's XPU platform refuses MLA ({text})"
    if not isinstance(error, TypeError) or "unexpected keyword argument" not in text:
        return ""
    if not any(f"'{name}'" in text for name in MLA_ARGUMENTS):
        return ""
    return (
        "the tree's XPU platform gives an MLA model an attention backend "
        f"without MLA ({text})"
    )
