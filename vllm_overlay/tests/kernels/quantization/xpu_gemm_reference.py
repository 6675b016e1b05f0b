# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU stand-ins for the Intel XPU quantized GEMM kernels.

Where the real kernels cannot load -- any machine without an Intel GPU -- the
ops are defined here with the kernels' exact schemas and CPU reference
implementations, so that ``torch.library.opcheck`` can compare the fake
kernels with a real one.

A reference kernel computes the real math (dequantize, fp32 matmul, bias) and
returns it in the layout the XPU kernel allocates: ``A.shape[:-1] + (N,)``,
strides ``A.stride(i) // K * N`` but the last, which is A's. It performs the
XPU kernel's input checks with the XPU kernel's messages.

Sources:

* vllm-project/vllm-xpu-kernels (``_xpu_C``): ``csrc/xpu/torch_bindings.cpp``
  (schemas), ``csrc/xpu/onednn/onednn_matmul.cpp`` and ``onednn/*.h``
  (allocation, checks);
* intel/intel-extension-for-pytorch (``torch_ipex``):
  ``csrc/gpu/aten/operators/fp8/FP8Linear.cpp``.
"""

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import regex as re
import torch

# Schemas, verbatim from the kernels' registrations. Identical in every
# release that has the op.
XPU_C_SCHEMAS = {
    "fp8_gemm": "fp8_gemm(Tensor A, Tensor B, ScalarType? out_dtype, "
    "Tensor? A_scale_, Tensor? B_scale_, Tensor? bias_) -> Tensor",
    "fp8_gemm_out": "fp8_gemm_out(Tensor(a!) out, Tensor A, Tensor B, "
    "ScalarType? out_dtype, Tensor? A_scale_, Tensor? B_scale_, "
    "Tensor? bias_) -> Tensor",
    "fp8_bmm": "fp8_bmm(Tensor A, Tensor B, ScalarType? out_dtype, Tensor? A_scale_, "
    "Tensor? B_scale_, Tensor? bias_) -> Tensor",
    "fp8_gemm_w8a16": "fp8_gemm_w8a16(Tensor A, Tensor B, Tensor? B_scale_, "
    "Tensor? bias_) -> Tensor",
    "fp4_gemm": "fp4_gemm(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, "
    "ScalarType? out_dtype, Tensor? bias_) -> Tensor",
    "int4_gemm_w4a16": "int4_gemm_w4a16(Tensor A, Tensor B, Tensor? bias, "
    "Tensor B_scale, Tensor B_zp, int group_size, Tensor? g_idx) -> Tensor",
    "int4_gemm_w4a8": "int4_gemm_w4a8(Tensor A_, Tensor A_scale, Tensor A_zp, "
    "Tensor B, Tensor B_scale, Tensor B_zp, int group_size, Tensor? g_idx, "
    "Tensor? bias) -> Tensor",
}

# vllm-xpu-kernels release that first has an op (the others are in v0.1.0).
XPU_C_OP_SINCE = {
    "fp4_gemm": (0, 1, 6),
    "fp8_bmm": (0, 1, 11),
    "fp8_gemm_out": (0, 1, 14),
}

# vllm-xpu-kernels release that first performs a check.
XPU_C_CHECK_SINCE = {
    "batched_weights": (0, 1, 11),  # dda91d1: B may be 3-D
    "contiguity_checks": (0, 1, 13),  # 22bbc16
}

# IPEX infers the schema from the C++ signature (unnamed arguments) and
# registers it as the "xpu" overload, with CONSERVATIVE alias analysis.
TORCH_IPEX_SCHEMAS = {
    "fp8_gemm_w8a16.xpu": "fp8_gemm_w8a16.xpu(Tensor _0, Tensor _1, bool _2, "
    "Tensor? _3, Tensor? _4) -> Tensor _0",
}

# The vllm-xpu-kernels release the stand-ins are by default: the one the newest
# supported vLLM release pins (requirements/xpu.txt).
NEWEST_XPU_KERNELS = "0.1.17"

_FP8 = (torch.float8_e5m2, torch.float8_e4m3fn)
_HALF = (torch.float16, torch.bfloat16)
_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
_E8M0 = getattr(torch, "float8_e8m0fnu", None)

# c10's names for ScalarTypes, as the kernels print them.
_C10_NAMES = {
    torch.float32: "Float",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float64: "Double",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.float8_e4m3fn: "Float8_e4m3fn",
    torch.float8_e5m2: "Float8_e5m2",
}

# e2m1 code -> value (sign in the high bit of the nibble)
_E2M1 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    + [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def parse_version(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version)
    if not match:
        raise ValueError(f"not a release number: {version!r}")
    return tuple(int(p) for p in match.group(0).split("."))


def _name(dtype: torch.dtype) -> str:
    return _C10_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


# ---------------------------------------------------------------------------
# Shared pieces of the reference kernels
# ---------------------------------------------------------------------------


class _Release:
    def __init__(self, version: tuple[int, ...]):
        self.version = version

    def has(self, check: str) -> bool:
        return self.version >= XPU_C_CHECK_SINCE[check]


def _allocate(A: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    k = A.shape[-1]
    if k == 0:
        # The XPU kernel divides by K here (SIGFPE); do not imitate that.
        raise RuntimeError("XPU GEMM: the input's last dimension (K) is 0")
    shape = list(A.shape[:-1]) + [n]
    strides = [s // k * n for s in A.stride()[:-1]] + [A.stride(-1)]
    return torch.empty_strided(shape, strides, dtype=dtype, device=A.device)


def _check_and_create_output(
    release: _Release, A: torch.Tensor, B: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    _require(A.dim() in (2, 3), "OneDNN Matmul only support 2D and 3D inputs!\n")
    if not release.has("batched_weights"):
        _require(B.dim() == 2, "OneDNN Matmul only support 2D weights!\n")
    _require(B.dim() in (2, 3), "OneDNN Matmul only support 2D and 3D weights!\n")
    if B.dim() == 3:
        _require(
            A.dim() == 3,
            "OneDNN Matmul expects 3D input when using batched weights!\n",
        )
        _require(
            A.shape[0] == B.shape[0],
            "OneDNN Matmul expects input and weight batches to match, got "
            f"{A.shape[0]} and {B.shape[0]}.",
        )
    if B.dtype == torch.int32:
        _require(B.stride(-2) == 1, "Int4 weight must be in NT format!\n")
    return _allocate(A, B.shape[-1], dtype)


def _check_contiguous(
    release: _Release, t: torch.Tensor | None, what: str, kind: str
) -> None:
    if release.has("contiguity_checks") and t is not None:
        _require(t.is_contiguous(), f"{what} must be contiguous for {kind} matmul")


def _bias(bias: torch.Tensor | None, m: int, n: int) -> torch.Tensor | None:
    """``get_bias_type`` of the oneDNN glue; returns a broadcastable bias."""
    if bias is None:
        return None
    numel = bias.numel()
    if numel == 1:
        value = bias.reshape(1, 1)
    elif numel == m * n:
        value = bias.reshape(m, n)
    elif bias.shape[-1] == n and numel == n:
        value = bias.reshape(1, n)
    elif bias.shape[-1] == 1 and numel == m:
        value = bias.reshape(m, 1)
    elif numel == 0:
        value = None
    else:
        sizes = ", ".join(map(str, bias.shape))
        raise RuntimeError(f"unsupported bias dim in matmul ...[{sizes}]")
    _require(
        bias.dtype in (torch.float32, torch.bfloat16, torch.float16),
        f"Unsupported data type for bias in int4 matmul: {_name(bias.dtype)}",
    )
    return None if value is None else value.float()


def _expand_scale(scale: torch.Tensor | None, rows: int, cols: int) -> torch.Tensor:
    """An fp32 factor that broadcasts to [rows, cols], from a per-tensor,
    per-row ([rows, 1]), per-column ([cols] / [1, cols]) or block
    ([rows/r, cols/c]) scale."""
    if scale is None:
        return torch.ones(())
    if scale.numel() == 1:  # per-tensor
        return scale.float().reshape(())
    s = scale.float()
    if s.dim() == 1 and s.numel() == cols:
        return s.reshape(1, cols).expand(rows, cols)
    if s.dim() == 2 and s.shape == (1, cols):
        return s.expand(rows, cols)
    if s.dim() == 2 and s.shape == (rows, 1):
        return s.expand(rows, cols)
    if s.dim() == 2 and rows % s.shape[0] == 0 and cols % s.shape[1] == 0:
        return s.repeat_interleave(rows // s.shape[0], 0).repeat_interleave(
            cols // s.shape[1], 1
        )
    raise RuntimeError(f"reference kernel: unsupported scale shape {list(s.shape)}")


def _finish(
    out: torch.Tensor, product: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Write ``product + bias`` ([rows, N], fp32) through out's strides."""
    if bias is not None:
        product = product + bias
    out.copy_(product.reshape(out.shape).to(out.dtype))
    return out


def _rows(A: torch.Tensor) -> torch.Tensor:
    return A.reshape(-1, A.shape[-1])


# ---------------------------------------------------------------------------
# _xpu_C reference kernels
# ---------------------------------------------------------------------------


def _fp8_gemm_common(out, A, B, A_scale, B_scale, bias):
    _require(
        A.dtype in _FP8 and B.dtype in _FP8 and A.dtype == B.dtype,
        "input and weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul",
    )
    _require(out.dtype in _HALF, "output must be float16 or bfloat16 for fp8 matmul")
    if (
        A_scale is not None
        and B_scale is not None
        and A_scale.dim() == 2
        and A_scale.shape[1] > 1
    ):
        _require(
            A_scale.shape[1] == B_scale.shape[0],
            "Mismatch group size in input and weight."
            f"{A_scale.shape[1]} vs {B_scale.shape[0]}",
        )
    k, n = A.shape[-1], B.shape[-1]
    a = _rows(A).float()
    a = a * _expand_scale(A_scale, a.shape[0], k)
    bias_ = _bias(bias, a.shape[0], n)
    if B.dim() == 3:  # one [K, N] weight per batch entry, a per-tensor scale
        w = B.float() * _expand_scale(B_scale, 1, 1)
        product = torch.bmm(a.reshape(A.shape), w).reshape(-1, n)
        return _finish(out, product, bias_)
    w = B.float() * _expand_scale(B_scale, k, n)
    return _finish(out, a @ w, bias_)


def make_xpu_c_kernels(release: _Release) -> dict:
    def fp8_gemm(A, B, out_dtype, A_scale, B_scale, bias):
        _check_contiguous(release, A_scale, "A_scale", "fp8")
        _check_contiguous(release, B_scale, "B_scale", "fp8")
        _check_contiguous(release, bias, "bias", "fp8")
        dtype = torch.float16 if out_dtype is None else out_dtype
        out = _check_and_create_output(release, A, B, dtype)
        return _fp8_gemm_common(out, A, B, A_scale, B_scale, bias)

    def fp8_gemm_out(out, A, B, out_dtype, A_scale, B_scale, bias):
        _check_contiguous(release, A_scale, "A_scale", "fp8")
        _check_contiguous(release, B_scale, "B_scale", "fp8")
        _check_contiguous(release, bias, "bias", "fp8")
        _check_and_create_output(release, A, B, out.dtype)
        expected = list(A.shape[:-1]) + [B.shape[-1]]
        _require(
            out.device == A.device,
            f"OneDNN Matmul expects out on device {A.device}, got {out.device}.",
        )
        _require(
            list(out.shape) == expected,
            f"OneDNN Matmul expects out of shape {expected}, got {list(out.shape)}.",
        )
        _require(
            out_dtype is None or out.dtype == out_dtype,
            f"OneDNN Matmul expects out of dtype {_name(out_dtype or out.dtype)}, "
            f"got {_name(out.dtype)}.",
        )
        return _fp8_gemm_common(out, A, B, A_scale, B_scale, bias)

    def fp8_bmm(A, B, out_dtype, A_scale, B_scale, bias):
        _require(A.dim() == 3, "fp8_bmm expects A to be a 3D tensor")
        _require(B.dim() == 3, "fp8_bmm expects B to be a 3D tensor")
        _check_contiguous(release, A_scale, "A_scale", "fp8")
        _check_contiguous(release, B_scale, "B_scale", "fp8")
        dtype = torch.float16 if out_dtype is None else out_dtype
        out = _check_and_create_output(release, A, B, dtype)
        _require(
            A.dtype in _FP8 and B.dtype in _FP8 and A.dtype == B.dtype,
            "input and weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul",
        )
        _require(
            out.dtype in _HALF, "output must be float16 or bfloat16 for fp8 matmul"
        )
        n = B.shape[-1]
        _require(
            bias is None
            or bias.numel() in (0, 1)
            or (bias.numel() == n and bias.shape[-1] == n),
            "Batched fp8 matmul only supports empty, scalar, or [N] bias.",
        )
        a_scale = 1.0 if A_scale is None else A_scale.float().reshape(-1)[0]
        b_scale = 1.0 if B_scale is None else B_scale.float().reshape(-1)[0]
        product = torch.bmm(A.float(), B.float()) * (a_scale * b_scale)
        bias_ = None if bias is None or bias.numel() == 0 else bias.float()
        return _finish(out, product.reshape(-1, n), bias_)

    def fp8_gemm_w8a16(A, B, B_scale, bias):
        _check_contiguous(release, B_scale, "B_scale", "fp8")
        _check_contiguous(release, bias, "bias", "fp8")
        out = _check_and_create_output(release, A, B, A.dtype)
        _require(B.dtype in _FP8, "weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul")
        _require(
            A.dtype in _HALF,
            f"INTERNAL ASSERT FAILED: Unsupported data type for fp8 matmul: "
            f"{_name(A.dtype)}",
        )
        k, n = A.shape[-1], B.shape[-1]
        w = B.float() * _expand_scale(B_scale, k, n)
        a = _rows(A).float()
        return _finish(out, a @ w, _bias(bias, a.shape[0], n))

    def fp4_gemm(A, B, A_scale, B_scale, out_dtype, bias):
        _check_contiguous(release, A_scale, "A_scale", "fp4")
        _check_contiguous(release, B_scale, "B_scale", "fp4")
        dtype = torch.float16 if out_dtype is None else out_dtype
        out = _check_and_create_output(release, A, B, dtype)
        _require(
            A.dtype == _FP4 and B.dtype == _FP4,
            "input and weight must be f4_e2m1x2 or f4_e2m1x2 for fp4 matmul",
        )
        _require(
            out.dtype in _HALF, "output must be float16 or bfloat16 for fp4 matmul"
        )
        _require(
            A_scale.dtype == _E8M0,
            "INTERNAL ASSERT FAILED: Unsupported scale type for fp4 matmul: "
            f"{_name(A_scale.dtype)}",
        )
        _require(
            B_scale.dtype == A_scale.dtype,
            "Mismatched scale data types in mxfp4 matmul: "
            f"{_name(A_scale.dtype)} vs {_name(B_scale.dtype)}",
        )
        a = unpack_fp4(_rows(A), dim=1)  # [M, K]
        w = unpack_fp4(B, dim=0)  # [K, N]
        k, n = w.shape
        a = a * _expand_scale(A_scale, a.shape[0], k)
        b_scale = B_scale if B_scale.shape[-1] == n else B_scale.t()
        w = w * _expand_scale(b_scale, k, n)
        return _finish(out, a @ w, _bias(bias, a.shape[0], n))

    def int4_gemm_w4a16(A_, B, bias, B_scale, B_zp, group_size, g_idx):
        _check_contiguous(release, B_scale, "B_scale", "int4")
        A = A_.index_select(-1, g_idx) if g_idx is not None else A_
        out = _check_and_create_output(release, A, B, A.dtype)
        _require(
            A.dtype in _HALF,
            "INTERNAL ASSERT FAILED: Unsupported data type for int4-f16/bf16 "
            f"matmul: {_name(A.dtype)}",
        )
        w = dequantize_int4(B, B_scale, B_zp, group_size)
        a = _rows(A).float()
        return _finish(out, a @ w, _bias(bias, a.shape[0], w.shape[1]))

    def int4_gemm_w4a8(A_, A_scale, A_zp, B, B_scale, B_zp, group_size, g_idx, bias):
        _check_contiguous(release, A_scale, "A_scale", "int4")
        _check_contiguous(release, B_scale, "B_scale", "int4")
        A = A_.index_select(-1, g_idx) if g_idx is not None else A_
        per_token = (
            A_scale.dim() == 2
            and A_scale.shape[1] == 1
            and A_zp.dim() == 2
            and A_zp.shape[1] == 1
        )
        per_tensor = A_scale.dim() == 1 and A_zp.dim() == 1
        _require(
            per_token or per_tensor,
            "Int4-Int8 matmul expects quantized input A to be per-token "
            "([b*m,1]) or per-tensor ([b]) quantized!",
        )
        out = _check_and_create_output(release, A, B, torch.float16)
        _require(
            A.dtype in (torch.int8, torch.uint8),
            "INTERNAL ASSERT FAILED: Unsupported data type for int4-int8 matmul: "
            f"{_name(A.dtype)}",
        )
        a = _rows(A).float()
        zp = A_zp.float().reshape(-1, 1) if per_token else A_zp.float().reshape(())
        scale = (
            A_scale.float().reshape(-1, 1) if per_token else A_scale.float().reshape(())
        )
        a = (a - zp) * scale
        w = dequantize_int4(B, B_scale, B_zp, group_size)
        return _finish(out, a @ w, _bias(bias, a.shape[0], w.shape[1]))

    # every function above is the kernel of the op of its name
    return {name: kernel for name, kernel in locals().items() if callable(kernel)}


# ---------------------------------------------------------------------------
# torch_ipex reference kernels
# ---------------------------------------------------------------------------


def ipex_fp8_gemm_w8a16(A, B, trans_B, B_scale, bias):
    if A.dim() == 3:
        _require(B.dim() == 2, "fp8_gemm only support 2D weight\n")
    else:
        _require(A.dim() == 2, "linear only support for 2D and 3D tensors!\n")
    w = B.float().t() if trans_B else B.float()  # [K, N]
    out = _allocate(A, w.shape[1], A.dtype)
    _require(B.dtype in _FP8, "weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul")
    _require(
        A.dtype in _HALF,
        f"INTERNAL ASSERT FAILED: Unsupported data type for fp8 matmul: "
        f"{_name(A.dtype)}",
    )
    # oneDNN is given the scale with mask 0: one value for the whole weight.
    if B_scale is not None:
        w = w * B_scale.float().reshape(-1)[0]
    a = _rows(A).float()
    return _finish(out, a @ w, _bias(bias, a.shape[0], w.shape[1]))


# ---------------------------------------------------------------------------
# Quantized formats
# ---------------------------------------------------------------------------


# op (with its overload) -> its reference kernel
TORCH_IPEX_KERNELS = {"fp8_gemm_w8a16.xpu": ipex_fp8_gemm_w8a16}


def unpack_fp4(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """fp32 values of float4_e2m1fn_x2 data, unpacked along ``dim`` (the low
    nibble holds the even element)."""
    codes = packed.view(torch.uint8).long()
    low, high = codes & 0xF, codes >> 4
    values = torch.stack([_E2M1[low], _E2M1[high]], dim=dim + 1)
    shape = list(packed.shape)
    shape[dim] *= 2
    return values.reshape(shape)


def unpack_int4(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """Unsigned 4-bit values of int32 data (eight per element, the lowest
    nibble first), unpacked along ``dim``."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    codes = packed.long().unsqueeze(dim + 1)
    view = [1] * codes.dim()
    view[dim + 1] = 8
    values = (codes >> shifts.reshape(view)) & 0xF
    shape = list(packed.shape)
    shape[dim] *= 8
    return values.reshape(shape)


def dequantize_int4(
    B: torch.Tensor, B_scale: torch.Tensor, B_zp: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The fp32 [K, N] weight of an int4 GEMM: B is int32 [K/8, N] (NT),
    B_scale [K/group, N], B_zp int32 [K/group, N/8] or a symmetric scalar."""
    q = unpack_int4(B, dim=0).float()  # [K, N]
    k, n = q.shape
    groups = k // group_size
    scale = B_scale.float().reshape(groups, n).repeat_interleave(group_size, 0)
    if B_zp.dim() == 2:
        zp = unpack_int4(B_zp, dim=1).float().reshape(groups, n)
        zp = zp.repeat_interleave(group_size, 0)
    else:
        zp = B_zp.float().reshape(-1)[0]
    return (q - zp) * scale


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


def as_backend_kernel(reference: Callable) -> Callable:
    """A reference implementation as the kernels are: a backend kernel whose
    output records no autograd history (the C++ kernels allocate it and fill
    it with oneDNN; opcheck's test_autograd_registration checks this)."""

    def kernel(*args):
        with torch.no_grad():
            return reference(*args)

    kernel.__name__ = reference.__name__
    return kernel


def define_xpu_c_kernels(release: str = NEWEST_XPU_KERNELS) -> dict:
    """Define the ``_xpu_C`` GEMMs of a vllm-xpu-kernels release that are not
    defined yet, with CPU reference implementations.

    Returns ``{"library": lib, "ops": [names defined here]}``; keep the
    library referenced for as long as the ops are used.
    """
    version = parse_version(release)
    kernels = make_xpu_c_kernels(_Release(version))
    lib = torch.library.Library("_xpu_C", "FRAGMENT")
    defined = []
    for name, schema in XPU_C_SCHEMAS.items():
        if version < XPU_C_OP_SINCE.get(name, (0, 1, 0)):
            continue
        if hasattr(torch.ops._xpu_C, name):
            continue
        lib.define(schema)
        lib.impl(name, as_backend_kernel(kernels[name]), "CPU")
        defined.append(name)
    return {"library": lib, "ops": defined}


def define_torch_ipex_kernels() -> dict:
    """Define the ``torch_ipex`` GEMMs that are not defined yet (IPEX's XPU
    builds define them), with CPU reference implementations."""
    lib = torch.library.Library("torch_ipex", "FRAGMENT")
    defined = []
    for name, schema in TORCH_IPEX_SCHEMAS.items():
        op_name, _, overload = name.partition(".")
        packet = getattr(torch.ops.torch_ipex, op_name, None)
        if packet is not None and overload in packet.overloads():
            continue
        lib.define(schema, alias_analysis="CONSERVATIVE")
        lib.impl(name, as_backend_kernel(TORCH_IPEX_KERNELS[name]), "CPU")
        defined.append(name)
    return {"library": lib, "ops": defined}


@contextlib.contextmanager
def stand_in_ops(
    definers: list[Callable[[], dict]],
    registrations: list[Callable[[], object]],
    unregister: Callable[[], object] | None = None,
) -> Iterator[None]:
    """Define the stand-in ops (``definers``), register their fakes
    (``registrations``), and on exit take the fakes back (``unregister``)
    and remove the ops: nothing is left in ``torch.ops`` afterwards."""
    libraries = [define()["library"] for define in definers]
    try:
        for register in registrations:
            register()
        yield
    finally:
        if unregister is not None:
            unregister()
        for lib in libraries:
            lib._destroy()


# ---------------------------------------------------------------------------
# opcheck cases: the inputs a fake must get right
# ---------------------------------------------------------------------------

K, N = 64, 48
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
LAYOUTS = ("2d", "3d", "3d-mbk", "row-sliced")


def activation(layout: str, dtype: torch.dtype, device: str, k: int = K):
    """An activation in one of the layouts a fake must get right: 2-D, 3-D,
    the transposed [m, b, k] view of a [b, m, k] tensor, rows with gaps."""
    if layout == "2d":
        x = torch.randn(5, k, device=device)
    elif layout == "3d":
        x = torch.randn(3, 5, k, device=device)
    elif layout == "3d-mbk":
        x = torch.randn(3, 5, k, device=device).transpose(0, 1)
    elif layout == "row-sliced":
        x = torch.randn(7, 2 * k, device=device)[:, :k]
    else:
        raise ValueError(layout)
    return _cast(x, dtype)


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy of x in dtype, with its strides (fp8 and int8 casts of a view)."""
    out = torch.empty_strided(x.shape, x.stride(), dtype=dtype, device=x.device)
    if dtype in (torch.int8, torch.uint8):
        x = x.clamp(-8, 7).round()
    out.copy_(x)
    return out


def fp8_weight(dtype: torch.dtype, layout: str, device: str) -> torch.Tensor:
    """The logical [K, N] weight: "nt" is the .t() view of a [N, K] tensor, as
    vLLM passes it; "nn" a contiguous [K, N] tensor."""
    w = torch.randn(N, K, device=device).to(dtype)
    return w.t() if layout == "nt" else w.t().contiguous()


def fp4_data(shape, device: str) -> torch.Tensor:
    codes = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    return codes.view(_FP4)


def e8m0_scales(shape, device: str) -> torch.Tensor:
    exponents = torch.randint(120, 130, shape, dtype=torch.uint8, device=device)
    return exponents.view(_E8M0)


def int4_weight(k: int, group: int, dtype: torch.dtype, device: str):
    """int4 weight as vLLM passes it: int32 [K/8, N] (NT), scales [K/g, N],
    packed zero points [K/g, N/8]."""
    packed = torch.randint(-(2**31), 2**31 - 1, (N, k // 8), dtype=torch.int32)
    scale = (torch.rand(k // group, N) + 0.5).to(dtype)
    zp = torch.randint(-(2**31), 2**31 - 1, (k // group, N // 8), dtype=torch.int32)
    return packed.to(device).t(), scale.to(device), zp.to(device)


def _rows_of(A: torch.Tensor) -> int:
    return A.numel() // A.shape[-1]


def _fp8_gemm_w8a16_args(device, layout, act_dtype, w_dtype, weight, bias):
    A = activation(layout, act_dtype, device)
    B = fp8_weight(w_dtype, weight, device)
    scale = torch.tensor([0.5], device=device)
    b = torch.randn(N, device=device, dtype=act_dtype) if bias else None
    return (A, B, scale, b)


def _fp8_gemm_args(device, layout, out_dtype, dtype, weight, scales):
    A = activation(layout, dtype, device)
    B = fp8_weight(dtype, weight, device)
    rows = _rows_of(A)
    bias = None
    if scales == "per-token":
        a_scale = torch.rand(rows, 1, device=device) + 0.5
        b_scale = torch.rand(N, device=device) + 0.5
    elif scales == "block":
        group = 16
        a_scale = torch.rand(rows, K // group, device=device) + 0.5
        b_scale = torch.rand(K // group, N // group, device=device) + 0.5
        bias = torch.empty(0, device=device)  # vLLM's "no bias" on this path
    else:
        a_scale = torch.tensor([0.25], device=device)
        b_scale = torch.tensor([2.0], device=device)
        if scales == "bias":
            bias = torch.randn(N, device=device)
    return (A, B, out_dtype, a_scale, b_scale, bias)


def _fp8_gemm_batched_args(device, layout, out_dtype):
    A = activation(layout, torch.float8_e4m3fn, device)
    w = torch.randn(A.shape[0], N, K, device=device).to(torch.float8_e4m3fn)
    return (A, w.transpose(1, 2), out_dtype, None, None, None)


def _fp8_bmm_args(device, layout, weight, out_dtype):
    A = activation(layout, torch.float8_e4m3fn, device)
    w = torch.randn(A.shape[0], N, K, device=device).to(torch.float8_e4m3fn)
    B = w.transpose(1, 2) if weight == "nt" else w.transpose(1, 2).contiguous()
    scale = torch.tensor([0.5], device=device)
    return (A, B, out_dtype, scale, scale, None)


def _fp8_gemm_out_args(device, layout, out_dtype):
    A = activation(layout, torch.float8_e4m3fn, device)
    B = fp8_weight(torch.float8_e4m3fn, "nt", device)
    out = torch.empty(*A.shape[:-1], N, device=device, dtype=torch.bfloat16)
    return (out, A, B, out_dtype, None, None, None)


def _fp4_gemm_args(device, layout, out_dtype, bias):
    k = 128  # unpacked; two values per byte
    base = fp4_data((3, 5, k // 2), device)
    A = {"2d": base[0], "3d": base, "3d-mbk": base.transpose(0, 1)}[layout]
    B = fp4_data((N, k // 2), device).t()  # logical [K/2, N], NT
    a_scale = e8m0_scales((_rows_of(A), k // 32), device)
    b_scale = e8m0_scales((N, k // 32), device)
    b = torch.randn(N, device=device, dtype=torch.bfloat16) if bias else None
    return (A, B, a_scale, b_scale, out_dtype, b)


def _int4_gemm_w4a16_args(device, layout, dtype, g_idx, zero_points, bias):
    group = 32
    A = activation(layout, dtype, device)
    B, scale, zp = int4_weight(K, group, dtype, device)
    if zero_points == "sym":
        zp = torch.tensor([8], dtype=torch.int8, device=device)
    perm = torch.randperm(K, device=device) if g_idx else None
    b = torch.randn(N, device=device, dtype=dtype) if bias else None
    return (A, B, b, scale, zp, group, perm)


def _int4_gemm_w4a8_args(device, layout, quant, g_idx):
    group = 32
    A = activation(layout, torch.int8, device)
    rows = _rows_of(A)
    if quant == "per-token":
        a_scale = torch.rand(rows, 1, device=device) + 0.5
        a_zp = torch.zeros(rows, 1, dtype=torch.int32, device=device)
    else:
        a_scale = torch.tensor([0.5], device=device)
        a_zp = torch.tensor([0], dtype=torch.int32, device=device)
    B, scale, zp = int4_weight(K, group, torch.float16, device)
    perm = torch.randperm(K, device=device) if g_idx else None
    return (A, a_scale, a_zp, B, scale, zp, group, perm, None)


def _ipex_fp8_gemm_w8a16_args(device, layout, act_dtype, w_dtype, trans_b, bias):
    A = activation(layout, act_dtype, device)
    w = torch.randn(N, K, device=device).to(w_dtype)  # [N, K], as vLLM passes it
    B = w if trans_b else w.t().contiguous()
    scale = torch.tensor([0.5], device=device)
    b = torch.randn(N, device=device, dtype=act_dtype) if bias else None
    return (A, B, trans_b, scale, b)


HALF = (torch.float16, torch.bfloat16)
OUT_DTYPES = (None, torch.float16, torch.bfloat16)

# (namespace, op, overload) -> (argument builder, {dimension: values})
CASE_SPACE: dict[tuple[str, str, str], tuple[Callable, dict[str, tuple]]] = {
    ("_xpu_C", "fp8_gemm_w8a16", "default"): (
        _fp8_gemm_w8a16_args,
        {
            "layout": LAYOUTS,
            "act_dtype": HALF,
            "w_dtype": FP8_DTYPES,
            "weight": ("nt", "nn"),
            "bias": (True, False),
        },
    ),
    ("_xpu_C", "fp8_gemm", "default"): (
        _fp8_gemm_args,
        {
            "layout": LAYOUTS,
            "out_dtype": OUT_DTYPES,
            "dtype": FP8_DTYPES,
            "weight": ("nt", "nn"),
            "scales": ("per-tensor", "per-token", "block", "bias"),
        },
    ),
    ("_xpu_C", "fp8_gemm", "batched"): (
        _fp8_gemm_batched_args,
        {"layout": ("3d", "3d-mbk"), "out_dtype": OUT_DTYPES},
    ),
    ("_xpu_C", "fp8_bmm", "default"): (
        _fp8_bmm_args,
        {"layout": ("3d", "3d-mbk"), "weight": ("nt", "nn"), "out_dtype": OUT_DTYPES},
    ),
    ("_xpu_C", "fp8_gemm_out", "default"): (
        _fp8_gemm_out_args,
        {"layout": ("2d", "3d", "3d-mbk"), "out_dtype": (None, torch.bfloat16)},
    ),
    ("_xpu_C", "fp4_gemm", "default"): (
        _fp4_gemm_args,
        {
            "layout": ("2d", "3d", "3d-mbk"),
            "out_dtype": OUT_DTYPES,
            "bias": (True, False),
        },
    ),
    ("_xpu_C", "int4_gemm_w4a16", "default"): (
        _int4_gemm_w4a16_args,
        {
            "layout": LAYOUTS,
            "dtype": HALF,
            "g_idx": (True, False),
            "zero_points": ("asym", "sym"),
            "bias": (False, True),
        },
    ),
    ("_xpu_C", "int4_gemm_w4a8", "default"): (
        _int4_gemm_w4a8_args,
        {
            "layout": LAYOUTS,
            "quant": ("per-token", "per-tensor"),
            "g_idx": (False, True),
        },
    ),
    ("torch_ipex", "fp8_gemm_w8a16", "xpu"): (
        _ipex_fp8_gemm_w8a16_args,
        {
            "layout": LAYOUTS,
            "act_dtype": HALF,
            "w_dtype": FP8_DTYPES,
            "trans_b": (True, False),
            "bias": (True, False),
        },
    ),
}


# opcheck sub-tests: the two that compare a fake with its kernel, and the two
# that check the kernel's registration (test_schema: mutations and aliases
# against the schema; test_autograd_registration: no autograd-recording ops
# below the autograd key). These two run the kernel alone.
FAKE_CHECKS = ("test_faketensor", "test_aot_dispatch_dynamic")
KERNEL_CHECKS = ("test_schema", "test_autograd_registration")

# Where test_schema cannot run, and why. (It compares every input before and
# after the call with torch.allclose; fp8 needs vLLM opcheck's fp8 allclose.)
SCHEMA_CHECK_SKIPPED = {
    "fp4_gemm": "SchemaCheckMode clones the inputs, and torch has no CPU "
    "copy_ for float4_e2m1fn_x2",
    "fp8_gemm_out": "the kernel returns `out`, which its schema does not "
    "declare an alias of the output: it fails by the kernel's schema, "
    "whatever the fake (docs/fp8-gemm-out-aliasing.md)",
}


def fp8_allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    """torch.allclose that also compares fp8 tensors on the CPU (as vLLM's
    tests/kernels/utils.py opcheck patches it in)."""
    return bool(
        torch._refs.allclose(
            a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=equal_nan
        )
    )


def with_grad(args: tuple) -> tuple:
    """Copy args, every fp16 / bf16 / fp32 tensor a leaf that requires grad,
    same strides (test_autograd_registration is a no-op without one)."""
    return tuple(
        a.detach().requires_grad_()
        if isinstance(a, torch.Tensor) and a.dtype in (torch.float32, *_HALF)
        else a
        for a in args
    )


@dataclass(frozen=True)
class OpcheckCase:
    namespace: str
    name: str
    overload: str  # "batched" is fp8_gemm.default with 3-D weights
    params: dict = field(hash=False)

    @property
    def id(self) -> str:
        values = []
        for key, value in self.params.items():
            if isinstance(value, bool):
                value = key if value else f"no-{key}"
            elif isinstance(value, torch.dtype):
                value = str(value).removeprefix("torch.")
            elif value is None:
                value = f"{key}-None"
            values.append(str(value))
        op = self.name if self.overload != "batched" else f"{self.name}-batched"
        return "-".join([op, *values])

    def op(self) -> torch._ops.OpOverload:
        packet = getattr(getattr(torch.ops, self.namespace), self.name)
        return getattr(
            packet, "default" if self.overload == "batched" else self.overload
        )

    def available(self) -> bool:
        packet = getattr(getattr(torch.ops, self.namespace), self.name, None)
        if packet is None:
            return False
        if self.overload == "batched":  # 3-D weights came with fp8_bmm
            return hasattr(torch.ops._xpu_C, "fp8_bmm")
        return self.overload in packet.overloads()

    def args(self, device: str) -> tuple:
        builder, _ = CASE_SPACE[(self.namespace, self.name, self.overload)]
        return builder(device, **self.params)

    def kernel_checks(self) -> tuple[str, ...]:
        """The KERNEL_CHECKS this case's kernel can run (SCHEMA_CHECK_SKIPPED
        says why not)."""
        if self.name in SCHEMA_CHECK_SKIPPED:
            return ("test_autograd_registration",)
        return KERNEL_CHECKS


def _grid(dims: dict[str, tuple], full: bool) -> list[dict]:
    names = list(dims)
    if full:
        return [dict(zip(names, c)) for c in itertools.product(*dims.values())]
    # Every layout with every value of every other dimension, rotating the
    # other dimensions against each other from one layout to the next.
    first, others = names[0], names[1:]
    width = max((len(dims[n]) for n in others), default=1)
    cases = []
    for i, value in enumerate(dims[first]):
        for j in range(width):
            case = {first: value}
            for k, name in enumerate(others, 1):
                values = dims[name]
                case[name] = values[(j + i * k) % len(values)]
            if case not in cases:
                cases.append(case)
    return cases


def opcheck_cases(full: bool = True) -> list[OpcheckCase]:
    """The opcheck cases of every op: the full product of each op's
    dimensions, or (full=False) a covering subset in which every layout meets
    every value of every other dimension."""
    return [
        OpcheckCase(ns, name, overload, params)
        for (ns, name, overload), (_, dims) in CASE_SPACE.items()
        for params in _grid(dims, full)
    ]


# ---------------------------------------------------------------------------
# IPEX weight-only-quantized (WOQ) int4 linear, behind vLLM's IPEX AWQ, GPTQ
# and wNa16 methods (intel/intel-extension-for-pytorch
# intel_extension_for_pytorch/nn/utils/_quantize_convert.py,
# csrc/gpu/aten/operators/XEGEMM_INT4.cpp, XeInt4Dequantize.cpp, XeGemm.cpp)
# ---------------------------------------------------------------------------

# IPEX registers these with IPEX_OP_REGISTER, without a dispatch key: the
# kernel becomes a CompositeImplicitAutograd kernel (so no fake can be
# registered), the schema is inferred and the overload is "xpu".
TORCH_IPEX_WOQ_SCHEMAS = {
    "mm_int4.xpu": "mm_int4.xpu(Tensor _0, Tensor _1, Tensor _2, Tensor _3, "
    "int _4, Tensor? _5) -> Tensor _0",
    "mm_bias_int4.xpu": "mm_bias_int4.xpu(Tensor _0, Tensor _1, Tensor _2, "
    "Tensor _3, Tensor _4, int _5, Tensor? _6) -> Tensor _0",
    "mm_w4a8.xpu": "mm_w4a8.xpu(Tensor _0, Tensor _1, Tensor _2, Tensor _3, "
    "int _4, int _5, Tensor? _6) -> Tensor _0",
    "mm_bias_w4a8.xpu": "mm_bias_w4a8.xpu(Tensor _0, Tensor _1, Tensor _2, "
    "Tensor _3, Tensor _4, int _5, int _6, Tensor? _7) -> Tensor _0",
    "mm_low_bits.xpu": "mm_low_bits.xpu(Tensor _0, Tensor _1, Tensor _2, "
    "Tensor _3, Tensor _4, bool _5, str _6, str _7, int _8, Tensor? _9) -> Tensor _0",
    "int4x8_dequantize.xpu": "int4x8_dequantize.xpu(Tensor _0, Tensor _1, "
    "Tensor _2, int _3) -> Tensor _0",
    "mm_common.xpu": "mm_common.xpu(Tensor _0, Tensor _1) -> Tensor _0",
}

# The torch_ipex WOQ ops the reference kernels ran, in order (a probe for
# which ops a forward pass reaches).
WOQ_CALLS: list[str] = []

# AutoAWQ packs the 8 columns of a word in this order.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _touch(*tensors) -> None:
    """What IPEX's C++ does first: read the tensors' memory. Under fake
    tensors (torch.compile) this fails, as the real kernels do."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.untyped_storage().data_ptr()


def _unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """[rows, cols/8] AWQ-packed int32 -> [rows, cols] values."""
    nibbles = unpack_int4(packed, dim=1)  # storage order
    rows, cols = nibbles.shape
    order = torch.tensor(AWQ_ORDER).repeat(cols // 8) + torch.arange(
        0, cols, 8
    ).repeat_interleave(8)
    values = torch.empty_like(nibbles)
    values[:, order] = nibbles
    return values


def pack_int4_rows(values: torch.Tensor) -> torch.Tensor:
    """[K, N] 4-bit values -> [K/8, N] int32, packed along K (GPTQ)."""
    k, n = values.shape
    groups = values.long().reshape(k // 8, 8, n)
    word = torch.zeros(k // 8, n, dtype=torch.int64)
    for i in range(8):
        word |= groups[:, i, :] << (4 * i)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _woq_weight(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    qzeros: torch.Tensor | None,
    group_size: int,
) -> torch.Tensor:
    """The fp32 [K, N] weight from either layout of the prepared module:
    oneDNN (qweight [K/8, N], scales [K/G, N]) or XeTLA (qweight [N, K/8],
    scales [N, K/G]); zero points int32 [K/G, N/8] (GPTQ order) or symmetric
    (None, or a 1-element tensor: 8)."""
    if scales.shape[0] * group_size == qweight.shape[0] * 8:  # oneDNN [K/8, N]
        q = unpack_int4(qweight.contiguous(), dim=0).float()
        s = scales.float()
    else:  # XeTLA [N, K/8]
        q = unpack_int4(qweight.contiguous(), dim=1).float().t()
        s = scales.float().t()
    if qzeros is None or qzeros.numel() == 1:
        z = torch.tensor(8.0 if qzeros is None else float(qzeros.reshape(-1)[0]))
    else:
        z = unpack_int4(qzeros.contiguous(), dim=1).float()
        z = z.repeat_interleave(group_size, 0)
    return (q - z) * s.repeat_interleave(group_size, 0)


def _woq_gemm(x, qweight, bias, scales, qzeros, group_size, g_idx, w4a8=False):
    a = x.index_select(-1, g_idx) if g_idx is not None else x
    a2 = a.reshape(-1, a.shape[-1]).float()
    if w4a8:  # activation quantized per token to int8 (act_quant_mode 2)
        step = a2.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
        a2 = torch.round(a2 / step).clamp(-128, 127) * step
    out = a2 @ _woq_weight(qweight, scales, qzeros, group_size)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])


def _woq_kernels() -> dict:
    def mm_int4(x, w, s, z, group_size, g_idx):
        _touch(x, w, s, z)
        WOQ_CALLS.append("mm_int4")
        return _woq_gemm(x, w, None, s, z, group_size, g_idx)

    def mm_bias_int4(x, w, bias, s, z, group_size, g_idx):
        _touch(x, w, bias, s, z)
        WOQ_CALLS.append("mm_bias_int4")
        return _woq_gemm(x, w, bias, s, z, group_size, g_idx)

    def mm_w4a8(x, w, s, z, act_quant_mode, group_size, g_idx):
        _touch(x, w, s, z)
        WOQ_CALLS.append("mm_w4a8")
        return _woq_gemm(x, w, None, s, z, group_size, g_idx, w4a8=True)

    def mm_bias_w4a8(x, w, bias, s, z, act_quant_mode, group_size, g_idx):
        _touch(x, w, bias, s, z)
        WOQ_CALLS.append("mm_bias_w4a8")
        return _woq_gemm(x, w, bias, s, z, group_size, g_idx, w4a8=True)

    def mm_low_bits(x, w, s, z, bias, has_bias, compute, weight, group_size, g_idx):
        _touch(x, w, s)
        WOQ_CALLS.append("mm_low_bits")
        return _woq_gemm(x, w, bias if has_bias else None, s, z, group_size, g_idx)

    def int4x8_dequantize(w, s, z, group_size):
        _touch(w, s)
        WOQ_CALLS.append("int4x8_dequantize")
        _require(
            s.dtype == torch.float16,
            "int4 dequantize: scale dtype should be half type.",
        )
        return _woq_weight(w, s, z, group_size).to(s.dtype)  # new contiguous [K, N]

    def mm_common(a, b):
        _touch(a, b)
        WOQ_CALLS.append("mm_common")
        out = a.reshape(-1, a.shape[-1]).float() @ b.float()
        return out.to(a.dtype).reshape(*a.shape[:-1], b.shape[1])

    return {
        "mm_int4.xpu": mm_int4,
        "mm_bias_int4.xpu": mm_bias_int4,
        "mm_w4a8.xpu": mm_w4a8,
        "mm_bias_w4a8.xpu": mm_bias_w4a8,
        "mm_low_bits.xpu": mm_low_bits,
        "int4x8_dequantize.xpu": int4x8_dequantize,
        "mm_common.xpu": mm_common,
    }


def define_torch_ipex_woq_kernels() -> dict:
    """Define the IPEX WOQ ops that are not defined yet, as IPEX does: a
    CompositeImplicitAutograd kernel (here the reference one), CONSERVATIVE
    alias analysis. Keep the returned library referenced."""
    lib = torch.library.Library("torch_ipex", "FRAGMENT")
    kernels = _woq_kernels()
    defined = []
    for name, schema in TORCH_IPEX_WOQ_SCHEMAS.items():
        op_name, _, overload = name.partition(".")
        packet = getattr(torch.ops.torch_ipex, op_name, None)
        if packet is not None and overload in packet.overloads():
            continue
        lib.define(schema, alias_analysis="CONSERVATIVE")
        lib.impl(name, kernels[name], "CompositeImplicitAutograd")
        defined.append(name)
    return {"library": lib, "ops": defined}


class ReferenceWOQLinear(torch.nn.Module):
    """CPU stand-in of IPEX's XPU ``WeightOnlyQuantizedLinear`` as
    ``IPEXWeightOnlyQuantizedLinear.from_weight`` prepares it for vLLM, and
    of its forward, which dispatches to the torch_ipex WOQ ops:

    * oneDNN layout (the default on devices with XMX and 2-D block loads):
      ``mm_int4`` / ``mm_bias_int4``, or with ``USE_W4A8_COMPUTE``
      ``mm_w4a8`` / ``mm_bias_w4a8``;
    * XeTLA layout (other devices, or ``IPEX_COMPUTE_ENG=XETLA``): one row,
      ``mm_low_bits``; more, ``int4x8_dequantize`` then ``mm_common``.
    """

    def __init__(self, qweight, scales, qzeros, bias, group_size, g_idx, engine, w4a8):
        super().__init__()
        self.qweight, self.scales, self.qzeros = qweight, scales, qzeros
        self.bias, self.blocksize, self.g_idx = bias, group_size, g_idx
        self.engine, self.w4a8 = engine, w4a8

    @classmethod
    def from_weight(
        cls,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        qzeros: torch.Tensor | None,
        in_features: int,
        out_features: int,
        qconfig=None,
        bias: torch.Tensor | None = None,
        group_size: int = -1,
        g_idx: torch.Tensor | None = None,
        quant_method: int = 0,
        engine: str | None = None,
        w4a8: bool | None = None,
        **kwargs,
    ) -> "ReferenceWOQLinear":
        """quant_method 0: GPTQ (qweight int32 [K/8, N] packed along K,
        symmetric, zero point 8); 1: AWQ (qweight int32 [K, N/8] packed along
        N in AutoAWQ's order, qzeros [K/G, N/8]). in_features is not used
        (vLLM's GPTQ passes K/8 there)."""
        import os

        engine = engine or (
            "xetla"
            if os.environ.get("IPEX_COMPUTE_ENG", "").upper() == "XETLA"
            else "onednn"
        )
        if w4a8 is None:
            w4a8 = os.environ.get("USE_W4A8_COMPUTE", "").upper() in (
                "1",
                "Y",
                "ON",
                "YES",
                "TRUE",
            )
        if quant_method == 1:  # AWQ -> the GPTQ packing
            values = _unpack_awq(qweight)  # [K, N]
            zeros = _unpack_awq(qzeros)  # [K/G, N]
            zeros = pack_int4_rows(zeros.t().contiguous()).t().contiguous()
        else:
            values = unpack_int4(qweight, dim=0)  # [K, N]
            zeros = None
        k = values.shape[0]
        group = group_size if group_size > 0 else k
        runtime_g_idx = None
        if g_idx is not None:  # act-order: sort rows by group, permute inputs
            perm = torch.argsort(g_idx.long(), stable=True)
            values = values[perm]
            runtime_g_idx = perm.to(torch.int32)
        packed = pack_int4_rows(values)  # [K/8, N]
        if engine == "onednn":
            weight = packed.t().contiguous().t()  # [K/8, N], strides (1, K/8)
            zp = zeros if zeros is not None else torch.tensor([8], dtype=torch.int8)
            return cls(
                weight,
                scales.contiguous(),
                zp,
                bias,
                group,
                runtime_g_idx,
                engine,
                w4a8,
            )
        return cls(
            packed.t().contiguous(),  # [N, K/8]
            scales.t().contiguous().half(),  # [N, K/G]
            zeros,
            None if bias is None else bias.half(),
            group,
            runtime_g_idx,
            engine,
            False,
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.torch_ipex
        if self.engine == "onednn":
            if self.bias is not None:
                if self.w4a8:
                    return ops.mm_bias_w4a8(
                        input,
                        self.qweight,
                        self.bias,
                        self.scales,
                        self.qzeros,
                        2,
                        self.blocksize,
                        self.g_idx,
                    )
                return ops.mm_bias_int4(
                    input,
                    self.qweight,
                    self.bias,
                    self.scales,
                    self.qzeros,
                    self.blocksize,
                    self.g_idx,
                )
            if self.w4a8:
                return ops.mm_w4a8(
                    input,
                    self.qweight,
                    self.scales,
                    self.qzeros,
                    2,
                    self.blocksize,
                    self.g_idx,
                )
            return ops.mm_int4(
                input,
                self.qweight,
                self.scales,
                self.qzeros,
                self.blocksize,
                self.g_idx,
            )
        m = input.shape[0] if input.dim() == 2 else input.shape[1]
        if m > 1:
            if self.g_idx is not None:
                input = input[..., self.g_idx]
            weight = ops.int4x8_dequantize(
                self.qweight, self.scales, self.qzeros, self.blocksize
            )
            out = ops.mm_common(input, weight)
            if self.bias is not None:
                out += self.bias
            return out
        return ops.mm_low_bits(
            input,
            self.qweight,
            self.scales,
            self.qzeros,
            self.bias,
            self.bias is not None,
            "fp32",
            "int4_fullrange",
            self.blocksize,
            self.g_idx,
        )
