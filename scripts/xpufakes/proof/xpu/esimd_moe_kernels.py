"""CPU reference kernels of the MoE ops of intel/llm-scaler's ESIMD package
(`custom_esimd_kernels_vllm`, read from 25095b4's C++, the image of
0.21.0-b3.1) that the catalog's Qwen3-Next (moe_ops::moe_forward_full at
one token, moe_forward_full_v2 at more) and Gemma 4 (the expert-grouped fp8
path: moe_int4_prefill_ops::moe_prefill_gather_forward_v2, then
moe_ops::moe_up_fp8_grouped and moe_down_fp8_grouped, or
moe_forward_full_fp8_grouped) reach. Torch only, on the CPU; each takes
its op's arguments in schema order, checks what the C++ checks and returns
a new tensor as the op does (the C++ returns a persistent buffer, or a
narrow of one: here a fresh contiguous tensor of that shape and dtype).

The kernels address each argument by data_ptr() (dense, no stride, no
dtype check unless said): a buffer here is the argument's bytes read as
the type the kernel casts them to. The math is the C++'s, with its fp16
roundings where the C++ rounds (a product of two fp16 simd vectors is an
fp16; DPAS accumulates in fp32, or in fp16 where its accumulator is fp16),
fp32 elsewhere. Paths below are of csrc/ in 25095b4's tarball
(custom-esimd-kernels-vllm-csrc.tar.gz of the image); lines are that
commit's. esimd_kernels.REFERENCES registers these functions."""

import torch

# where each kernel is (25095b4)
SOURCES = {
    "moe_forward_full": "csrc/moe_batch/moe.sycl:1855 (defined :2457)",
    "moe_forward_full_v2": "csrc/moe_batch/moe.sycl:2337 (defined :2459)",
    "moe_up_fp8_grouped": "csrc/moe_batch/moe_fp8_grouped.h:348 (moe.sycl:2454)",
    "moe_down_fp8_grouped": "csrc/moe_batch/moe_fp8_grouped.h:410 (moe.sycl:2455)",
    "moe_forward_full_fp8_grouped": (
        "csrc/moe_batch/moe_fp8_grouped.h:471 (defined moe.sycl:2456)"
    ),
    "moe_prefill_gather_forward_v2": (
        "csrc/moe_prefill/moe_prefill_int4.sycl:458 (kernel :41, defined :997)"
    ),
}

_SCALAR_TYPE = {
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.float8_e4m3fn: "Float8_e4m3fn",
    torch.float8_e5m2: "Float8_e5m2",
}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)  # as TORCH_CHECK raises (c10::Error)


def _typed(tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """The check of the C++'s tensor.data_ptr<T>() (T: `dtype`)."""
    want, got = _SCALAR_TYPE[dtype], _SCALAR_TYPE.get(tensor.dtype, tensor.dtype)
    _check(tensor.dtype == dtype, f"expected scalar type {want} but found {got}")


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The buffer's bytes, as (const uint8_t*)tensor.data_ptr() reads them."""
    return tensor.reshape(-1).view(torch.uint8)


def _as(tensor: torch.Tensor, dtype: torch.dtype, count: int) -> torch.Tensor:
    """The first `count` elements of the buffer read as `dtype`
    ((const fp16*)tensor.data_ptr() and the like: a reinterpretation)."""
    raw = _bytes(tensor)
    size = torch.empty((), dtype=dtype).element_size()
    _check(raw.numel() >= count * size, "the kernel reads past the buffer")
    return raw[: count * size].view(dtype)


def fp8_to_half(raw: torch.Tensor, e5m2: bool) -> torch.Tensor:
    """fp16 of fp8 bytes (uint8), by the kernels' bit maps (moe.sycl):
    E4M3, fp8e4m3_to_half (:33-47): sign << 8 | ((byte & 0x7F) << 7) +
    0x2000, exponent 0 flushed to a signed zero (0x7F reads 480, not NaN);
    E5M2, fp8e5m2_to_half (:51-62): the byte as an fp16's high byte,
    exponent 0 flushed to a signed zero (exponent 31: inf, NaN)."""
    u = raw.to(torch.int32)
    sign = (u & 0x80) << 8
    if e5m2:
        bits = torch.where(((u >> 2) & 0x1F) == 0, sign, sign | ((u & 0x7F) << 8))
    else:
        bits = ((u & 0x7F) << 7) + 0x2000
        bits = torch.where((u & 0x78) == 0, sign, sign | bits)
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits)  # as int16
    return bits.to(torch.int16).view(torch.float16)


