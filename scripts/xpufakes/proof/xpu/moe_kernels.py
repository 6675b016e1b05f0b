"""CPU reference kernels of vllm-xpu-kernels' MoE ops (the build of the
image: data/xpu_moe_ops.toml), torch only: each takes the op's arguments in
its schema's order, refuses what the C++ refuses (TORCH_CHECK: its
refusals are the kernel's), writes exactly the buffers the C++ writes, in
place, and returns what the C++ returns. The math is the C++'s, small:
fp32 accumulation, the result cast to the buffer's dtype. MXFP4 experts
(gpt_oss_mxfp4) are computed; what no catalog model reaches (int4 and
block-fp8 experts, expert parallelism's map) raises, naming it."""

from collections.abc import Callable

import torch

# where each kernel is (vllm-project/vllm-xpu-kernels at 3cab97a, the
# b18beee image's build)
SOURCES = {
    "_moe_C::topk_softmax": "csrc/moe/topk.cpp:827 (weights :551, source rows "
    ":554, renormalize :564-567, bias for selection only :465-474)",
    "_moe_C::remap_hidden_states": "csrc/moe/remap_hidden_states.cpp:415 (counts "
    ":54-92, rows by expert :233-243, copy :262-274, the map written :321-325)",
    "_xpu_C::cutlass_grouped_gemm_interface": "csrc/xpu/grouped_gemm/xe_2/"
    "grouped_gemm_xe2_interface.hpp:162 (checks :181-222, fp8: one scale per "
    "expert :301-309, mxfp4: [E, N, K / 2] and e8m0 scales per group :203, "
    ":246-289, gemm_xe2.hpp:395, returns ptr_D :371)",
    "_moe_C::moe_gather": "csrc/moe/moe_gather.cpp:160 (the weighted sum :63-85)",
}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)  # as TORCH_CHECK raises (c10::Error)


def _not_stood_in(what: str) -> None:
    raise NotImplementedError(
        f"{what}: no CPU reference (no catalog model reaches it); "
        "proof/xpu/moe_kernels.py"
    )


def topk_softmax(
    topk_weights, topk_indices, token_expert_indices, gating_output, renormalize, bias
) -> None:
    """The router: softmax over each token's expert logits (fp32); the k
    experts of the largest softmax (+ bias, which only selects), the lower
    index first where equal; their softmax values (renormalize: divided by
    their sum) into topk_weights, their ids into topk_indices, and
    token_expert_indices[t, j] = j * num_tokens + t."""
    experts = gating_output.size(-1)
    scores = gating_output.reshape(-1, experts).float().softmax(-1)
    tokens, k = scores.size(0), topk_weights.size(-1)
    chosen = scores if bias is None else scores + bias.float()
    ids = torch.sort(chosen, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    topk_weights.copy_(weights.view(topk_weights.shape))
    topk_indices.copy_(ids.view(topk_indices.shape).to(topk_indices.dtype))
    rows = torch.arange(k).view(1, k) * tokens + torch.arange(tokens).view(tokens, 1)
    token_expert_indices.copy_(rows.view(token_expert_indices.shape))


def remap_hidden_states(
    hidden_states,
    hidden_states_scales,
    remapped_hidden_states,
    remapped_hidden_states_scales,
    expert_map,
    rows_per_expert,
    unpermuted_row_to_permuted_row,
    topk_ids,
    total_experts_num,
    local_experts_num,
) -> None:
    """The scatter: each (token, j) of topk_ids gets a row of
    remapped_hidden_states, the rows grouped by (local) expert in expert
    order (within an expert the device's order is its atomics'; here token
    order), a copy of the token's hidden state (and its scales); each
    expert's count is added to rows_per_expert (the caller's zeros), each
    (token, j)'s row written into unpermuted_row_to_permuted_row (-1: an
    expert of another rank)."""
    _check(
        hidden_states.dtype == remapped_hidden_states.dtype,
        "hidden_states and remapped_hidden_states must have save dtype",
    )
    if hidden_states_scales is not None:
        _check(
            remapped_hidden_states_scales is not None,
            "if hidden_states_scales is provided, remapped_hidden_states_scales "
            "must also be provided",
        )
    _check(rows_per_expert.dtype == torch.int32, "rows_per_expert must be int32")
    _check(
        topk_ids.dtype in (torch.int64, torch.int32), "topk_ids must be int64 or int32"
    )
    rows, top_k = topk_ids.shape
    _check(
        remapped_hidden_states.size(0) == rows * top_k
        and hidden_states.size(1) == remapped_hidden_states.size(1),
        "remapped_hidden_states must be [num_rows * TopK, hidden_size]",
    )
    experts = topk_ids.long().reshape(-1)
    if expert_map is not None:
        experts = expert_map.long()[experts]
    present = experts != -1
    counts = torch.bincount(experts[present], minlength=local_experts_num)
    rows_per_expert.add_(counts[:local_experts_num].to(torch.int32))
    starts = torch.cumsum(rows_per_expert.long(), 0) - rows_per_expert.long()
    order = torch.argsort(torch.where(present, experts, local_experts_num), stable=True)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    first = torch.cumsum(counts, 0) - counts  # rank among this call's rows
    permuted = starts[experts.clamp(min=0)] + position - first[experts.clamp(min=0)]
    permuted = torch.where(present, permuted, torch.full_like(permuted, -1))
    sources = torch.arange(rows).repeat_interleave(top_k)
    taken = permuted[present]
    remapped_hidden_states[taken] = hidden_states[sources[present]]
    if hidden_states_scales is not None:
        remapped_hidden_states_scales[taken] = hidden_states_scales[sources[present]]
    unpermuted_row_to_permuted_row.copy_(
        permuted.view(unpermuted_row_to_permuted_row.shape)
    )


# e2m1's magnitudes by code (bit 3 the sign): cutlass float_e2m1_t
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# the group sizes the kernel takes for int4 / mxfp4 scales (:258)
MX_GROUPS = (32, 64, 128, 256)


def dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K] of one expert's MXFP4 weight: packed [N, K / 2] uint8, two
    e2m1 values a byte, element 2j in the low nibble of byte j and 2j + 1 in
    the high (cutlass's sub-byte order, the checkpoint's as the XPU backend
    keeps it), times its group's e8m0 scale, scales [N, K / group] uint8
    taken as a float's exponent bits (s << 23: 2^(s - 127); gemm_xe2.hpp:396)."""
    lut = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float32)
    low = lut[(packed & 0x0F).long()]
    high = lut[(packed >> 4).long()]
    values = torch.stack([low, high], -1).reshape(packed.shape[0], -1)
    scale = (scales.to(torch.int32) << 23).view(torch.float32)
    group = values.shape[1] // scales.shape[-1]
    return values * scale.repeat_interleave(group, -1)


