"""The canonical fake module (vllm_overlay/vllm/_xpu_gemm_fakes.py) and the
reference kernels, outside any vLLM tree: the reference math, the output
layout rule, bad input, kernel-release-dependent checks, registration, and
the real fake of every op of the registry (data/fakes.toml) through its
opcheck grid, with its negative controls: the standard wrong fakes derived
from the registry (support/wrong_fakes.py), and the real fake broken in a
copy of the module. No sdist is needed: a new op's fake is checked here
(`-k <op>`) as soon as it has its reference kernel and grid.

Forked: fake registrations are process-global.
"""

import ast
import importlib
import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo.testing

from support import grid, standins, wrong_fakes
from xpufakes.changes import opfacts
from xpufakes.common import ops, paths
from xpufakes.trees import pins

pytestmark = pytest.mark.forked

ref = standins.reference()


def _fakes():
    sys.path.insert(0, str(paths.OVERLAY))
    return importlib.import_module("vllm._xpu_gemm_fakes")


def _setup(release: str = ref.NEWEST_XPU_KERNELS):
    """Stand-ins of a vllm-xpu-kernels release (by default the newest pin's,
    which `make ops` writes into the reference) and IPEX, then our fakes."""
    libraries = [ref.define_xpu_c_kernels(release), ref.define_torch_ipex_kernels()]
    fakes = _fakes()
    fakes.register_xpu_gemm_fakes()
    fakes.register_ipex_gemm_fakes()
    return libraries, fakes


# ---------------------------------------------------------------------------
# The reference kernels compute the real math
# ---------------------------------------------------------------------------


def _e2m1_value(code: int) -> float:
    """OCP MX e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit."""
    sign = -1.0 if code & 0b1000 else 1.0
    exponent, mantissa = (code >> 1) & 0b11, code & 0b1
    if exponent == 0:
        return sign * 0.5 * mantissa
    return sign * 2.0 ** (exponent - 1) * (1 + mantissa / 2)


def _pack_nibbles(values: torch.Tensor, per_word: int, dtype) -> torch.Tensor:
    """Pack unsigned 4-bit values along the last dim, the first value in the
    lowest bits."""
    groups = values.reshape(*values.shape[:-1], -1, per_word).long()
    word = torch.zeros(groups.shape[:-1], dtype=torch.int64)
    for i in range(per_word):
        word |= groups[..., i] << (4 * i)
    if dtype == torch.int32:
        word = torch.where(word >= 2**31, word - 2**32, word)
    return word.to(dtype)


def test_reference_fp8_gemm_w8a16_is_the_dense_product():
    libraries, _ = _setup()  # noqa: F841
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    w = torch.randn(48, 64).to(torch.float8_e4m3fn)  # [N, K]
    scale, bias = torch.tensor([0.5]), torch.randn(48, dtype=torch.bfloat16)
    got = torch.ops._xpu_C.fp8_gemm_w8a16(x.transpose(0, 1), w.t(), scale, bias)
    expected = torch.einsum("mbk,nk->mbn", x.transpose(0, 1).double(), w.double())
    expected = (expected * 0.5 + bias.double()).to(torch.bfloat16)
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)


