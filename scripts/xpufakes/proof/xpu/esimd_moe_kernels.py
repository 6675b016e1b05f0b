"""CPU reference kernels of the MoE ops of intel/llm-scaler's ESIMD package
(`custom_esimd_kernels_vllm`, read from 25095b4's C++, the image of
0.21.0-b3.1) that the catalog's Qwen3-Next (moe_ops::moe_forward_full at
one token, moe_forward_full_v2 at more) and Gemma 4 (the expert-grouped fp8
path: moe_int4_prefill_ops::moe_prefill_gather_forward_v2, then
moe_ops::moe_up_fp8_grouped and moe_down_fp8_grouped, or
moe_forward_full_fp8_grouped; at one token the per-route fp8 ops,
moe_ops::moe_forward_full_gelu_tanh_decode or _routed_decode, and their
routing op moe_ops::moe_topk; at more, moe_forward_full_gelu_tanh and
_routed, _routed_no_accum) reach. Torch only, on the CPU; each takes
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
    # Gemma 4's per-route fp8 MoE and the routing op
    "moe_topk": "csrc/moe_batch/moe.sycl:1309 (defined :2447)",
    "moe_forward_full_gelu_tanh": "csrc/moe_batch/moe.sycl:2044 (defined :2449)",
    "moe_forward_full_gelu_tanh_routed": (
        "csrc/moe_batch/moe.sycl:2249 (defined :2451)"
    ),
    "moe_forward_full_gelu_tanh_routed_no_accum": (
        "csrc/moe_batch/moe.sycl:2297 (defined :2450)"
    ),
    "moe_forward_full_gelu_tanh_routed_decode": (
        "csrc/moe_batch/moe.sycl:2096 (moe_decode_gemv.h:47, :102; defined :2452)"
    ),
    "moe_forward_full_gelu_tanh_decode": (
        "csrc/moe_batch/moe.sycl:2172 (fold moe_decode_gemv.h:145; defined :2453)"
    ),
}

# ScalarType names, as a failed data_ptr<T>() says them ("expected scalar
# type Float but found Half", ATen's TensorBase::data_ptr<T>); these
# helpers serve esimd_kernels.py too
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
    """z / (1 + exp(-z)) (the MoE's activation, the gated norms' gate:
    rms_norm_gated.h:52-53)."""
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


def _topk_heap(logits: torch.Tensor, top_k: int, norm: bool = True):
    """moe_topk_forward_kernel_impl (moe_batch/moe_topk.h:11-105), the other
    shapes: softmax in fp16 (scores - max, fp16; exp rounded to fp16, here
    exp in fp32; the sum in fp32, each score times 1 / sum rounded to
    fp16); a heap of top_k slots seeded with experts 0..top_k-1 (past
    n_experts: the zeroed padding of 512, :40-42, :62-65), each later
    expert whose score is above the heap's minimum replacing the lowest
    slot that holds the minimum (fbl); norm (:80-91): each slot times 1 /
    (fp32 sum of the slots), fp16; else the softmax scores as they are.
    Ids and weights in slot order (not sorted)."""
    rows, n = logits.shape
    lx = logits.half().double()
    shifted = (lx - lx.max(-1, keepdim=True).values).half()
    scores = torch.exp(shifted.float()).half()
    inv = 1.0 / scores.float().sum(-1, keepdim=True)
    scores = (scores.float() * inv).half()
    ids = torch.zeros(rows, top_k, dtype=torch.int64)
    weights = torch.zeros(rows, top_k, dtype=torch.float16)
    for r in range(rows):
        values = scores[r].tolist() + [0.0] * max(0, top_k - n)
        heap = values[:top_k]
        slot = list(range(top_k))
        for i in range(top_k, n):
            low = min(heap)
            if values[i] > low:
                at = heap.index(low)
                heap[at], slot[at] = values[i], i
        ids[r] = torch.tensor(slot, dtype=torch.int64)
        if not norm:
            weights[r] = torch.tensor(heap, dtype=torch.float16)
            continue
        total = torch.zeros((), dtype=torch.float32)
        for v in heap:
            total = total + v
        inv_top = 1.0 / total
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


# --- moe_topk: the routing as its own op (moe.sycl:1309) ---------------------


def moe_topk(logits, top_k, norm):
    """(topk_idx [n, top_k] int32, topk_weight [n, top_k] fp16), in that
    order (moe.sycl:1309-1342, std::make_tuple(topk_idx, topk_weight)), of
    dispatch_moe_topk_forward (:1271): with norm, the V2 kernel for the
    (n_experts, top_k) of TOPK_V2 (fp32 softmax, ids by descending weight,
    the lowest id among equal ones: _topk_v2), else the heap (fp16
    softmax, ids in heap-slot order; renormalized only with norm:
    _topk_heap). Checks (:1314-1321): dim 2, fp16, n_experts <= 512, a
    multiple of 16, top_k <= 32."""
    _check(logits.dim() == 2, "Expected logits.dim() == 2")
    _check(
        logits.dtype == torch.float16,
        "Expected logits.scalar_type() == torch::kHalf",
    )
    n_tokens, n_experts = logits.size(0), logits.size(1)
    _check(n_experts <= 512, "Expected n_experts <= 512")
    _check(n_experts % 16 == 0, "Expected n_experts % 16 == 0")
    _check(top_k <= 32, "Expected top_k <= 32")
    x = _as(logits, torch.float16, n_tokens * n_experts).view(n_tokens, n_experts)
    if norm and (n_experts, top_k) in TOPK_V2:
        ids, weights = _topk_v2(x, top_k)
    else:
        ids, weights = _topk_heap(x, top_k, norm)
    return ids.to(torch.int32).contiguous(), weights.contiguous()


# --- Gemma 4's per-route fp8 MoE (moe.sycl:1978-2340) ------------------------


def fp8e4m3_dequant_fast(raw: torch.Tensor) -> torch.Tensor:
    """fp32 of E4M3 bytes (uint8) as the decode GEMVs read them
    (moe_decode_gemv.h:22-42): exponent e != 0: the fp16 of bits sign << 15
    | (e + 8) << 10 | mantissa << 7 (0x7F reads 480, not NaN); e == 0: the
    subnormal mantissa * 2^-9, signed (not flushed, unlike fp8_to_half)."""
    u = raw.to(torch.int32)
    sign, e, m = (u >> 7) & 1, (u >> 3) & 0xF, u & 0x7
    bits = (sign << 15) | ((e + 8) << 10) | (m << 7)
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits)  # as int16
    normal = bits.to(torch.int16).view(torch.float16).float()
    subnormal = m.float() * (1.0 / 512.0)
    subnormal = torch.where(sign == 1, -subnormal, subnormal)
    return torch.where(e == 0, subnormal, normal)


def _gelu_tanh_2z(g: torch.Tensor) -> torch.Tensor:
    """0.5 g (1 + tanh(c0 (g + c1 g^3))), tanh = (e^2z - 1) / (e^2z + 1)
    with 2z clamped to [-30, 30] (moe.sycl:523-537; moe_decode_gemv.h:
    89-97), fp32."""
    two_z = (2.0 * (0.7978845608 * (g + 0.044715 * (g * g * g)))).clamp(-30.0, 30.0)
    e2 = torch.exp(two_z)
    return 0.5 * g * (1.0 + (e2 - 1.0) / (e2 + 1.0))


def _routes(topk_weights, topk_indices, n_routes: int, gate_up_weight):
    """(expert ids: a list, routing weights fp16 [n_routes]) read flat, route
    r = token * top_k + k (moe.sycl:470-474, :889-890); the C++ indexes the
    weights by any id it is given: one outside [0, gate_up_weight.size(0))
    is refused here."""
    ids = _as(topk_indices, torch.int32, n_routes).tolist()
    n_experts = gate_up_weight.size(0)
    _check(
        all(0 <= e < n_experts for e in ids),
        "topk_indices: an expert id outside [0, gate_up_weight.size(0))",
    )
    return ids, _as(topk_weights, torch.float16, n_routes)


def _gelu_tanh_rows(x, ids, weights, gu_w, gu_s, d_w, d_s, decode: bool):
    """[T * top_k, H] fp16: row r (route r of token r // top_k, expert
    ids[r], weight weights[r]) = fp16(fp16(gelu_tanh(g) * u) @ D_e^T * w *
    d_s[e]), g = (x @ G_e^T) * s[e], u = (x @ U_e^T) * s[e], gate_up [E, 2I,
    H] (rows: gate 0..I-1, up I..2I-1), down [E, H, I], the sums fp32.
    `decode`: the 1D-load GEMVs (moe_decode_gemv.h:47-99 and :102-138): E4M3
    with subnormals (fp8e4m3_dequant_fast), the up's K the whole chunks of
    256 of H (VL=256, no tail: the rest of H left out), the down's K the
    whole chunks of 256 of I then 32 more (VL=256, VL_TAIL=32: the rest of I
    left out; fewer than 32 left past the chunks: the kernel reads past the
    row, refused here), the sum times w then d_s. Else the DPAS kernels
    (moe.sycl:458-558, :870-920): E4M3 with subnormals flushed
    (fp8e4m3_to_half via fp8e4m3_block_to_vnni_nk), fp32 accumulators, the
    whole of H and of I (both multiples of 16: the up's tiles and K steps,
    the down's; else the C++ reads x or the intermediates past a row, or
    leaves columns unwritten: refused here), the sum times (w * d_s)."""
    t, h = x.size(0), x.size(1)
    i = gu_w.size(1) // 2
    top_k = len(ids) // t if t else 0
    if decode:
        kh = h // 256 * 256
        ki = i // 256 * 256 + 32
        _check(ki <= i, "the decode down kernel reads past a row (I % 256 < 32)")
    else:
        _check(i % 16 == 0, "the routed kernels need intermediate_size % 16 == 0")
        _check(h % 16 == 0, "the routed kernels need hidden_size % 16 == 0")
        kh, ki = h, i
    _typed(gu_s, torch.float32)
    _typed(d_s, torch.float32)
    n_scales = max(ids, default=-1) + 1  # scale[eid] read for the ids given
    gu_scale = _as(gu_s, torch.float32, n_scales)
    d_scale = _as(d_s, torch.float32, n_scales)
    xs = _as(x, torch.float16, t * h).view(t, h).float()
    out = torch.empty(len(ids), h, dtype=torch.float16)
    for r, e in enumerate(ids):
        w_gu = _shared(gu_w, e, 2 * i * h).view(2 * i, h)
        w_d = _shared(d_w, e, h * i).view(h, i)
        if decode:
            w_gu, w_d = fp8e4m3_dequant_fast(w_gu), fp8e4m3_dequant_fast(w_d)
        else:
            w_gu, w_d = (
                fp8_to_half(w_gu, False).float(),
                fp8_to_half(w_d, False).float(),
            )
        row = xs[r // top_k, :kh]
        g = (row @ w_gu[:i, :kh].t()) * gu_scale[e]
        u = (row @ w_gu[i:, :kh].t()) * gu_scale[e]
        inter = (_gelu_tanh_2z(g) * u).half()
        acc = inter[:ki].float() @ w_d[:, :ki].t()
        w = weights[r].float()
        if decode:
            out[r] = (acc * w * d_scale[e]).half()
        else:
            out[r] = (acc * (w * d_scale[e])).half()
    return out


def _accumulate(rows: torch.Tensor, t: int, top_k: int) -> torch.Tensor:
    """[T, H] fp16: each token's top_k rows summed in fp32
    (moe_accumulate_kernel, moe.sycl:1177-1200: chunks of 64 columns; H not
    a multiple of 64 leaves columns of the C++'s output unwritten: refused
    here)."""
    h = rows.size(1)
    _check(h % 64 == 0, "moe_accumulate writes whole chunks of 64 (H % 64 != 0)")
    total = torch.zeros(t, h, dtype=torch.float32)
    view = rows.view(t, top_k, h)
    for k in range(top_k):
        total = total + view[:, k].float()
    return total.half()


def moe_forward_full_gelu_tanh(
    x,
    logits,
    gate_up_weight,
    gate_up_scale,
    down_weight,
    down_scale,
    top_k,
    n_routed_experts,
):
    """Gemma 4's routed MoE, routing inside (moe.sycl:2044-2091): `route`
    (softmax, top_k, renormalized; logits read as fp16 [T,
    n_routed_experts]), then the DPAS up (gelu_tanh(gate) * up) and down of
    _gelu_tanh_rows (decode=False), the rows summed per token
    (_accumulate). No per_expert_scale. Checks: x fp16 (:2049), the scales
    fp32 (data_ptr<float>()). Returns [T, H] fp16 (the C++: a narrow of
    one of a ring of 4 persistent buffers, :2088-2090)."""
    _check(x.dtype == torch.float16, "Expected x.scalar_type() == torch::kHalf")
    t = x.size(0)
    ids, weights = route(logits, t, n_routed_experts, top_k)
    rows = _gelu_tanh_rows(
        x,
        ids.reshape(-1).tolist(),
        weights.reshape(-1),
        gate_up_weight,
        gate_up_scale,
        down_weight,
        down_scale,
        decode=False,
    )
    return _accumulate(rows, t, top_k)


def _routed(args, decode: bool, accumulate: bool = True) -> torch.Tensor:
    """The three ops with routing given: checks, then _gelu_tanh_rows."""
    (x, topk_weights, topk_indices, gu_w, gu_s, d_w, d_s, top_k, _) = args
    _check(x.dtype == torch.float16, "Expected x.scalar_type() == torch::kHalf")
    if decode:
        _check(x.size(0) == 1, "decode kernel requires n_tokens==1")
        _check(
            topk_indices.dtype == torch.int32,
            "Expected topk_indices.scalar_type() == torch::kInt32",
        )
        _check(
            topk_weights.dtype == torch.float16,
            "Expected topk_weights.scalar_type() == torch::kHalf",
        )
    else:
        _check(
            topk_weights.dtype == torch.float16, "topk_weights must be fp16 [T, top_k]"
        )
        _check(
            topk_indices.dtype == torch.int32, "topk_indices must be int32 [T, top_k]"
        )
    t = x.size(0)
    ids, weights = _routes(topk_weights, topk_indices, t * top_k, gu_w)
    rows = _gelu_tanh_rows(x, ids, weights, gu_w, gu_s, d_w, d_s, decode)
    return _accumulate(rows, t, top_k) if accumulate else rows


def moe_forward_full_gelu_tanh_routed(
    x,
    topk_weights,
    topk_indices,
    gate_up_weight,
    gate_up_scale,
    down_weight,
    down_scale,
    top_k,
    n_routed_experts,
):
    """moe_forward_full_gelu_tanh with the routing given (moe.sycl:2249-2294):
    topk_weights fp16 and topk_indices int32, read flat (route r = token *
    top_k + k; Gemma 4's routing function has folded per_expert_scale into
    the weights); n_routed_experts unused (:2256). Checks: x fp16, the
    weights fp16, the ids int32 (:2257-2261), the scales fp32. Returns [T,
    H] fp16."""
    return _routed(
        (
            x,
            topk_weights,
            topk_indices,
            gate_up_weight,
            gate_up_scale,
            down_weight,
            down_scale,
            top_k,
            n_routed_experts,
        ),
        decode=False,
    )


def moe_forward_full_gelu_tanh_routed_no_accum(
    x,
    topk_weights,
    topk_indices,
    gate_up_weight,
    gate_up_scale,
    down_weight,
    down_scale,
    top_k,
    n_routed_experts,
):
    """moe_forward_full_gelu_tanh_routed without the sum (moe.sycl:2297-2335):
    the per-route rows [T * top_k, H] fp16 (the C++: a narrow of its
    persistent sg_routed_output, :2334)."""
    return _routed(
        (
            x,
            topk_weights,
            topk_indices,
            gate_up_weight,
            gate_up_scale,
            down_weight,
            down_scale,
            top_k,
            n_routed_experts,
        ),
        decode=False,
        accumulate=False,
    )


def moe_forward_full_gelu_tanh_routed_decode(
    x,
    topk_weights,
    topk_indices,
    gate_up_weight,
    gate_up_scale,
    down_weight,
    down_scale,
    top_k,
    n_routed_experts,
):
    """moe_forward_full_gelu_tanh_routed at one token through the 1D-load
    GEMVs (moe.sycl:2096-2166; _gelu_tanh_rows with decode=True: subnormal
    weights read, H and I in chunks: only H % 256 == 0 and I % 256 == 32
    compute the whole sums; Gemma 4: H 2816, I 1056 a card). Checks: x
    fp16, x.size(0) == 1, the ids int32, the weights fp16 (:2102-2105), the
    scales fp32. Returns [1, H] fp16."""
    return _routed(
        (
            x,
            topk_weights,
            topk_indices,
            gate_up_weight,
            gate_up_scale,
            down_weight,
            down_scale,
            top_k,
            n_routed_experts,
        ),
        decode=True,
    )


def moe_forward_full_gelu_tanh_decode(
    x,
    logits,
    gate_up_weight,
    gate_up_scale,
    down_weight,
    down_scale,
    per_expert_scale,
    top_k,
    n_routed_experts,
):
    """Gemma 4's MoE at one token, routing inside (moe.sycl:2172-2241):
    `route` (norm=true: Gemma 4's 128 experts, top 8 take the V2 kernel:
    fp32 softmax, top_k by descending weight, renormalized, fp16); each
    weight times per_expert_scale[id] (fp32, rounded to fp16:
    MoeFoldExpertScale, moe_decode_gemv.h:145-157); then the decode GEMVs
    and the sum of moe_forward_full_gelu_tanh_routed_decode. Checks: x
    fp16, x.size(0) == 1 (:2179-2180), per_expert_scale and the scales
    fp32 (data_ptr<float>()). Returns [1, H] fp16 (a narrow of a ring
    buffer, :2240)."""
    _check(x.dtype == torch.float16, "Expected x.scalar_type() == torch::kHalf")
    _check(x.size(0) == 1, "decode kernel requires n_tokens==1")
    ids, weights = route(logits, 1, n_routed_experts, top_k)
    _typed(per_expert_scale, torch.float32)
    ids = ids.reshape(-1).tolist()
    scale = _as(per_expert_scale, torch.float32, max(ids, default=-1) + 1)
    folded = (weights.reshape(-1).float() * scale[ids]).half()
    _check(
        all(e < gate_up_weight.size(0) for e in ids),
        "an expert id outside [0, gate_up_weight.size(0))",
    )
    args = (gate_up_weight, gate_up_scale, down_weight, down_scale)
    rows = _gelu_tanh_rows(x, ids, folded, *args, decode=True)
    return _accumulate(rows, 1, top_k)