def _fp8(tensor, shape, e5m2: bool) -> torch.Tensor:
    """fp16 [shape] of the first prod(shape) fp8 bytes of `tensor`."""
    count = 1
    for dim in shape:
        count *= dim
    return fp8_to_half(_as(tensor, torch.uint8, count), e5m2).view(shape)


def _half_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 of a * b for fp16 a and b, rounded to fp16 (a simd<fp16> times
    a simd<fp16> is an fp16 simd; the fp32 product of two fp16 is exact,
    so one rounding)."""
    return (a.float() * b.float()).half().float()


def _silu(z: torch.Tensor) -> torch.Tensor:
    return z / (1.0 + torch.exp(-z))


# --- routing: dispatch_moe_topk_forward (moe.sycl:1271) ---------------------

# the (n_experts, top_k) of moe_topk_v2_host (moe.sycl:1276-1293, norm=true)
TOPK_V2 = {(512, 10), (512, 8), (256, 10), (256, 8), (128, 8), (128, 10)}


def _topk_v2(logits: torch.Tensor, top_k: int):
    """MoE_TopK_V2_Kernel (xpu/esimd_kernels/moe_ops.h:106-216): p =
    exp(x - max) * (1 / sum) in fp32; top_k rounds of the largest p left,
    the lowest expert id among equal ones (the first chunk of 64 wins with
    `m > bv`, the lowest index within: chunk_argmax_and_zero, :77-104):
    order = descending, stable; the chosen values times 1 / their sum
    (summed in order, fp32), stored fp16, ids int32; in rank order."""
    x = logits.float()
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    probs = e * (1.0 / e.sum(-1, keepdim=True))
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k]
    chosen = probs.gather(-1, order)
    total = torch.zeros(chosen.size(0), dtype=torch.float32)
    for k in range(top_k):
        total = total + chosen[:, k]
    return order, (chosen * (1.0 / total).unsqueeze(-1)).half()


def _topk_heap(logits: torch.Tensor, top_k: int):
    """moe_topk_forward_kernel_impl (moe_batch/moe_topk.h:11-105), the other
    shapes: softmax in fp16 (scores - max, fp16; exp rounded to fp16, here
    exp in fp32; the sum in fp32, each score times 1 / sum rounded to
    fp16); a heap of top_k slots seeded with experts 0..top_k-1, each later
    expert whose score is above the heap's minimum replacing the lowest
    slot that holds the minimum (fbl); norm: each slot times 1 / (fp32 sum
    of the slots), fp16. Ids and weights in slot order (not sorted)."""
    rows, n = logits.shape
    lx = logits.half().double()
    shifted = (lx - lx.max(-1, keepdim=True).values).half()
    scores = torch.exp(shifted.float()).half()
    inv = 1.0 / scores.float().sum(-1, keepdim=True)
    scores = (scores.float() * inv).half()
    ids = torch.zeros(rows, top_k, dtype=torch.int64)
    weights = torch.zeros(rows, top_k, dtype=torch.float16)
    for r in range(rows):
        heap = scores[r, :top_k].tolist()
        slot = list(range(top_k))
        values = scores[r].tolist()
        for i in range(top_k, n):
            low = min(heap)
            if values[i] > low:
                at = heap.index(low)
                heap[at], slot[at] = values[i], i
        total = torch.zeros((), dtype=torch.float32)
        for v in heap:
            total = total + v
        inv_top = 1.0 / total
        ids[r] = torch.tensor(slot)
        weights[r] = (torch.tensor(heap, dtype=torch.float32) * inv_top).half()
    return ids, weights


def route(logits, n_tokens: int, n_experts: int, top_k: int):
    """(ids [T, top_k] int64, weights [T, top_k] fp16) of
    dispatch_moe_topk_forward with norm=true (moe.sycl:1271): logits read
    as fp16 [T, n_experts] (no check of its dtype)."""
    x = _as(logits, torch.float16, n_tokens * n_experts).view(n_tokens, n_experts)
    if (n_experts, top_k) in TOPK_V2:
        return _topk_v2(x, top_k)
    _check(n_experts <= 512 and top_k <= 32, "topk fallback: n_experts, top_k")
    return _topk_heap(x, top_k)


# --- moe_forward_full / _v2 (Qwen3-Next, per-tensor fp8) --------------------


def _moe_full(args, v2: bool) -> torch.Tensor:
    """The math of moe_forward_full (v2=False) and moe_forward_full_v2."""
    (x, logits, gu_w, gu_s, sgu_w, sgu_s, d_w, d_s, sd_w, sd_s, sg_w) = args[:11]
    top_k, n_shared, n_experts = args[11:]
    _check(x.dtype == torch.float16, "Expected x.scalar_type() == torch::kHalf")
    for scale in (gu_s, sgu_s, d_s, sd_s):
        _typed(scale, torch.float32)
    t, h = x.size(0), x.size(1)
    i = gu_w.size(2) // 2
    # the decoder of every weight: gate_up_weight's dtype (e4m3 only for
    # float8_e4m3fn; uint8 and float8_e5m2 take e5m2), moe.sycl:1880, :2363
    e5m2 = gu_w.dtype != torch.float8_e4m3fn
    ids, weights = route(logits, t, n_experts, top_k)
    xs = _as(x, torch.float16, t * h).view(t, h)
    xf = xs.float()
    gu_scale = _as(gu_s, torch.float32, n_experts)
    d_scale = _as(d_s, torch.float32, n_experts)
    up, down = {}, {}  # expert -> its decoded fp16 weights
    out = torch.empty(t, h, dtype=torch.float16)
    for token in range(t):
        routed = []  # fp16 rows of the routed experts
        for k in range(top_k):
            e = int(ids[token, k])
            # moe_up_routed_*_kernel (:371, :560): gate_up [E, H, 2I], gate
            # columns [0, I), up [I, 2I); DPAS fp16 x fp16 into fp32; the
            # per-expert scale after the sum; silu(gate) * up, fp16
            if e not in up:
                up[e] = _fp8(_shared(gu_w, e, h * 2 * i), (h, 2 * i), e5m2).float()
                down[e] = _fp8(_shared(d_w, e, i * h), (i, h), e5m2).float()
            w, wd = up[e], down[e]
            g = (xf[token] @ w[:, :i]) * gu_scale[e]
            u = (xf[token] @ w[:, i:]) * gu_scale[e]
            inter = (_silu(g) * u).half()
            # moe_down_routed_*_kernel (:815, :926): down [E, I, H]; the sum
            # times (routing weight (fp16 -> fp32) * down_scale[e]), fp16
            acc = inter.float() @ wd
            routed.append((acc * (weights[token, k].float() * d_scale[e])).half())
        total = torch.zeros(h, dtype=torch.float32)
        for row in routed:
            total = total + row.float()
        for sid in range(n_shared):
            # moe_up_shared_*_kernel (:647, :694): shared gate_up [S, 2I, H]
            # (rows: gate 0..I-1, up I..2I-1); w = fp16(fp8 * fp16(scale)),
            # each x * w an fp16, summed in fp32
            s = _as(sgu_s, torch.float32, n_shared)[sid].half()
            ws = _fp8(_shared(sgu_w, sid, 2 * i * h), (2 * i, h), e5m2)
            ws = _half_product(ws, s)
            g = _half_product(xs[token], ws[:i]).sum(-1)
            u = _half_product(xs[token], ws[i:]).sum(-1)
            inter = (_silu(g) * u).half()
            # shared down [S, H, I], the same roundings (:1386-1419, :1013)
            ds = _as(sd_s, torch.float32, n_shared)[sid].half()
            wd = _half_product(_fp8(_shared(sd_w, sid, h * i), (h, i), e5m2), ds)
            acc = _half_product(wd, inter).sum(-1)
            gw = _as(sg_w, torch.float16, n_shared * h).view(n_shared, h)[sid]
            if v2:
                # moe_down_gate_precompute_kernel (:979): each x * w an fp16;
                # moe_down_shared_*_kernel: fp16(gate * sum) into its row;
                # moe_accumulate_kernel (:1177): the rows summed in fp32
                gate = torch.sigmoid(_half_product(xs[token], gw).sum())
                total = total + (gate * acc).half().float()
            else:
                # moe_down_finalize_*_kernel (:1345, :1386): x * w in fp32;
                # the shared sum times the gate added in fp32, not rounded
                gate = torch.sigmoid((xf[token] * gw.float()).sum())
                total = total + acc * gate
        out[token] = total.half()
    return out


def _shared(weight: torch.Tensor, sid: int, size: int) -> torch.Tensor:
    """Shared expert `sid`'s bytes: size bytes from sid * size on."""
    return _as(weight, torch.uint8, (sid + 1) * size)[sid * size :]


