# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fake (meta) implementations of the Intel XPU quantized GEMM kernels.

torch.compile traces vLLM's quantized linear layers with fake tensors, so every
custom op called there needs a fake kernel. A fake must return exactly what the
real kernel returns -- shape, strides, dtype and device -- or Inductor plans the
rest of the graph around a tensor that does not exist (a run-time assert at
best, a wrong shape or a buffer overrun at worst).

The rules below are read from the kernels' C++ sources:

* vllm-xpu-kernels (``_xpu_C``), ``csrc/xpu/onednn/onednn_matmul.cpp``:
  every GEMM allocates its output with ``check_and_create_output_tensor``:
  shape ``A.shape[:-1] + (N,)`` with ``N = B.size(-1)`` (leading dimensions are
  never flattened), strides ``A.stride(i) / K * N`` for all but the last
  dimension, dtype ``out_dtype`` or float16 when it is None, device of A.
* intel-extension-for-pytorch (``torch_ipex``),
  ``csrc/gpu/aten/operators/fp8/FP8Linear.cpp``: the same layout, with
  ``N = B.size(0)`` when ``trans_B`` (weight given as ``[N, K]``) and the
  activation's dtype.

Each fake mirrors the kernel's input checks (same messages) so that bad input
fails at trace time, and it works with symbolic sizes.

