"""The CPU reference kernels of llm-scaler's ESIMD ops (proof/xpu/
esimd_kernels.py) that b18beee's traced path reaches besides the GEMMs and
norms test_model_numbers checks: each against its math written out here
on its own (loops over tiny shapes in float64, int4 packed and unpacked
nibble by nibble, fp8 through torch's own float8 conversion). A check
(`verify`) compares every buffer the C++ writes, asserts every other tensor
argument bitwise as it was, and the return: the argument the C++ returns
(`is`), or None. Each check is shown able to fail (`assert_checked`): the
same check of a variant that leaves one written buffer unwritten (fused2:
writes o0 only), writes a read-only argument too, or returns another
tensor, fails; and one of wrong math (nibble order, subnormals, 1 + w, the
gate) fails each value check. Where the C++ walks part of a buffer (one
row, a prefix of K, whole heads per thread), the cases say so with the
C++'s line. A few seconds in all."""

import math

import pytest
import torch

from xpufakes.proof.xpu import esimd_kernels as kernels

TOLERANCE = {"rtol": 4e-3, "atol": 4e-3}  # fp16 buffers vs float64 math


# --- the check and its controls -------------------------------------------


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def verify(kernel, make, expect, returns):
    """Call kernel(*make()); the buffers expect(args) names ({index: the
    whole buffer after}, float64) hold those values; every other tensor
    argument is bitwise what it was; the result is args[returns] itself,
    or None where `returns` is None. Raises AssertionError otherwise."""
    args = make()
    written = expect(args)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    result = kernel(*args)
    for index, (arg, was) in enumerate(zip(args, before, strict=True)):
        if not isinstance(arg, torch.Tensor):
            continue
        assert arg.dtype == was.dtype and arg.shape == was.shape, index
        if index in written:
            torch.testing.assert_close(
                arg.double(), written[index].double(), **TOLERANCE
            )
        else:
            assert torch.equal(_bits(arg), _bits(was)), f"argument {index} written"
    if returns is None:
        assert result is None, "returns a value; the C++ returns nothing"
    else:
        assert result is args[returns], "does not return the argument itself"


def skipping(kernel, index):
    """The kernel without its write of args[index] (it is put back)."""

    def run(*args):
        kept = args[index].clone()
        result = kernel(*args)
        args[index].copy_(kept)
        return result

    return run


def also_writing(kernel, index):
    """The kernel, then one bit of args[index] flipped."""

    def run(*args):
        result = kernel(*args)
        first = args[index].view(-1).view(torch.uint8)
        first[0] = first[0] ^ 1
        return result

    return run


def returning_other(kernel, index):
    """The kernel returning a copy of what it returns, or args[index]
    where it returns nothing."""

    def run(*args):
        result = kernel(*args)
        return args[index] if result is None else result.clone()

    return run


def assert_checked(kernel, make, expect, returns, wrong_math=()):
    """verify passes, and the same check fails for each variant: every
    written buffer left unwritten, every other tensor argument written too,
    another return; and for every expectation of `wrong_math`."""
    verify(kernel, make, expect, returns)
    args = make()
    written = expect(args)
    variants = [skipping(kernel, i) for i in written]
    variants += [
        also_writing(kernel, i)
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor) and i not in written
    ]
    variants.append(returning_other(kernel, min(written)))
    for variant in variants:
        with pytest.raises(AssertionError):
            verify(variant, make, expect, returns)
    for wrong in wrong_math:
        with pytest.raises(AssertionError):
            verify(kernel, make, wrong, returns)


# --- the math written out -------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _half(*shape, seed, scale=1.0, low=None) -> torch.Tensor:
    g = _gen(seed)
    if low is not None:  # uniform in [low, low + scale)
        return (torch.rand(*shape, generator=g) * scale + low).half()
    return (torch.randn(*shape, generator=g) * scale).half()


def _rows(tensor: torch.Tensor) -> list:
    return tensor.double().tolist()


def _rms_inv(values, count, eps) -> float:
    """1 / sqrt(sum(v^2) / count + eps)."""
    return 1.0 / math.sqrt(sum(v * v for v in values) / count + eps)


def _silu(v: float) -> float:
    return v / (1.0 + math.exp(-v))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


def _dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _replace(tensor: torch.Tensor, flat_start: int, values) -> torch.Tensor:
    """float64 copy of `tensor` with its flat elements from flat_start on
    replaced by `values`."""
    out = tensor.double().clone().view(-1)
    out[flat_start : flat_start + len(values)] = torch.tensor(
        values, dtype=torch.float64
    )
    return out.view(tensor.shape)


# int4: q[n][k] in 0..15, zero point 8


def _nibbles(n: int, k: int, seed: int) -> list[list[int]]:
    return torch.randint(0, 16, (n, k), generator=_gen(seed)).tolist()