def moe_forward_full(
    x,
    logits,
    gate_up_weight,
    gate_up_scale,
    shared_gate_up_weight,
    shared_gate_up_scale,
    down_weight,
    down_scale,
    shared_down_weight,
    shared_down_scale,
    shared_expert_gate_weight,
    top_k,
    num_shared_experts,
    n_routed_experts,
):
    """Qwen3-Next's MoE at decode, one op (moe.sycl:1855): per token,
    route (softmax, top_k, renormalized: `route`); each routed expert e:
    silu(x @ G_e * s_e) * (x @ U_e * s_e) (gate_up [E, H, 2I], I =
    gate_up_weight.size(2) / 2, gate columns first, per-expert fp32 scale
    [E]) rounded to fp16, then (that @ D_e) * (w * d_e) (down [E, I, H])
    rounded to fp16; each shared expert (gate_up [S, 2I, H], down [S, H,
    I], scales [S] read fp32, used as fp16) the same with silu, times
    sigmoid(x . shared_expert_gate_weight[sid]) (Qwen3-Next passes vLLM
    0.21.0's XPU layouts as they are, w13 [E, H, 2I], w2 [E, I, H]: the
    image's vllm patch, esimd_utils.py's comment on moe_forward_full; the
    bytes are read in the kernel's layout whatever the shape); the fp16
    routed rows and the unrounded shared sums added in fp32
    (moe_down_finalize, :1386), fp16. fp8 decoding: E4M3 for a
    float8_e4m3fn gate_up_weight, E5M2 otherwise (uint8 too), subnormals
    flushed (fp8_to_half). Checks: x
    fp16 (:1862), the scales fp32 (data_ptr<float>()). Returns [T, H] fp16
    (the C++: a narrow of its persistent s_final_output, :1942). H and I
    multiples of 64 are what the kernels compute whole."""
    return _moe_full(
        (
            x,
            logits,
            gate_up_weight,
            gate_up_scale,
            shared_gate_up_weight,
            shared_gate_up_scale,
            down_weight,
            down_scale,
            shared_down_weight,
            shared_down_scale,
            shared_expert_gate_weight,
            top_k,
            num_shared_experts,
            n_routed_experts,
        ),
        v2=False,
    )