Each fake names its op's schema in its decorator, as PyTorch's and vLLM's
fakes name their op; a downstream build of the kernels that extends an op's
schema has a fake of its own (``@_variant_of``, the kernel's source cited).
Registration is schema-checked: a fake is registered only if the live op has
exactly the schema it was written for. On a mismatch a warning is logged and
the op is left alone: the fake a vLLM tree registered for it, if any, stays
(a wrong fake is worse than none, and a tree's fake for a schema we do not
know is the tree's to keep). Ops that do not exist are skipped. Nothing here
raises at import or registration time, and registering twice is a no-op.

This module imports only torch, packaging and the standard library.
"""

import importlib.metadata
import inspect
import logging
import math
from collections.abc import Callable
from functools import cache
from typing import NamedTuple

import torch
from packaging.version import Version

logger = logging.getLogger(__name__)

_FP8_DTYPES = (torch.float8_e5m2, torch.float8_e4m3fn)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
_BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Absent from older torch releases.
_FP4_DTYPE = getattr(torch, "float4_e2m1fn_x2", None)
_E8M0_DTYPE = getattr(torch, "float8_e8m0fnu", None)


class FakeSpec(NamedTuple):
    schema: str  # the schema the fake was written for, as torch prints it
    fake: Callable[..., torch.Tensor]


# op overload -> its fake: each fake below is entered by its decorator, and
# register_xpu_gemm_fakes() registers them.
XPU_GEMM_FAKES: dict[str, FakeSpec] = {}
# The same for the torch_ipex ops, registered by register_ipex_gemm_fakes().
IPEX_GEMM_FAKES: dict[str, FakeSpec] = {}
# op overload -> {schema: fake} of the other schemas of the op that a fake
# here is exact for: a downstream build of the kernels that extends the op
# (a trailing argument with a default), entered by @_variant_of.
SCHEMA_VARIANTS: dict[str, dict[str, Callable[..., torch.Tensor]]] = {}

_Fake = Callable[..., torch.Tensor]


def _fake_of(table: dict[str, FakeSpec], schema: str) -> Callable[[_Fake], _Fake]:
    """Enter the decorated function in ``table`` as the fake of the op that
    ``schema`` (as torch prints it) declares."""

    def enter(fake: _Fake) -> _Fake:
        table[schema.partition("(")[0]] = FakeSpec(schema, fake)
        return fake

    return enter


def _variant_of(schema: str) -> Callable[[_Fake], _Fake]:
    """Enter the decorated function as the fake of the op in a downstream
    build of its kernels, whose schema (as torch prints it) is ``schema``."""

    def enter(fake: _Fake) -> _Fake:
        SCHEMA_VARIANTS.setdefault(schema.partition("(")[0], {})[schema] = fake
        return fake

    return enter


def fake_for(qualname: str, schema: str, fake: _Fake, live: str) -> _Fake | None:
    """The fake exact for an op whose live schema is ``live``: ``fake``
    (written for ``schema``), a downstream build's, or None."""
    if live == schema:
        return fake
    return SCHEMA_VARIANTS.get(qualname, {}).get(live)


def exact_for(qualname: str, schema: str, live: str) -> bool:
    """Whether a fake of ours is exact for the op's live schema ``live``."""
    return live == schema or live in SCHEMA_VARIANTS.get(qualname, {})


def _c10(dtype: torch.dtype) -> str:
    """How c10 prints a ScalarType ("Half"); the kernels' messages embed it."""
    name = torch.empty(0, dtype=dtype, device="cpu").type()  # "torch.HalfTensor"
    return name.removeprefix("torch.").removesuffix("Tensor")


# ---------------------------------------------------------------------------
# vllm-xpu-kernels release in use
# ---------------------------------------------------------------------------

# Checks that exist only from a given vllm-xpu-kernels release on, and the
# behaviour assumed when the release cannot be determined (the lenient one: a
# fake that rejects what the kernel accepts would break compilation).
_KERNEL_FEATURES: dict[str, tuple[tuple[int, ...], bool]] = {
    # dda91d1 (v0.1.11): B may be a 3-D batch of weights.
    "batched_weights": ((0, 1, 11), True),
    # 22bbc16 (v0.1.13): scales and bias must be contiguous.
    "contiguity_checks": ((0, 1, 13), False),
}


@cache
def _xpu_kernels_version() -> tuple[int, ...] | None:
    """The release number of the vllm-xpu-kernels installed, as PEP 440
    reads it ("v0.1.13rc1+xpu" -> (0, 1, 13)); None when it is not installed
    or its version is not PEP 440."""
    try:
        return Version(importlib.metadata.version("vllm_xpu_kernels")).release
    except Exception:
        return None


def _kernel_has(feature: str) -> bool:
    since, unknown = _KERNEL_FEATURES[feature]
    version = _xpu_kernels_version()
    return unknown if version is None else version >= since


# ---------------------------------------------------------------------------
# The oneDNN GEMMs' output and checks (check_and_create_output_tensor)
# ---------------------------------------------------------------------------


def _onednn_output(
    A: torch.Tensor, B: torch.Tensor, dtype: torch.dtype | None
) -> torch.Tensor:
    """The output of vllm-xpu-kernels' oneDNN GEMMs, after their checks:
    ``A.shape[:-1] + (B.size(-1),)``, A's strides rescaled from K to N
    columns (``A.stride(i) / K * N``), ``dtype`` (float16 if None)."""
    torch._check(
        A.dim() in (2, 3), lambda: "OneDNN Matmul only support 2D and 3D inputs!"
    )
    if not _kernel_has("batched_weights"):
        torch._check(B.dim() == 2, lambda: "OneDNN Matmul only support 2D weights!")
    torch._check(
        B.dim() in (2, 3), lambda: "OneDNN Matmul only support 2D and 3D weights!"
    )
    if B.dim() == 3:
        torch._check(
            A.dim() == 3,
            lambda: "OneDNN Matmul expects 3D input when using batched weights!",
        )
        torch._check(
            A.size(0) == B.size(0),
            lambda: (
                "OneDNN Matmul expects input and weight batches to match, "
                f"got {A.size(0)} and {B.size(0)}."
            ),
        )
    if B.dtype == torch.int32:
        torch._check(B.stride(-2) == 1, lambda: "Int4 weight must be in NT format!")
    return _strided_output(A, B.size(-1), torch.float16 if dtype is None else dtype)


def _check_out(
    out: torch.Tensor, A: torch.Tensor, B: torch.Tensor, out_dtype: torch.dtype | None
) -> None:
    expected = (*A.shape[:-1], B.size(-1))
    torch._check(
        out.device == A.device,
        lambda: f"OneDNN Matmul expects out on device {A.device}, got {out.device}.",
    )
    torch._check(
        tuple(out.shape) == expected,
        lambda: (
            f"OneDNN Matmul expects out of shape {list(expected)}, "
            f"got {list(out.shape)}."
        ),
    )
    torch._check(
        out_dtype is None or out.dtype == out_dtype,
        lambda: (
            f"OneDNN Matmul expects out of dtype {_c10(out_dtype or out.dtype)}, "
            f"got {_c10(out.dtype)}."
        ),
    )


def _strided_output(A: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``A.shape[:-1] + (n,)``, A's strides rescaled from K to n columns."""
    k = A.size(-1)
    # The kernels divide by K without checking it.
    torch._check(k != 0, lambda: "XPU GEMM: the input's last dimension (K) is 0")
    shape = (*A.shape[:-1], n)
    strides = (*(s // k * n for s in A.stride()[:-1]), A.stride(-1))
    return A.new_empty_strided(shape, strides, dtype=dtype)


def _check_bias(bias: torch.Tensor | None, A: torch.Tensor, n: int) -> None:
    """``get_bias_type`` of the oneDNN glue: a scalar, ``[n]``, ``[m, 1]``,
    ``m * n`` elements or an empty tensor (no bias); f32, bf16 or f16."""
    if bias is None:
        return
    numel = bias.numel()
    last = bias.size(-1) if bias.dim() > 0 else 1
    m = math.prod(A.shape[:-1])
    # Shapes that do not depend on the token count first, so a symbolic m is
    # only compared with when it has to be.
    supported = (
        numel == 1
        or numel == 0
        or (last == n and numel == n)
        or (last == 1 and numel == m)
        or numel == m * n
    )
    torch._check(
        supported, lambda: f"unsupported bias dim in matmul ...{list(bias.shape)}"
    )
    torch._check(
        bias.dtype in _BIAS_DTYPES,
        lambda: f"Unsupported data type for bias in int4 matmul: {_c10(bias.dtype)}",
    )


def _check_contiguous(kind: str, **tensors: torch.Tensor | None) -> None:
    if _kernel_has("contiguity_checks"):
        for what, t in tensors.items():
            torch._check(
                t is None or t.is_contiguous(),
                lambda what=what: f"{what} must be contiguous for {kind} matmul",
            )


def _check_fp8(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> None:
    torch._check(
        A.dtype in _FP8_DTYPES and B.dtype == A.dtype,
        lambda: "input and weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul",
    )
    _check_half_output(out, "fp8")


def _check_half_output(out: torch.Tensor, kind: str) -> None:
    torch._check(
        out.dtype in _HALF_DTYPES,
        lambda: f"output must be float16 or bfloat16 for {kind} matmul",
    )


def _check_half_activation(A: torch.Tensor, message: str) -> None:
    torch._check(A.dtype in _HALF_DTYPES, lambda: f"{message}: {_c10(A.dtype)}")


# ---------------------------------------------------------------------------
# _xpu_C (vllm-xpu-kernels)
# ---------------------------------------------------------------------------


@_fake_of(
    XPU_GEMM_FAKES,
    "_xpu_C::fp8_gemm(Tensor A, Tensor B, ScalarType? out_dtype, "
    "Tensor? A_scale_, Tensor? B_scale_, Tensor? bias_) -> Tensor",
)
def fp8_gemm_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    out_dtype: torch.dtype | None,
    A_scale: torch.Tensor | None,
    B_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    _check_contiguous("fp8", A_scale=A_scale, B_scale=B_scale, bias=bias)
    out = _onednn_output(A, B, out_dtype)
    _check_fp8(A, B, out)
    if A_scale is not None and B_scale is not None and A_scale.dim() == 2:
        torch._check(
            A_scale.size(1) <= 1 or A_scale.size(1) == B_scale.size(0),
            lambda: (
                "Mismatch group size in input and weight."
                f"{A_scale.size(1)} vs {B_scale.size(0)}"
            ),
        )
    _check_bias(bias, A, out.size(-1))
    return out


@_fake_of(
    XPU_GEMM_FAKES,
    "_xpu_C::fp8_gemm_out(Tensor(a!) out, Tensor A, Tensor B, "
    "ScalarType? out_dtype, Tensor? A_scale_, Tensor? B_scale_, "
    "Tensor? bias_) -> Tensor",
)
def fp8_gemm_out_fake(
    out: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    out_dtype: torch.dtype | None,
    A_scale: torch.Tensor | None,
    B_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    # The kernel writes into ``out`` and returns ``out`` itself, although the
    # schema declares a plain ``Tensor`` return; so does the fake: a fake must
    # alias what the kernel aliases (opcheck's test_faketensor compares them).
    # The schema is the kernel's to fix (``-> Tensor(a!)``).
    fp8_gemm_fake(A, B, out.dtype, A_scale, B_scale, bias)  # the same checks
    _check_out(out, A, B, out_dtype)
    return out


@_fake_of(
    XPU_GEMM_FAKES,
    "_xpu_C::fp8_bmm(Tensor A, Tensor B, ScalarType? out_dtype, "
    "Tensor? A_scale_, Tensor? B_scale_, Tensor? bias_) -> Tensor",
)
def fp8_bmm_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    out_dtype: torch.dtype | None,
    A_scale: torch.Tensor | None,
    B_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    torch._check(A.dim() == 3, lambda: "fp8_bmm expects A to be a 3D tensor")
    torch._check(B.dim() == 3, lambda: "fp8_bmm expects B to be a 3D tensor")
    _check_contiguous("fp8", A_scale=A_scale, B_scale=B_scale)
    out = _onednn_output(A, B, out_dtype)
    _check_fp8(A, B, out)
    if bias is not None:
        n = out.size(-1)
        torch._check(
            bias.numel() in (0, 1) or (bias.numel() == n and bias.size(-1) == n),
            lambda: "Batched fp8 matmul only supports empty, scalar, or [N] bias.",
        )
    return out


@_fake_of(
    XPU_GEMM_FAKES,
    "_xpu_C::fp8_gemm_w8a16(Tensor A, Tensor B, Tensor? B_scale_, "
    "Tensor? bias_) -> Tensor",
)
def fp8_gemm_w8a16_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    B_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    _check_contiguous("fp8", B_scale=B_scale, bias=bias)
    out = _onednn_output(A, B, A.dtype)
    torch._check(
        B.dtype in _FP8_DTYPES,
        lambda: "weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul",
    )
    _check_half_activation(A, "Unsupported data type for fp8 matmul")
    _check_bias(bias, A, out.size(-1))
    return out


@_variant_of(
    # intel/llm-scaler's build of the kernels (image 0.21.0-b3.1, llm-scaler
    # 25095b4, vllm/patches/vllm_xpu_kernels.patch): block-scaled W8A16, a
    # 2-D grid of weight scales (csrc/xpu/torch_bindings.cpp; onednn_matmul.cpp
    # fp8_gemm_w8a16 allocates the output as without it, then checks).
    "_xpu_C::fp8_gemm_w8a16(Tensor A, Tensor B, Tensor? B_scale_, "
    "Tensor? bias_, int group_size=0) -> Tensor",
)
def fp8_gemm_w8a16_grouped_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    B_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    group_size: int = 0,
) -> torch.Tensor:
    out = fp8_gemm_w8a16_fake(A, B, B_scale, bias)
    torch._check(group_size >= 0, lambda: "group_size must be non-negative")
    if group_size > 0:
        _check_grouped_scales(A, B, B_scale, group_size)
    return out


def _check_grouped_scales(
    A: torch.Tensor, B: torch.Tensor, B_scale: torch.Tensor | None, group_size: int
) -> None:
    """The checks of a block-scaled fp8_gemm_w8a16 (``group_size > 0``, the
    llm-scaler build): float16 activations, a 2-D weight whose dimensions
    ``group_size`` divides, contiguous ``[K / g, N / g]`` scales of float32,
    bfloat16 or float16 on the weight's device."""
    torch._check(
        A.dtype == torch.float16,
        lambda: "grouped FP8 weight scales currently require float16 activations",
    )
    if B_scale is None:
        raise RuntimeError("grouped FP8 weight scales must be provided")
    torch._check(
        B.dim() == 2 and B.size(0) % group_size == 0 and B.size(1) % group_size == 0,
        lambda: "grouped FP8 weight dimensions must be divisible by group_size",
    )
    torch._check(
        B_scale.dim() == 2
        and B_scale.size(0) == B.size(0) // group_size
        and B_scale.size(1) == B.size(1) // group_size,
        lambda: (
            "grouped FP8 weight scales must have shape [K / group_size, N / group_size]"
        ),
    )
    torch._check(
        B_scale.is_contiguous(),
        lambda: (
            "grouped FP8 weight scales must be contiguous in "
            "[K / group_size, N / group_size] order"
        ),
    )
    torch._check(
        B_scale.device == B.device,
        lambda: "grouped FP8 weight scales and weight must be on the same device",
    )
    torch._check(
        B_scale.dtype in (torch.float32, torch.bfloat16, torch.float16),
        lambda: "grouped FP8 weight scales must be float32, bfloat16, or float16",
    )


@_fake_of(
    XPU_GEMM_FAKES,
    "_xpu_C::fp4_gemm(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, "
    "ScalarType? out_dtype, Tensor? bias_) -> Tensor",
)
def fp4_gemm_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    out_dtype: torch.dtype | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    _check_contiguous("fp4", A_scale=A_scale, B_scale=B_scale)
    # Two e2m1 values a byte, packed along K: the weight is the logical
    # [K/2, N], and the output's strides follow the packed activation's.
    out = _onednn_output(A, B, out_dtype)
    torch._check(
        A.dtype == _FP4_DTYPE and B.dtype == _FP4_DTYPE,
        lambda: "input and weight must be f4_e2m1x2 or f4_e2m1x2 for fp4 matmul",
    )
    _check_half_output(out, "fp4")
    torch._check(
        A_scale.dtype == _E8M0_DTYPE,
        lambda: f"Unsupported scale type for fp4 matmul: {_c10(A_scale.dtype)}",
    )
    torch._check(
        B_scale.dtype == A_scale.dtype,
        lambda: (
            "Mismatched scale data types in mxfp4 matmul: "
            f"{_c10(A_scale.dtype)} vs {_c10(B_scale.dtype)}"
        ),
    )
    _check_bias(bias, A, out.size(-1))
    return out


@_fake_of(
    XPU_GEMM_FAKES,
    "_xpu_C::int4_gemm_w4a16(Tensor A, Tensor B, Tensor? bias, "
    "Tensor B_scale, Tensor B_zp, int group_size, Tensor? g_idx) -> Tensor",
)
def int4_gemm_w4a16_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    bias: torch.Tensor | None,
    B_scale: torch.Tensor,
    B_zp: torch.Tensor,
    group_size: int,
    g_idx: torch.Tensor | None,
) -> torch.Tensor:
    _check_contiguous("int4", B_scale=B_scale)
    # With g_idx (GPTQ act-order) the kernel multiplies a permuted copy of the
    # activation, which is new and contiguous.
    if g_idx is not None:
        A = A.index_select(-1, g_idx)
    out = _onednn_output(A, B, A.dtype)
    _check_half_activation(A, "Unsupported data type for int4-f16/bf16 matmul")
    _check_bias(bias, A, out.size(-1))
    return out


@_fake_of(
    XPU_GEMM_FAKES,
    "_xpu_C::int4_gemm_w4a8(Tensor A_, Tensor A_scale, Tensor A_zp, "
    "Tensor B, Tensor B_scale, Tensor B_zp, int group_size, Tensor? g_idx, "
    "Tensor? bias) -> Tensor",
)
def int4_gemm_w4a8_fake(
    A: torch.Tensor,
    A_scale: torch.Tensor,
    A_zp: torch.Tensor,
    B: torch.Tensor,
    B_scale: torch.Tensor,
    B_zp: torch.Tensor,
    group_size: int,
    g_idx: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    _check_contiguous("int4", A_scale=A_scale, B_scale=B_scale)
    if g_idx is not None:
        A = A.index_select(-1, g_idx)
    per_token = (
        A_scale.dim() == 2
        and A_scale.size(1) == 1
        and A_zp.dim() == 2
        and A_zp.size(1) == 1
    )
    torch._check(
        per_token or (A_scale.dim() == 1 and A_zp.dim() == 1),
        lambda: (
            "Int4-Int8 matmul expects quantized input A to be per-token "
            "([b*m,1]) or per-tensor ([b]) quantized!"
        ),
    )
    # The kernel always produces float16.
    out = _onednn_output(A, B, torch.float16)
    torch._check(
        A.dtype in (torch.int8, torch.uint8),
        lambda: f"Unsupported data type for int4-int8 matmul: {_c10(A.dtype)}",
    )
    _check_bias(bias, A, out.size(-1))
    return out


# ---------------------------------------------------------------------------
# torch_ipex (intel-extension-for-pytorch, XPU builds)
# ---------------------------------------------------------------------------


@_fake_of(
    IPEX_GEMM_FAKES,
    "torch_ipex::fp8_gemm_w8a16.xpu(Tensor _0, Tensor _1, bool _2, "
    "Tensor? _3, Tensor? _4) -> Tensor _0",
)
def ipex_fp8_gemm_w8a16_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    trans_B: bool,
    B_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    if A.dim() == 3:
        torch._check(B.dim() == 2, lambda: "fp8_gemm only support 2D weight")
    else:
        torch._check(A.dim() == 2, lambda: "linear only support for 2D and 3D tensors!")
    # trans_B: the weight is given as [N, K] (the nn.Linear layout).
    out = _strided_output(A, B.size(0) if trans_B else B.size(1), A.dtype)
    torch._check(
        B.dtype in _FP8_DTYPES,
        lambda: "weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul",
    )
    _check_half_activation(A, "Unsupported data type for fp8 matmul")
    _check_bias(bias, A, out.size(-1))
    return out


def ipex_woq_linear_fake(
    x: torch.Tensor, key: torch.Tensor, out_features: int
) -> torch.Tensor:
    """``vllm::ipex_woq_linear`` (vllm/_ipex_woq_linear.py): IPEX's XPU
    weight-only-quantized int4 linear of the module ``key`` names. Every
    branch of its forward (oneDNN ``mm_int4`` / ``mm_bias_int4`` /
    ``mm_w4a8``, XeTLA ``mm_low_bits`` or ``int4x8_dequantize`` +
    ``mm_common``) returns a new contiguous tensor of
    ``x.shape[:-1] + (out_features,)`` with x's dtype and device."""
    torch._check(x.dim() >= 1, lambda: "ipex_woq_linear expects at least 1-D input")
    return x.new_empty((*x.shape[:-1], out_features))


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


class _Registration(NamedTuple):
    fake: Callable[..., torch.Tensor]
    # The library the fake is registered through: torch takes back what a
    # library registered when the library is destroyed.
    library: torch.library.Library


# op overload -> the fake this module registered for it, and how
_registrations: dict[str, _Registration] = {}


def _find_overload(qualname: str) -> torch._ops.OpOverload | None:
    namespace, _, name = qualname.partition("::")
    op_name, _, overload = name.partition(".")
    packet = getattr(getattr(torch.ops, namespace), op_name, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _register(qualname: str, schema: str, fake: Callable[..., torch.Tensor]) -> bool:
    op = _find_overload(qualname)
    if op is None:
        return False
    live = str(op._schema)
    exact = fake_for(qualname, schema, fake, live)
    registration = _registrations.get(qualname)
    if registration is not None and registration.fake is exact is not None:
        return True
    if exact is None:
        logger.warning(
            "Not registering a fake for %s: its schema is %r, the fake was "
            "written for %r; the op keeps the fake it has, if any",
            qualname,
            live,
            schema,
        )
        return False
    kwargs = {}
    # Replace a fake registered earlier (an older, wrong one). Asked of the
    # function, not of torch's version: torch 2.8 added allow_override during
    # its nightlies (2.8.0.dev builds exist with and without it) and its
    # default changed (False through 2.12, True from 2.13).
    if "allow_override" in inspect.signature(torch.library.register_fake).parameters:
        kwargs["allow_override"] = True
    library = torch.library.Library(qualname.partition("::")[0], "FRAGMENT")
    torch.library.register_fake(qualname, exact, lib=library, **kwargs)
    _registrations[qualname] = _Registration(exact, library)
    return True


def _register_all(fakes: dict[str, FakeSpec]) -> list[str]:
    registered = []
    for qualname, (schema, fake) in fakes.items():
        try:
            if _register(qualname, schema, fake):
                registered.append(qualname)
        except Exception as e:  # never break vLLM's import
            logger.warning("Could not register a fake for %s: %s", qualname, e)
    return registered


def register_xpu_gemm_fakes() -> list[str]:
    """Register the fakes of the ``_xpu_C`` GEMMs that exist; return them."""
    return _register_all(XPU_GEMM_FAKES)


def register_ipex_gemm_fakes() -> list[str]:
    """Register the fakes of the ``torch_ipex`` GEMMs that exist; return them.

    Call after ``import intel_extension_for_pytorch``: the ops do not exist
    before.
    """
    return _register_all(IPEX_GEMM_FAKES)


def unregister_fakes() -> None:
    """Take back every fake this module registered (torch forgets them with
    the libraries they were registered through); registering again
    registers them anew. For tests, which define and remove the ops."""
    while _registrations:
        _, registration = _registrations.popitem()
        registration.library._destroy()
