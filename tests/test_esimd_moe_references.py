"""The CPU reference kernels of llm-scaler 25095b4's MoE ops (proof/xpu/
esimd_moe_kernels.py, registered in esimd_kernels.REFERENCES): Qwen3-Next's
moe_forward_full / _v2 and Gemma 4's grouped fp8 path
(moe_prefill_gather_forward_v2, moe_up_fp8_grouped, moe_down_fp8_grouped,
moe_forward_full_fp8_grouped), each against its math written out here on
its own: loops over tiny shapes in float64, fp8 through torch's own float8
conversion (subnormals read 0, as the kernels' decoders flush them),
softmax and sorting by hand. A check compares the returned tensor (dtype,
shape, values) and asserts every argument bitwise as it was. Each check is
shown able to fail: the same check against known-wrong math (gate and up
swapped, no renormalization, the shared expert's gate left out, the other
fp8 decoder, silu for gelu_tanh, rows in the gathered order rather than by
pair, the routing weight left out, end offsets for start offsets, ...)
fails. The fp16 roundings inside the kernels (the shared expert's fp16
products, the grouped ops' fp16 accumulator, v2's fp16 shared row) are
below the tolerance: moe_forward_full and _v2 pass the same check."""

import math

import pytest
import torch

from xpufakes.proof.xpu import esimd_kernels
from xpufakes.proof.xpu import esimd_moe_kernels as moe

TOLERANCE = {"rtol": 4e-3, "atol": 4e-3}  # fp16 results vs float64 math


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def check(kernel, args, expected) -> None:
    """kernel(*args) returns a new fp16 tensor holding `expected` (float64,
    within TOLERANCE); no argument is written."""
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    out = kernel(*args)
    for index, (arg, was) in enumerate(zip(args, before, strict=True)):
        if isinstance(arg, torch.Tensor):
            assert torch.equal(_bits(arg), _bits(was)), f"argument {index} written"
    assert all(out is not a for a in args), "returns an argument"
    assert out.dtype == torch.float16, out.dtype
    assert tuple(out.shape) == tuple(expected.shape), (out.shape, expected.shape)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)


def check_controls(kernel, args, expect, wrongs) -> None:
    """check passes with expect(); fails with each of wrongs (keyword
    arguments of expect giving known-wrong math)."""
    check(kernel, args, expect())
    for wrong in wrongs:
        with pytest.raises(AssertionError):
            check(kernel, args, expect(**wrong))


# --- the math written out -------------------------------------------------

SMALLEST_NORMAL = {torch.float8_e4m3fn: 2.0**-6, torch.float8_e5m2: 2.0**-14}


def fp8(shape, seed: int, dtype=torch.float8_e4m3fn, scale=1.0) -> torch.Tensor:
    values = torch.randn(*shape, generator=_gen(seed)).clamp(-3, 3) * scale
    return values.to(dtype)


def decoded(weight: torch.Tensor, dtype: torch.dtype) -> list:
    """float64 nested lists of the weight's bytes read as `dtype` (torch's
    conversion), subnormals 0."""
    values = weight.view(torch.uint8).view(dtype).double()
    small = values.abs() < SMALLEST_NORMAL[dtype]
    return torch.where(small, torch.zeros_like(values), values).tolist()


def _dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _silu(v: float) -> float:
    return v / (1.0 + math.exp(-v))


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


def _softmax(row) -> list:
    top = max(row)
    e = [math.exp(v - top) for v in row]
    return [v / sum(e) for v in e]


def _choose(probs, top_k, lowest_on_tie=True) -> list:
    """the top_k expert ids, largest first, the lowest id among equals."""
    sign = 1 if lowest_on_tie else -1
    return sorted(range(len(probs)), key=lambda e: (-probs[e], sign * e))[:top_k]


# --- moe_forward_full / _v2 -------------------------------------------------


