"""The CPU reference kernels of llm-scaler 25095b4's MoE ops (proof/xpu/
esimd_moe_kernels.py, registered in esimd_kernels.REFERENCES): Qwen3-Next's
moe_forward_full / _v2, Gemma 4's grouped fp8 path
(moe_prefill_gather_forward_v2, moe_up_fp8_grouped, moe_down_fp8_grouped,
moe_forward_full_fp8_grouped), its per-route fp8 ops
(moe_forward_full_gelu_tanh, _routed, _routed_no_accum, _routed_decode,
_decode) and moe_topk, each against its math written out here on its own:
loops over tiny shapes in float64, fp8 through torch's own float8
conversion (subnormals read 0 where the kernels' decoders flush them,
kept for the decode GEMVs, which read them),
softmax and sorting by hand. A check compares the returned tensor (dtype,
shape, values) and asserts every argument bitwise as it was. Each check is
shown able to fail: the same check against known-wrong math (gate and up
swapped, no renormalization, the shared expert's gate left out, the other
fp8 decoder, silu for gelu_tanh, rows in the gathered order rather than by
pair, the routing weight left out, end offsets for start offsets, no
per_expert_scale, sorted ids where the heap keeps slots, subnormal weights
read where they are flushed and the other way, the whole sums where the
decode GEMVs leave tails out, ...) fails. The fp16 roundings inside the
kernels (the shared expert's fp16 products, the grouped ops' fp16
accumulator, v2's fp16 shared row) are below the tolerance:
moe_forward_full and _v2 pass the same check."""

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


# --- moe_topk (moe_ops::moe_topk) -------------------------------------------


def check_topk(logits, top_k, norm, ids, weights) -> None:
    """moe_topk returns new (ids int32 [n, top_k] equal to `ids`, weights
    fp16 [n, top_k] holding `weights` within TOLERANCE); logits unwritten."""
    before = logits.clone()
    out = esimd_kernels.REFERENCES["moe_topk"](logits, top_k, norm)
    assert torch.equal(_bits(logits), _bits(before)), "logits written"
    assert isinstance(out, tuple) and len(out) == 2
    got_ids, got_weights = out
    assert got_ids.dtype == torch.int32 and got_weights.dtype == torch.float16
    assert got_ids.shape == got_weights.shape == (logits.size(0), top_k)
    assert got_ids.is_contiguous() and got_weights.is_contiguous()
    assert torch.equal(got_ids, torch.tensor(ids, dtype=torch.int32)), (got_ids, ids)
    expected = torch.tensor(weights, dtype=torch.float64)
    torch.testing.assert_close(got_weights.double(), expected, **TOLERANCE)


def topk_math(logits, top_k, norm, order="rank", lowest_on_tie=True):
    """(ids, weights) as lists: the top_k of the softmax, renormalized with
    `norm`. order "rank": largest first; "heap": the slots of a heap seeded
    with experts 0..top_k-1, a larger newcomer taking the slot of the
    current smallest (the lowest such slot)."""
    all_ids, all_weights = [], []
    for row in logits.double().tolist():
        probs = _softmax(row)
        if order == "rank":
            ids = _choose(probs, top_k, lowest_on_tie)
        else:
            ids = list(range(top_k))
            for e in range(top_k, len(probs)):
                low = min(probs[s] for s in ids)
                if probs[e] > low:
                    ids[[probs[s] for s in ids].index(low)] = e
        total = sum(probs[e] for e in ids) if norm else 1.0
        all_ids.append(ids)
        all_weights.append([probs[e] / total for e in ids])
    return all_ids, all_weights


def _spaced_logits(n_tokens, n_experts, seed) -> torch.Tensor:
    """fp16 logits 8 / n_experts apart, spanning 8 (a permutation per
    token): every softmax score a distinct normal fp16, even after the heap
    path's fp16 softmax (no ties there that float64 would not see)."""
    g = _gen(seed)
    step = 8.0 / n_experts
    rows = [
        torch.randperm(n_experts, generator=g) * step - 4.0 for _ in range(n_tokens)
    ]
    return torch.stack(rows).half()