def moe_forward_full_v2(
    x,
    logits,
    gate_up_weight,
    gate_up_scale,
    shared_gate_up_weight,
    shared_gate_up_scale,
    down_weight,
    down_scale,
    shared_down_weight,
    shared_down_scale,
    shared_expert_gate_weight,
    top_k,
    num_shared_experts,
    n_routed_experts,
):
    """moe_forward_full for more tokens (moe.sycl:2337): the same routing,
    up and routed down; only the shared expert's down and the sum differ
    (the standalone path instead of down_finalize, :1941-1947): the gate
    sigmoid(sum of fp16 x * w products) (moe_down_gate_precompute, :979),
    the shared row fp16(gate * sum) (moe_down_shared_*, :1013/:1052), then
    all top_k + S rows of a token summed in fp32, fp16 (moe_accumulate,
    :1177). Returns [T, H] fp16 (a narrow of s2_final_output, :2440)."""
    return _moe_full(
        (
            x,
            logits,
            gate_up_weight,
            gate_up_scale,
            shared_gate_up_weight,
            shared_gate_up_scale,
            down_weight,
            down_scale,
            shared_down_weight,
            shared_down_scale,
            shared_expert_gate_weight,
            top_k,
            num_shared_experts,
            n_routed_experts,
        ),
        v2=True,
    )


# --- Gemma 4's expert-grouped fp8 path ---------------------------------------