def _moe_args(config, dtype, seed=0, tie=False):
    t, h, i, n_experts, top_k, shared = config
    g = _gen(seed)
    x = (torch.randn(t, h, generator=g) * 0.5).half()
    logits = torch.randn(t, n_experts, generator=g).half()
    if tie:  # 10 experts tied at the top, more than top_k
        logits.fill_(-4.0)
        logits[:, 3:33:3] = 2.0
    weight_dtype = torch.uint8 if dtype == "uint8" else dtype
    fp8_dtype = torch.float8_e5m2 if dtype == "uint8" else dtype

    def weight(shape, s):
        w = fp8(shape, s, fp8_dtype)
        return w.view(torch.uint8) if weight_dtype == torch.uint8 else w

    def scales(n, s):
        return torch.rand(n, generator=_gen(s)) * 0.1 + 0.1

    return [
        x,
        logits,
        weight((n_experts, h, 2 * i), seed + 1),
        scales(n_experts, seed + 2),
        weight((shared, 2 * i, h), seed + 3),
        scales(shared, seed + 4),
        weight((n_experts, i, h), seed + 5),
        scales(n_experts, seed + 6),
        weight((shared, h, i), seed + 7),
        scales(shared, seed + 8),
        (torch.randn(shared, h, generator=g) * 0.3).half(),
        top_k,
        shared,
        n_experts,
    ]


def moe_full_math(
    args,
    decode,
    swap=False,
    renormalize=True,
    shared_gate=True,
    lowest_on_tie=True,
) -> torch.Tensor:
    """float64 [T, H]: routed experts (gate_up [E, H, 2I]: gate columns
    first) and shared ones (gate_up [S, 2I, H], down [S, H, I]), silu(gate)
    * up, the shared expert times sigmoid(x . gate_weight)."""
    (x, logits, gu, gus, sgu, sgus, d, ds, sd, sds, sgw, top_k, shared, _) = args
    xs, lg = x.double().tolist(), logits.double().tolist()
    gu, sgu, d, sd = (decoded(w, decode) for w in (gu, sgu, d, sd))
    gus, sgus, ds, sds = (s.double().tolist() for s in (gus, sgus, ds, sds))
    sgw = sgw.double().tolist()
    h, i = len(xs[0]), len(d[0])
    first, second = (
        (slice(i, 2 * i), slice(0, i)) if swap else (slice(0, i), slice(i, 2 * i))
    )
    out = []
    for t, xt in enumerate(xs):
        probs = _softmax(lg[t])
        chosen = _choose(probs, top_k, lowest_on_tie)
        total = sum(probs[e] for e in chosen) if renormalize else 1.0
        y = [0.0] * h
        for e in chosen:
            w = probs[e] / total
            cols = list(zip(*gu[e], strict=True))  # [2I][H]
            gate = [_dot(xt, c) * gus[e] for c in cols[first]]
            up = [_dot(xt, c) * gus[e] for c in cols[second]]
            act = [_silu(a) * b for a, b in zip(gate, up, strict=True)]
            for j in range(h):
                y[j] += w * ds[e] * sum(act[n] * d[e][n][j] for n in range(i))
        for s in range(shared):
            rows = sgu[s]  # [2I][H]
            gate = [_dot(xt, r) * sgus[s] for r in rows[first]]
            up = [_dot(xt, r) * sgus[s] for r in rows[second]]
            act = [_silu(a) * b for a, b in zip(gate, up, strict=True)]
            g = _sigmoid(_dot(xt, sgw[s])) if shared_gate else 1.0
            for j in range(h):
                y[j] += g * sds[s] * _dot(act, sd[s][j])
        out.append(y)
    return torch.tensor(out, dtype=torch.float64)


# (T, H, I, n_routed_experts, top_k, shared): 128/8 takes moe_topk_v2_host,
# 32/4 the heap fallback (moe.sycl:1276-1299)
MOE_CONFIGS = {"v2_topk": (2, 64, 64, 128, 8, 1), "heap_topk": (2, 64, 64, 32, 4, 1)}


@pytest.mark.parametrize("op", ["moe_forward_full", "moe_forward_full_v2"])
@pytest.mark.parametrize("config", sorted(MOE_CONFIGS))
def test_moe_forward_full(op, config):
    """Softmax, top_k, renormalized; silu(gate) * up of gate_up [E, H, 2I]
    (gate first) and per-expert scales; the shared expert times its sigmoid
    gate; e4m3 weights. Wrong math: gate and up swapped; no
    renormalization; the shared gate left out."""
    kernel = esimd_kernels.REFERENCES[op]
    args = _moe_args(MOE_CONFIGS[config], torch.float8_e4m3fn)

    def expect(**wrong):
        return moe_full_math(args, torch.float8_e4m3fn, **wrong)

    check_controls(
        kernel,
        args,
        expect,
        [{"swap": True}, {"renormalize": False}, {"shared_gate": False}],
    )