def test_moe_topk_v2_ranks_and_renormalizes():
    """norm with 128 experts, top 8 (Gemma 4's): the V2 kernel, ids largest
    first, weights renormalized (moe.sycl:1276-1293, moe_ops.h:106-216).
    Wrong math: no renormalization; the ids in heap-slot order."""
    logits = (torch.randn(3, 128, generator=_gen(30)) * 2).half()
    check_topk(logits, 8, True, *topk_math(logits, 8, True))
    for wrong in ({"norm": False}, {"order": "heap"}):
        ids, weights = topk_math(logits, 8, **{"norm": True, **wrong})
        with pytest.raises(AssertionError):
            check_topk(logits, 8, True, ids, weights)


def test_moe_topk_v2_ties_go_to_the_lowest_expert():
    """10 experts tied at the top, more than top_k: the lowest ids, in
    ascending order (chunk_argmax_and_zero). Wrong math: the highest."""
    logits = torch.full((1, 128), -4.0).half()
    logits[0, 5:125:12] = 2.0  # 10 tied, across both chunks of 64
    check_topk(logits, 8, True, *topk_math(logits, 8, True))
    with pytest.raises(AssertionError):
        check_topk(logits, 8, True, *topk_math(logits, 8, True, lowest_on_tie=False))


@pytest.mark.parametrize(
    ("shape", "norm"), [((32, 4), True), ((32, 4), False), ((128, 8), False)]
)
def test_moe_topk_heap_keeps_slot_order(shape, norm):
    """The heap (moe_topk.h:11-105): any shape without norm, and those not
    in TOPK_V2 with it: ids in heap-slot order, not sorted; the weights
    renormalized only with norm. Wrong math: sorted ids; the other norm."""
    n_experts, top_k = shape
    assert not (norm and shape in moe.TOPK_V2)  # those take the V2 kernel
    logits = _spaced_logits(2, n_experts, seed=31)
    expected = topk_math(logits, top_k, norm, order="heap")
    assert expected[0] != topk_math(logits, top_k, norm)[0]  # the control differs
    check_topk(logits, top_k, norm, *expected)
    for wrong in ({"order": "rank"}, {"norm": not norm, "order": "heap"}):
        ids, weights = topk_math(logits, top_k, **{"norm": norm, **wrong})
        with pytest.raises(AssertionError):
            check_topk(logits, top_k, norm, ids, weights)


def test_moe_topk_refuses_what_the_cpp_refuses():
    logits = _spaced_logits(2, 32, seed=32)
    with pytest.raises(RuntimeError, match="dim"):
        moe.moe_topk(logits.view(-1), 4, True)
    with pytest.raises(RuntimeError, match="kHalf"):
        moe.moe_topk(logits.float(), 4, True)
    with pytest.raises(RuntimeError, match="% 16"):
        moe.moe_topk(logits[:, :24].contiguous(), 4, True)
    with pytest.raises(RuntimeError, match="top_k <= 32"):
        moe.moe_topk(logits, 33, False)


# --- Gemma 4's per-route fp8 MoE (moe_forward_full_gelu_tanh*) ---------------


def decoded_e4m3(weight: torch.Tensor, subnormals: bool) -> list:
    """float64 nested lists of E4M3 bytes by torch's conversion, the
    subnormals kept or read 0."""
    if not subnormals:
        return decoded(weight, torch.float8_e4m3fn)
    return weight.view(torch.uint8).view(torch.float8_e4m3fn).double().tolist()


