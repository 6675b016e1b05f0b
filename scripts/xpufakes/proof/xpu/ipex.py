"""intel_extension_for_pytorch as vLLM's IPEX releases find it on an XPU
host, stood in.

* IPEX's Python APIs (`intel_extension_for_pytorch.llm.functional.*`) are
  Python functions that call `torch_ipex` ops, as IPEX's XPU path does
  (IPEX `transformers/models/xpu/fusions/activation_fusion.py`,
  `mha_fusion.py`); those ops are registered for the XPU dispatch key only,
  with no CPU, Meta or fake kernel (IPEX `csrc/gpu/aten/operators/*.cpp`,
  `IPEX_OP_REGISTER_DISPATCH(..., c10::DispatchKey::XPU)`), so under fake
  tensors they fail: "Operator does not support running with fake tensors".
* `torch_ipex::rms_norm_vllm` and `fused_add_rms_norm_vllm` are registered by
  IPEX without a dispatch key (`IPEX_OP_REGISTER`), which makes them
  CompositeImplicitAutograd kernels: no fake can be registered for them, and
  traced, their body reads the tensors' memory, which fake tensors do not
  have (IPEX `csrc/gpu/aten/operators/RMSNormVllm.cpp@v2.10.10+xpu`).
* IPEX's MoE module (`llm.modules.GatedMLPMOE`), which vLLM runs inside its
  own opaque `vllm::moe_forward`, computes its math (ipex_moe.py); its
  attention module is made, never run.

The schemas are IPEX's as it infers them from the C++ signatures: overload
"xpu", arguments `_0` ... `_n`, no alias annotations (docs/ipex-woq-ops.md
explains the inference). The kernels are the reference math (cpu_kernels.py).
The tests' IPEX stand-in (tests/support/woq_probe.py, which make e2e's plugin
loads too) is this one.
"""

import enum
import importlib.machinery
import sys
import types
from collections.abc import Callable

import torch

from xpufakes.proof.xpu import defining, ipex_moe
from xpufakes.proof.xpu.cpu_kernels import (
    bgmv_expand_with_slice,
    bgmv_shrink,
    fused_add_rms_norm,
    gelu_and_mul,
    gelu_quick,
    ipex_add_rms_norm,
    ipex_rms_norm,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
)
from xpufakes.proof.xpu.uncomputed import NoCPUReference

# ---------------------------------------------------------------------------
# torch_ipex ops beyond the GEMMs, registered as IPEX's XPU build does
# ---------------------------------------------------------------------------