@pytest.mark.parametrize("op", ["moe_forward_full", "moe_forward_full_v2"])
@pytest.mark.parametrize("dtype", [torch.float8_e5m2, "uint8"])
def test_moe_forward_full_decodes_by_the_gate_up_dtype(op, dtype):
    """The decoder is gate_up_weight's dtype: E4M3 only for float8_e4m3fn,
    E5M2 for float8_e5m2 and for uint8 bytes (moe.sycl:1880). Wrong math:
    the bytes read as E4M3."""
    kernel = esimd_kernels.REFERENCES[op]
    args = _moe_args(MOE_CONFIGS["v2_topk"], dtype, seed=10)

    def expect(decode=torch.float8_e5m2):
        return moe_full_math(args, decode)

    check_controls(kernel, args, expect, [{"decode": torch.float8_e4m3fn}])


@pytest.mark.parametrize("config", sorted(MOE_CONFIGS))
def test_moe_forward_full_ties_go_to_the_lowest_expert(config):
    """10 experts tied at the top, more than top_k: the lowest ids win
    (chunk_argmax_and_zero, moe_ops.h:77-104; the heap replaces only on a
    larger score, moe_topk.h:71). Wrong math: the highest ids."""
    kernel = moe.moe_forward_full
    args = _moe_args(MOE_CONFIGS[config], torch.float8_e4m3fn, seed=20, tie=True)

    def expect(**wrong):
        return moe_full_math(args, torch.float8_e4m3fn, **wrong)

    check_controls(kernel, args, expect, [{"lowest_on_tie": False}])


def test_moe_forward_full_refuses_what_the_cpp_refuses():
    args = _moe_args(MOE_CONFIGS["heap_topk"], torch.float8_e4m3fn)
    bad_x = [args[0].float()] + args[1:]
    with pytest.raises(RuntimeError, match="kHalf"):
        moe.moe_forward_full(*bad_x)
    bad_scale = args[:3] + [args[3].half()] + args[4:]
    with pytest.raises(RuntimeError, match="expected scalar type Float"):
        moe.moe_forward_full_v2(*bad_scale)


# --- the grouped fp8 path (Gemma 4) -----------------------------------------


