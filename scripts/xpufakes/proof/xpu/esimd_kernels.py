"""CPU reference kernels of intel/llm-scaler's ESIMD ops
(`custom_esimd_kernels_vllm`, vllm/custom-esimd-kernels-vllm/csrc/xpu/ of
the image), torch only: each takes the op's arguments in its schema's order,
checks what the C++ checks (TORCH_CHECK: its refusals are the kernel's),
writes exactly the buffers the C++ writes (in place, through the tensor the
caller passed) and returns what the C++ returns (that same tensor, or
nothing). The math is the C++'s, small: fp32 accumulation, the result cast
to the buffer's dtype. An op a catalog model does not reach has none (its
stand-in raises, naming it: esimd.py)."""

from collections.abc import Callable

import torch

# where each kernel is (b18beee, vllm/custom-esimd-kernels-vllm/)
SOURCES = {
    "esimd_gemm_fp8_blockscale": "csrc/xpu/esimd_kernel_gemm.sycl:97 (K checked: :116)",
    "esimd_gemm_fp8_pert": "csrc/xpu/esimd_kernel_gemm.sycl:32",
    "esimd_gemv_fp8_pert": "csrc/xpu/esimd_kernel.sycl:88",
    "esimd_rms_norm": "csrc/xpu/esimd_kernel.sycl:488",
    "esimd_fused_add_rms_norm": "csrc/xpu/esimd_kernel.sycl:503",
    "esimd_fused_add_rms_norm_batched": "csrc/xpu/esimd_kernel.sycl:541",
}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)  # as TORCH_CHECK raises (c10::Error)


def dequant_block(weight, scale, block_n: int, block_k: int) -> torch.Tensor:
    """fp32 weight [N, K] of an fp8 weight and its block scales
    [ceil(N/block_n), ceil(K/block_k)]: w[n, k] * scale[n // bn, k // bk]."""
    n, k = weight.shape
    expanded = scale.float().repeat_interleave(block_n, 0)[:n]
    expanded = expanded.repeat_interleave(block_k, 1)[:, :k]
    return weight.float() * expanded


def gemm_fp8_blockscale(input, weight, weight_scale, output, block_n, block_k):
    """output[M, N] = input[M, K] @ dequant(weight[N, K], 128x128 blocks)^T;
    returns output."""
    name = "esimd_gemm_fp8_blockscale"
    _check(input.dtype == torch.float16, f"{name}: input must be fp16")
    _check(weight.dtype in (torch.float8_e4m3fn, torch.uint8), f"{name}: weight")
    _check(weight_scale.dtype == torch.float32, f"{name}: weight_scale must be float32")
    _check(output.dtype == torch.float16, f"{name}: output must be fp16")
    _check(block_n == 128 and block_k == 128, f"{name}: only 128x128 weight blocks")
    m, (n, k) = input.size(0), weight.shape
    _check(k % block_k == 0, f"{name}: K must be a multiple of block_k(128), got K={k}")
    nb, kb = -(-n // block_n), -(-k // block_k)
    _check(tuple(weight_scale.shape) == (nb, kb), f"{name}: weight_scale shape")
    _check(tuple(output.shape[:2]) == (m, n), f"{name}: output shape mismatch")
    if weight.dtype == torch.uint8:
        weight = weight.view(torch.float8_e4m3fn)
    w = dequant_block(weight, weight_scale, block_n, block_k)
    output.copy_(input.float() @ w.t())
    return output


def _pert(input, weight, weight_scale, output):
    """output = input @ (weight * scale)^T, fp32 accumulation."""
    w = weight.float() * weight_scale.float().reshape(())
    output.copy_((input.reshape(-1, input.size(-1)).float() @ w.t()).view_as(output))
    return output


def gemv_fp8_pert(input, weight, weight_scale, output):
    """[1, K] @ fp8 [N, K]^T (per-tensor scale) into output [1, N]; returns it."""
    return _pert(input, weight, weight_scale, output)


def gemm_fp8_pert(input, weight, weight_scale, output):
    """[M, K] @ fp8 [N, K]^T (per-tensor scale) into output [M, N]; returns it."""
    return _pert(input, weight, weight_scale, output)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rms_norm(input, output, weight, eps):
    """output = rmsnorm(input) * weight; returns output."""
    output.copy_(_rms(input, weight, eps))
    return output


def fused_add_rms_norm(hidden_states, residual, weight, eps):
    """residual += hidden_states; hidden_states = rmsnorm(residual) * weight
    (the caller's w + 1); both in place; returns hidden_states."""
    residual.copy_(residual.float() + hidden_states.float())
    hidden_states.copy_(_rms(residual, weight, eps))
    return hidden_states


# op name (without its namespace) -> reference
REFERENCES: dict[str, Callable] = {
    "esimd_gemm_fp8_blockscale": gemm_fp8_blockscale,
    "esimd_gemm_fp8_pert": gemm_fp8_pert,
    "esimd_gemv_fp8_pert": gemv_fp8_pert,
    "esimd_rms_norm": rms_norm,
    "esimd_fused_add_rms_norm": fused_add_rms_norm,
    "esimd_fused_add_rms_norm_batched": fused_add_rms_norm,
}