def _touch(*tensors) -> None:
    """What a C++ kernel does first: read the tensors' memory (fails on fake
    tensors, as IPEX's CompositeImplicitAutograd kernels do under a trace)."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.untyped_storage().data_ptr()


def _rms_norm_vllm(out, input, weight, epsilon):
    _touch(out, input, weight)
    rms_norm(out, input, weight, epsilon)


def _fused_add_rms_norm_vllm(input, residual, weight, epsilon):
    _touch(input, residual, weight)
    fused_add_rms_norm(input, residual, weight, epsilon)


# name -> (schema, kernel, registration): "XPU" as IPEX_OP_REGISTER_DISPATCH
# with DispatchKey::XPU registers it, "CompositeImplicitAutograd" as
# IPEX_OP_REGISTER (no key) does. Sources (intel/intel-extension-for-pytorch):
# TripleOps.cpp, Activation.cpp, Rope.cpp, AddNormFusion.cpp, RMSNorm.cpp
# @v2.8.10+xpu; RMSNormVllm.cpp @v2.10.10+xpu.
TORCH_IPEX_OPS: dict[str, tuple[str, Callable, str]] = {
    "silu_and_mul.xpu": (
        "silu_and_mul.xpu(Tensor _0, Tensor _1) -> Tensor _0",
        silu_and_mul,
        "XPU",
    ),
    "gelu_and_mul.xpu": (
        "gelu_and_mul.xpu(Tensor _0, Tensor _1, str _2) -> Tensor _0",
        gelu_and_mul,
        "XPU",
    ),
    "gelu_quick_out.xpu": (
        "gelu_quick_out.xpu(Tensor _0, Tensor _1) -> Tensor _0",
        gelu_quick,
        "XPU",
    ),
    "rotary_embedding.xpu": (
        "rotary_embedding.xpu(Tensor _0, Tensor _1, Tensor _2, int _3, Tensor _4, "
        "bool _5, int _6) -> ()",
        rotary_embedding,
        "XPU",
    ),
    "rotary_embedding_batched.xpu": (
        "rotary_embedding_batched.xpu(Tensor _0, Tensor _1, Tensor _2, int _3, "
        "Tensor _4, bool _5, int _6, Tensor _7) -> ()",
        rotary_embedding,
        "XPU",
    ),
    "add_rms_norm.xpu": (
        "add_rms_norm.xpu(Tensor _0, Tensor _1, int[] _2, Tensor? _3, Tensor? _4, "
        "float _5, bool _6) -> Tensor _0",
        ipex_add_rms_norm,
        "XPU",
    ),
    "rms_norm.xpu": (
        "rms_norm.xpu(Tensor X, int[] normalized_shape, Tensor W, float epsilon) "
        "-> (Tensor _0, Tensor _1)",
        ipex_rms_norm,
        "XPU",
    ),
    "rms_norm_vllm.xpu": (
        "rms_norm_vllm.xpu(Tensor _0, Tensor _1, Tensor _2, float _3) -> ()",
        _rms_norm_vllm,
        "CompositeImplicitAutograd",
    ),
    "fused_add_rms_norm_vllm.xpu": (
        "fused_add_rms_norm_vllm.xpu(Tensor _0, Tensor _1, Tensor _2, float _3) -> ()",
        _fused_add_rms_norm_vllm,
        "CompositeImplicitAutograd",
    ),
    # Punica.cpp@v2.8.10+xpu
    "bgmv_shrink.xpu": (
        "bgmv_shrink.xpu(Tensor _0, Tensor _1, Tensor _2, Tensor _3, float _4) -> ()",
        bgmv_shrink,
        "XPU",
    ),
    "bgmv_expand_with_slice.xpu": (
        "bgmv_expand_with_slice.xpu(Tensor _0, Tensor _1, Tensor _2, Tensor _3, "
        "int _4, bool _5) -> ()",
        bgmv_expand_with_slice,
        "XPU",
    ),
}


def define_torch_ipex_ops(also_cpu: bool = False) -> dict:
    """Define the torch_ipex ops of TORCH_IPEX_OPS that are not defined yet,
    registered as IPEX's XPU build registers them. `also_cpu`: give the XPU
    ones a CPU kernel too, for an eager run on the CPU (a wrapper op's
    opcheck). A trace fails either way (FakeTensor runs a real kernel in
    place of a missing fake only for torch's own namespaces), but a CPU
    kernel lets eager CPU code run what on the XPU host is XPU-only, so the
    model proof registers none. Keep the returned library referenced."""
    lib = torch.library.Library("torch_ipex", "FRAGMENT")
    defined = []
    for name, (schema, kernel, key) in TORCH_IPEX_OPS.items():
        if defining.defined(f"torch_ipex::{name}"):
            continue
        lib.define(schema, alias_analysis="CONSERVATIVE")
        keys = [key] + (["CPU"] if also_cpu and key == "XPU" else [])
        for dispatch_key in keys:
            lib.impl(name, kernel, dispatch_key)
        defined.append(name)
    return {"library": lib, "ops": defined}


# ---------------------------------------------------------------------------
# intel_extension_for_pytorch: the Python APIs vLLM's IPEX releases call
# ---------------------------------------------------------------------------

IPEX_VERSION = "2.8.10+xpu"


def _functional() -> dict[str, Callable]:
    """ipex.llm.functional's functions as IPEX's XPU path runs them
    (`_get_function_from_device("xpu", f)` -> `<f>_xpu` of
    transformers/models/xpu/fusions/activation_fusion.py, mha_fusion.py)."""
    ops = torch.ops.torch_ipex

    def silu_and_mul(x, out=None):
        if out is None:
            out = torch.empty(x.shape[:-1] + (x.size(-1) // 2,), dtype=x.dtype)
        return ops.silu_and_mul(x, out)

    def gelu_and_mul(x, out=None, approximate="none"):
        if out is None:
            out = torch.empty(x.shape[:-1] + (x.size(-1) // 2,), dtype=x.dtype)
        return ops.gelu_and_mul(x, out, approximate)

    def gelu_quick(x, out=None):
        if out is None:
            out = torch.empty_like(x)
        return ops.gelu_quick_out(x, out)

    def rotary_embedding_batched(
        positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, offsets=None
    ):
        if offsets is None:
            ops.rotary_embedding(
                positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim
            )
        else:
            ops.rotary_embedding_batched(
                positions,
                query,
                key,
                head_size,
                cos_sin_cache,
                is_neox,
                rot_dim,
                offsets,
            )
        return query, key

    def rms_norm(hidden_states, weight, eps):
        return ops.rms_norm(hidden_states, [hidden_states.size(-1)], weight, eps)[0]

    def add_rms_norm(residual, x, weight, bias, eps, add_back=False):
        return ops.add_rms_norm(residual, x, [x.size(-1)], weight, bias, eps, add_back)

    def bgmv_shrink(inputs, lora_a_weights, output_tensor, indices, scaling=1.0):
        ops.bgmv_shrink(output_tensor, inputs, lora_a_weights, indices, scaling)

    def bgmv_expand(inputs, lora_b_weights, output_tensor, indices, add_inputs=True):
        ops.bgmv_expand_with_slice(
            output_tensor, inputs, lora_b_weights, indices, 0, add_inputs
        )

    def bgmv_expand_slice(
        inputs, lora_b_weights, output_tensor, indices, offset, size, add_inputs=True
    ):
        ops.bgmv_expand_with_slice(
            output_tensor, inputs, lora_b_weights, indices, offset, add_inputs
        )

    return {
        "bgmv_shrink": bgmv_shrink,
        "bgmv_expand": bgmv_expand,
        "bgmv_expand_slice": bgmv_expand_slice,
        "silu_and_mul": silu_and_mul,
        "gelu_and_mul": gelu_and_mul,
        "gelu_quick": gelu_quick,
        "rotary_embedding_batched": rotary_embedding_batched,
        "rms_norm": rms_norm,
        "add_rms_norm": add_rms_norm,
    }


class _XPUOnly:
    """An IPEX module or API that runs only XPU kernels and that vLLM calls
    only inside its own opaque ops (attention) or while loading: made
    freely, never run here. (IPEX's MoE module computes: ipex_moe.py.)"""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise NoCPUReference(f"{type(self).__name__} is an XPU-only IPEX stand-in")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self


def install_ipex(woq_from_weight: Callable | None = None) -> types.ModuleType:
    """Put an `intel_extension_for_pytorch` stand-in into sys.modules (the
    parts vLLM's IPEX releases use) and return it. `woq_from_weight`: what
    `llm.quantization.woq_linear.IPEXWeightOnlyQuantizedLinear.from_weight`
    makes (tests/support/woq_probe.py: the reference WOQ module)."""

    def module(name: str, **attrs) -> types.ModuleType:
        made = types.ModuleType(name)
        # as an imported module has: importlib.util.find_spec reads it
        # (transformers 4 asks whether IPEX is there that way)
        made.__spec__ = importlib.machinery.ModuleSpec(name, None)
        made.__dict__.update(attrs)
        sys.modules[name] = made
        return made

    quantization = module(
        "intel_extension_for_pytorch.quantization",
        WoqLowpMode=enum.Enum("WoqLowpMode", "NONE FP16 BF16 INT8"),
        WoqWeightDtype=enum.Enum("WoqWeightDtype", "INT8 INT4 NF4"),
        WoqActQuantMode=enum.Enum(
            "WoqActQuantMode",
            "PER_TENSOR PER_IC_BLOCK PER_BATCH PER_BATCH_IC_BLOCK",
        ),
        WoqWeightQScheme=enum.Enum(
            "WoqWeightQScheme", "UNDEFINED ASYMMETRIC SYMMETRIC"
        ),
        get_weight_only_quant_qconfig_mapping=lambda **kw: types.SimpleNamespace(**kw),
    )

    class IPEXWeightOnlyQuantizedLinear:
        @classmethod  # as IPEX's (llm/quantization/woq_linear.py)
        def from_weight(cls, *args, **kwargs):
            if woq_from_weight is None:
                raise RuntimeError("no IPEX WOQ linear stand-in was given")
            return woq_from_weight(*args, **kwargs)

    woq_linear = module(
        "intel_extension_for_pytorch.llm.quantization.woq_linear",
        IPEXWeightOnlyQuantizedLinear=IPEXWeightOnlyQuantizedLinear,
    )
    llm_quantization = module(
        "intel_extension_for_pytorch.llm.quantization", woq_linear=woq_linear
    )
    functional = module("intel_extension_for_pytorch.llm.functional", **_functional())
    modules = module(
        "intel_extension_for_pytorch.llm.modules",
        PagedAttention=_XPUOnly(),
        GatedMLPMOE=ipex_moe.GatedMLPMOE,
    )
    llm = module(
        "intel_extension_for_pytorch.llm",
        quantization=llm_quantization,
        functional=functional,
        modules=modules,
    )
    ipex = module(
        "intel_extension_for_pytorch",
        __version__=IPEX_VERSION,
        quantization=quantization,
        llm=llm,
    )
    for made in (ipex, llm, llm_quantization):
        made.__path__ = []
    return ipex