def gather_math(ids, n_experts, end_offsets=False, token_index=False, descending=False):
    """[offsets, tokens, pair_to_perm, counts] as int32 tensors: the pairs
    p = t * top_k + k of each expert, ascending, experts in order."""
    flat = [e for row in ids.tolist() for e in row]
    top_k = ids.size(1)
    counts = [flat.count(e) for e in range(n_experts)]
    offsets, running = [], 0
    for c in counts:
        running += c
        offsets.append(running if end_offsets else running - c)
    tokens = []
    for e in range(n_experts):
        pairs = [p for p, v in enumerate(flat) if v == e]
        tokens += sorted(pairs, reverse=descending)
    perm = [0] * len(flat)
    for slot, p in enumerate(tokens):
        perm[p] = slot
    if token_index:
        tokens = [p // top_k for p in tokens]
    return [torch.tensor(v, dtype=torch.int32) for v in (offsets, tokens, perm, counts)]


def _selected(t, top_k, n_experts, seed) -> torch.Tensor:
    """[T, top_k] int32, distinct experts per token, expert 0 unused."""
    g = _gen(seed)
    rows = [torch.randperm(n_experts - 1, generator=g)[:top_k] + 1 for _ in range(t)]
    return torch.stack(rows).to(torch.int32)


def check_gather(ids, n_experts, expected):
    out = esimd_kernels.REFERENCES["moe_prefill_gather_forward_v2"](ids, n_experts)
    assert isinstance(out, list) and len(out) == 4
    for got, want in zip(out, expected, strict=True):
        assert got.dtype == torch.int32
        assert torch.equal(got, want), (got, want)


def test_gather_groups_pairs_by_expert():
    """expert_offsets: exclusive prefix sums of the counts; expert_tokens:
    the pair indices (t * top_k + k), expert by expert (ascending within
    one: the C++'s order there is its atomics', unspecified); pair_to_perm:
    the inverse; rows_for_experts: the counts (moe_prefill_int4.sycl:41).
    Wrong math: end offsets; token indices; pair_to_perm = expert_tokens;
    descending within an expert."""
    ids = _selected(5, 3, 6, seed=1)
    check_gather(ids, 6, gather_math(ids, 6))
    wrong = [
        gather_math(ids, 6, end_offsets=True),
        gather_math(ids, 6, token_index=True),
        gather_math(ids, 6, descending=True),
    ]
    right = gather_math(ids, 6)
    wrong.append([right[0], right[1], right[1], right[3]])
    assert not torch.equal(right[1], right[2])  # the control differs
    for expected in wrong:
        with pytest.raises(AssertionError):
            check_gather(ids, 6, expected)


def test_gather_refuses_what_the_cpp_refuses():
    gather = moe.moe_prefill_gather_forward_v2
    with pytest.raises(RuntimeError, match="kInt32"):
        gather(_selected(2, 2, 4, seed=2).long(), 4)
    with pytest.raises(RuntimeError, match="dim"):
        gather(_selected(2, 2, 4, seed=2).view(-1), 4)


# (T, H, I, E, top_k)
GROUPED = (5, 32, 16, 6, 3)


def _grouped_inputs(seed=0, as_uint8=True):
    t, h, i, n_experts, top_k = GROUPED
    g = _gen(seed)
    ids = _selected(t, top_k, n_experts, seed)
    offsets, tokens, _, _ = moe.moe_prefill_gather_forward_v2(ids, n_experts)
    gu = fp8((n_experts, 2 * i, h), seed + 1)
    d = fp8((n_experts, h, i), seed + 2)
    if as_uint8:  # as Gemma 4 passes them (gemma4.py _forward_grouped)
        gu, d = gu.view(torch.uint8), d.view(torch.uint8)
    return {
        "ids": ids,
        "x": (torch.randn(t, h, generator=g) * 0.5).half(),
        "gu": gu,
        "gus": torch.rand(n_experts, generator=g) * 0.2 + 0.2,
        "d": d,
        "ds": torch.rand(n_experts, generator=g) * 0.2 + 0.2,
        "rw": (torch.rand(t * top_k, generator=g) + 0.2).half(),
        "inter": (torch.randn(t * top_k, i, generator=g)).half(),
        "offsets": offsets,
        "tokens": tokens,
    }


def up_math(
    v, swap=False, act=_gelu_tanh, decode=torch.float8_e4m3fn, slot_order=False
) -> torch.Tensor:
    """float64 [T * top_k, I]: row p = act(gate) * up for the token p //
    top_k and its expert; gate_up [E, 2I, H], gate rows first."""
    t, h, i, n_experts, top_k = GROUPED
    xs, gu, s = v["x"].double().tolist(), decoded(v["gu"], decode), v["gus"].tolist()
    flat = [e for row in v["ids"].tolist() for e in row]
    gate_rows, up_rows = (
        (range(i, 2 * i), range(i)) if swap else (range(i), range(i, 2 * i))
    )
    rows = []
    for p, e in enumerate(flat):
        xt = xs[p // top_k]
        gate = [s[e] * _dot(xt, gu[e][n]) for n in gate_rows]
        up = [s[e] * _dot(xt, gu[e][n]) for n in up_rows]
        rows.append([act(a) * b for a, b in zip(gate, up, strict=True)])
    out = torch.tensor(rows, dtype=torch.float64)
    return out[v["tokens"].long()] if slot_order else out


def down_math(v, weighted=True, slot_order=False) -> torch.Tensor:
    """float64 [T * top_k, H]: row p = rw[p] * ds[e] * D_e [H, I] @
    inter[p]."""
    t, h, i, n_experts, top_k = GROUPED
    d, s = decoded(v["d"], torch.float8_e4m3fn), v["ds"].tolist()
    inter, rw = v["inter"].double().tolist(), v["rw"].double().tolist()
    flat = [e for row in v["ids"].tolist() for e in row]
    rows = []
    for p, e in enumerate(flat):
        w = (rw[p] if weighted else 1.0) * s[e]
        rows.append([w * _dot(d[e][j], inter[p]) for j in range(h)])
    out = torch.tensor(rows, dtype=torch.float64)
    return out[v["tokens"].long()] if slot_order else out


def _up_args(v):
    top_k, n_experts = GROUPED[4], GROUPED[3]
    return [v["x"], v["gu"], v["gus"], v["offsets"], v["tokens"], top_k, n_experts]


def _down_args(v):
    top_k, n_experts = GROUPED[4], GROUPED[3]
    return [
        v["inter"],
        v["d"],
        v["ds"],
        v["rw"],
        v["offsets"],
        v["tokens"],
        top_k,
        n_experts,
    ]


@pytest.mark.parametrize("as_uint8", [True, False])
def test_moe_up_fp8_grouped(as_uint8):
    """Row p (pair-indexed) = gelu_tanh(gate) * up of x[p // top_k] and its
    expert's gate_up [E, 2I, H] (gate rows first) times scale[e]; E4M3
    whatever the dtype (moe_fp8_grouped.h:111-241). Wrong math: gate and up
    swapped; silu; the bytes read as E5M2; rows in the gathered order."""
    v = _grouped_inputs(seed=3, as_uint8=as_uint8)
    kernel = esimd_kernels.REFERENCES["moe_up_fp8_grouped"]
    wrongs = [
        {"swap": True},
        {"act": _silu},
        {"decode": torch.float8_e5m2},
        {"slot_order": True},
    ]
    check_controls(kernel, _up_args(v), lambda **w: up_math(v, **w), wrongs)


def test_moe_down_fp8_grouped():
    """Row p (pair-indexed, what the caller's view(M, top_k, H).sum(1)
    needs) = rw[p] * scale[e] * D_e [H, I] @ intermediate[p]
    (moe_fp8_grouped.h:249-333). Wrong math: the routing weight left out;
    rows in the gathered order."""
    v = _grouped_inputs(seed=4)
    kernel = esimd_kernels.REFERENCES["moe_down_fp8_grouped"]
    wrongs = [{"weighted": False}, {"slot_order": True}]
    check_controls(kernel, _down_args(v), lambda **w: down_math(v, **w), wrongs)


def test_moe_forward_full_fp8_grouped():
    """up, down, each token's top_k rows summed (moe_fp8_grouped.h:471).
    Wrong math: the routing weight left out; gate and up swapped."""
    v = _grouped_inputs(seed=5)
    t, h, i, n_experts, top_k = GROUPED
    kernel = esimd_kernels.REFERENCES["moe_forward_full_fp8_grouped"]
    args = [
        v["x"],
        v["gu"],
        v["gus"],
        v["d"],
        v["ds"],
        v["rw"],
        v["offsets"],
        v["tokens"],
        top_k,
        n_experts,
    ]

    def expect(weighted=True, swap=False):
        inter = moe.moe_up_fp8_grouped(*_up_args(v))
        torch.testing.assert_close(inter.double(), up_math(v), **TOLERANCE)
        v2 = dict(v, inter=up_math(v, swap=swap).half())
        return down_math(v2, weighted=weighted).view(t, top_k, h).sum(1)

    check_controls(kernel, args, expect, [{"weighted": False}, {"swap": True}])


def test_grouped_rows_do_not_depend_on_the_order_within_an_expert():
    """The gather's order within an expert is unspecified (atomics): the
    grouped ops give the same rows, bitwise, for any order there."""
    v = _grouped_inputs(seed=6)
    offsets = v["offsets"].tolist() + [v["tokens"].numel()]
    shuffled = v["tokens"].clone()
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        shuffled[start:end] = shuffled[start:end].flip(0)
    assert not torch.equal(shuffled, v["tokens"])
    other = dict(v, tokens=shuffled)
    up = moe.moe_up_fp8_grouped
    down = moe.moe_down_fp8_grouped
    assert torch.equal(up(*_up_args(v)), up(*_up_args(other)))
    assert torch.equal(down(*_down_args(v)), down(*_down_args(other)))


def test_grouped_refuse_what_the_cpp_refuses():
    v = _grouped_inputs(seed=7)
    args = _up_args(v)
    with pytest.raises(RuntimeError, match="kHalf"):
        moe.moe_up_fp8_grouped(args[0].float(), *args[1:])
    with pytest.raises(RuntimeError, match="expected scalar type Float"):
        moe.moe_up_fp8_grouped(args[0], args[1], args[2].double(), *args[3:])
    args = _down_args(v)
    with pytest.raises(RuntimeError, match="kHalf"):
        moe.moe_down_fp8_grouped(args[0].float(), *args[1:])
    with pytest.raises(RuntimeError, match="expected scalar type Int"):
        moe.moe_down_fp8_grouped(*args[:4], args[4].long(), *args[5:])


def test_the_stand_ins_find_them():
    """esimd.py looks a reference up by the op's name without namespace."""
    for name in moe.SOURCES:
        assert esimd_kernels.REFERENCES[name].__module__ == moe.__name__
        assert esimd_kernels.SOURCES[name] == moe.SOURCES[name]