def test_reference_fp8_gemm_scales_per_token_and_per_block():
    libraries, _ = _setup()  # noqa: F841
    m, k, n, g = 4, 32, 16, 8
    a = torch.randn(m, k).to(torch.float8_e4m3fn)
    w = torch.randn(n, k).to(torch.float8_e4m3fn)
    a_scale = torch.rand(m, k // g) + 0.5
    w_scale = torch.rand(k // g, n // g) + 0.5
    got = torch.ops._xpu_C.fp8_gemm(
        a, w.t(), torch.float16, a_scale, w_scale, torch.empty(0)
    )
    expected = torch.zeros(m, n, dtype=torch.float64)
    for i in range(m):
        for j in range(n):
            for kk in range(k):
                expected[i, j] += (
                    float(a[i, kk].float())
                    * float(a_scale[i, kk // g])
                    * float(w[j, kk].float())
                    * float(w_scale[kk // g, j // g])
                )
    torch.testing.assert_close(got, expected.half(), rtol=1e-2, atol=1e-2)


def test_reference_int4_w4a16_unpacks_gptq_nibbles_with_zero_points():
    libraries, _ = _setup()  # noqa: F841
    k, n, group = 64, 16, 32
    q = torch.randint(0, 16, (n, k))  # [N, K] values
    zeros = torch.randint(0, 16, (k // group, n))
    scales = torch.rand(k // group, n, dtype=torch.float16) + 0.5
    packed = _pack_nibbles(q, 8, torch.int32)  # [N, K/8], packed along K
    packed_zeros = _pack_nibbles(zeros, 8, torch.int32)  # [K/g, N/8]
    x = torch.randn(3, k, dtype=torch.float16)
    got = torch.ops._xpu_C.int4_gemm_w4a16(
        x, packed.t(), None, scales, packed_zeros, group, None
    )
    groups = torch.arange(k) // group
    w = (q.double() - zeros[groups].t().double()) * scales[groups].t().double()
    torch.testing.assert_close(got, (x.double() @ w.t()).half(), rtol=1e-2, atol=5e-2)
    # act-order: the kernel permutes the activation's columns by g_idx
    perm = torch.randperm(k)
    got = torch.ops._xpu_C.int4_gemm_w4a16(
        x, packed.t(), None, scales, packed_zeros, group, perm
    )
    expected = (x[:, perm].double() @ w.t()).half()
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=5e-2)


def test_reference_int4_w4a8_dequantizes_the_activation():
    libraries, _ = _setup()  # noqa: F841
    k, n, group = 32, 8, 32
    q = torch.randint(0, 16, (n, k))
    scales = torch.rand(1, n, dtype=torch.float16) + 0.5
    x = torch.randint(-100, 100, (4, k), dtype=torch.int8)
    x_scale, x_zp = torch.rand(4, 1) + 0.1, torch.randint(-3, 3, (4, 1))
    sym = torch.tensor([8], dtype=torch.int8)
    got = torch.ops._xpu_C.int4_gemm_w4a8(
        x,
        x_scale,
        x_zp,
        _pack_nibbles(q, 8, torch.int32).t(),
        scales,
        sym,
        group,
        None,
        None,
    )
    assert got.dtype == torch.float16
    a = (x.double() - x_zp.double()) * x_scale.double()
    w = (q.double() - 8) * scales.double().t()
    torch.testing.assert_close(got, (a @ w.t()).half(), rtol=1e-2, atol=1e-1)


def test_reference_fp4_gemm_decodes_e2m1_with_e8m0_scales():
    libraries, _ = _setup()  # noqa: F841
    m, k, n = 2, 64, 8
    a_codes, w_codes = torch.randint(0, 16, (m, k)), torch.randint(0, 16, (n, k))
    a = _pack_nibbles(a_codes, 2, torch.uint8).view(torch.float4_e2m1fn_x2)
    w = _pack_nibbles(w_codes, 2, torch.uint8).view(torch.float4_e2m1fn_x2)
    a_exp = torch.randint(125, 130, (m, k // 32), dtype=torch.uint8)
    w_exp = torch.randint(125, 130, (n, k // 32), dtype=torch.uint8)
    got = torch.ops._xpu_C.fp4_gemm(
        a,
        w.t(),
        a_exp.view(torch.float8_e8m0fnu),
        w_exp.view(torch.float8_e8m0fnu),
        torch.float32 if False else None,
        None,
    )
    value = torch.tensor([_e2m1_value(c) for c in range(16)], dtype=torch.float64)
    av = value[a_codes] * 2.0 ** (a_exp.double() - 127).repeat_interleave(32, 1)
    wv = value[w_codes] * 2.0 ** (w_exp.double() - 127).repeat_interleave(32, 1)
    torch.testing.assert_close(got, (av @ wv.t()).half(), rtol=1e-2, atol=1e-2)


def test_reference_ipex_gemm_takes_an_nk_weight_when_trans_b():
    libraries, _ = _setup()  # noqa: F841
    x = torch.randn(4, 32, dtype=torch.float16)
    w = torch.randn(16, 32).to(torch.float8_e5m2)
    got_t = torch.ops.torch_ipex.fp8_gemm_w8a16(x, w, True, torch.tensor([2.0]), None)
    got_n = torch.ops.torch_ipex.fp8_gemm_w8a16(
        x, w.t().contiguous(), False, torch.tensor([2.0]), None
    )
    expected = (x.double() @ w.double().t() * 2).half()
    torch.testing.assert_close(got_t, expected, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got_n, expected, rtol=1e-2, atol=1e-2)


AUTOAWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column [i]


@pytest.mark.parametrize(
    "method,engine,act_order,bias,rows",
    [
        ("gptq", "onednn", False, False, 5),
        ("gptq", "onednn", True, True, 1),
        ("gptq", "xetla", True, False, 5),
        ("gptq", "xetla", False, True, 1),
        ("awq", "onednn", False, True, 5),
        ("awq", "xetla", False, False, 5),
        ("awq", "xetla", False, True, 1),
    ],
)
def test_reference_woq_linear_is_the_dense_product(
    method, engine, act_order, bias, rows
):
    """The reference of IPEX's WOQ linear (both layouts, both packings,
    act-order, bias, one row and more) computes x @ ((q - z) * s)."""
    library = ref.define_torch_ipex_woq_kernels()  # noqa: F841
    k, n, g = 64, 16, 32
    q = torch.randint(0, 16, (k, n))
    scales = torch.rand(k // g, n, dtype=torch.float16) + 0.5
    groups = torch.arange(k) // g
    if method == "gptq":  # symmetric: zero point 8
        zeros = torch.full((k // g, n), 8)
        qweight = _pack_nibbles(q.t(), 8, torch.int32).t().contiguous()  # [K/8, N]
        qzeros = torch.zeros(k // g, n // 8, dtype=torch.int32)  # ignored
        if act_order:
            groups = groups[torch.randperm(k)]
    else:
        zeros = torch.randint(0, 16, (k // g, n))
        order = torch.tensor(
            [8 * c + AUTOAWQ_ORDER[i] for c in range(n // 8) for i in range(8)]
        )
        qweight = _pack_nibbles(q[:, order], 8, torch.int32)  # [K, N/8]
        qzeros = _pack_nibbles(zeros[:, order], 8, torch.int32)  # [K/G, N/8]
    b = torch.randn(n, dtype=torch.float16) if bias else None
    module = ref.ReferenceWOQLinear.from_weight(
        qweight,
        scales,
        qzeros,
        k,
        n,
        bias=b,
        group_size=g,
        g_idx=groups.int() if act_order else None,
        quant_method=0 if method == "gptq" else 1,
        engine=engine,
    )
    x = torch.randn(rows, k, dtype=torch.float16)
    ref.WOQ_CALLS.clear()
    got = module(x)
    expected_ops = {
        ("onednn", False): ["mm_int4"],
        ("onednn", True): ["mm_bias_int4"],
        ("xetla", False): ["mm_low_bits"]
        if rows == 1
        else ["int4x8_dequantize", "mm_common"],
        ("xetla", True): ["mm_low_bits"]
        if rows == 1
        else ["int4x8_dequantize", "mm_common"],
    }
    assert expected_ops[(engine, bias)] == ref.WOQ_CALLS
    w = (q.double() - zeros[groups].double()) * scales[groups].double()
    expected = x.double() @ w + (b.double() if bias else 0)
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-1)
    assert got.is_contiguous() and got.dtype == x.dtype


# The layout rule (shape A.shape[:-1] + (N,), strides A.stride(i) / K * N but
# the last, A's): docs/ipex-woq-ops.md §3.8 from IPEX's source, the docstring
# of vllm_overlay/vllm/_xpu_gemm_fakes.py for vllm-xpu-kernels; worked
# examples (K=8, N=16) computed by hand from it.
BF16 = torch.bfloat16
LAYOUT_EXAMPLES = [
    (lambda: torch.randn(4, 8, dtype=BF16), (4, 16), (16, 1)),
    (lambda: torch.randn(2, 4, 8, dtype=BF16), (2, 4, 16), (64, 16, 1)),
    (lambda: torch.randn(2, 4, 8, dtype=BF16).transpose(0, 1), (4, 2, 16), (16, 64, 1)),
    (lambda: torch.randn(4, 16, dtype=BF16)[:, :8], (4, 16), (32, 1)),
]


@pytest.mark.parametrize("example", range(len(LAYOUT_EXAMPLES)))
def test_fake_and_reference_follow_the_documented_layout(example):
    libraries, _ = _setup()  # noqa: F841
    make, shape, strides = LAYOUT_EXAMPLES[example]
    x = make()
    w = torch.randn(16, 8).to(torch.float8_e4m3fn).t()
    real = torch.ops._xpu_C.fp8_gemm_w8a16(x, w, None, None)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = torch.ops._xpu_C.fp8_gemm_w8a16(
            mode.from_tensor(x), mode.from_tensor(w), None, None
        )
    for out in (real, fake):
        assert (tuple(out.shape), out.stride()) == (shape, strides)


# ---------------------------------------------------------------------------
# Bad input: a clear error at trace time, with the kernel's message
# ---------------------------------------------------------------------------


def _fp8(*shape):
    return torch.randn(*shape).to(torch.float8_e4m3fn)


BAD_INPUTS = {
    "w8a16-wrong-activation-dtype": lambda: (
        torch.ops._xpu_C.fp8_gemm_w8a16,
        (torch.randn(4, 64), _fp8(48, 64).t(), None, None),
    ),
    "w8a16-wrong-weight-dtype": lambda: (
        torch.ops._xpu_C.fp8_gemm_w8a16,
        (torch.randn(4, 64).half(), torch.randn(64, 48).half(), None, None),
    ),
    "w8a16-wrong-rank": lambda: (
        torch.ops._xpu_C.fp8_gemm_w8a16,
        (torch.randn(2, 2, 4, 64).half(), _fp8(48, 64).t(), None, None),
    ),
    "fp8-mismatched-fp8-types": lambda: (
        torch.ops._xpu_C.fp8_gemm,
        (_fp8(4, 64), _fp8(48, 64).t().to(torch.float8_e5m2), None, None, None, None),
    ),
    "fp8-fp32-output": lambda: (
        torch.ops._xpu_C.fp8_gemm,
        (_fp8(4, 64), _fp8(48, 64).t(), torch.float32, None, None, None),
    ),
    "fp8-mismatched-batch": lambda: (
        torch.ops._xpu_C.fp8_gemm,
        (_fp8(2, 4, 64), _fp8(3, 48, 64).transpose(1, 2), None, None, None, None),
    ),
    "fp8-batched-weight-2d-input": lambda: (
        torch.ops._xpu_C.fp8_gemm,
        (_fp8(4, 64), _fp8(3, 48, 64).transpose(1, 2), None, None, None, None),
    ),
    "fp8-bad-bias": lambda: (
        torch.ops._xpu_C.fp8_gemm,
        (_fp8(4, 64), _fp8(48, 64).t(), None, None, None, torch.randn(7)),
    ),
    "bmm-2d-input": lambda: (
        torch.ops._xpu_C.fp8_bmm,
        (_fp8(4, 64), _fp8(2, 48, 64).transpose(1, 2), None, None, None, None),
    ),
    "bmm-mismatched-batch": lambda: (
        torch.ops._xpu_C.fp8_bmm,
        (_fp8(2, 4, 64), _fp8(3, 48, 64).transpose(1, 2), None, None, None, None),
    ),
    "int4-weight-not-nt": lambda: (
        torch.ops._xpu_C.int4_gemm_w4a16,
        (
            torch.randn(4, 64).half(),
            torch.zeros(8, 48, dtype=torch.int32),
            None,
            torch.ones(2, 48).half(),
            torch.zeros(2, 6, dtype=torch.int32),
            32,
            None,
        ),
    ),
    "w4a8-bad-activation-scale": lambda: (
        torch.ops._xpu_C.int4_gemm_w4a8,
        (
            torch.zeros(4, 64, dtype=torch.int8),
            torch.ones(4, 2),
            torch.zeros(4, 2, dtype=torch.int32),
            torch.zeros(48, 8, dtype=torch.int32).t(),
            torch.ones(2, 48).half(),
            torch.zeros(2, 6, dtype=torch.int32),
            32,
            None,
            None,
        ),
    ),
    "fp4-wrong-scale-dtype": lambda: (
        torch.ops._xpu_C.fp4_gemm,
        (
            torch.zeros(4, 32, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
            torch.zeros(48, 32, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).t(),
            torch.ones(4, 2),
            torch.ones(48, 2),
            None,
            None,
        ),
    ),
    "ipex-3d-input-3d-weight": lambda: (
        torch.ops.torch_ipex.fp8_gemm_w8a16,
        (torch.randn(2, 4, 64).half(), _fp8(2, 48, 64), True, None, None),
    ),
    "ipex-wrong-rank": lambda: (
        torch.ops.torch_ipex.fp8_gemm_w8a16,
        (torch.randn(64).half(), _fp8(48, 64), True, None, None),
    ),
}


def _message(error: BaseException) -> str:
    """The kernel's message, without the trailing newline TORCH_CHECK keeps
    and the INTERNAL ASSERT prefix."""
    text = str(error).strip().splitlines()[0]
    return text.removeprefix("INTERNAL ASSERT FAILED: ").strip()


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_at_trace_time_with_the_kernel_message(case):
    libraries, _ = _setup()  # noqa: F841
    op, args = BAD_INPUTS[case]()
    with pytest.raises(RuntimeError) as kernel:
        op(*args)
    expected = _message(kernel.value)
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(lambda *a: op(*a), backend=counter, fullgraph=True)
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError) as traced:
        compiled(*args)
    assert counter.frame_count == 0  # it failed while tracing
    assert expected in str(traced.value), (expected, str(traced.value)[:500])


def test_zero_k_is_rejected_instead_of_dividing_by_it():
    libraries, _ = _setup()  # noqa: F841
    x, w = torch.randn(4, 0).half(), _fp8(48, 0).t()
    compiled = torch.compile(
        lambda a, b: torch.ops._xpu_C.fp8_gemm_w8a16(a, b, None, None), fullgraph=True
    )
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=r"\(K\) is 0"):
        compiled(x, w)


# ---------------------------------------------------------------------------
# Checks that depend on the vllm-xpu-kernels release in use
# ---------------------------------------------------------------------------


def _install_metadata(tmp_path: Path, version: str) -> None:
    """Make importlib.metadata see vllm_xpu_kernels <version> installed."""
    info = tmp_path / f"vllm_xpu_kernels-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm_xpu_kernels\nVersion: {version}\n"
    )
    sys.path.insert(0, str(tmp_path))


@pytest.mark.parametrize("kernels,rejects", [("0.1.12", False), ("0.1.13.2", True)])
def test_scale_contiguity_is_checked_from_0_1_13(tmp_path, kernels, rejects):
    _install_metadata(tmp_path, kernels)
    libraries, fakes = _setup(kernels)  # noqa: F841
    assert fakes._xpu_kernels_version() == ref.parse_version(kernels)
    x, w = torch.randn(4, 64).half(), _fp8(48, 64).t()
    scale = torch.rand(48, 2).t()[0]  # a non-contiguous per-channel scale
    compiled = torch.compile(
        lambda a, b, s: torch.ops._xpu_C.fp8_gemm_w8a16(a, b, s, None),
        fullgraph=True,
        backend="eager",
    )
    if rejects:
        with pytest.raises(
            torch._dynamo.exc.TorchRuntimeError,
            match="B_scale must be contiguous for fp8 matmul",
        ):
            compiled(x, w, scale)
        with pytest.raises(RuntimeError, match="B_scale must be contiguous"):
            torch.ops._xpu_C.fp8_gemm_w8a16(x, w, scale, None)
    else:
        torch.testing.assert_close(
            compiled(x, w, scale), torch.ops._xpu_C.fp8_gemm_w8a16(x, w, scale, None)
        )


@pytest.mark.parametrize(
    "installed,number,batched",
    [
        ("v0.1.10", (0, 1, 10), False),  # PEP 440 allows the "v"
        ("0.1.13rc1+xpu", (0, 1, 13), True),
        ("0.1.13.2", (0, 1, 13, 2), True),
        ("nightly", None, True),  # not PEP 440: unknown, the lenient checks
    ],
)
def test_the_kernels_version_is_read_as_pep_440(tmp_path, installed, number, batched):
    """Negative control: the regex read before ("\\d+(\\.\\d+)*" from the
    start) gave None for "v0.1.10", so a 0.1.10 took 3-D weights."""
    _install_metadata(tmp_path, installed)
    fakes = _fakes()
    assert fakes._xpu_kernels_version() == number
    # 3-D weights from 0.1.11 on (dda91d1); taken when the release is unknown
    assert fakes._kernel_has("batched_weights") is batched


def test_batched_weights_are_rejected_before_0_1_11(tmp_path):
    _install_metadata(tmp_path, "0.1.10.1")
    libraries, fakes = _setup("0.1.10.1")  # noqa: F841
    x, w = _fp8(2, 4, 64), _fp8(2, 48, 64).transpose(1, 2)
    compiled = torch.compile(
        lambda a, b: torch.ops._xpu_C.fp8_gemm(a, b, None, None, None, None),
        fullgraph=True,
    )
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="only support 2D"):
        compiled(x, w)


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


def test_registration_skips_absent_ops_and_never_raises():
    fakes = _fakes()  # no stand-ins: no _xpu_C or torch_ipex op exists
    assert fakes.register_xpu_gemm_fakes() == []
    assert fakes.register_ipex_gemm_fakes() == []


def test_ipex_fake_is_registered_once_ipex_defines_the_op():
    fakes = _fakes()
    assert fakes.register_ipex_gemm_fakes() == []
    library = ref.define_torch_ipex_kernels()  # noqa: F841 - "import IPEX"
    assert fakes.register_ipex_gemm_fakes() == ["torch_ipex::fp8_gemm_w8a16.xpu"]


def test_registering_twice_is_harmless():
    libraries, fakes = _setup()  # noqa: F841
    first = fakes.register_xpu_gemm_fakes()
    assert fakes.register_xpu_gemm_fakes() == first
    assert len(first) == len(fakes.XPU_GEMM_FAKES)


def _meta_shape(op: str) -> tuple[int, ...]:
    """The output shape of _xpu_C::<op> on meta tensors: what its fake
    (torch's Meta kernel of a registered fake) returns."""
    x = torch.empty(3, 5, 64, dtype=torch.half, device="meta")
    w = torch.empty(48, 64, dtype=torch.float8_e4m3fn, device="meta").t()
    return tuple(getattr(torch.ops._xpu_C, op)(x, w, None, None).shape)


def test_unregistering_takes_the_fakes_back_and_registering_again_works():
    """Negative control: fakes registered through torch's own libraries
    (register_fake(lib=None), as before) and then forgotten (the in-tree
    test cleared the module's dict by hand) stay registered in torch, and
    the first pytest.raises fails."""
    libraries, fakes = _setup()  # noqa: F841
    assert _meta_shape("fp8_gemm_w8a16") == (3, 5, 48)
    fakes.unregister_fakes()
    with pytest.raises(NotImplementedError, match="no fake impl"):
        _meta_shape("fp8_gemm_w8a16")
    assert fakes.register_xpu_gemm_fakes() == list(fakes.XPU_GEMM_FAKES)
    assert _meta_shape("fp8_gemm_w8a16") == (3, 5, 48)


def _register_fake_of_torch(allow_override: bool | None):
    """torch.library.register_fake as a torch release has it: without
    allow_override (2.7), or with it defaulting to False (2.8 - 2.12)."""
    real = torch.library.register_fake
    if allow_override is None:

        def register_fake(op, func=None, /, *, lib=None, _stacklevel=1):
            return real(op, func, lib=lib, _stacklevel=_stacklevel + 1)

        return register_fake

    def register_fake(
        op, func=None, /, *, lib=None, _stacklevel=1, allow_override=allow_override
    ):
        return real(
            op,
            func,
            lib=lib,
            _stacklevel=_stacklevel + 1,
            allow_override=allow_override,
        )

    return register_fake


def _traced_shape(x, w):
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        return tuple(torch.ops._xpu_C.fp8_gemm_w8a16(fx, fw, None, None).shape)


def test_an_earlier_wrong_fake_is_replaced_where_torch_refuses_by_default(
    monkeypatch,
):
    """torch 2.8 - 2.12 (allow_override=False by default) with vLLM's
    flattening fake registered first. Negative control: registering without
    allow_override=True raises there, and the flattened [15, 48] stays."""
    libraries = [ref.define_xpu_c_kernels()]  # noqa: F841
    monkeypatch.setattr(
        torch.library, "register_fake", _register_fake_of_torch(allow_override=False)
    )
    torch.library.register_fake("_xpu_C::fp8_gemm_w8a16", _flattening_fake)
    x, w = torch.randn(3, 5, 64).half(), _fp8(48, 64).t()
    assert _traced_shape(x, w) == (15, 48)  # vLLM's fake is the one in use
    fakes = _fakes()
    assert "_xpu_C::fp8_gemm_w8a16" in fakes.register_xpu_gemm_fakes()
    assert _traced_shape(x, w) == (3, 5, 48)


def test_a_register_fake_without_allow_override_still_registers(monkeypatch):
    """A torch whose register_fake has no allow_override (2.7, and 2.8.0
    nightlies before it was added) although its version says 2.8.
    Negative control: deciding from the version (>= 2.8 -> pass it) raises
    TypeError there, and nothing is registered."""
    libraries = [ref.define_xpu_c_kernels()]  # noqa: F841
    monkeypatch.setattr(torch, "__version__", "2.8.0.dev20250301+cpu")
    monkeypatch.setattr(
        torch.library, "register_fake", _register_fake_of_torch(allow_override=None)
    )
    fakes = _fakes()
    assert "_xpu_C::fp8_gemm_w8a16" in fakes.register_xpu_gemm_fakes()
    x, w = torch.randn(3, 5, 64).half(), _fp8(48, 64).t()
    assert _traced_shape(x, w) == (3, 5, 48)


def test_a_schema_mismatch_is_logged_and_skipped(caplog):
    """An older, never-released form of the op (with trans_B) gets no fake."""
    library = torch.library.Library("_xpu_C", "FRAGMENT")
    library.define(
        "fp8_gemm_w8a16(Tensor! A, Tensor! B, bool trans_B, Tensor? B_scale_, "
        "Tensor? bias_) -> Tensor"
    )
    fakes = _fakes()
    with caplog.at_level(logging.WARNING):
        assert fakes.register_xpu_gemm_fakes() == []
    assert "Not registering a fake for _xpu_C::fp8_gemm_w8a16" in caplog.text


def test_the_fakes_expect_the_schemas_the_kernels_register():
    """The schemas the fakes are written for are the reference's (copied
    verbatim from the kernels' sources), as torch prints them."""
    libraries, fakes = _setup()  # noqa: F841
    for qualname, spec in {**fakes.XPU_GEMM_FAKES, **fakes.IPEX_GEMM_FAKES}.items():
        op = fakes._find_overload(qualname)
        assert str(op._schema) == spec.schema


# ---------------------------------------------------------------------------
# The real fake of each op of the registry (data/fakes.toml), through its
# opcheck grid on the stand-ins: no sdist, no vLLM tree. Negative controls:
# the standard wrong fakes derived from the registry (support/wrong_fakes.py)
# and the real fake broken in a copy of its module each fail the grid.
# ---------------------------------------------------------------------------

FAKES_FILE = paths.OVERLAY / "vllm" / "_xpu_gemm_fakes.py"
OPS = {op["name"]: op for op in ops.FAKES}


def _flattening_fake(A, B, B_scale, bias):  # vLLM's: 2-D, contiguous
    return A.new_empty((A.numel() // A.shape[-1], B.shape[-1]))


def op_schemas() -> dict[str, str]:
    """qualified op -> its schema (data/op_schemas.toml), as torch prints it."""
    return opfacts.schemas()


def _kernels_release(op: dict) -> str:
    """The vllm-xpu-kernels release whose stand-ins the op is checked on: the
    newest pin's kernels pin, or the op's `since` if that is newer."""
    newest = next(p for p in reversed(pins.load().ordered()) if p.era == "kernels")
    release = newest.kernels.split()[-1]
    since = op.get("since", "0")
    return max(release, since, key=ref.parse_version)


def _stand_in(name: str) -> list:
    """The op's stand-in (its schema, the reference kernel); keep the
    returned libraries referenced."""
    op = OPS[name]
    if op["era"] == "ipex":
        return [ref.define_torch_ipex_kernels()]
    return [ref.define_xpu_c_kernels(_kernels_release(op))]


def _grid_of(name: str) -> list:
    """The op's cases of the reference's opcheck grid (CASE_SPACE)."""
    namespace, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    return [
        c
        for c in grid.cases()
        if (c.namespace, c.name) == (namespace, op)
        and (not overload or c.overload == overload)
    ]


def _load_fakes(path: Path):
    """The fake module at path, as a module of its own (a test forks)."""
    spec = importlib.util.spec_from_file_location("xpu_gemm_fakes_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _register_the_modules_fake(fakes, name: str):
    """Register the module's fakes; the op's is the function the registry
    names. Returns that function."""
    registered = fakes.register_xpu_gemm_fakes() + fakes.register_ipex_gemm_fakes()
    assert name in registered, (name, registered)
    fake = getattr(fakes, OPS[name]["fake"])
    assert fakes._registrations[name].fake is fake
    return fake


def _grid_failures(name: str, chosen: list) -> dict[str, str]:
    """case id -> its failure, for the op's chosen cases; every case must
    have run (a case whose op is not defined proves nothing)."""
    results = grid.run(chosen)
    assert len(results) == len(chosen) > 0, (name, sorted(results))
    return grid.failures(results)


def _cases_it_must_fail(name: str, wrong: wrong_fakes.WrongFake) -> list:
    """The op's cases the wrong fake gets wrong, from each case's arguments
    and what the stand-in kernel returns for them (call with no fake
    registered: the kernel runs eagerly). The grid must have some."""
    schema = op_schemas()[name]
    chosen = []
    for case in _grid_of(name):
        args = case.args("cpu")
        if wrong.must_fail(schema, args, case.op()(*args)):
            chosen.append(case)
    assert chosen, (
        f"no case of {name}'s grid (CASE_SPACE) has what a {wrong.name} fake "
        "gets wrong: add the layouts (LAYOUTS) or the out_dtype None it lacks"
    )
    return chosen


def _flattened_copy(directory: Path, fake: str) -> Path:
    """A copy of the fake module in which the function `fake` returns its
    output flattened to 2-D (every return of it)."""
    tree = ast.parse(FAKES_FILE.read_text())
    function = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fake
    )
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and node.value is not None:
            node.value = ast.Call(
                ast.Name("_flattened_by_the_test", ast.Load()), [node.value], []
            )
    tree.body += ast.parse(
        "def _flattened_by_the_test(out):\n"
        "    return out.new_empty((out.numel() // out.size(-1), out.size(-1)))\n"
    ).body
    copy = directory / "_xpu_gemm_fakes.py"
    copy.write_text(ast.unparse(ast.fix_missing_locations(tree)))
    return copy


@pytest.mark.parametrize("name", sorted(OPS))
def test_the_real_fake_passes_its_grid(name):
    """The fake of vllm_overlay/vllm/_xpu_gemm_fakes.py that the registry
    names, registered by the module, on every case of the op's grid."""
    libraries = _stand_in(name)  # noqa: F841
    _register_the_modules_fake(_load_fakes(FAKES_FILE), name)
    assert _grid_failures(name, _grid_of(name)) == {}


WRONG = [
    (name, wrong.name)
    for name in sorted(OPS)
    for wrong in wrong_fakes.for_schema(op_schemas()[name])
]


@pytest.mark.parametrize(("name", "wrong"), WRONG, ids=["-".join(w) for w in WRONG])
def test_a_standard_wrong_fake_fails_the_grid(name, wrong):
    """Negative control of the test above: the real fake made wrong in a
    standard way (support/wrong_fakes.py) fails every case it gets wrong,
    in test_faketensor. The op's grid must have such cases."""
    libraries = _stand_in(name)  # noqa: F841
    wrong_fake = wrong_fakes.by_name(wrong)
    chosen = _cases_it_must_fail(name, wrong_fake)
    real = getattr(_load_fakes(FAKES_FILE), OPS[name]["fake"])
    library = torch.library.Library(name.partition("::")[0], "FRAGMENT")  # noqa: F841
    torch.library.register_fake(
        name, wrong_fake.wrap(real, op_schemas()[name]), lib=library
    )
    failed = _grid_failures(name, chosen)
    assert set(failed) == {c.id for c in chosen}, failed
    assert all("test_faketensor" in failure for failure in failed.values()), failed


@pytest.mark.parametrize("name", sorted(OPS))
def test_the_real_fake_broken_in_a_copy_fails_its_grid(name, tmp_path):
    """Negative control: the module's own fake of the op, changed in a copy
    of the module to flatten its output to 2-D, registered by that copy as
    the test above registers the real one, fails the op's cases whose
    output is not 2-D (or is an argument)."""
    libraries = _stand_in(name)  # noqa: F841
    chosen = _cases_it_must_fail(name, wrong_fakes.by_name("flattened"))
    copy = _load_fakes(_flattened_copy(tmp_path, OPS[name]["fake"]))
    _register_the_modules_fake(copy, name)
    failed = _grid_failures(name, chosen)
    assert set(failed) == {c.id for c in chosen}, failed
    assert all("test_faketensor" in failure for failure in failed.values()), failed


# ---------------------------------------------------------------------------
# The grid also checks the kernels' registration (test_schema,
# test_autograd_registration), and those checks can fail
# ---------------------------------------------------------------------------


def _override_standin(name: str, kernel) -> torch.library.Library:
    lib = torch.library.Library("_xpu_C", "IMPL")
    lib.impl(name, kernel, "CPU")
    return lib


def test_the_grid_runs_the_kernel_checks_and_they_can_fail():
    libraries, _ = _setup()  # noqa: F841
    chosen = [c for c in grid.cases() if c.name == "int4_gemm_w4a16"]
    assert chosen and grid.failures(grid.run(chosen)) == {}
    assert all("test_schema" in c.kernel_checks() for c in chosen)
    kernels = ref.make_xpu_c_kernels(
        ref._Release(ref.parse_version(ref.NEWEST_XPU_KERNELS))
    )
    # a stand-in that records autograd history below the autograd key
    lib = _override_standin("int4_gemm_w4a16", kernels["int4_gemm_w4a16"])
    failed = grid.failures(grid.run(chosen))
    assert set(failed) == {c.id for c in chosen}, failed
    assert all("test_autograd_registration" in v for v in failed.values()), failed
    # a stand-in that writes into its input A, which the schema does not allow
    reference = ref.as_backend_kernel(kernels["int4_gemm_w4a16"])

    def mutating(A, *args):
        A.add_(1)
        return reference(A, *args)

    lib = _override_standin("int4_gemm_w4a16", mutating)  # noqa: F841
    failed = grid.failures(grid.run(chosen))
    assert set(failed) == {c.id for c in chosen}, failed
    assert all("test_schema" in v for v in failed.values()), failed


def test_the_kernel_checks_skipped_are_the_ones_that_cannot_run():
    """test_schema on fp4 inputs and on fp8_gemm_out fails for reasons that
    are not the fake's: SCHEMA_CHECK_SKIPPED says which, and this shows it."""
    libraries, _ = _setup()  # noqa: F841
    from unittest.mock import patch

    for name, expected in (
        ("fp4_gemm", "Float4_e2m1fn_x2"),
        ("fp8_gemm_out", "Argument out is not defined to alias output"),
    ):
        assert name in ref.SCHEMA_CHECK_SKIPPED
        case = next(c for c in grid.cases() if c.name == name)
        assert "test_schema" not in case.kernel_checks()
        with (
            patch("torch.allclose", new=ref.fp8_allclose),
            pytest.raises(Exception, match=expected),
        ):
            torch.library.opcheck(
                case.op(), case.args("cpu"), test_utils=("test_schema",)
            )