def gelu_rows_math(
    v,
    ids,
    weights,
    subnormals,
    kh=None,
    ki=None,
    act=_gelu_tanh,
    swap=False,
) -> torch.Tensor:
    """float64 [T * top_k, H]: route r (token r // top_k, expert ids[r],
    weight weights[r]) = weight * ds[e] * D_e [H, I] @ (act(gate) * up),
    gate and up = gus[e] * (rows 0..I-1 and I..2I-1 of gate_up [E, 2I, H])
    @ x; only the first kh of H and ki of I taken."""
    xs = v["x"].double().tolist()
    h, i = len(xs[0]), v["gu"].size(1) // 2
    kh, ki = kh or h, ki or i
    top_k = len(ids) // len(xs)
    gus, ds = v["gus"].tolist(), v["ds"].tolist()
    gate_rows, up_rows = (
        (range(i, 2 * i), range(i)) if swap else (range(i), range(i, 2 * i))
    )
    rows = []
    for r, e in enumerate(ids):
        gu = decoded_e4m3(v["gu"][e], subnormals)
        d = decoded_e4m3(v["d"][e], subnormals)
        xt = xs[r // top_k][:kh]
        gate = [gus[e] * _dot(xt, gu[n][:kh]) for n in gate_rows]
        up = [gus[e] * _dot(xt, gu[n][:kh]) for n in up_rows]
        inter = [act(a) * b for a, b in zip(gate, up, strict=True)][:ki]
        rows.append([weights[r] * ds[e] * _dot(inter, d[j][:ki]) for j in range(h)])
    return torch.tensor(rows, dtype=torch.float64)


def per_token(rows: torch.Tensor, top_k: int) -> torch.Tensor:
    return rows.view(-1, top_k, rows.size(1)).sum(1)


def _gelu_inputs(t, h, i, n_experts, seed, weight_scale=1.0, scale=0.1):
    """x, logits, gate_up [E, 2I, H] and down [E, H, I] fp8 e4m3 (as Gemma
    4 passes them: w13_weight, w2_weight), per-expert scales [E] fp32,
    per_expert_scale [E] fp32."""
    g = _gen(seed)
    return {
        "x": (torch.randn(t, h, generator=g) * 0.5).half(),
        "logits": (torch.randn(t, n_experts, generator=g) * 2).half(),
        "gu": fp8((n_experts, 2 * i, h), seed + 1, scale=weight_scale),
        "gus": torch.rand(n_experts, generator=g) * scale + scale,
        "d": fp8((n_experts, h, i), seed + 2, scale=weight_scale),
        "ds": torch.rand(n_experts, generator=g) * scale + scale,
        "pes": torch.rand(n_experts, generator=g) + 0.5,
    }


def _given_routes(t, top_k, n_experts, seed):
    """(ids int32 [T, top_k], weights fp16 [T, top_k]) for the routed ops."""
    ids = _selected(t, top_k, n_experts, seed)
    weights = (torch.rand(t, top_k, generator=_gen(seed)) + 0.2).half()
    return ids, weights


def _routed_args(v, ids, weights):
    top_k, n_experts = ids.size(1), v["gu"].size(0)
    return [v["x"], weights, ids, v["gu"], v["gus"], v["d"], v["ds"], top_k, n_experts]


def test_gelu_tanh_decode_routes_folds_and_decodes():
    """moe_forward_full_gelu_tanh_decode at Gemma 4's routing (128 experts,
    top 8: softmax, top 8, renormalized) times per_expert_scale[id]; the
    1D-load GEMVs: gelu_tanh(gate) * up of gate_up [E, 2I, H] (gate rows
    first), down [E, H, I], the rows summed (moe.sycl:2172). Wrong math: no
    per_expert_scale; no renormalization; gate and up swapped; silu."""
    t, h, i, n_experts, top_k = 1, 256, 32, 128, 8
    v = _gelu_inputs(t, h, i, n_experts, seed=40)
    kernel = esimd_kernels.REFERENCES["moe_forward_full_gelu_tanh_decode"]
    args = [v["x"], v["logits"], v["gu"], v["gus"], v["d"], v["ds"], v["pes"]]
    args += [top_k, n_experts]

    def expect(fold=True, norm=True, **wrong):
        (ids,), (weights,) = topk_math(v["logits"], top_k, norm)
        pes = v["pes"].tolist()
        weights = [
            w * (pes[e] if fold else 1.0) for w, e in zip(weights, ids, strict=True)
        ]
        rows = gelu_rows_math(v, ids, weights, subnormals=True, **wrong)
        return per_token(rows, top_k)

    wrongs = [{"fold": False}, {"norm": False}, {"swap": True}, {"act": _silu}]
    check_controls(kernel, args, expect, wrongs)


@pytest.mark.parametrize(
    "op",
    ["moe_forward_full_gelu_tanh_routed", "moe_forward_full_gelu_tanh_routed_decode"],
)
def test_gelu_tanh_routed(op):
    """The routing given (ids int32, weights fp16 [T, top_k], read flat):
    the DPAS kernels (routed) and the decode GEMVs (routed_decode, one
    token), the same math. Wrong math: the weights left out; gate and up
    swapped; silu."""
    decode = op.endswith("decode")
    t, h, i, n_experts, top_k = (1, 256, 32, 6, 3) if decode else (3, 64, 32, 6, 3)
    v = _gelu_inputs(t, h, i, n_experts, seed=41)
    ids, weights = _given_routes(t, top_k, n_experts, seed=42)
    kernel = esimd_kernels.REFERENCES[op]

    def expect(weighted=True, **wrong):
        w = weights.double().view(-1).tolist() if weighted else [1.0] * (t * top_k)
        flat = ids.view(-1).tolist()
        return per_token(gelu_rows_math(v, flat, w, decode, **wrong), top_k)

    wrongs = [{"weighted": False}, {"swap": True}, {"act": _silu}]
    check_controls(kernel, _routed_args(v, ids, weights), expect, wrongs)


def test_gelu_tanh_routed_no_accum_gives_the_route_rows():
    """[T * top_k, H]: row r of route r = token * top_k + k, not summed
    (moe.sycl:2297). Wrong math: the rows grouped by expert; the weights
    left out."""
    t, h, i, n_experts, top_k = 3, 64, 32, 6, 3
    v = _gelu_inputs(t, h, i, n_experts, seed=43)
    ids, weights = _given_routes(t, top_k, n_experts, seed=44)
    kernel = esimd_kernels.REFERENCES["moe_forward_full_gelu_tanh_routed_no_accum"]
    flat = ids.view(-1).tolist()

    def expect(weighted=True, by_expert=False):
        w = weights.double().view(-1).tolist() if weighted else [1.0] * len(flat)
        rows = gelu_rows_math(v, flat, w, subnormals=False)
        if by_expert:
            rows = rows[sorted(range(len(flat)), key=lambda r: (flat[r], r))]
        return rows

    wrongs = [{"weighted": False}, {"by_expert": True}]
    check_controls(kernel, _routed_args(v, ids, weights), expect, wrongs)


def test_gelu_tanh_routes_inside():
    """moe_forward_full_gelu_tanh: softmax, top_k, renormalized, no
    per_expert_scale (moe.sycl:2044). Wrong math: no renormalization;
    silu."""
    t, h, i, n_experts, top_k = 2, 64, 32, 128, 8
    v = _gelu_inputs(t, h, i, n_experts, seed=45)
    kernel = esimd_kernels.REFERENCES["moe_forward_full_gelu_tanh"]
    args = [v["x"], v["logits"], v["gu"], v["gus"], v["d"], v["ds"], top_k, n_experts]

    def expect(norm=True, **wrong):
        ids, weights = topk_math(v["logits"], top_k, norm)
        flat = [e for row in ids for e in row]
        w = [x for row in weights for x in row]
        return per_token(gelu_rows_math(v, flat, w, False, **wrong), top_k)

    check_controls(kernel, args, expect, [{"norm": False}, {"act": _silu}])


@pytest.mark.parametrize(
    "op",
    ["moe_forward_full_gelu_tanh_routed", "moe_forward_full_gelu_tanh_routed_decode"],
)
def test_gelu_tanh_subnormal_weights(op):
    """Weights mostly E4M3 subnormals: the decode GEMVs read them
    (fp8e4m3_dequant_fast, moe_decode_gemv.h:22), the DPAS kernels flush
    them to 0 (fp8e4m3_to_half, moe.sycl:33). Wrong math: the other."""
    decode = op.endswith("decode")
    t, h, i, n_experts, top_k = 1, 256, 32, 4, 2
    v = _gelu_inputs(t, h, i, n_experts, seed=46, weight_scale=0.01, scale=20.0)
    ids, weights = _given_routes(t, top_k, n_experts, seed=47)
    kernel = esimd_kernels.REFERENCES[op]
    flat, w = ids.view(-1).tolist(), weights.double().view(-1).tolist()

    def expect(subnormals=decode):
        return per_token(gelu_rows_math(v, flat, w, subnormals), top_k)

    check_controls(
        kernel, _routed_args(v, ids, weights), expect, [{"subnormals": not decode}]
    )


def test_gelu_tanh_decode_leaves_out_the_tails():
    """The decode GEMVs sum H in whole chunks of 256 (no tail) and I in
    chunks of 256 and one of 32 (moe.sycl:2121, :2141): H 320 and I 48 take
    the first 256 of H and 32 of I. Wrong math: the whole sums."""
    t, h, i, n_experts, top_k = 1, 320, 48, 4, 2
    v = _gelu_inputs(t, h, i, n_experts, seed=48)
    ids, weights = _given_routes(t, top_k, n_experts, seed=49)
    kernel = esimd_kernels.REFERENCES["moe_forward_full_gelu_tanh_routed_decode"]
    flat, w = ids.view(-1).tolist(), weights.double().view(-1).tolist()

    def expect(kh=256, ki=32):
        return per_token(gelu_rows_math(v, flat, w, True, kh=kh, ki=ki), top_k)

    wrongs = [{"kh": h, "ki": i}, {"kh": h}, {"ki": i}]
    check_controls(kernel, _routed_args(v, ids, weights), expect, wrongs)


def test_gelu_tanh_refuse_what_the_cpp_refuses():
    v = _gelu_inputs(2, 256, 32, 128, seed=50)
    one = dict(v, x=v["x"][:1].contiguous(), logits=v["logits"][:1].contiguous())
    decode = moe.moe_forward_full_gelu_tanh_decode

    def decode_args(w, **change):
        args = dict(w, **change)
        keys = ("x", "logits", "gu", "gus", "d", "ds", "pes")
        return [args[k] for k in keys] + [8, 128]

    with pytest.raises(RuntimeError, match="n_tokens==1"):
        decode(*decode_args(v))
    with pytest.raises(RuntimeError, match="kHalf"):
        decode(*decode_args(one, x=one["x"].float()))
    with pytest.raises(RuntimeError, match="expected scalar type Float"):
        decode(*decode_args(one, pes=one["pes"].half()))
    ids, weights = _given_routes(2, 2, 128, seed=51)
    routed = moe.moe_forward_full_gelu_tanh_routed
    with pytest.raises(RuntimeError, match="topk_weights must be fp16"):
        routed(*_routed_args(v, ids, weights.float()))
    with pytest.raises(RuntimeError, match="topk_indices must be int32"):
        routed(*_routed_args(v, ids.long(), weights))
    with pytest.raises(RuntimeError, match="expected scalar type Float"):
        routed(*_routed_args(dict(v, ds=v["ds"].double()), ids, weights))
    with pytest.raises(RuntimeError, match="an expert id outside"):
        routed(*_routed_args(v, ids + 128, weights))
    ids, weights = _given_routes(1, 2, 128, seed=52)
    routed_decode = moe.moe_forward_full_gelu_tanh_routed_decode
    with pytest.raises(RuntimeError, match="kInt32"):
        routed_decode(*_routed_args(one, ids.long(), weights))
    small = _gelu_inputs(1, 256, 16, 4, seed=53)  # I % 256 < 32: reads past
    ids, weights = _given_routes(1, 2, 4, seed=54)
    with pytest.raises(RuntimeError, match="reads past"):
        routed_decode(*_routed_args(small, ids, weights))
    odd = _gelu_inputs(1, 96, 16, 4, seed=55)  # H % 64: columns left unwritten
    with pytest.raises(RuntimeError, match="64"):
        routed(*_routed_args(odd, ids, weights))
