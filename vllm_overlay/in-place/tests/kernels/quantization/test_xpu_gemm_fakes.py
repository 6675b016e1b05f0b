# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fakes of the XPU quantized GEMMs (vllm/_xpu_ops.py) must return what the
kernels return: shape, strides, dtype. opcheck compares them on the inputs vLLM
passes: 2-D, 3-D, transposed, row slices; NN, NT weights; bias, no out_dtype."""

import itertools

import pytest
import torch

from tests.kernels.utils import opcheck
from vllm.platforms import current_platform

pytestmark = pytest.mark.skipif(
    not current_platform.is_xpu(), reason="The XPU kernels need an Intel GPU."
)

DEVICE = "xpu"
K, N = 64, 48
LAYOUTS = ("2d", "3d", "transposed", "row-sliced")
FP8 = torch.float8_e4m3fn


def _activation(layout: str, dtype: torch.dtype, k: int = K) -> torch.Tensor:
    if layout == "row-sliced":
        return torch.randn(7, 2 * k, device=DEVICE).to(dtype)[:, :k]
    x = torch.randn(*(() if layout == "2d" else (3,)), 5, k, device=DEVICE).to(dtype)
    return x.transpose(0, 1) if layout == "transposed" else x


def _fp8_weight(weight: str, batch: tuple[int, ...] = ()) -> torch.Tensor:
    """The logical [K, N] weight: NT is the transpose of [N, K], as vLLM has it."""
    w = torch.randn(*batch, N, K, device=DEVICE).to(FP8).transpose(-1, -2)
    return w if weight == "nt" else w.contiguous()


def _scale(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, device=DEVICE) + 0.5


def _bias(bias: str, dtype: torch.dtype) -> torch.Tensor | None:
    return torch.randn(N, device=DEVICE, dtype=dtype) if bias == "bias" else None


def _bytes(dtype: torch.dtype, *shape: int, low: int = 0, high: int = 256):
    return torch.randint(low, high, shape, dtype=torch.uint8, device=DEVICE).view(dtype)


OUT_DTYPES = (None, torch.bfloat16)
BIAS = ("no-bias", "bias")
# op -> (its arguments, the values of each of its parameters)
GRID: dict[str, tuple] = {}


def _cases(op: str, *dims: tuple):
    """Enter the decorated function in GRID as the arguments of `op`."""

    def enter(make_args):
        GRID[op] = (make_args, dims)
        return make_args

    return enter


# xpufakes: op-fp8_gemm_w8a16 begin
@_cases("_xpu_C::fp8_gemm_w8a16", LAYOUTS, ("nt", "nn"), BIAS)
def _fp8_gemm_w8a16(layout, weight, bias):
    x = _activation(layout, torch.bfloat16)
    return x, _fp8_weight(weight), _scale(1), _bias(bias, torch.bfloat16)


# xpufakes: op-fp8_gemm_w8a16 end
# xpufakes: op-fp8_gemm begin
@_cases("_xpu_C::fp8_gemm", LAYOUTS, ("nt", "nn"), OUT_DTYPES)
def _fp8_gemm(layout, weight, out_dtype):
    x = _activation(layout, FP8)
    return x, _fp8_weight(weight), out_dtype, _scale(1), _scale(1), None


# xpufakes: op-fp8_gemm end
# xpufakes: op-fp4_gemm begin
@_cases("_xpu_C::fp4_gemm", ("2d", "3d", "transposed"), OUT_DTYPES, BIAS)
def _fp4_gemm(layout, out_dtype, bias):
    x = _bytes(torch.float4_e2m1fn_x2, 3, 5, 64)  # K = 128, two values a byte
    x = {"2d": x[0], "3d": x, "transposed": x.transpose(0, 1)}[layout]
    w = _bytes(torch.float4_e2m1fn_x2, N, 64).t()
    rows = x.numel() // 64
    e8m0 = [_bytes(torch.float8_e8m0fnu, n, 4, low=120, high=130) for n in (rows, N)]
    return x, w, *e8m0, out_dtype, _bias(bias, torch.bfloat16)


# xpufakes: op-fp4_gemm end
# xpufakes: op-int4 begin
def _int4_weight(group: int = 32):
    """int32 [K/8, N] (NT), scales [K/g, N], packed zero points [K/g, N/8]."""
    w, zp = _bytes(torch.int32, N, K // 2).t(), _bytes(torch.int32, K // group, N // 2)
    return w, _scale(K // group, N).half(), zp


# xpufakes: op-int4 end
# xpufakes: op-int4_gemm_w4a16 begin
@_cases("_xpu_C::int4_gemm_w4a16", LAYOUTS, BIAS)
def _int4_gemm_w4a16(layout, bias):
    x = _activation(layout, torch.float16)
    w, scale, zp = _int4_weight()
    return x, w, _bias(bias, torch.float16), scale, zp, 32, None


# xpufakes: op-int4_gemm_w4a16 end
# xpufakes: op-int4_gemm_w4a8 begin
@_cases("_xpu_C::int4_gemm_w4a8", LAYOUTS)
def _int4_gemm_w4a8(layout):
    x = _activation(layout, torch.int8)
    rows = x.numel() // x.size(-1)
    zero = torch.zeros(rows, 1, dtype=torch.int32, device=DEVICE)
    w, scale, zp = _int4_weight()
    return x, _scale(rows, 1), zero, w, scale, zp, 32, None, None


# xpufakes: op-int4_gemm_w4a8 end
# xpufakes: xpu-fp8-bmm begin
@_cases("vllm::xpu_fp8_bmm", ("3d", "transposed"), ("nt", "nn"))
def _xpu_fp8_bmm(layout, weight):
    x = _activation(layout, FP8)
    w = _fp8_weight(weight, batch=(x.size(0),))
    return x, w, torch.bfloat16, _scale(1), _scale(1), None


# xpufakes: xpu-fp8-bmm end
CASES = [
    pytest.param(op, args, values, id="-".join([op.split("::")[1], *map(str, values)]))
    for op, (args, dims) in GRID.items()
    for values in itertools.product(*dims)
]


@pytest.mark.parametrize("op, make_args, values", CASES)
def test_fake_matches_kernel(op, make_args, values):
    import vllm._xpu_ops  # noqa: F401 (registers the fakes)

    namespace, name = op.split("::")
    opcheck(
        getattr(getattr(torch.ops, namespace), name).default,
        make_args(*values),
        test_utils=("test_faketensor", "test_aot_dispatch_dynamic"),
    )