def pack_bytes(q) -> torch.Tensor:
    """uint8 [N, K/2]: byte j = q[2j] | q[2j+1] << 4 (low nibble first)."""
    rows = [
        [row[2 * j] | row[2 * j + 1] << 4 for j in range(len(row) // 2)] for row in q
    ]
    return torch.tensor(rows, dtype=torch.uint8)


def pack_words(q) -> torch.Tensor:
    """int32 [N, K/8]: word i holds q[8i + z] in bits 4z..4z+3."""
    rows = []
    for row in q:
        words = []
        for i in range(len(row) // 8):
            word = sum(row[8 * i + z] << (4 * z) for z in range(8))
            words.append(word - (1 << 32) if word >= 1 << 31 else word)
        rows.append(words)
    return torch.tensor(rows, dtype=torch.int32)


def swapped(q):
    """q with each (even, odd) pair swapped: the other nibble order."""
    return [
        [row[k + 1] if k % 2 == 0 else row[k - 1] for k in range(len(row))] for row in q
    ]


def dequant_int4(q, scale: torch.Tensor, group: int = 128):
    """(q - 8) * scale[n][k // group], float64 rows."""
    s = _rows(scale)
    return [
        [(v - 8) * s[n][k // group] for k, v in enumerate(row)]
        for n, row in enumerate(q)
    ]


def _int4_scales(n: int, groups: int, seed: int) -> torch.Tensor:
    """fp16 [N, groups], some negative (GGML's scale = max / -8)."""
    s = torch.rand(n, groups, generator=_gen(seed)) * 0.05 + 0.01
    sign = torch.where(torch.rand(n, groups, generator=_gen(seed + 1)) < 0.3, -1.0, 1.0)
    return (s * sign).half()


# fp8: subnormals (exponent 0) are below the smallest normal
SMALLEST_NORMAL = {torch.float8_e4m3fn: 2.0**-6, torch.float8_e5m2: 2.0**-14}


def fp8_weight(n: int, k: int, seed: int, dtype=torch.float8_e4m3fn) -> torch.Tensor:
    """fp8 [N, K]: row 0 all subnormals (E4M3: the codes 1..7), the other
    rows normal values of either sign."""
    g = _gen(seed)
    values = torch.randn(n, k, generator=g).clamp(-3, 3)
    values = torch.where(values.abs() < 0.1, torch.full_like(values, 0.25), values)
    weight = values.to(dtype)
    if dtype == torch.float8_e4m3fn:
        codes = torch.randint(1, 8, (k,), generator=g, dtype=torch.uint8)
        weight.view(torch.uint8)[0] = codes
    return weight


def fp8_values(weight: torch.Tensor, flush: bool) -> list:
    """float64 rows of an fp8 weight; `flush`: its subnormals read 0."""
    values = weight.double()
    if flush:
        small = values.abs() < SMALLEST_NORMAL[weight.dtype]
        values = torch.where(small, torch.zeros_like(values), values)
    return values.tolist()


def _gemv(rows, x) -> list:
    return [_dot(row, x) for row in rows]


# --- the ops ---------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 2])
def test_rms_norm_and_fused_add_rms_norm_take_one_row(rows):
    """esimd_rms_norm: output = rmsnorm(input) * weight; esimd_fused_add_
    rms_norm: residual += h, h = rmsnorm(residual) * weight; one row each
    (K = size(-1), nd_range 1: fused_add_rms_norm.h:221-233, 295-299):
    with 2 rows, row 1 stays. The batched op normalizes every row. Wrong
    math: every row normalized by the one-row ops; 1 + w."""
    k, eps = 128, 1e-6

    def make_norm():
        return [_half(rows, k, seed=5), _half(rows, k, seed=6), _half(k, seed=7), eps]

    def expect_norm(args, every_row=False, plus_one=False):
        w = [v + float(plus_one) for v in args[2].double().tolist()]
        out = []
        for x in _rows(args[0])[: rows if every_row else 1]:
            inv = _rms_inv(x, k, eps)
            out += [v * inv * wk for v, wk in zip(x, w, strict=True)]
        return {1: _replace(args[1], 0, out)}

    wrong = [lambda a: expect_norm(a, plus_one=True)]
    if rows > 1:
        wrong.append(lambda a: expect_norm(a, every_row=True))
    assert_checked(kernels.rms_norm, make_norm, expect_norm, 1, wrong)

    def make_add():
        return [_half(rows, k, seed=8), _half(rows, k, seed=9), _half(k, seed=3), eps]

    def expect_add(args, count=1):
        h_out, r_out = [], []
        w = args[2].double().tolist()
        for h, r in list(zip(_rows(args[0]), _rows(args[1]), strict=True))[:count]:
            added = [a + b for a, b in zip(h, r, strict=True)]
            inv = _rms_inv(added, k, eps)
            h_out += [v * inv * wk for v, wk in zip(added, w, strict=True)]
            r_out += added
        return {0: _replace(args[0], 0, h_out), 1: _replace(args[1], 0, r_out)}

    wrong = [lambda a: expect_add(a, rows)] if rows > 1 else []
    assert_checked(kernels.fused_add_rms_norm, make_add, expect_add, 0, wrong)
    batched = kernels.REFERENCES["esimd_fused_add_rms_norm_batched"]
    wrong = [lambda a: expect_add(a, 1)] if rows > 1 else []
    assert_checked(batched, make_add, lambda a: expect_add(a, rows), 0, wrong)


@pytest.mark.parametrize("rows", [1, 2])
def test_fused_scaled_add_rms_norm(rows):
    """residual <- (h + r) * scalar; hidden_states <- rmsnorm(residual) *
    weight (weight as given); returns hidden_states. One row: K =
    hidden_states.size(-1), nd_range 1 (esimd_kernel.sycl:529,
    fused_add_rms_norm.h:206): with 2 rows, row 1 stays. Wrong math: 1 + w."""
    k, eps, scalar = 128, 1e-6, 0.75

    def make():
        return [
            _half(rows, k, seed=1),
            _half(rows, k, seed=2),
            _half(k, seed=3, low=0.5),
            eps,
            scalar,
        ]

    def expect(args, plus_one=False):
        h, r = _rows(args[0])[0], _rows(args[1])[0]
        w = [v + float(plus_one) for v in args[2].double().tolist()]
        added = [(a + b) * scalar for a, b in zip(h, r, strict=True)]
        inv = _rms_inv(added, k, eps)
        normed = [v * inv * wk for v, wk in zip(added, w, strict=True)]
        return {0: _replace(args[0], 0, normed), 1: _replace(args[1], 0, added)}

    assert_checked(
        kernels.fused_scaled_add_rms_norm,
        make,
        expect,
        0,
        [lambda args: expect(args, plus_one=True)],
    )


def test_rms_norm_gated():
    """output = x * rsqrt(mean(x^2) + eps) * weight * silu(z), per row of V;
    returns output. Wrong math: sigmoid(z) as the gate; the norm taken
    after the gate."""
    rows, v, eps = 3, 128, 1e-6

    def make():
        return [
            _half(rows, v, seed=4),
            _half(rows, v, seed=5),
            _half(v, seed=6, low=0.5),
            torch.full((rows, v), -7.0, dtype=torch.float16),
            eps,
        ]

    def expect(args, gate=_silu, gate_first=False):
        x, z, w = _rows(args[0]), _rows(args[1]), args[2].double().tolist()
        out = []
        for xr, zr in zip(x, z, strict=True):
            gated = [a * gate(b) for a, b in zip(xr, zr, strict=True)]
            inv = _rms_inv(gated if gate_first else xr, v, eps)
            if gate_first:
                out += [g * inv * wk for g, wk in zip(gated, w, strict=True)]
            else:
                out += [
                    a * inv * wk * gate(b) for a, b, wk in zip(xr, zr, w, strict=True)
                ]
        return {3: _replace(args[3], 0, out)}

    def sigmoid(b):
        return 1.0 / (1.0 + math.exp(-b))

    assert_checked(
        kernels.rms_norm_gated,
        make,
        expect,
        3,
        [
            lambda args: expect(args, gate=sigmoid),
            lambda args: expect(args, gate_first=True),
        ],
    )


@pytest.mark.parametrize("k", [128, 96])
def test_norm_add_norm(k):
    """h1 <- rmsnorm(h2_raw, eps1) * w1 + h1; out <- rmsnorm(h1, eps2) * w2;
    returns nothing (`-> ()`). K = 96: the kernel walks K / 64 chunks of 64
    (norm_add_norm.h:119, host :175-178): the first 64 are summed and
    written, the sums divided by 96; h1[64:] and out[64:] stay. Wrong
    math: the second norm over h1 as it was."""
    eps1, eps2 = 1e-6, 1e-5
    walked = k - k % 64

    def make():
        return [
            _half(1, k, seed=7),
            _half(1, k, seed=8),
            _half(k, seed=9, low=0.5),
            _half(k, seed=10, low=0.5),
            torch.full((1, k), -7.0, dtype=torch.float16),
            eps1,
            eps2,
        ]

    def expect(args, stale_h1=False):
        h2, h1 = _rows(args[0])[0][:walked], _rows(args[1])[0][:walked]
        w1, w2 = args[2].double().tolist(), args[3].double().tolist()
        inv1 = _rms_inv(h2, k, eps1)
        new = [a * inv1 * w + b for a, b, w in zip(h2, h1, w1[:walked], strict=True)]
        second = h1 if stale_h1 else new
        inv2 = _rms_inv(second, k, eps2)
        out = [a * inv2 * w for a, w in zip(second, w2[:walked], strict=True)]
        return {1: _replace(args[1], 0, new), 4: _replace(args[4], 0, out)}

    assert_checked(
        kernels.norm_add_norm,
        make,
        expect,
        None,
        [lambda args: expect(args, stale_h1=True)],
    )


def test_norm_gemv_norm_fp16():
    """normed = rmsnorm(residual) (no weight); router_logits = (normed *
    scale_with_root) @ proj_w^T; moe_input = normed * pre_ff_w; returns
    nothing (`-> ()`). Wrong math: router logits without scale_with_root;
    moe_input with 1 + pre_ff_w."""
    n, k, eps = 6, 128, 1e-6

    def make():
        return [
            _half(1, k, seed=11),
            _half(k, seed=12, low=0.5),
            _half(n, k, seed=13, scale=0.2),
            _half(k, seed=14, low=0.5),
            torch.full((1, n), -7.0, dtype=torch.float16),
            torch.full((1, k), -7.0, dtype=torch.float16),
            eps,
        ]

    def expect(args, unscaled=False, plus_one=False):
        res = _rows(args[0])[0]
        swr, pre = args[1].double().tolist(), args[3].double().tolist()
        inv = _rms_inv(res, k, eps)
        normed = [v * inv for v in res]
        router_in = (
            normed if unscaled else [a * s for a, s in zip(normed, swr, strict=True)]
        )
        logits = _gemv(_rows(args[2]), router_in)
        moe = [a * (p + float(plus_one)) for a, p in zip(normed, pre, strict=True)]
        return {4: _replace(args[4], 0, logits), 5: _replace(args[5], 0, moe)}

    assert_checked(
        kernels.norm_gemv_norm_fp16,
        make,
        expect,
        None,
        [
            lambda args: expect(args, unscaled=True),
            lambda args: expect(args, plus_one=True),
        ],
    )


def test_gemv_fp16():
    """output[M, N] = input @ weight^T; returns output; refuses what its
    TORCH_CHECKs refuse (esimd_kernel.sycl:104-120). Wrong math: each
    weight row read backwards."""
    m, n, k = 2, 5, 64

    def make():
        return [
            _half(m, k, seed=15),
            _half(n, k, seed=16, scale=0.3),
            torch.full((m, n), -7.0, dtype=torch.float16),
        ]

    def expect(args, reversed_k=False):
        x, w = _rows(args[0]), _rows(args[1])
        if reversed_k:
            w = [row[::-1] for row in w]
        out = [v for row in x for v in _gemv(w, row)]
        return {2: _replace(args[2], 0, out)}

    assert_checked(
        kernels.gemv_fp16, make, expect, 2, [lambda args: expect(args, reversed_k=True)]
    )
    x, w, out = make()
    with pytest.raises(RuntimeError, match="input.scalar_type"):
        kernels.gemv_fp16(x.float(), w, out)
    with pytest.raises(RuntimeError, match="input.size.1. == K"):
        kernels.gemv_fp16(x[:, :32].contiguous(), w, out)
    with pytest.raises(RuntimeError, match="is_contiguous"):
        kernels.gemv_fp16(x, w, torch.empty(n, m, dtype=torch.float16).t())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_gemv_fp8_pert_fused2(dtype):
    """o0 = (input @ fp8(w0)^T) * s0 AND o1 = (input @ fp8(w1)^T) * s1, one
    launch (GEMV_fp8_pert_fused_host, fp8_GEMV_v2.h:475); returns o0
    (esimd_kernel.sycl:170). E4M3 subnormals read 0 (fp8_dequant,
    fp8_GEMV_v2.h:29: w0's row 0 is all subnormals, so o0[0] = 0). The
    control the brief names: a variant that writes only o0 fails
    (assert_checked's skipping, and spelt out below). Wrong math: the
    subnormals kept."""
    k, n0, n1 = 128, 6, 3

    def make():
        return [
            _half(1, k, seed=17, low=0.5),
            fp8_weight(n0, k, seed=18, dtype=dtype),
            torch.tensor([0.5]),
            torch.full((1, n0), -7.0, dtype=torch.float16),
            fp8_weight(n1, k, seed=19, dtype=dtype),
            torch.tensor([1.5]),
            torch.full((1, n1), -7.0, dtype=torch.float16),
        ]

    def expect(args, flush=True):
        x = _rows(args[0])[0]
        written = {}
        for w, s, o in ((1, 2, 3), (4, 5, 6)):
            scale = args[s].item()
            out = [v * scale for v in _gemv(fp8_values(args[w], flush), x)]
            written[o] = _replace(args[o], 0, out)
        return written

    wrong = [lambda args: expect(args, flush=False)]
    if dtype == torch.float8_e5m2:
        wrong = []  # E5M2's subnormals are too small to show at this K
    assert_checked(kernels.gemv_fp8_pert_fused2, make, expect, 3, wrong)

    def only_o0(*args):
        kept = args[6].clone()
        result = kernels.gemv_fp8_pert_fused2(*args)
        args[6].copy_(kept)
        return result

    with pytest.raises(AssertionError):
        verify(only_o0, make, expect, 3)


def test_gemv_int4():
    """output[n] = sum_k input[k] * (q[n, k] - 8) * scale[n, k // 128], q
    packed two to a byte, low nibble first (int4_GEMV.h:12-22); returns
    output. Wrong math: the other nibble order."""
    n, k = 5, 256
    q = _nibbles(n, k, seed=20)

    def make():
        return [
            _half(1, k, seed=21),
            pack_bytes(q),
            _int4_scales(n, k // 128, seed=22),
            torch.full((1, n), -7.0, dtype=torch.float16),
        ]

    def expect(args, nibbles=q):
        out = _gemv(dequant_int4(nibbles, args[2]), _rows(args[0])[0])
        return {3: _replace(args[3], 0, out)}

    assert_checked(
        kernels.gemv_int4, make, expect, 3, [lambda args: expect(args, swapped(q))]
    )


def test_gemv_int4_fused2():
    """gemv_int4 of w0 into o0 AND of w1 into o1, one launch
    (GEMV_int4_fused_host, int4_GEMV.h:415); returns o0
    (esimd_kernel.sycl:229). A variant that writes only o0 fails. Wrong
    math: the other nibble order."""
    n0, n1, k = 4, 2, 256
    q0, q1 = _nibbles(n0, k, seed=23), _nibbles(n1, k, seed=24)

    def make():
        return [
            _half(1, k, seed=25),
            pack_bytes(q0),
            _int4_scales(n0, k // 128, seed=26),
            torch.full((1, n0), -7.0, dtype=torch.float16),
            pack_bytes(q1),
            _int4_scales(n1, k // 128, seed=27),
            torch.full((1, n1), -7.0, dtype=torch.float16),
        ]

    def expect(args, order=lambda q: q):
        x = _rows(args[0])[0]
        return {
            3: _replace(args[3], 0, _gemv(dequant_int4(order(q0), args[2]), x)),
            6: _replace(args[6], 0, _gemv(dequant_int4(order(q1), args[5]), x)),
        }

    assert_checked(
        kernels.gemv_int4_fused2, make, expect, 3, [lambda args: expect(args, swapped)]
    )
    with pytest.raises(AssertionError):
        verify(skipping(kernels.gemv_int4_fused2, 6), make, expect, 3)


@pytest.mark.parametrize("m", [3, 66])
def test_gemm_int4_pgrp(m):
    """output[M, N] = input @ dequant(weight)^T (per-group scale, the
    weight in fp16); returns output; its TORCH_CHECKs
    (esimd_kernel_gemm.sycl:62-78). M = 66: the dispatch runs at most 8
    tiles of 8 rows (int4_GEMM.h:295, :303-318): rows 64 and 65 stay.
    Wrong math: the other nibble order."""
    n, k = 16, 256
    q = _nibbles(n, k, seed=28)
    written_rows = min(m, 64)

    def make():
        return [
            _half(m, k, seed=29),
            pack_bytes(q),
            _int4_scales(n, k // 128, seed=30),
            torch.full((m, n), -7.0, dtype=torch.float16),
        ]

    def expect(args, nibbles=q):
        w = torch.tensor(dequant_int4(nibbles, args[2]), dtype=torch.float64)
        out = args[0].double()[:written_rows] @ w.t()
        return {3: _replace(args[3], 0, out.view(-1).tolist())}

    assert_checked(
        kernels.gemm_int4_pgrp, make, expect, 3, [lambda args: expect(args, swapped(q))]
    )
    x, w, s, out = make()
    with pytest.raises(RuntimeError, match="N must be a multiple of 16"):
        kernels.gemm_int4_pgrp(x, w[:8], s[:8], out[:, :8])
    with pytest.raises(RuntimeError, match="K must be a multiple of 128"):
        kernels.gemm_int4_pgrp(x, w[:, :32].contiguous(), s, out)
    with pytest.raises(RuntimeError, match="weight must be uint8"):
        kernels.gemm_int4_pgrp(x, w.to(torch.int32), s, out)
    with pytest.raises(RuntimeError, match="weight_scale shape mismatch"):
        kernels.gemm_int4_pgrp(x, w, s[:, :1].contiguous(), out)


def test_moe_gelu_tanh_mul():
    """output[r] = gelu_tanh(input[r, :N_half]) * input[r, N_half:2 N_half]
    for r < total_rows; returns output. The buffer's fourth row is past
    total_rows: it stays. A gate of 20 (2z past the kernel's clamp of 30,
    moe_ops.h:717-719) is still gelu(20). Wrong math: gate and up swapped
    (GELU of the second half); silu. (erf's GELU is within fp16 of it.)"""
    rows, total, half = 4, 3, 64

    def make():
        x = _half(rows, 2 * half, seed=31, scale=2.0)
        x[0, 0] = 20.0
        return [
            x,
            torch.full((rows, half), -7.0, dtype=torch.float16),
            2 * half,
            half,
            total,
        ]

    def expect(args, act=_gelu_tanh, up_first=False):
        x = _rows(args[0])
        gate, up = (half, 0) if up_first else (0, half)
        out = [act(r[gate + j]) * r[up + j] for r in x[:total] for j in range(half)]
        return {1: _replace(args[1], 0, out)}

    assert_checked(
        kernels.moe_gelu_tanh_mul,
        make,
        expect,
        1,
        [
            lambda args: expect(args, up_first=True),
            lambda args: expect(args, _silu),
        ],
    )


def test_moe_topk():
    """Per row r < T: softmax of the 128 logits; the 8 largest, the lowest
    expert id first among equal ones; their values over their sum into
    top_values (fp16), their ids into top_indices (int32); returns
    top_values. Row 0 holds a tie (experts 70 and 3 equal: 3 first); the
    third row is past T: it stays. Wrong math: not renormalized; a tie
    taken by the higher id."""
    rows, t, experts, k = 3, 2, 128, 8

    def make():
        logits = _half(rows, experts, seed=41, scale=3.0)
        logits[0, 3] = logits[0, 70] = 9.0
        return [
            logits,
            torch.full((rows, k), -5.0, dtype=torch.float16),
            torch.full((rows, k), -1, dtype=torch.int32),
            t,
        ]

    def expect(args, renormalize=True, high_first=False):
        values, ids = [], []
        for row in _rows(args[0])[:t]:
            top = max(row)
            e = [math.exp(v - top) for v in row]
            p = [v / sum(e) for v in e]
            ranked = sorted(
                range(experts), key=lambda i: (-p[i], -i if high_first else i)
            )[:k]
            total = sum(p[i] for i in ranked) if renormalize else 1.0
            values += [p[i] / total for i in ranked]
            ids += ranked
        return {1: _replace(args[1], 0, values), 2: _replace(args[2], 0, ids)}

    assert_checked(
        kernels.moe_topk,
        make,
        expect,
        1,
        [
            lambda args: expect(args, renormalize=False),
            lambda args: expect(args, high_first=True),
        ],
    )


def _gated(x, z, w, heads, v, eps) -> list:
    """Each head's x * rsqrt(mean(x^2) + eps) * w * silu(z), flat."""
    y = []
    for xr, zr in zip(_rows(x)[:heads], _rows(z)[:heads], strict=True):
        inv = _rms_inv(xr, v, eps)
        y += [a * inv * wk * _silu(b) for a, b, wk in zip(xr, zr, w, strict=True)]
    return y


def test_norm_gemv_fp8_pert():
    """y = per-head gated norm of x (weight as given, silu(z)); output =
    (y @ fp8(gemv_weight)^T) * gemv_scale; returns output. Its E4M3
    decoding keeps subnormals (fp8_dequant_norm, norm_gemv_fused.h:40-47):
    row 0 (all subnormals) is not 0. gemv_scale must be fp32
    (data_ptr<float>()). Wrong math: subnormals flushed; the norm over all
    of K instead of each head."""
    hv, v, n, eps = 2, 128, 4, 1e-6

    def make():
        return [
            _half(hv, v, seed=32),
            _half(hv, v, seed=33),
            _half(v, seed=34, low=0.5),
            fp8_weight(n, hv * v, seed=35),
            torch.tensor([0.75]),
            torch.full((1, n), -7.0, dtype=torch.float16),
            hv,
            v,
            eps,
        ]

    def expect(args, flush=False, whole=False):
        w = args[2].double().tolist()
        if whole:
            x, z = _rows(args[0].view(1, -1))[0], _rows(args[1].view(1, -1))[0]
            inv = _rms_inv(x, hv * v, eps)
            y = [
                a * inv * w[i % v] * _silu(b)
                for i, (a, b) in enumerate(zip(x, z, strict=True))
            ]
        else:
            y = _gated(args[0], args[1], w, hv, v, eps)
        scale = args[4].item()
        out = [s * scale for s in _gemv(fp8_values(args[3], flush), y)]
        return {5: _replace(args[5], 0, out)}

    assert_checked(
        kernels.norm_gemv_fp8_pert,
        make,
        expect,
        5,
        [lambda args: expect(args, flush=True), lambda args: expect(args, whole=True)],
    )
    args = make()
    args[4] = args[4].half()
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Half"):
        kernels.norm_gemv_fp8_pert(*args)


@pytest.mark.parametrize("hv", [2, 12])
def test_norm_gemv_int4_pert(hv):
    """y = per-head gated norm; output[n] = sum_k y[k] * (q[n, k] - 8) *
    scale[n, head]; returns output; gemv_weight must be int32
    (data_ptr<int32_t>()), packed 8 to a word, low nibble first. HV = 12
    with N <= 512: 8 threads of HV // 8 = 1 head (norm_gemv_int4.h:84-86,
    host :182-187): heads 8..11 are not in the sum. Wrong math: the other
    nibble order."""
    v, n, eps = 128, 4, 1e-6
    k = hv * v
    walked = 8 if hv == 12 else hv
    q = _nibbles(n, k, seed=36)

    def make():
        return [
            _half(hv, v, seed=37),
            _half(hv, v, seed=38),
            _half(v, seed=39, low=0.5),
            pack_words(q),
            _int4_scales(n, k // 128, seed=40),
            torch.full((1, n), -7.0, dtype=torch.float16),
            hv,
            v,
            eps,
        ]

    def expect(args, nibbles=q):
        y = _gated(args[0], args[1], args[2].double().tolist(), walked, v, eps)
        weight = [row[: walked * v] for row in dequant_int4(nibbles, args[4])]
        return {5: _replace(args[5], 0, _gemv(weight, y))}

    assert_checked(
        kernels.norm_gemv_int4_pert,
        make,
        expect,
        5,
        [lambda args: expect(args, swapped(q))],
    )
    args = make()
    args[3] = pack_bytes(q)
    with pytest.raises(RuntimeError, match="expected scalar type Int but found Byte"):
        kernels.norm_gemv_int4_pert(*args)


def _resadd(args, walked, k, eps):
    """(h + r, the normed (h + r) * rsqrt(mean) * norm_weight) over the
    first `walked` of K, the mean dividing by K."""
    h, r = _rows(args[0])[0][:walked], _rows(args[1])[0][:walked]
    added = [a + b for a, b in zip(h, r, strict=True)]
    inv = _rms_inv(added, k, eps)
    w = args[2].double().tolist()[:walked]
    return added, [a * inv * wk for a, wk in zip(added, w, strict=True)]


def test_resadd_norm_gemv_fp8_pert():
    """residual <- h + r; normed_out <- rmsnorm(h + r) * norm_weight;
    output = (normed @ fp8(gemv_weight)^T) * gemv_scale, subnormals read 0
    (fp8_dequant_rng, resadd_norm_gemv_fused.h:29); hidden_states read
    only; returns output; gemv_scale must be fp32. Wrong math: 1 + w; the
    subnormals kept."""
    n, k, eps = 4, 128, 1e-6

    def make():
        return [
            _half(1, k, seed=41),
            _half(1, k, seed=42),
            _half(k, seed=43, low=0.5),
            fp8_weight(n, k, seed=44),
            torch.tensor([0.5]),
            torch.full((1, n), -7.0, dtype=torch.float16),
            torch.full((1, k), -7.0, dtype=torch.float16),
            eps,
        ]

    def expect(args, plus_one=False, flush=True):
        if plus_one:
            args = list(args)
            args[2] = args[2].double() + 1
        added, normed = _resadd(args, k, k, eps)
        scale = args[4].item()
        out = [s * scale for s in _gemv(fp8_values(args[3], flush), normed)]
        return {
            1: _replace(args[1], 0, added),
            5: _replace(args[5], 0, out),
            6: _replace(args[6], 0, normed),
        }

    assert_checked(
        kernels.resadd_norm_gemv_fp8_pert,
        make,
        expect,
        5,
        [
            lambda args: expect(args, plus_one=True),
            lambda args: expect(args, flush=False),
        ],
    )
    args = make()
    args[4] = args[4].half()
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Half"):
        kernels.resadd_norm_gemv_fp8_pert(*args)


@pytest.mark.parametrize("k", [256, 640])
def test_resadd_norm_gemv_int4_pert(k):
    """residual <- h + r; normed_out <- rmsnorm(h + r) * norm_weight;
    output[n] = sum_k normed[k] * (q[n, k] - 8) * scale[n, k // 128];
    hidden_states read only; returns output; gemv_weight must be int32.
    K = 640 with N = 4: one thread (640 % 256 != 0,
    resadd_norm_gemv_int4.h:498-503) of K / 512 chunks of 512 (:122-127):
    the first 512 are walked, residual[512:] and normed_out[512:] stay.
    Wrong math: the other nibble order."""
    n, eps = 4, 1e-6
    walked = 512 if k == 640 else k
    q = _nibbles(n, k, seed=45)

    def make():
        return [
            _half(1, k, seed=46),
            _half(1, k, seed=47),
            _half(k, seed=48, low=0.5),
            pack_words(q),
            _int4_scales(n, k // 128, seed=49),
            torch.full((1, n), -7.0, dtype=torch.float16),
            torch.full((1, k), -7.0, dtype=torch.float16),
            eps,
        ]

    def expect(args, nibbles=q):
        added, normed = _resadd(args, walked, k, eps)
        weight = [row[:walked] for row in dequant_int4(nibbles, args[4])]
        return {
            1: _replace(args[1], 0, added),
            5: _replace(args[5], 0, _gemv(weight, normed)),
            6: _replace(args[6], 0, normed),
        }

    assert_checked(
        kernels.resadd_norm_gemv_int4_pert,
        make,
        expect,
        5,
        [lambda args: expect(args, swapped(q))],
    )
    args = make()
    args[3] = pack_bytes(q)
    with pytest.raises(RuntimeError, match="expected scalar type Int but found Byte"):
        kernels.resadd_norm_gemv_int4_pert(*args)


# --- the table --------------------------------------------------------------

# Qwen3-Next's fused QKV split + q/k norm + RoPE (+ sigmoid gate) at decode:
# 25095b4 csrc/xpu/esimd_kernels/qkv_split_norm_rope.h, head dim 256


@pytest.mark.parametrize(
    "gated, rotary", [(True, 64), (False, 64), (True, 256)], ids=str
)
def test_qkv_split_norm_rope(gated, rotary):
    """Per token and 256-wide head of the packed projection: with the gate,
    heads [Q0, G0, Q1, G1, K0, V0]; without, [Q0, Q1, K0, V0]. Q and K:
    x * (w + 1) / sqrt(mean(x^2) + 1e-6), then rotated NeoX-style by the
    cache row of the token's position ([cos | sin], rotary/2 each): rotary
    64 turns the pairs (i, i + 32), i < 32, and leaves 64..255; rotary 256
    turns (i, i + 128). G: sigmoid; V: copied. The op returns nothing.
    Wrong math: GPT-J's pairs (2i, 2i + 1); the weight without + 1; the gate
    heads read as [Q0, Q1, G0, G1]."""
    tokens, q_heads, kv_heads, d, positions_max = 2, 2, 1, 256, 6
    heads = (2 * q_heads if gated else q_heads) + 2 * kv_heads

    def make():
        return [
            _half(tokens, heads * d, seed=70),
            torch.full((tokens, q_heads * d), -3.0, dtype=torch.float16),
            torch.full((tokens, q_heads * d), -3.0, dtype=torch.float16),
            torch.full((tokens, kv_heads * d), -3.0, dtype=torch.float16),
            torch.full((tokens, kv_heads * d), -3.0, dtype=torch.float16),
            _half(d, seed=71, scale=0.2),
            _half(d, seed=72, scale=0.2),
            torch.tensor([4, 1], dtype=torch.int32),
            q_heads,
            kv_heads,
            gated,
            rotary,
            _half(positions_max, rotary, seed=73, low=-1.0, scale=2.0),
        ]

    def expect(args, pairs="neox", plus_one=True, gate_last=False):
        qkv, wq, wk = _rows(args[0]), _rows(args[5]), _rows(args[6])
        cache, position = _rows(args[12]), args[7].tolist()
        out = {1: args[1].double().clone(), 3: args[3].double().clone()}
        out[4] = args[4].double().clone()
        if gated:
            out[2] = args[2].double().clone()

        def normed(x, w):
            inv = _rms_inv(x, d, 1e-6)
            return [
                a * inv * (b + 1.0 if plus_one else b)
                for a, b in zip(x, w, strict=True)
            ]

        def rotated(x, row):
            half = rotary // 2
            cos, sin = cache[row][:half], cache[row][half:]
            y = list(x)
            for i in range(half):
                if pairs == "neox":
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                y[a] = x[a] * cos[i] - x[b] * sin[i]
                y[b] = x[b] * cos[i] + x[a] * sin[i]
            return y

        for t in range(tokens):
            head = [qkv[t][h * d : (h + 1) * d] for h in range(heads)]
            if gated and not gate_last:
                q_in = [head[2 * i] for i in range(q_heads)]
                g_in = [head[2 * i + 1] for i in range(q_heads)]
            elif gated:
                q_in, g_in = head[:q_heads], head[q_heads : 2 * q_heads]
            else:
                q_in, g_in = head[:q_heads], []
            rest = head[2 * q_heads :] if gated else head[q_heads:]
            k_in, v_in = rest[:kv_heads], rest[kv_heads:]
            for i, x in enumerate(q_in):
                y = rotated(normed(x, wq), position[t])
                out[1][t, i * d : (i + 1) * d] = torch.tensor(y, dtype=torch.float64)
            for i, x in enumerate(g_in):
                y = [1.0 / (1.0 + math.exp(-a)) for a in x]
                out[2][t, i * d : (i + 1) * d] = torch.tensor(y, dtype=torch.float64)
            for i, x in enumerate(k_in):
                y = rotated(normed(x, wk), position[t])
                out[3][t, i * d : (i + 1) * d] = torch.tensor(y, dtype=torch.float64)
            for i, x in enumerate(v_in):
                out[4][t, i * d : (i + 1) * d] = torch.tensor(x, dtype=torch.float64)
        return out

    wrong = [
        lambda args: expect(args, pairs="gptj"),
        lambda args: expect(args, plus_one=False),
    ]
    if gated:
        wrong.append(lambda args: expect(args, gate_last=True))
    assert_checked(kernels.qkv_split_norm_rope, make, expect, None, wrong)


NEW = {
    "esimd_fused_scaled_add_rms_norm",
    "esimd_gemm_int4_pgrp",
    "esimd_gemv_fp16",
    "esimd_gemv_fp8_pert_fused2",
    "esimd_gemv_int4",
    "esimd_gemv_int4_fused2",
    "esimd_moe_gelu_tanh_mul",
    "esimd_moe_topk",
    "esimd_norm_add_norm",
    "esimd_norm_gemv_fp8_pert",
    "esimd_norm_gemv_int4_pert",
    "esimd_norm_gemv_norm_fp16",
    "esimd_resadd_norm_gemv_fp8_pert",
    "esimd_resadd_norm_gemv_int4_pert",
    "esimd_rms_norm_gated",
}


def test_each_reference_has_its_source():
    """The 15 are references, each with where its C++ is (file:line)."""
    assert set(kernels.REFERENCES) >= NEW
    assert set(kernels.SOURCES) == set(kernels.REFERENCES)
    for name in NEW:
        path, _, line = kernels.SOURCES[name].partition(":")
        assert path.startswith("csrc/xpu/esimd_kernel") and line.isdigit(), name


def test_each_takes_its_schemas_arguments_in_order():
    """Each reference's parameters are its op's schema's, in order
    (b18beee's schemas, data/esimd_schemas.toml); an op whose schema returns
    nothing is one whose reference returns None (the tests above)."""
    import inspect
    import tomllib

    from xpufakes.common import paths

    ops = tomllib.loads((paths.DATA / "esimd_schemas.toml").read_text())["b18beee"]
    for name in NEW:
        schema = ops["ops"][f"custom_esimd_kernels_vllm::{name}"]["schema"]
        params = schema.partition("(")[2].rpartition(") ->")[0].split(", ")
        names = [p.rpartition(" ")[2] for p in params]
        reference = kernels.REFERENCES[name]
        assert list(inspect.signature(reference).parameters) == names, name


def test_through_the_dispatcher():
    """Two of them as ops of a namespace of this test, with b18beee's
    schemas: `-> Tensor` (fused2: the value is o0 itself, o1 written too)
    and `-> ()` (norm_add_norm: h1 and out written, nothing returned)."""
    library = torch.library.Library("xpufakes_test_esimd_references", "FRAGMENT")
    try:
        library.define(
            "esimd_gemv_int4_fused2(Tensor input, Tensor w0, Tensor s0, "
            "Tensor o0, Tensor w1, Tensor s1, Tensor o1) -> Tensor"
        )
        library.impl("esimd_gemv_int4_fused2", kernels.gemv_int4_fused2, "CPU")
        library.define(
            "esimd_norm_add_norm(Tensor h2_raw, Tensor h1, Tensor w1, Tensor w2, "
            "Tensor out, float eps1, float eps2) -> ()"
        )
        library.impl("esimd_norm_add_norm", kernels.norm_add_norm, "CPU")
        ops = torch.ops.xpufakes_test_esimd_references
        q = _nibbles(4, 128, seed=50)
        x, w, s = _half(1, 128, seed=51), pack_bytes(q), _int4_scales(4, 1, seed=52)
        o0, o1 = torch.zeros(1, 4).half(), torch.zeros(1, 4).half()
        assert ops.esimd_gemv_int4_fused2(x, w, s, o0, w, s, o1) is o0
        expected = _gemv(dequant_int4(q, s), _rows(x)[0])
        for out in (o0, o1):
            torch.testing.assert_close(
                out.double(), torch.tensor([expected], dtype=torch.float64), **TOLERANCE
            )
        h2, h1 = _half(1, 64, seed=53), _half(1, 64, seed=54)
        h1_was, weight = h1.clone(), torch.ones(64, dtype=torch.float16)
        out = torch.zeros(1, 64, dtype=torch.float16)
        assert ops.esimd_norm_add_norm(h2, h1, weight, weight, out, 1e-6, 1e-6) is None
        assert not torch.equal(h1, h1_was) and out.abs().sum() > 0
    finally:
        library._destroy()
