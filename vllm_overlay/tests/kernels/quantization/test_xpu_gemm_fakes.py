# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tests of the fake (meta) kernels of the Intel XPU quantized GEMMs.

torch.compile traces the quantized linear layers with fake tensors, so each
GEMM's fake must return what the kernel returns. opcheck's test_faketensor
runs the kernel and its fake side by side and compares the outputs' shape,
strides, dtype and device.

On an XPU host the real kernels (vllm-xpu-kernels, or IPEX on the releases
that use it) are tested; elsewhere the ops are defined with the kernels'
schemas and CPU reference implementations (xpu_gemm_reference.py). Every
test id names which: ``[xpu-...]`` or ``[cpu-reference-...]``.

Run: pytest tests/kernels/quantization/test_xpu_gemm_fakes.py
"""

import importlib.util
import itertools
import logging

import pytest
import torch

from tests.kernels.quantization import xpu_gemm_reference as reference
from tests.kernels.utils import opcheck

ON_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()
KERNELS = "xpu" if ON_XPU else "cpu-reference"
DEVICE = "xpu" if ON_XPU else "cpu"

if ON_XPU:
    # Import the module that registers the fakes, as vLLM does at start-up.
    if importlib.util.find_spec("vllm._xpu_ops") is not None:
        import vllm._xpu_ops  # noqa: F401
    else:
        import vllm._ipex_ops  # noqa: F401
    _LIBRARIES: list = []
else:
    # The reference kernels must exist before the fakes are registered.
    _LIBRARIES = [
        reference.define_xpu_c_kernels(),
        reference.define_torch_ipex_kernels(),
    ]

from vllm import _xpu_gemm_fakes as fakes  # noqa: E402

if not ON_XPU:
    fakes.register_xpu_gemm_fakes()
    fakes.register_ipex_gemm_fakes()

TEST_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
K, N = 64, 48


def _has(namespace: str, name: str) -> bool:
    return hasattr(getattr(torch.ops, namespace), name)


def _requires(namespace: str, name: str):
    return pytest.mark.skipif(
        not _has(namespace, name),
        reason=f"{namespace}::{name} is not in this build of the kernels",
    )


def _activations(dtype: torch.dtype, k: int = K) -> dict[str, torch.Tensor]:
    """The activation layouts a fake must get right."""
    x = torch.randn(3, 5, k, device=DEVICE).to(dtype)
    wide = torch.randn(7, 2 * k, device=DEVICE).to(dtype)
    return {
        "2d": x[0],
        "3d": x,
        "3d-mbk": x.transpose(0, 1),  # [m, b, k] view of [b, m, k]
        "row-sliced": wide[:, :k],  # rows with gaps
    }


def _fp8_weight(dtype: torch.dtype, nt: bool) -> torch.Tensor:
    """The logical [K, N] weight: NT (a .t() view of [N, K], as vLLM passes
    it) or NN (contiguous [K, N])."""
    w = torch.randn(N, K, device=DEVICE).to(dtype)
    return w.t() if nt else w.t().contiguous()


def _ids(*parts) -> str:
    return "-".join(str(p) for p in (KERNELS, *parts))


# ---------------------------------------------------------------------------
# _xpu_C (vllm-xpu-kernels)
# ---------------------------------------------------------------------------


W8A16_CASES = list(
    itertools.product(
        ("2d", "3d", "3d-mbk", "row-sliced"),
        (torch.float16, torch.bfloat16),
        FP8,
        ("nt", "nn"),
        ("bias", "no-bias"),
    )
)


@_requires("_xpu_C", "fp8_gemm_w8a16")
@pytest.mark.parametrize(
    "layout,act_dtype,w_dtype,weight,bias",
    W8A16_CASES,
    ids=[_ids(*c) for c in W8A16_CASES],
)
def test_fp8_gemm_w8a16(layout, act_dtype, w_dtype, weight, bias):
    A = _activations(act_dtype)[layout]
    B = _fp8_weight(w_dtype, weight == "nt")
    scale = torch.tensor([0.5], device=DEVICE)
    b = torch.randn(N, device=DEVICE, dtype=act_dtype) if bias == "bias" else None
    opcheck(
        torch.ops._xpu_C.fp8_gemm_w8a16.default, (A, B, scale, b), test_utils=TEST_UTILS
    )


FP8_GEMM_CASES = list(
    itertools.product(
        ("2d", "3d", "3d-mbk", "row-sliced"),
        (None, torch.float16, torch.bfloat16),
        FP8,
        ("nt", "nn"),
        ("per-tensor", "per-token", "bias"),
    )
)


@_requires("_xpu_C", "fp8_gemm")
@pytest.mark.parametrize(
    "layout,out_dtype,dtype,weight,scales",
    FP8_GEMM_CASES,
    ids=[_ids(*c) for c in FP8_GEMM_CASES],
)
def test_fp8_gemm(layout, out_dtype, dtype, weight, scales):
    A = _activations(torch.float32)[layout].to(dtype)
    B = _fp8_weight(dtype, weight == "nt")
    rows = A.numel() // A.shape[-1]
    if scales == "per-token":
        a_scale = torch.rand(rows, 1, device=DEVICE) + 0.5
        b_scale = torch.rand(N, device=DEVICE) + 0.5
    else:
        a_scale = torch.tensor([0.25], device=DEVICE)
        b_scale = torch.tensor([2.0], device=DEVICE)
    bias = torch.randn(N, device=DEVICE) if scales == "bias" else None
    opcheck(
        torch.ops._xpu_C.fp8_gemm.default,
        (A, B, out_dtype, a_scale, b_scale, bias),
        test_utils=TEST_UTILS,
    )


@_requires("_xpu_C", "fp8_gemm")
@pytest.mark.parametrize("layout", ["2d", "3d-mbk"], ids=lambda x: _ids(x))
def test_fp8_gemm_block_scaled(layout):
    """The block-scaled path (vLLM passes an empty tensor as "no bias")."""
    group = 16
    A = _activations(torch.float32)[layout].to(torch.float8_e4m3fn)
    B = _fp8_weight(torch.float8_e4m3fn, nt=True)
    rows = A.numel() // A.shape[-1]
    a_scale = torch.rand(rows, K // group, device=DEVICE) + 0.5
    b_scale = torch.rand(K // group, N // group, device=DEVICE) + 0.5
    empty = torch.empty(0, device=DEVICE)
    opcheck(
        torch.ops._xpu_C.fp8_gemm.default,
        (A, B, torch.bfloat16, a_scale, b_scale, empty),
        test_utils=TEST_UTILS,
    )


@_requires("_xpu_C", "fp8_gemm")
@_requires("_xpu_C", "fp8_bmm")  # batched weights arrived with fp8_bmm
@pytest.mark.parametrize("layout", ["3d", "3d-mbk"], ids=lambda x: _ids(x))
def test_fp8_gemm_batched_weights(layout):
    A = _activations(torch.float32)[layout].to(torch.float8_e4m3fn)
    B = torch.randn(A.shape[0], N, K, device=DEVICE).to(torch.float8_e4m3fn)
    B = B.transpose(1, 2)
    opcheck(
        torch.ops._xpu_C.fp8_gemm.default,
        (A, B, None, None, None, None),
        test_utils=TEST_UTILS,
    )


@_requires("_xpu_C", "fp8_bmm")
@pytest.mark.parametrize(
    "layout,weight",
    list(itertools.product(["3d", "3d-mbk"], ["nt", "nn"])),
    ids=lambda x: x,
)
def test_fp8_bmm(layout, weight):
    A = _activations(torch.float32)[layout].to(torch.float8_e4m3fn)
    w = torch.randn(A.shape[0], N, K, device=DEVICE).to(torch.float8_e4m3fn)
    B = w.transpose(1, 2) if weight == "nt" else w.transpose(1, 2).contiguous()
    scale = torch.tensor([0.5], device=DEVICE)
    opcheck(
        torch.ops._xpu_C.fp8_bmm.default,
        (A, B, torch.bfloat16, scale, scale, None),
        test_utils=TEST_UTILS,
    )


@_requires("_xpu_C", "fp8_gemm_out")
@pytest.mark.parametrize("layout", ["2d", "3d", "3d-mbk"], ids=lambda x: _ids(x))
def test_fp8_gemm_out(layout):
    A = _activations(torch.float32)[layout].to(torch.float8_e4m3fn)
    B = _fp8_weight(torch.float8_e4m3fn, nt=True)
    out = torch.empty(*A.shape[:-1], N, device=DEVICE, dtype=torch.bfloat16)
    opcheck(
        torch.ops._xpu_C.fp8_gemm_out.default,
        (out, A, B, None, None, None, None),
        test_utils=TEST_UTILS,
    )


def _fp4(shape) -> torch.Tensor:
    codes = torch.randint(0, 256, shape, dtype=torch.uint8, device=DEVICE)
    return codes.view(torch.float4_e2m1fn_x2)


def _e8m0(shape) -> torch.Tensor:
    exponents = torch.randint(120, 130, shape, dtype=torch.uint8, device=DEVICE)
    return exponents.view(torch.float8_e8m0fnu)


FP4_CASES = list(
    itertools.product(("2d", "3d", "3d-mbk"), (None, torch.bfloat16), ("bias", "no"))
)


@_requires("_xpu_C", "fp4_gemm")
@pytest.mark.parametrize(
    "layout,out_dtype,bias", FP4_CASES, ids=[_ids(*c) for c in FP4_CASES]
)
def test_fp4_gemm(layout, out_dtype, bias):
    k = 128  # unpacked; two values per byte
    base = _fp4((3, 5, k // 2))
    A = {"2d": base[0], "3d": base, "3d-mbk": base.transpose(0, 1)}[layout]
    B = _fp4((N, k // 2)).t()  # logical [K/2, N], NT
    rows = A.numel() // A.shape[-1]
    a_scale = _e8m0((rows, k // 32))
    b_scale = _e8m0((N, k // 32))
    b = torch.randn(N, device=DEVICE, dtype=torch.bfloat16) if bias == "bias" else None
    opcheck(
        torch.ops._xpu_C.fp4_gemm.default,
        (A, B, a_scale, b_scale, out_dtype, b),
        test_utils=TEST_UTILS,
    )


def _int4_weight(k: int, group: int) -> tuple[torch.Tensor, ...]:
    packed = torch.randint(-(2**31), 2**31 - 1, (N, k // 8), dtype=torch.int32)
    scale = torch.rand(k // group, N, dtype=torch.float16) + 0.5
    zp = torch.randint(-(2**31), 2**31 - 1, (k // group, N // 8), dtype=torch.int32)
    return packed.to(DEVICE).t(), scale.to(DEVICE), zp.to(DEVICE)


INT4_CASES = list(
    itertools.product(
        ("2d", "3d", "3d-mbk", "row-sliced"),
        (torch.float16, torch.bfloat16),
        ("g_idx", "no-g_idx"),
        ("asym", "sym"),
    )
)


@_requires("_xpu_C", "int4_gemm_w4a16")
@pytest.mark.parametrize(
    "layout,dtype,g_idx,zero_points", INT4_CASES, ids=[_ids(*c) for c in INT4_CASES]
)
def test_int4_gemm_w4a16(layout, dtype, g_idx, zero_points):
    group = 32
    A = _activations(dtype)[layout]
    B, scale, zp = _int4_weight(K, group)
    scale = scale.to(dtype)
    if zero_points == "sym":
        zp = torch.tensor([8], dtype=torch.int8, device=DEVICE)
    perm = torch.randperm(K, device=DEVICE) if g_idx == "g_idx" else None
    opcheck(
        torch.ops._xpu_C.int4_gemm_w4a16.default,
        (A, B, None, scale, zp, group, perm),
        test_utils=TEST_UTILS,
    )


W4A8_CASES = list(
    itertools.product(("2d", "3d", "row-sliced"), ("per-token", "per-tensor"))
)


@_requires("_xpu_C", "int4_gemm_w4a8")
@pytest.mark.parametrize(
    "layout,quant", W4A8_CASES, ids=[_ids(*c) for c in W4A8_CASES]
)
def test_int4_gemm_w4a8(layout, quant):
    group = 32
    A = _activations(torch.float32)[layout].clamp(-8, 7).to(torch.int8)
    rows = A.numel() // A.shape[-1]
    if quant == "per-token":
        a_scale = torch.rand(rows, 1, device=DEVICE) + 0.5
        a_zp = torch.zeros(rows, 1, dtype=torch.int32, device=DEVICE)
    else:
        a_scale = torch.tensor([0.5], device=DEVICE)
        a_zp = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    B, scale, zp = _int4_weight(K, group)
    opcheck(
        torch.ops._xpu_C.int4_gemm_w4a8.default,
        (A, a_scale, a_zp, B, scale, zp, group, None, None),
        test_utils=TEST_UTILS,
    )


# ---------------------------------------------------------------------------
# torch_ipex (IPEX XPU builds)
# ---------------------------------------------------------------------------

IPEX_CASES = list(
    itertools.product(
        ("2d", "3d", "3d-mbk", "row-sliced"),
        (torch.float16, torch.bfloat16),
        FP8,
        ("trans_B", "no-trans_B"),
        ("bias", "no-bias"),
    )
)


@_requires("torch_ipex", "fp8_gemm_w8a16")
@pytest.mark.parametrize(
    "layout,act_dtype,w_dtype,trans_b,bias",
    IPEX_CASES,
    ids=[_ids(*c) for c in IPEX_CASES],
)
def test_ipex_fp8_gemm_w8a16(layout, act_dtype, w_dtype, trans_b, bias):
    A = _activations(act_dtype)[layout]
    w = torch.randn(N, K, device=DEVICE).to(w_dtype)  # [N, K], as vLLM passes it
    B = w if trans_b == "trans_B" else w.t().contiguous()
    scale = torch.tensor([0.5], device=DEVICE)
    b = torch.randn(N, device=DEVICE, dtype=act_dtype) if bias == "bias" else None
    opcheck(
        torch.ops.torch_ipex.fp8_gemm_w8a16.xpu,
        (A, B, trans_b == "trans_B", scale, b),
        test_utils=TEST_UTILS,
    )


# ---------------------------------------------------------------------------
# Compilation, bad input, registration
# ---------------------------------------------------------------------------


@_requires("_xpu_C", "fp8_gemm_w8a16")
@pytest.mark.parametrize("layout", ["2d", "3d", "3d-mbk"], ids=lambda x: _ids(x))
def test_compiled_fp8_linear_matches_eager(layout):
    """Inductor plans the graph around the fake's output: a wrong rank or
    stride breaks the reduction over dim 1 downstream."""
    torch._dynamo.reset()
    B = _fp8_weight(torch.float8_e4m3fn, nt=True)
    scale = torch.tensor([0.5], device=DEVICE)

    def block(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops._xpu_C.fp8_gemm_w8a16(x, B, scale, None)
        return torch.nn.functional.silu(y).sum(dim=1)

    x = _activations(torch.bfloat16)[layout]
    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    torch.testing.assert_close(compiled(x), block(x), rtol=2e-2, atol=2e-2)


BAD_INPUTS = {
    "wrong-rank": (lambda: torch.randn(2, 3, 4, K), "only support 2D and 3D inputs"),
    "zero-k": (lambda: torch.randn(4, 0), "(K) is 0"),
}


@_requires("_xpu_C", "fp8_gemm_w8a16")
@pytest.mark.parametrize("case", sorted(BAD_INPUTS), ids=lambda x: _ids(x))
def test_fake_rejects_what_the_kernel_rejects(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    make_input, message = BAD_INPUTS[case]
    k = 0 if case == "zero-k" else K
    with FakeTensorMode():
        A = make_input().to(torch.bfloat16)
        B = torch.empty(N, k, dtype=torch.float8_e4m3fn).t()
        with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
            torch.ops._xpu_C.fp8_gemm_w8a16(A, B, None, None)


def test_registration_skips_a_mismatched_schema(caplog):
    lib = torch.library.Library("_xpu_gemm_fakes_test", "FRAGMENT")
    lib.define("gemm(Tensor A, Tensor B, bool trans_B) -> Tensor")
    expected = "_xpu_gemm_fakes_test::gemm(Tensor A, Tensor B) -> Tensor"
    with caplog.at_level(logging.WARNING):
        ok = fakes._register("_xpu_gemm_fakes_test::gemm", expected, fakes.fp8_gemm_fake)
    assert not ok
    assert "Not registering a fake for _xpu_gemm_fakes_test::gemm" in caplog.text
    assert not fakes._register("_xpu_gemm_fakes_test::absent", expected, lambda: None)
