"""Stand-ins for what only exists on an Intel XPU host, made to look to
Dynamo as the real things do, so that a trace through them fails where it
fails on the XPU (and a trace through a fix passes for the right reason).

* A native extension's function (a downstream build's pybind11 `vllm._C`,
  whose `ops` submodule holds `rms_norm`, `rotary_embedding`, ...) is a
  `builtin_function_or_method` whose `__qualname__` is `PyCapsule.<name>`, as
  pybind11 makes it (`builtin`). Dynamo refuses to trace it: "Attempted to
  call function marked as skipped ... third-party C/C++ Python extension".
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

The schemas are IPEX's as it infers them from the C++ signatures: overload
"xpu", arguments `_0` ... `_n`, no alias annotations (docs/ipex-woq-ops.md
explains the inference). Every stand-in computes the reference math, so that
an eager run (a wrapper op's opcheck on the CPU) has a result to compare.

This file imports only torch and the standard library: the tests' IPEX
stand-in (tests/support/woq_probe.py, which make e2e's plugin loads too)
loads it by path.
"""

import ctypes
import enum
import importlib.abc
import importlib.machinery
import shutil
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch

# ---------------------------------------------------------------------------
# A C extension's function: a real builtin, bound to a capsule as pybind11's
# ---------------------------------------------------------------------------


class _PyMethodDef(ctypes.Structure):
    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


_METH_VARARGS, _METH_KEYWORDS = 0x1, 0x2
_api = ctypes.pythonapi
_api.PyCFunction_NewEx.restype = ctypes.py_object
_api.PyCFunction_NewEx.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
# The C function of every stand-in builtin: PyObject_Call(self, args, kwargs),
# with `self` the capsule below.
_CALL = ctypes.cast(_api.PyObject_Call, ctypes.c_void_p).value
_DEFS: list = []  # each PyMethodDef must outlive its function


class PyCapsule:
    """pybind11 binds every function to a capsule, so its builtins'
    `__qualname__` is `PyCapsule.<name>`; this one calls `func`."""

    def __init__(self, func: Callable):
        self.func = func

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)


def builtin(name: str, module: str, func: Callable):
    """A `builtin_function_or_method` named `module.name` (as a pybind11
    function of that module is) that calls `func`."""
    definition = _PyMethodDef(
        name.encode(), _CALL, _METH_VARARGS | _METH_KEYWORDS, None
    )
    _DEFS.append(definition)
    return _api.PyCFunction_NewEx(ctypes.addressof(definition), PyCapsule(func), module)


def unavailable(qualname: str) -> Callable:
    """What a native function without a reference does when called."""

    def function(*args, **kwargs):
        raise RuntimeError(
            f"{qualname} is a stand-in for vLLM's native extension "
            "(not loaded here): the tree calls it while it is imported"
        )

    return function


# ---------------------------------------------------------------------------
# The reference math of the kernels the stand-ins stand for
# ---------------------------------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        out = out * weight.float()
    return out.to(x.dtype)


def rms_norm(out: torch.Tensor, input: torch.Tensor, weight, epsilon) -> None:
    """vLLM's `rms_norm(out, input, weight, epsilon)`: writes `out`."""
    out.copy_(_rms(input, weight, epsilon))


def fused_add_rms_norm(input, residual, weight, epsilon) -> None:
    """vLLM's `fused_add_rms_norm`: residual += input; input = rms(residual)."""
    residual.add_(input)
    input.copy_(_rms(residual, weight, epsilon))


def _rotate(x: torch.Tensor, cos, sin, rot_dim: int, is_neox: bool) -> None:
    """Rotate the first rot_dim of each head of x [tokens, heads, head] in
    place (cos, sin: [tokens, rot_dim / 2])."""
    rot = x[..., :rot_dim].float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    x[..., :rot_dim] = out.to(x.dtype)


def rotary_embedding(
    positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim=None, offsets=None
) -> None:
    """vLLM's and IPEX's `rotary_embedding(positions, query, key, head_size,
    cos_sin_cache, is_neox[, rot_dim[, offsets]])`: rotates query and key in
    place. Positions [num_tokens], or [3, num_tokens] for MRoPE, of which the
    first row is taken (text positions are equal in all three)."""
    if positions.dim() == 2:
        positions = positions[0]
    positions = positions.reshape(-1)
    if offsets is not None:
        positions = positions + offsets.reshape(-1)
    rot_dim = rot_dim or cos_sin_cache.size(-1)
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    tokens = positions.numel()
    for x in (query, key):
        if x is not None:
            _rotate(x.view(tokens, -1, head_size), cos, sin, rot_dim, is_neox)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    d = x.size(-1) // 2
    return out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])