def moe_prefill_gather_forward_v2(selected_experts, num_experts):
    """Tokens grouped by expert (moe_prefill_gather_forward_kernel,
    moe_prefill_int4.sycl:41-110; host :458): for the N = numel pairs
    (pair p = token * top_k + k, selected_experts read flat, int32),
    [expert_offsets [E]: the exclusive prefix sums of the per-expert
    counts (:80-85), expert_tokens [N]: the pairs, expert by expert (slot
    offsets[e] + j holds expert e's j-th), pair_to_perm [N]: the inverse
    (pair_to_perm[p] = the slot of p), rows_for_experts [E]: the counts],
    all int32. Within one expert the C++'s order is that of its relaxed
    work-group atomics (:100-105), unspecified: here the pairs ascending
    (the order a serial walk gives; the grouped ops' results do not depend
    on it: each row is its own). Checks: dim 2, int32 (:462-463). An
    expert id outside [0, num_experts) the kernel counts out of bounds:
    refused here."""
    _check(selected_experts.dim() == 2, "Expected selected_experts.dim() == 2")
    _check(
        selected_experts.dtype == torch.int32,
        "Expected selected_experts.scalar_type() == torch::kInt32",
    )
    ids = _as(selected_experts, torch.int32, selected_experts.numel()).long()
    _check(
        ids.numel() == 0 or (ids.min() >= 0 and ids.max() < num_experts),
        "selected_experts: an expert id outside [0, num_experts)",
    )
    counts = torch.bincount(ids, minlength=num_experts)
    offsets = torch.cumsum(counts, 0) - counts
    tokens = torch.sort(ids, stable=True).indices
    inverse = torch.empty_like(tokens)
    inverse[tokens] = torch.arange(tokens.numel())
    return [
        offsets.to(torch.int32),
        tokens.to(torch.int32),
        inverse.to(torch.int32),
        counts.to(torch.int32),
    ]


def _segments(expert_offsets, expert_tokens, n_experts: int, total: int):
    """(expert e, its pairs: a list) for each expert with slots: expert e's
    slots are [offsets[e], offsets[e + 1]) (the last one's end:
    total_routes), each holding a pair (moe_fp8_grouped.h:71-73, :130-131,
    :163-170, :270-282)."""
    _typed(expert_offsets, torch.int32)
    _typed(expert_tokens, torch.int32)
    offsets = _as(expert_offsets, torch.int32, n_experts).tolist()
    pairs = expert_tokens.reshape(-1).tolist()
    for e in range(n_experts):
        end = offsets[e + 1] if e + 1 < n_experts else total
        if offsets[e] < end:
            yield e, pairs[offsets[e] : end]