def _mxfp4_checks(ptr_A, ptr_B, ptr_scales, ptr_bias, ptr_D, N, K, num_experts):
    """The C++'s checks of an MXFP4 B ([E, N, K / 2], its scales [E, N,
    K / group]): grouped_gemm_xe2_interface.hpp:181-262."""
    _check(N % 32 == 0, "N must be divisible by 32")
    _check(ptr_A.dim() == 2, "ptr_A must be 2D [Total_M, K]")
    _check(ptr_B.dim() == 3, "ptr_B must be 3D [num_experts, K, N]")
    _check(ptr_D.dim() == 2, "ptr_D must be 2D [Total_M, N]")
    if ptr_bias is not None:
        _check(ptr_bias.dim() == 2, "ptr_bias must be 2D [num_experts, N]")
    for name, t in (("ptr_A", ptr_A), ("ptr_B", ptr_B), ("ptr_D", ptr_D)):
        _check(t.is_contiguous(), f"{name} must be contiguous")
    _check(ptr_B.size(0) == num_experts, "ptr_B.size(0) must match num_experts")
    _check(ptr_A.size(0) == ptr_D.size(0), "ptr_A.size(0) must match ptr_D.size(0)")
    _check(
        ptr_A.size(1) == ptr_B.size(2) * 2 == K,
        "ptr_A.size(1) must match ptr_B.size(1)",
    )
    _check(
        ptr_B.size(1) == ptr_D.size(1) == N, "ptr_B.size(2) must match ptr_D.size(1)"
    )
    if ptr_bias is not None:
        _check(
            ptr_bias.size(0) == num_experts, "ptr_bias.size(0) must match num_experts"
        )
        _check(ptr_bias.size(1) == N, "ptr_bias.size(1) must match N")
    _check(ptr_scales is not None, "w8a16 grouped gemm must have scales")
    _check(ptr_scales.is_contiguous(), "ptr_scales must be contiguous")
    _check(
        ptr_scales.dim() == 3,
        "ptr_scales of int4 must be 3D [num_experts, group_num, N]",
    )
    _check(
        ptr_scales.size(0) == num_experts,
        "ptr_scales.size(0) of int4 must match num_experts",
    )
    _check(
        K % ptr_scales.size(2) == 0, "ptr_scales.size(2) of int4 must be divisible by K"
    )
    _check(ptr_scales.size(1) == N, "ptr_scales.size(1) of int4 must match N")
    _check(
        K // ptr_scales.size(2) in MX_GROUPS, "group_size must be 32, 64, 128 or 256"
    )