def gelu_and_mul(x: torch.Tensor, out: torch.Tensor, approximate: str = "none"):
    d = x.size(-1) // 2
    gelu = torch.nn.functional.gelu(x[..., :d], approximate=approximate)
    return out.copy_(gelu * x[..., d:])


def gelu_quick(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out.copy_(x * torch.sigmoid(1.702 * x))


def ipex_rms_norm(x, normalized_shape, weight, eps):
    """IPEX `rms_norm_fw`: a new contiguous output of x's shape, and rstd."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out.copy_(_rms(x, weight, eps))
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
    return out, rstd


def ipex_add_rms_norm(add, x, normalized_shape, weight, bias, eps, add_back):
    """IPEX `add_rms_norm`: rms(x + add); with add_back, add = x + add. A new
    contiguous output of x's shape (AddNormFusion.cpp, `at::empty(input.sizes(),
    input.options())`)."""
    total = x + add if add is not None else x
    if add is not None and add_back:
        add.copy_(total)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out.copy_(_rms(total, weight, eps))
    if bias is not None:
        out.add_(bias)
    return out


def bgmv_shrink(out, inputs, weights, indices, scaling) -> None:
    """IPEX Punica bgmv_shrink: out[i] = inputs[i] @ weights[indices[i]].T *
    scaling (rows whose index is -1 are left as they are)."""
    for i, index in enumerate(indices.tolist()):
        if index >= 0:
            row = inputs[i].float() @ weights[index].float().t() * scaling
            out[i] = row.to(out.dtype)


def bgmv_expand_with_slice(out, inputs, weights, indices, offset, add) -> None:
    """IPEX Punica bgmv_expand_with_slice: out[i, offset:offset + n] (+)=
    inputs[i] @ weights[indices[i]].T, n = weights.size(-2)."""
    n = weights.size(-2)
    for i, index in enumerate(indices.tolist()):
        if index >= 0:
            row = inputs[i].float() @ weights[index].float().t()
            if add:
                row = row + out[i, offset : offset + n].float()
            out[i, offset : offset + n] = row.to(out.dtype)


# Known native functions (a downstream's pybind11 `vllm._C`, csrc/xpu/
# pybind.cpp of intel/llm-scaler's vllm_for_multi_arc.patch) -> reference.
NATIVE_REFERENCES: dict[str, Callable] = {
    "vllm._C.ops.rms_norm": rms_norm,
    "vllm._C.ops.fused_add_rms_norm": fused_add_rms_norm,
    "vllm._C.ops.rotary_embedding": rotary_embedding,
    "vllm._C.ops.silu_and_mul": lambda out, x: silu_and_mul(x, out),
    "vllm._C.ops.gelu_and_mul": lambda out, x: gelu_and_mul(x, out),
    "vllm._C.ops.gelu_tanh_and_mul": lambda out, x: gelu_and_mul(x, out, "tanh"),
}


def native_function(qualname: str):
    """The stand-in builtin for a native function, e.g.
    "vllm._C.ops.rms_norm": its reference, or one that raises, naming it."""
    module, _, name = qualname.rpartition(".")
    return builtin(name, module, NATIVE_REFERENCES.get(qualname, unavailable(qualname)))


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
        op_name, _, overload = name.partition(".")
        packet = getattr(torch.ops.torch_ipex, op_name, None)
        if packet is not None and overload in packet.overloads():
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
    only inside its own opaque ops (attention, MoE) or while loading: made
    freely, never run here."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is an XPU-only IPEX stand-in")

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
        GatedMLPMOE=type("GatedMLPMOE", (_XPUOnly,), {}),
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


# ---------------------------------------------------------------------------
# Ops vLLM runs while it loads the weights (not traced), with a CPU kernel
# ---------------------------------------------------------------------------


def dynamic_scaled_fp8_quant(result, input, scale) -> None:
    """Per-tensor dynamic fp8 quantization (online fp8 quantizes the weights
    with it while loading): scale = amax / fp8 max."""
    finfo = torch.finfo(result.dtype)
    amax = input.abs().amax().float().clamp(min=1e-12)
    scale.fill_(amax / finfo.max)
    result.copy_((input.float() / scale).clamp(finfo.min, finfo.max).to(result.dtype))


def static_scaled_fp8_quant(result, input, scale, group_shape=None) -> None:
    """fp8 quantization by a given scale (a scalar, or one that broadcasts
    over the input as `group_shape` says: per channel or per token)."""
    finfo = torch.finfo(result.dtype)
    if scale.numel() > 1 and scale.dim() == 1:
        per_token = group_shape is not None and group_shape[1] != 1
        scale = scale.view(-1, 1) if per_token else scale.view(1, -1)
    quantized = (input.float() / scale.float()).clamp(finfo.min, finfo.max)
    result.copy_(quantized.to(result.dtype))


# "ns::name.overload" -> (schema, CPU kernel): the quantization ops that run
# while loading (online fp8 quantizes the weights with them), registered by
# the XPU builds for the XPU key only: IPEX's (data/untraceable.toml, its
# schema as IPEX infers it) and vllm-xpu-kernels' _C ones (0.21.0's
# ops.scaled_fp8_quant). Here they have CPU kernels, so that loading runs on
# the CPU. They are never traced: weight loading is not.
LOADING_OPS: dict[str, tuple[str, Callable]] = {
    "torch_ipex::dynamic_scaled_fp8_quant.xpu": (
        "dynamic_scaled_fp8_quant.xpu(Tensor _0, Tensor _1, Tensor _2) -> ()",
        dynamic_scaled_fp8_quant,
    ),
    "_C::dynamic_scaled_fp8_quant": (
        "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()",
        dynamic_scaled_fp8_quant,
    ),
    "_C::static_scaled_fp8_quant": (
        "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, "
        "int[]? group_shape=None) -> ()",
        static_scaled_fp8_quant,
    ),
}


def define_loading_ops(namespace: str) -> torch.library.Library:
    """Define the ops of LOADING_OPS in `namespace` ("torch_ipex": IPEX's;
    "_C": vllm-xpu-kernels') that are not defined yet, with their CPU
    kernels. Keep the returned library referenced."""
    lib = torch.library.Library(namespace, "FRAGMENT")
    for qualified, (schema, kernel) in LOADING_OPS.items():
        if not qualified.startswith(f"{namespace}::"):
            continue
        name = qualified.partition("::")[2]
        op_name, _, overload = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op_name, None)
        if packet is not None and (overload or "default") in packet.overloads():
            continue
        lib.define(schema, alias_analysis="CONSERVATIVE" if overload else "")
        lib.impl(name, kernel, "CPU")
    return lib


# ---------------------------------------------------------------------------
# vllm-xpu-kernels' `_C`: the activations, norms and rotary embedding a
# kernels-era tree calls on a model's dense path (its CustomOps take them in
# __init__, `self.op = torch.ops._C.silu_and_mul`)
# ---------------------------------------------------------------------------


def _and_mul(activation: Callable) -> Callable:
    """`<act>_and_mul(out, input)`: out = act(input[:d]) * input[d:]."""

    def kernel(out: torch.Tensor, input: torch.Tensor) -> None:
        d = input.size(-1) // 2
        out.copy_(activation(input[..., :d].float()) * input[..., d:].float())

    return kernel


def _elementwise(activation: Callable) -> Callable:
    def kernel(out: torch.Tensor, input: torch.Tensor) -> None:
        out.copy_(activation(input.float()))

    return kernel


def _mul_and_silu(out: torch.Tensor, input: torch.Tensor) -> None:
    """`mul_and_silu(out, input)`: out = input[:d] * silu(input[d:])."""
    d = input.size(-1) // 2
    out.copy_(input[..., :d].float() * torch.nn.functional.silu(input[..., d:].float()))


def _dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub) -> None:
    """Per-token dynamic fp8: each row's scale = its amax (at most scale_ub)
    / fp8 max, the row divided by it."""
    finfo = torch.finfo(result.dtype)
    amax = input.abs().float().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub.float())
    row_scale = (amax / finfo.max).clamp(min=1.0 / (finfo.max * 512.0))
    scale.copy_(row_scale.view(scale.shape))
    quantized = (input.float() / row_scale).clamp(finfo.min, finfo.max)
    result.copy_(quantized.to(result.dtype))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


# op -> its CPU kernel (the arguments in the schema's order); the schemas are
# data (data/xpu_kernels_c.toml, by release), given to define_xpu_kernels_c_ops
XPU_KERNELS_C: dict[str, Callable] = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "silu_and_mul": _and_mul(torch.nn.functional.silu),
    "mul_and_silu": _mul_and_silu,
    "gelu_and_mul": _and_mul(torch.nn.functional.gelu),
    "gelu_tanh_and_mul": _and_mul(_gelu_tanh),
    "gelu_fast": _elementwise(_gelu_tanh),
    "gelu_new": _elementwise(_gelu_tanh),
    "gelu_quick": _elementwise(lambda x: x * torch.sigmoid(1.702 * x)),
    "rotary_embedding": rotary_embedding,
    "dynamic_per_token_scaled_fp8_quant": _dynamic_per_token_scaled_fp8_quant,
}


def define_xpu_kernels_c_ops(schemas: dict[str, str]) -> torch.library.Library:
    """Define vllm-xpu-kernels' `_C` ops of `schemas` (op -> schema, of the
    tree's release) that are not defined yet, each with its CPU kernel
    (XPU_KERNELS_C; an op only named by vLLM's fusion passes has none) and,
    as the package registers them, no Meta or fake kernel (an op that
    returns nothing gets torch's own trivial fake, as on the XPU). Keep the
    returned library referenced."""
    lib = torch.library.Library("_C", "FRAGMENT")
    for name, schema in schemas.items():
        packet = getattr(torch.ops._C, name, None)
        if packet is not None and "default" in packet.overloads():
            continue
        lib.define(schema)
        if name in XPU_KERNELS_C:
            lib.impl(name, XPU_KERNELS_C[name], "CPU")
    return lib


# vllm-xpu-kernels' device queries (`_xpu_C::is_xe2_arch`, ...), answered
# for an Arc B-series GPU (BMG, Xe2: the bug report's): vLLM's XPU MoE
# experts ask them while the model is made (0.33.0's xpu_moe.py)
XPU_DEVICE: dict[str, bool] = {
    "is_xe2_arch": True,
    "is_xe3_arch": False,
    "is_bmg": True,
    "is_pvc": False,
}
# torch.xpu.get_device_properties().max_compute_units of an Arc B580
# (20 Xe2 cores x 8 vector engines)
XPU_COMPUTE_UNITS = 160


def define_xpu_device_queries(schemas: dict[str, str]) -> torch.library.Library:
    """Define the `_xpu_C` device queries of XPU_DEVICE (their schemas given,
    as the package registers them: no dispatch key) that are not defined
    yet. Keep the returned library referenced."""
    lib = torch.library.Library("_xpu_C", "FRAGMENT")
    for name, answer in XPU_DEVICE.items():
        packet = getattr(torch.ops._xpu_C, name, None)
        if packet is not None and "default" in packet.overloads():
            continue

        def query(device_index: int = -1, answer: bool = answer) -> bool:
            return answer

        lib.define(schemas[name])
        lib.impl(name, query, "CompositeImplicitAutograd")
    return lib


class XPUOnCPU(torch.overrides.TorchFunctionMode):
    """The XPU device, where a tree names it while it makes the model or
    processes its weights (`.to("xpu")`, `device=current_platform.device_type`):
    the CPU, where the tensors of the proof are; a torch without XPU cannot
    make a tensor there."""

    @staticmethod
    def _cpu(value):
        if isinstance(value, str) and (value == "xpu" or value.startswith("xpu:")):
            return "cpu"
        if isinstance(value, torch.device) and value.type == "xpu":
            return torch.device("cpu")
        if isinstance(value, (list, tuple)):
            return type(value)(XPUOnCPU._cpu(v) for v in value)
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.xpu:
            return args[0]
        args = tuple(self._cpu(a) for a in args)
        kwargs = {k: self._cpu(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


# ---------------------------------------------------------------------------
# torchvision, for the module-level imports of a multimodal model's module
# ---------------------------------------------------------------------------


class _Anything(type):
    """A torchvision name: a class whose every attribute is another one
    (`InterpolationMode.BICUBIC`), which raises when it is made or called."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        made = _Anything(name, (_TorchvisionName,), {"__module__": cls.__module__})
        setattr(cls, name, made)
        return made


class _TorchvisionName(metaclass=_Anything):
    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__module__}.{type(self).__name__} is a torchvision "
            "stand-in: the vision path is not run here"
        )


class _NamesModule(types.ModuleType):
    """A stand-in module: each name asked of it is made once, by
    ``make(module name, name)``, and kept."""

    def __init__(self, name: str, make: Callable[[str, str], object]):
        super().__init__(name)
        self._make = make

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        made = self._make(self.__name__, name)
        setattr(self, name, made)
        return made


def _torchvision_name(module: str, name: str) -> type:
    return _Anything(name, (_TorchvisionName,), {"__module__": module})


class _Torchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _NamesModule(spec.name, _torchvision_name)
        module.__path__ = []
        # transformers reads the version once it finds the package: one
        # below every version it asks for, so that where it has a choice it
        # takes the path that needs the least of torchvision
        module.__version__ = "0.0"
        return module

    def exec_module(self, module):
        pass


def install_torchvision() -> bool:
    """If torchvision cannot be imported, let `torchvision` and every module
    below it import as stand-ins whose names raise when used. A multimodal
    model's module imports an image processor at module level (transformers'
    image_processing_qwen2_vl imports torchvision.transforms.v2); the
    language model never runs it. Returns whether it installed them."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or built for another torch
        for name in [n for n in sys.modules if n.partition(".")[0] == "torchvision"]:
            del sys.modules[name]
        if not any(isinstance(f, _Torchvision) for f in sys.meta_path):
            sys.meta_path.insert(0, _Torchvision())
        return True
    return False


# ---------------------------------------------------------------------------
# A downstream image's own kernel packages, beside vLLM
# ---------------------------------------------------------------------------

# name -> what it is and where a tree imports it. Its real functions are
# Python wrappers of torch ops its C++ registers for the XPU only
# (custom_esimd_kernels_vllm/ops.py: `torch.ops.custom_esimd_kernels_vllm.*`),
# so a trace that reaches one fails on the XPU as it fails here. Each name
# below the package is stood in by a callable that raises, naming itself.
DOWNSTREAM_PACKAGES = {
    "custom_esimd_kernels_vllm": "intel/llm-scaler's ESIMD kernels "
    "(vllm/custom-esimd-kernels-vllm): 0a85564 (0.14.0) imports three of "
    "them in ipex_quant.py at module level, b18beee (0.21.0) in esimd_utils.py",
}


class _DownstreamName:
    """A name of a downstream kernel package: its attributes are names
    too, and calling it raises, naming it."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _DownstreamName(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._qualname} is a stand-in: the image's kernel package is "
            "not here, and the traced path reached it"
        )


class _Downstream(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in DOWNSTREAM_PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _NamesModule(spec.name, lambda m, n: _DownstreamName(f"{m}.{n}"))
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


Q4_0_SOURCE = Path(__file__).with_name("q4_0_standin.c")


def q4_0_library(directory: Path) -> Path:
    """intel/llm-scaler's sym_int4 loads its quantizer, a shared library,
    with ctypes (VLLM_QUANTIZE_Q40_LIB, the image's
    /opt/lib/vllm_int4_for_multi_arc.so) and calls it on the CPU while it
    processes the weights. A ctypes library has to be one: the stand-in
    (q4_0_standin.c, its contract there) built with the C compiler
    Inductor uses here too. Returns its path."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) for the sym_int4 library stand-in")
    made = directory / "vllm_int4_for_multi_arc.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(made), str(Q4_0_SOURCE), "-lm"],
        check=True,
        capture_output=True,
    )
    return made


def install_downstream_packages() -> list[str]:
    """Stand-ins for the packages of DOWNSTREAM_PACKAGES that cannot be
    imported here. Returns their names."""
    import importlib.util

    missing = [n for n in DOWNSTREAM_PACKAGES if importlib.util.find_spec(n) is None]
    if missing and not any(isinstance(f, _Downstream) for f in sys.meta_path):
        sys.meta_path.append(_Downstream())
    return missing