def _dpas_fp16(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ w [N, K]^T with an fp16 accumulator, as dpas<8, 8, fp16,
    fp16, fp16, fp16> walks K by 16 (moe_fp8_grouped.h:185-204, :290-305):
    each 16-wide partial product sum in fp32 added to the fp16 accumulator
    and the sum rounded to fp16 (the hardware's internal precision of one
    DPAS step: taken as fp32)."""
    acc = torch.zeros(a.size(0), w.size(0), dtype=torch.float16)
    for k in range(0, a.size(1), 16):
        part = a[:, k : k + 16].float() @ w[:, k : k + 16].float().t()
        acc = (acc.float() + part).half()
    return acc


def _gelu_tanh(g: torch.Tensor) -> torch.Tensor:
    """0.5 g (1 + tanh(c0 (g + c1 g^3))), tanh = (e^2z - 1) / (e^2z + 1)
    with z clamped to [-30, 30] (moe_fp8_grouped.h:211-227)."""
    inner = (0.7978845608 * (g + 0.044715 * (g * g * g))).clamp(-30.0, 30.0)
    e2 = torch.exp(2.0 * inner)
    return 0.5 * g * (1.0 + (e2 - 1.0) / (e2 + 1.0))


def moe_up_fp8_grouped(
    x,
    gate_up_weight,
    gate_up_scale,
    expert_offsets,
    expert_tokens,
    top_k,
    n_routed_experts,
):
    """intermediate [T * top_k, I] fp16 (moe_fp8_grouped.h:348; kernel
    :111): for each gathered slot (expert e, pair p): row p = gelu_tanh(g)
    * u, g and u from x[p // top_k] and expert e's gate_up [E, 2I, H]
    (rows: gate 0..I-1, up I..2I-1; I = gate_up_weight.size(1) / 2),
    decoded E4M3 whatever the dtype (fp8e4m3_block_to_vnni_nk; Gemma 4
    passes the weight viewed as uint8), each weight times fp16(scale[e])
    rounded to fp16 (:187-188), an fp16 DPAS accumulator (_dpas_fp16), the
    activation in fp32 from it, fp16. A pair in no slot: its row is not
    written (torch::empty in the C++; zeros here). Checks: x fp16 (:356),
    gate_up_scale fp32, the offsets and tokens int32 (data_ptr<T>())."""
    _check(x.dtype == torch.float16, "Expected x.scalar_type() == torch::kHalf")
    _typed(gate_up_scale, torch.float32)
    t, h = x.size(0), x.size(1)
    i = gate_up_weight.size(1) // 2
    total = t * top_k
    xs = _as(x, torch.float16, t * h).view(t, h)
    scale = _as(gate_up_scale, torch.float32, n_routed_experts).half()
    out = torch.zeros(total, i, dtype=torch.float16)
    for e, pairs in _segments(expert_offsets, expert_tokens, n_routed_experts, total):
        w = _fp8(_shared(gate_up_weight, e, 2 * i * h), (2 * i, h), False)
        w = _half_product(w, scale[e]).half()
        index = torch.tensor(pairs)
        rows = xs[index // top_k]
        g = _dpas_fp16(rows, w[:i]).float()
        u = _dpas_fp16(rows, w[i:]).float()
        out[index] = (_gelu_tanh(g) * u).half()
    return out


def moe_down_fp8_grouped(
    intermediate,
    down_weight,
    down_scale,
    routing_weights,
    expert_offsets,
    expert_tokens,
    top_k,
    n_routed_experts,
):
    """per-route output [N, H] fp16, N = intermediate.size(0), H =
    down_weight.size(1) (moe_fp8_grouped.h:410; kernel :249): for each
    gathered slot (expert e, pair p): row p (pair-indexed, so that the
    caller's view(M, top_k, H).sum(1) adds a token's routes) = (intermediate
    [p] @ D_e^T) * routing_weights[p], D_e [H, I] of down [E, H, I],
    decoded E4M3 whatever the dtype, times fp16(down_scale[e]) rounded to
    fp16; an fp16 DPAS accumulator; times the routing weight (read as fp16,
    flat, pair-indexed: no dtype check) in fp32; fp16. A pair in no slot:
    not written (zeros here). Checks: intermediate fp16 (:418), down_scale
    fp32, offsets and tokens int32."""
    _check(
        intermediate.dtype == torch.float16,
        "Expected intermediate.scalar_type() == torch::kHalf",
    )
    _typed(down_scale, torch.float32)
    total, i = intermediate.size(0), intermediate.size(1)
    h = down_weight.size(1)
    rows = _as(intermediate, torch.float16, total * i).view(total, i)
    rw = _as(routing_weights, torch.float16, total)
    scale = _as(down_scale, torch.float32, n_routed_experts).half()
    out = torch.zeros(total, h, dtype=torch.float16)
    for e, pairs in _segments(expert_offsets, expert_tokens, n_routed_experts, total):
        w = _fp8(_shared(down_weight, e, h * i), (h, i), False)
        w = _half_product(w, scale[e]).half()
        index = torch.tensor(pairs)
        acc = _dpas_fp16(rows[index], w).float()
        out[index] = (acc * rw[index].float().unsqueeze(-1)).half()
    return out


def moe_forward_full_fp8_grouped(
    x,
    gate_up_weight,
    gate_up_scale,
    down_weight,
    down_scale,
    routing_weights,
    expert_offsets,
    expert_tokens,
    top_k,
    n_routed_experts,
):
    """moe_up_fp8_grouped, moe_down_fp8_grouped, then each token's top_k
    rows summed in fp32, fp16 (moe_grouped_accumulate_kernel,
    moe_fp8_grouped.h:440-466; the op :471). Returns [T, H] fp16."""
    inter = moe_up_fp8_grouped(
        x,
        gate_up_weight,
        gate_up_scale,
        expert_offsets,
        expert_tokens,
        top_k,
        n_routed_experts,
    )
    partials = moe_down_fp8_grouped(
        inter,
        down_weight,
        down_scale,
        routing_weights,
        expert_offsets,
        expert_tokens,
        top_k,
        n_routed_experts,
    )
    t, h = x.size(0), x.size(1)
    rows = partials.view(t, top_k, h)
    total = torch.zeros(t, h, dtype=torch.float32)
    for k in range(top_k):
        total = total + rows[:, k].float()
    return total.half()
