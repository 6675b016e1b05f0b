"""A stand-in of vllm_xpu_kernels.fused_moe_interface (Python the package
ships, which needs its XPU extensions), as the b18beee image builds it
(vllm-xpu-kernels 3cab97a: data/xpu_moe_ops.toml): the names a tree's XPU
MoE path imports (vllm/model_executor/layers/fused_moe/experts/xpu_moe.py:
XpuFusedMoe, fused_moe_activation), calling the package's torch ops in the
package's order (fused_moe_interface.py@3cab97a: XpuFusedMoe._apply_kernel
:431-513), so that the ops' CPU kernels (moe_kernels.py) compute what the
device would: fp8 (one scale per expert), 16-bit and MXFP4 experts (e2m1
[E, N, K / 2] with e8m0 scales per 32, gpt-oss's, with its swigluoai
activation). What is not stood in (int4, mxfp8 and block fp8 experts,
expert parallelism, the package's reference path) raises, naming it."""

import torch

from xpufakes.proof.xpu.uncomputed import NoCPUReference

# fused_moe_interface.py@3cab97a:95 (fused_moe_activation), :358 (act_func)
# and :361 (swigluoai: gpt-oss's, with its default alpha and limit)
_ACTIVATIONS = {
    "silu": "silu_and_mul",
    "gelu": "gelu_and_mul",
    "swigluoai": "swigluoai_and_mul",
}


def _refused(what: str):
    raise NoCPUReference(
        f"vllm_xpu_kernels.fused_moe_interface stand-in: {what} is not stood "
        "in; proof/xpu/fused_moe_standin.py"
    )


def _activation_op(activation: str):
    name = _ACTIVATIONS.get(str(activation))
    if name is None:
        _refused(f"the activation {activation!r}")
    return getattr(torch.ops._C, name)


def fused_moe_activation(act_output, gemm1_output, activation) -> None:
    """act_output = act(gemm1_output[:, :d]) * gemm1_output[:, d:], by the
    package's `_C` op of that activation."""
    _activation_op(activation)(act_output, gemm1_output)


class XpuFusedMoe:
    """The experts of one MoE layer: fp8 (one scale per expert) or 16-bit
    weights [E, K, N], as the package lays them out for its grouped GEMM, or
    MXFP4 ones [E, N, K / 2] with their scales [E, N, K / 32]."""

    def __init__(
        self,
        w13,
        w13_scales,
        w13_bias,
        w2,
        w2_scales,
        w2_bias,
        n_experts_per_token,
        activation,
        num_experts,
        ep_rank=0,
        ep_size=1,
        expert_map=None,
        is_fp8=False,
        is_int4=False,
        is_mxfp4=False,
        is_mxfp8=False,
        is_block_fp8=False,
    ):
        if is_int4 or is_mxfp8 or is_block_fp8:
            _refused("int4, mxfp8 or block-fp8 experts")
        if ep_size > 1 or expert_map is not None:
            _refused("expert parallelism")
        if w13.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and not is_fp8:
            _refused("fp8 weights without is_fp8")
        assert w13.is_contiguous() and w2.is_contiguous()
        # [E, K, N]; MXFP4 [E, N, K / 2] (fused_moe_interface.py@3cab97a:309)
        self.inter_size = w13.shape[-2 if is_mxfp4 else -1] // 2
        self.is_mxfp4 = bool(is_mxfp4)
        self.w13, self.w2 = w13, w2
        self.w13_scales = w13_scales if (is_fp8 or is_mxfp4) else None
        self.w2_scales = w2_scales if (is_fp8 or is_mxfp4) else None
        self.w13_bias, self.w2_bias = w13_bias, w2_bias
        self.top_k = n_experts_per_token
        self.act_func = _activation_op(activation)
        self.num_experts = num_experts

    def apply(self, output, hidden_states, topk_weights, topk_ids, expert_map=None):
        """output = the weighted sum of each token's experts: scatter the
        tokens by expert, gate_up GEMM, activation, down GEMM, gather."""
        if expert_map is not None:
            _refused("expert parallelism")
        rows, hidden = hidden_states.shape
        total = rows * self.top_k
        like = {"dtype": hidden_states.dtype, "device": hidden_states.device}
        remapped = torch.empty((total, hidden), **like)
        rows_per_expert = torch.zeros(
            self.num_experts, dtype=torch.int32, device=hidden_states.device
        )
        to_permuted = torch.empty(
            (rows, self.top_k), dtype=torch.int32, device=hidden_states.device
        )
        torch.ops._moe_C.remap_hidden_states(
            hidden_states,
            None,
            remapped,
            None,
            None,
            rows_per_expert,
            to_permuted,
            topk_ids,
            self.num_experts,
            self.num_experts,
        )
        gate_up = torch.empty((total, 2 * self.inter_size), **like)
        self._gemm(remapped, self.w13, self.w13_scales, self.w13_bias, gate_up,
                   rows_per_expert, 2 * self.inter_size, hidden)  # fmt: skip
        activated = torch.empty((total, self.inter_size), **like)
        self.act_func(activated, gate_up)
        down = torch.empty((total, hidden), **like)
        self._gemm(activated, self.w2, self.w2_scales, self.w2_bias, down,
                   rows_per_expert, hidden, self.inter_size)  # fmt: skip
        torch.ops._moe_C.moe_gather(
            output, down, topk_weights, to_permuted, self.num_experts
        )

    def _gemm(self, a, b, scales, bias, d, rows_per_expert, n, k) -> None:
        torch.ops._xpu_C.cutlass_grouped_gemm_interface(
            a, b, scales, bias, d, rows_per_expert, n, k, self.num_experts,
            False, self.is_mxfp4,
        )  # fmt: skip