def cutlass_grouped_gemm_interface(
    ptr_A,
    ptr_B,
    ptr_scales,
    ptr_bias,
    ptr_D,
    rows_per_expert,
    N,
    K,
    num_experts,
    is_B_int4,
    is_B_mxfp4,
    is_B_fp8_block=False,
):
    """The grouped GEMM: the rows of expert e (rows_per_expert[e] of them,
    in expert order) of ptr_A [M, K] times ptr_B[e] [K, N] (fp8: times
    ptr_scales[e], one scale per expert; 16-bit: no scales) plus
    ptr_bias[e], into the same rows of ptr_D [M, N]; returns ptr_D."""
    if is_B_int4 or is_B_fp8_block:
        _not_stood_in("cutlass_grouped_gemm_interface with int4 or fp8 blocks")
    if is_B_mxfp4:
        _mxfp4_checks(ptr_A, ptr_B, ptr_scales, ptr_bias, ptr_D, N, K, num_experts)
        if ptr_A.dtype not in (torch.bfloat16, torch.float16):
            return ptr_D  # no launcher for it (:283-289): nothing written
        start = 0
        for e, count in enumerate(rows_per_expert.tolist()):
            if count:
                weight = dequant_mxfp4(ptr_B[e], ptr_scales[e]).t()  # [K, N]
                rows = ptr_A[start : start + count].float() @ weight
                if ptr_bias is not None:
                    rows = rows + ptr_bias[e].float()
                ptr_D[start : start + count] = rows.to(ptr_D.dtype)
            start += count
        return ptr_D
    _check(N % 32 == 0, "N must be divisible by 32")
    _check(ptr_A.dim() == 2, "ptr_A must be 2D [Total_M, K]")
    _check(ptr_B.dim() == 3, "ptr_B must be 3D [num_experts, K, N]")
    _check(ptr_D.dim() == 2, "ptr_D must be 2D [Total_M, N]")
    for name, t in (("ptr_A", ptr_A), ("ptr_B", ptr_B), ("ptr_D", ptr_D)):
        _check(t.is_contiguous(), f"{name} must be contiguous")
    _check(ptr_B.size(0) == num_experts, "ptr_B.size(0) must match num_experts")
    _check(ptr_A.size(0) == ptr_D.size(0), "ptr_A.size(0) must match ptr_D.size(0)")
    _check(
        ptr_A.size(1) == ptr_B.size(1) == K, "ptr_A.size(1) must match ptr_B.size(1)"
    )
    _check(
        ptr_B.size(2) == ptr_D.size(1) == N, "ptr_B.size(2) must match ptr_D.size(1)"
    )
    if ptr_bias is not None:
        _check(
            tuple(ptr_bias.shape) == (num_experts, N),
            "ptr_bias must be [num_experts, N]",
        )
    fp8 = ptr_B.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    if fp8:
        _check(ptr_scales is not None, "w8a16 grouped gemm must have scales")
        _check(ptr_scales.dim() == 1, "ptr_scales of fp8 must be 1D [num_experts]")
        _check(
            ptr_scales.size(0) == num_experts,
            "ptr_scales.size(0) of fp8 must match num_experts",
        )
        _check(ptr_scales.dtype == torch.float32, "ptr_scales must be float")
    else:
        _check(ptr_scales is None, "w16a16 grouped gemm must not have scales")
    start = 0
    for e, count in enumerate(rows_per_expert.tolist()):
        if count:
            weight = ptr_B[e].float() * (ptr_scales[e].float() if fp8 else 1.0)
            rows = ptr_A[start : start + count].float() @ weight
            if ptr_bias is not None:
                rows = rows + ptr_bias[e].float()
            ptr_D[start : start + count] = rows.to(ptr_D.dtype)
        start += count
    return ptr_D


def moe_gather(
    output, moe_output, topk_weights, unpermuted_row_to_permuted_row, num_experts
) -> None:
    """The weighted gather: output[t] = sum over j of topk_weights[t, j] *
    moe_output[unpermuted_row_to_permuted_row[t, j]] (fp32; a row of -1
    skipped), cast to output's dtype."""
    rows = unpermuted_row_to_permuted_row.long()
    valid = (rows != -1).unsqueeze(-1)
    taken = moe_output[rows.clamp(min=0)].float() * topk_weights.float().unsqueeze(-1)
    output.copy_(torch.where(valid, taken, 0.0).sum(1).to(output.dtype))


# op ("namespace::name") -> its reference
REFERENCES: dict[str, Callable] = {
    "_moe_C::topk_softmax": topk_softmax,
    "_moe_C::remap_hidden_states": remap_hidden_states,
    "_xpu_C::cutlass_grouped_gemm_interface": cutlass_grouped_gemm_interface,
    "_moe_C::moe_gather": moe_gather,
}
