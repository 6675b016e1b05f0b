"""CPU reference kernels of intel/llm-scaler's ESIMD ops
(`custom_esimd_kernels_vllm`, vllm/custom-esimd-kernels-vllm/csrc/xpu/ of
the image), torch only: each takes the op's arguments in its schema's
order, checks what the C++ checks (TORCH_CHECK: its refusals are the
kernel's), writes exactly the buffers the C++ writes (in place, through the
tensor the caller passed) and returns what the C++ returns (that same
tensor, or nothing). The math is the C++'s, small: fp32 accumulation, the
result cast to the buffer's dtype. Every ESIMD op
data/schema_contracts.toml names on llm-scaler b18beee's traced path (the
21 whose schemas hide a write there, esimd_moe_topk under
ENABLE_MOE_ESIMD_ROUTING=1) has one, and so has esimd_qkv_split_norm_rope
(Qwen3-Next's full attention at decode, read from 25095b4's C++), and so
have the MoE ops of Qwen3-Next and Gemma 4 at decode (moe_forward_full,
_v2, the grouped fp8 ones and their gather, the gelu_tanh per-route ones
and moe_topk: esimd_moe_kernels.py, 25095b4); an op without one
(esimd_gdn_conv_fused, esimd_gdn_conv_fused_seq, 25095b4's
esimd_gemv_fp16_gelu_mul, ...) has a stand-in that raises, naming it
(esimd.py)."""

from collections.abc import Callable

import torch

from xpufakes.proof.xpu import esimd_moe_kernels
from xpufakes.proof.xpu.esimd_moe_kernels import (  # shared with the MoE kernels
    _bytes,
    _check,
    _silu,
    _typed,
)

# where each kernel is (b18beee, vllm/custom-esimd-kernels-vllm/)
SOURCES = {
    "esimd_gemm_fp8_blockscale": "csrc/xpu/esimd_kernel_gemm.sycl:97 (K checked: :116)",
    "esimd_gemm_fp8_pert": "csrc/xpu/esimd_kernel_gemm.sycl:32",
    "esimd_gemv_fp8_pert": "csrc/xpu/esimd_kernel.sycl:88",
    "esimd_rms_norm": "csrc/xpu/esimd_kernel.sycl:488",
    "esimd_fused_add_rms_norm": "csrc/xpu/esimd_kernel.sycl:504",
    "esimd_fused_add_rms_norm_batched": "csrc/xpu/esimd_kernel.sycl:541",
    "esimd_fused_scaled_add_rms_norm": "csrc/xpu/esimd_kernel.sycl:522",
    "esimd_gemm_int4_pgrp": "csrc/xpu/esimd_kernel_gemm.sycl:55",
    "esimd_gemv_fp16": "csrc/xpu/esimd_kernel.sycl:100",
    "esimd_gemv_fp8_pert_fused2": "csrc/xpu/esimd_kernel.sycl:155",
    "esimd_gemv_int4": "csrc/xpu/esimd_kernel.sycl:200",
    "esimd_gemv_int4_fused2": "csrc/xpu/esimd_kernel.sycl:214",
    "esimd_moe_gelu_tanh_mul": "csrc/xpu/esimd_kernel_moe.sycl:148",
    "esimd_moe_topk": "csrc/xpu/esimd_kernel_moe.sycl:71",
    "esimd_norm_add_norm": "csrc/xpu/esimd_kernel.sycl:611",
    "esimd_norm_gemv_fp8_pert": "csrc/xpu/esimd_kernel.sycl:347",
    "esimd_norm_gemv_int4_pert": "csrc/xpu/esimd_kernel.sycl:439",
    "esimd_norm_gemv_norm_fp16": "csrc/xpu/esimd_kernel.sycl:561",
    "esimd_resadd_norm_gemv_fp8_pert": "csrc/xpu/esimd_kernel.sycl:315",
    "esimd_resadd_norm_gemv_int4_pert": "csrc/xpu/esimd_kernel.sycl:377",
    "esimd_rms_norm_gated": "csrc/xpu/esimd_kernel.sycl:467",
    # 25095b4 (host :241; the op: torch_extension.cc:68)
    "esimd_qkv_split_norm_rope": "csrc/xpu/esimd_kernels/qkv_split_norm_rope.h:23",
    # 25095b4's MoE ops of Qwen3-Next and Gemma 4 at decode (esimd_moe_kernels.py)
    **esimd_moe_kernels.SOURCES,
}


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
    """output = rmsnorm(input) * weight, of one row: K = input.size(-1),
    nd_range 1 (rms_norm_host, fused_add_rms_norm.h:295-299): the first K
    of output written, any other row as it was; returns output."""
    k = input.size(-1)
    _flat(output)[:k].copy_(_rms(_flat(input)[:k], weight, eps))
    return output


def fused_add_rms_norm_batched(hidden_states, residual, weight, eps):
    """Each row: residual += hidden_states; hidden_states = rmsnorm(residual)
    * weight (the caller's w + 1); both in place; returns hidden_states
    (fused_add_rms_norm_batched_host: rows = hidden_states.size(0))."""
    residual.copy_(residual.float() + hidden_states.float())
    hidden_states.copy_(_rms(residual, weight, eps))
    return hidden_states


def fused_add_rms_norm(hidden_states, residual, weight, eps):
    """fused_add_rms_norm_batched of one row: K = hidden_states.size(-1),
    nd_range 1 (fused_add_rms_norm_v2_host, fused_add_rms_norm.h:221-233):
    any other row as it was; returns hidden_states."""
    k = hidden_states.size(-1)
    fused_add_rms_norm_batched(
        _flat(hidden_states)[:k], _flat(residual)[:k], weight, eps
    )
    return hidden_states


# --- the ops of b18beee's traced path beyond the GEMMs and the norms above ---
#
# The kernels take data_ptr() and address it densely (reinterpret_cast, no
# stride): a buffer here is its tensor viewed flat (_flat: a view, so that a
# write goes through to the caller's tensor; a non-contiguous one is refused
# by view(), where the kernel would read it as if dense). Where a kernel takes
# only part of a buffer (one row, a prefix of K), the reference reads and
# writes that part and leaves the rest as it was. fp16 inputs, fp16 scales of
# the int4 ops and fp32 scales of the fp8 ones are what the kernels read
# (reinterpret_cast, unchecked unless the op's own check says so).


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The buffer as the kernel addresses it (data_ptr(), dense): a view."""
    return tensor.view(-1)


def _e5m2(weight: torch.Tensor) -> bool:
    """The kernels' fp8 mode: E5M2 for a float8_e5m2 weight, else E4M3 (a
    uint8 weight too; get_fp8_mode, esimd_kernel.sycl:30)."""
    return weight.dtype == torch.float8_e5m2


def _fp8(weight, count: int, e5m2: bool, e4m3_subnormals=False) -> torch.Tensor:
    """fp32 values of the first `count` fp8 bytes of `weight` as the kernels
    decode them: bit arithmetic into an fp16 (fp8_dequant, fp8_GEMV_v2.h:18;
    fp8_dequant_rng, resadd_norm_gemv_fused.h:29; fp8_dequant_norm,
    norm_gemv_fused.h:33), E5M2 where `e5m2`, else E4M3. E4M3: sign,
    exponent e (4 bits, bias 7), mantissa m (3 bits): 2^(e-7) (1 + m/8);
    0x7F and 0xFF (NaN in float8_e4m3fn) read +-480, as the bits give; e = 0
    a signed zero (flushed), or 2^-6 m/8 with `e4m3_subnormals`
    (fp8_dequant_norm's shift keeps them). E5M2: 2^(e-15) (1 + m/4), e = 31
    inf (m = 0) or NaN, e = 0 a signed zero."""
    raw = _bytes(weight)[:count].to(torch.int32)
    sign = torch.where(raw >= 128, -1.0, 1.0)
    if e5m2:
        e, m, bias, steps = (raw >> 2) & 0x1F, (raw & 3).float(), 15, 4.0
    else:
        e, m, bias, steps = (raw >> 3) & 0xF, (raw & 7).float(), 7, 8.0
    value = (1.0 + m / steps) * torch.exp2((e - bias).float())
    small = m / steps * 2.0 ** (1 - bias)
    if e5m2 or not e4m3_subnormals:
        small = torch.zeros_like(small)
    value = torch.where(e == 0, small, value)
    if e5m2:
        special = torch.where(m == 0, float("inf"), float("nan"))
        value = torch.where(e == 31, special, value)
    return sign * value


def _nibbles(weight, n: int, k: int) -> torch.Tensor:
    """int32 [n, k], unsigned 0..15: packed int4 read as the kernels read it
    (int4_GEMV.h:12-22, int4_dequant :92; resadd_norm_gemv_int4.h:102-110;
    int4_GEMM.h:62): row r is bytes [r k/2, (r+1) k/2) of the buffer (an
    int32 [N, K/8] weight read as its little-endian bytes); byte j holds
    element 2j in its low nibble and element 2j+1 in its high one."""
    packed = _bytes(weight)[: n * (k // 2)].view(n, k // 2).to(torch.int32)
    return torch.stack((packed & 0xF, packed >> 4), -1).reshape(n, k)


def _group_scales(scale, n: int, k: int) -> torch.Tensor:
    """[n, k] of the per-group scales (one per 128 of K, rows of K/128
    read from the buffer), each element's own; the scale's dtype."""
    groups = k // 128
    rows = _flat(scale)[: n * groups].view(n, groups)
    return rows.repeat_interleave(128, 1)


def _int4(weight, scale, n: int, k: int) -> torch.Tensor:
    """fp32 [n, k]: (nibble - 8) * scale, in fp32 (exact: the GEMVs'
    `wf * gs` and `u * s + (-8 s)`)."""
    return (_nibbles(weight, n, k) - 8).float() * _group_scales(scale, n, k).float()


def _inv_rms(sum_sq: torch.Tensor, k: int, eps: float) -> torch.Tensor:
    """rsqrt(sum_sq / K + eps): every norm here divides by the K it was
    given, whatever part of K it summed."""
    return torch.rsqrt(sum_sq / k + eps)


def fused_scaled_add_rms_norm(hidden_states, residual, weight, eps, scalar):
    """residual <- (hidden_states + residual) * scalar (fp16, in place);
    hidden_states <- residual * inv_rms * weight, where inv_rms = rsqrt(
    sum((h + r) * scalar)^2 / K + eps) over the fp32 sums, and pass 2
    reads the residual back as stored (fp16). One row: K =
    hidden_states.size(-1), the first K elements of each buffer
    (nd_range 1; FusedScaledAddRmsNorm_kernel, fused_add_rms_norm.h:153,
    host :206, the tail masked: all of K). weight as given (the caller
    prepares it: no 1 + w here). Returns hidden_states. A K below 64 reads
    before the buffer in the C++ (k_tail = K - VL < 0); here it is the
    same formula."""
    k = hidden_states.size(-1)
    h, r = _flat(hidden_states)[:k], _flat(residual)[:k]
    added = (h.float() + r.float()) * scalar
    r.copy_(added)
    inv = _inv_rms(added.square().sum(), k, eps)
    h.copy_(r.float() * inv * _flat(weight)[:k].float())
    return hidden_states


def rms_norm_gated(x, z, weight, output, eps):
    """output[i] = x[i] * rsqrt(mean(x[i]^2) + eps) * weight * silu(z[i])
    for each of rows = x.size(0) rows of V = x.size(1) (RmsNormGated_kernel,
    rms_norm_gated.h:15: the norm over x alone, then the gate; weight as
    given). Writes output only; returns it. The kernel loads 128 elements
    a row whatever V is (block_load<fp16, 128>, :31-33) and divides by V:
    V = 128 is what it computes; other V here is the same formula over V."""
    rows, v = x.size(0), x.size(1)
    xf = _flat(x)[: rows * v].view(rows, v).float()
    zf = _flat(z)[: rows * v].view(rows, v).float()
    inv = _inv_rms(xf.square().sum(-1, keepdim=True), v, eps)
    normed = xf * inv * _flat(weight)[:v].float()
    _flat(output)[: rows * v].copy_((normed * _silu(zf)).view(-1))
    return output


def norm_add_norm(h2_raw, h1, w1, w2, out, eps1, eps2):
    """h1 <- h2_raw * inv_rms(h2_raw, eps1) * w1 + h1 (fp16, in place);
    out <- h1 * inv_rms(h1, eps2) * w2, the second sum over the fp32 new h1,
    pass 3 reading h1 back as stored (NormAddNorm_kernel, norm_add_norm.h:
    108). One row of K = h2_raw.size(-1). The kernel walks K in chunks of
    VL = 512, 256, 128 (the largest dividing K) else 64, K / VL of them
    (host :162): the first K - K % 64 elements are summed, written and
    read; the rest of h1 and out stay as they were (the sums still divide
    by K). Returns nothing (schema `-> ()`)."""
    k = h2_raw.size(-1)
    p = k - k % 64
    h2 = _flat(h2_raw)[:p].float()
    h1_part = _flat(h1)[:p]
    inv1 = _inv_rms(h2.square().sum(), k, eps1)
    new = h2 * inv1 * _flat(w1)[:p].float() + h1_part.float()
    h1_part.copy_(new)
    inv2 = _inv_rms(new.square().sum(), k, eps2)
    _flat(out)[:p].copy_(h1_part.float() * inv2 * _flat(w2)[:p].float())


def norm_gemv_norm_fp16(
    residual, scale_with_root, proj_w, pre_ff_w, router_logits, moe_input, eps
):
    """normed = residual * rsqrt(mean(residual^2) + eps) (fp32);
    router_logits[n] = sum_k normed[k] * scale_with_root[k] * proj_w[n, k];
    moe_input = normed * pre_ff_w (NormGemvNorm_fp16_kernel,
    norm_gemv_norm_fp16.h:47: weights as given). N, K = proj_w's shape;
    one row of residual. Chunks of VL = 512/256/128 (dividing K) else 64
    (host :101): the first K - K % 64 elements count, the rest of moe_input
    stays as it was. Work-group 0 writes moe_input: with N = 0 nothing is
    written. Returns nothing (schema `-> ()`)."""
    n, k = proj_w.size(0), proj_w.size(1)
    p = k - k % 64
    res = _flat(residual)[:p].float()
    normed = res * _inv_rms(res.square().sum(), k, eps)
    router_in = normed * _flat(scale_with_root)[:p].float()
    weight = _flat(proj_w)[: n * k].view(n, k)[:, :p].float()
    if n > 0:
        _flat(moe_input)[:p].copy_(normed * _flat(pre_ff_w)[:p].float())
    _flat(router_logits)[:n].copy_(weight @ router_in)


def gemv_fp16(input, weight, output):
    """output[M, N] = input[M, K] @ weight[N, K]^T, fp32 accumulation
    (GEMV_fp16_kernel, fp16_GEMV.h:36), after the C++'s checks
    (esimd_kernel.sycl:104-120). Returns output. The launch splits K into
    K_SPLIT parts of K // K_SPLIT walked by VL (select_vl_ks_fp16, :143):
    a K that is not a multiple of 32 is read past or cut short there;
    here it is the whole K."""
    checks = [
        (input.dtype == torch.float16, "input.scalar_type() == at::ScalarType::Half"),
        (weight.dtype == torch.float16, "weight.scalar_type() == at::ScalarType::Half"),
        (output.dtype == torch.float16, "output.scalar_type() == at::ScalarType::Half"),
        (input.dim() == 2, "input.dim() == 2"),
        (weight.dim() == 2, "weight.dim() == 2"),
        (output.dim() == 2, "output.dim() == 2"),
        (input.is_contiguous(), "input.is_contiguous()"),
        (weight.is_contiguous(), "weight.is_contiguous()"),
        (output.is_contiguous(), "output.is_contiguous()"),
        (input.device == weight.device, "input.device() == weight.device()"),
        (input.device == output.device, "input.device() == output.device()"),
    ]
    for ok, what in checks:
        _check(ok, f"Expected {what} to be true, but got false.")
    m, n, k = input.size(0), weight.size(0), weight.size(1)
    _check(input.size(1) == k, "Expected input.size(1) == K to be true, but got false.")
    _check(
        output.size(0) == m and output.size(1) == n,
        "Expected output.size(0) == M && output.size(1) == N to be true, "
        "but got false.",
    )
    output.copy_(input.float() @ weight.float().t())
    return output


def gemv_fp8_pert_fused2(input, w0, s0, o0, w1, s1, o1):
    """o_i[n] = (sum_k input[k] * fp8(w_i[n, k])) * s_i, i = 0, 1, one
    launch (GEMV_fp8_pert_fused_kernel, fp8_GEMV_v2.h:410, host :475):
    writes BOTH o0 (N0 = w0.size(0)) and o1 (N1 = w1.size(0)); returns o0
    (esimd_kernel.sycl:170). K = w0.size(1) for both matrices (w1's rows
    are K bytes apart whatever its shape), one row of input, the fp8 format
    w0's for both (get_fp8_mode(w0), :169), subnormals flushed
    (fp8_dequant). The launch's fallback is VL = 128 (:523): K a multiple
    of 128 is what it computes whole."""
    k = w0.size(1)
    x = _flat(input)[:k].float()
    e5m2 = _e5m2(w0)
    for weight, scale, out in ((w0, s0, o0), (w1, s1, o1)):
        n = weight.size(0)
        values = _fp8(weight, n * k, e5m2).view(n, k)
        _flat(out)[:n].copy_((values @ x) * _flat(scale)[0].float())
    return o0


def gemv_int4(input, weight, weight_scale, output):
    """output[n] = sum_k input[k] * (nibble[n, k] - 8) * scale[n, k // 128]
    (GEMV_int4_kernel, int4_GEMV.h:166, host :267): N = weight.size(0),
    K = 2 weight.size(1) (uint8 [N, K/2]), scale fp16 [N, K/128], one row
    of input. Writes output; returns it. K a multiple of 128 (VL = group =
    128, :125) is what it computes."""
    n, k = weight.size(0), weight.size(1) * 2
    x = _flat(input)[:k].float()
    _flat(output)[:n].copy_(_int4(weight, weight_scale, n, k) @ x)
    return output


def gemv_int4_fused2(input, w0, s0, o0, w1, s1, o1):
    """gemv_int4 of both matrices on one input, one launch
    (GEMV_int4_fused_kernel, int4_GEMV.h:322, host :415): writes BOTH o0
    and o1; returns o0 (esimd_kernel.sycl:229). K = 2 w0.size(1) for both
    (w1's rows K/2 bytes apart whatever its shape)."""
    k = w0.size(1) * 2
    x = _flat(input)[:k].float()
    for weight, scale, out in ((w0, s0, o0), (w1, s1, o1)):
        n = weight.size(0)
        _flat(out)[:n].copy_(_int4(weight, scale, n, k) @ x)
    return o0


# GEMM_int4_pgrp_kernel's row tiles: ceil(M / 8) of 8 rows, at most 8
# (GEMM_int4_pgrp_host's dispatch, int4_GEMM.h:303-318)
_INT4_GEMM_ROWS = 64


def gemm_int4_pgrp(input, weight, weight_scale, output):
    """output[M, N] = input[M, K] @ w^T, w[n, k] the fp16 dequantized
    weight: nibble * s + (-8 s) in fp16 (int4_pair_to_vnni_scaled,
    int4_GEMM.h:62-73: read as written, the product and the sum each
    rounded to fp16; a fused multiply-add would round once), fp32
    accumulation (DPAS). After the C++'s checks
    (esimd_kernel_gemm.sycl:62-78). Rows: at most 8 tiles of 8 (the
    dispatch's largest M_TILES, int4_GEMM.h:303-318): rows from 64 on are
    not written (they stay as they were). Returns output."""
    name = "esimd_gemm_int4_pgrp"
    m, n, k = input.size(0), weight.size(0), weight.size(1) * 2
    _check(input.dtype == torch.float16, f"{name}: input must be fp16")
    _check(weight.dtype == torch.uint8, f"{name}: weight must be uint8 (packed int4)")
    _check(weight_scale.dtype == torch.float16, f"{name}: weight_scale must be fp16")
    _check(output.dtype == torch.float16, f"{name}: output must be fp16")
    _check(n % 16 == 0, f"{name}: N must be a multiple of 16 (DPAS N tile), got N={n}")
    _check(k % 128 == 0, f"{name}: K must be a multiple of 128 (group_size), got K={k}")
    groups = k // 128
    _check(
        weight_scale.size(0) == n and weight_scale.size(1) == groups,
        f"{name}: weight_scale shape mismatch; expected [{n}, {groups}], got "
        f"[{weight_scale.size(0)}, {weight_scale.size(1)}]",
    )
    _check(
        output.size(0) == m and output.size(1) == n,
        f"{name}: output shape mismatch; expected [{m}, {n}]",
    )
    scale = _group_scales(weight_scale, n, k)
    w = _nibbles(weight, n, k).half() * scale + scale * -8.0
    rows = min(m, _INT4_GEMM_ROWS)
    x = _flat(input)[: rows * k].view(rows, k).float()
    _flat(output)[: rows * n].copy_((x @ w.float().t()).view(-1))
    return output


def resadd_norm_gemv_fp8_pert(
    hidden_states,
    residual,
    norm_weight,
    gemv_weight,
    gemv_scale,
    output,
    normed_out,
    eps,
):
    """residual <- hidden_states + residual (in place); normed = (h + r) *
    rsqrt(mean((h + r)^2) + eps) * norm_weight (as given); normed_out <-
    normed (fp16); output[n] = sum_k normed[k] * fp8(gemv_weight[n, k]) *
    gemv_scale (ResAddNormGEMV_fp8_pert[_v2]_kernel, resadd_norm_gemv_fused.h
    :64/:181, host :243; fp8_dequant_rng: subnormals flushed). hidden_states
    is read only. Returns output. gemv_scale must be fp32 (data_ptr<float>(),
    esimd_kernel.sycl:336). N, K = gemv_weight's shape; one row. K a
    multiple of 128 is walked whole; any other K takes the VL = 512 kernel
    (resadd_norm_gemv_fused.h:269-274), which walks K / 512 chunks: the
    first K - K % 512 elements are summed, written and multiplied, the rest
    of residual and normed_out stay as they were. Work-group 0 stores residual while the
    others read it (a race in the C++: each work-group reads h + r from the
    buffer, and may read the stored sum): the reference reads the residual
    as passed, the math the kernel means. With N = 0 nothing is written."""
    _typed(gemv_scale, torch.float32)
    n, k = gemv_weight.size(0), gemv_weight.size(1)
    p = k if k % 128 == 0 else k - k % 512
    h = _flat(hidden_states)[:p].float()
    r = _flat(residual)[:p]
    added = h + r.float()
    normed = added * _inv_rms(added.square().sum(), k, eps)
    normed = normed * _flat(norm_weight)[:p].float()
    values = _fp8(gemv_weight, n * k, _e5m2(gemv_weight)).view(n, k)[:, :p]
    logits = (values @ normed) * _flat(gemv_scale)[0]
    if n > 0:
        r.copy_(added)
        _flat(normed_out)[:p].copy_(normed)
    _flat(output)[:n].copy_(logits)
    return output


def _resadd_int4_span(n: int, k: int) -> int:
    """How much of K the int4 resadd kernel walks (resadd_norm_gemv_int4.h,
    host :489): with K_SPLIT > 1 threads (N <= 512, K >= 512, K a multiple
    of K_SPLIT * 128) all of it; with one, chunks of 128 below K = 512
    (run_small_k, :52) and of 512 from it (run_large_k_impl, :122)."""
    split = 1
    if n <= 128 and k >= 2048:
        split = 8
    elif n <= 512 and k >= 2048:
        split = 4
    elif n <= 512 and k >= 512:
        split = 2
    while split > 1 and k % (split * 128) != 0:
        split //= 2
    if split > 1:
        return k
    return k - k % (128 if k < 512 else 512)


def resadd_norm_gemv_int4_pert(
    hidden_states,
    residual,
    norm_weight,
    gemv_weight,
    gemv_scale,
    output,
    normed_out,
    eps,
):
    """residual <- hidden_states + residual (in place); normed = (h + r) *
    rsqrt(mean((h + r)^2) + eps) * norm_weight; normed_out <- normed;
    output[n] = sum_k normed[k] * (nibble[n, k] - 8) * gemv_scale[n,
    k // 128] (ResAddNormGEMV_int4_pert_kernel / _ksplit_kernel,
    resadd_norm_gemv_int4.h:37/:248; the GEMV on the fp32 normed, not the
    stored fp16). hidden_states is read only. Returns output. gemv_weight
    must be int32 [N, K/8] (data_ptr<int32_t>(), esimd_kernel.sycl:395),
    read as bytes (nibble order: _nibbles); K = hidden_states.size(1), N =
    gemv_weight.size(0). Part of K may be left out (_resadd_int4_span: K =
    640 with a small N walks 512); the rest of residual and normed_out stay
    as they were. The same race as resadd_norm_gemv_fp8_pert's (work-group
    0 stores residual while others read it): the residual as passed here.
    With N = 0 nothing is written."""
    _typed(gemv_weight, torch.int32)
    n, k = gemv_weight.size(0), hidden_states.size(1)
    p = _resadd_int4_span(n, k)
    h = _flat(hidden_states)[:p].float()
    r = _flat(residual)[:p]
    added = h + r.float()
    normed = added * _inv_rms(added.square().sum(), k, eps)
    normed = normed * _flat(norm_weight)[:p].float()
    logits = _int4(gemv_weight, gemv_scale, n, k)[:, :p] @ normed
    if n > 0:
        r.copy_(added)
        _flat(normed_out)[:p].copy_(normed)
    _flat(output)[:n].copy_(logits)
    return output


def _gated_heads(x, z, norm_weight, heads: int, v: int, eps) -> torch.Tensor:
    """fp32 [heads * V]: each head's x * rsqrt(sum(x^2) * (1 / V) + eps) *
    norm_weight * silu(z) (norm_gemv_fused.h:105-118,
    norm_gemv_int4.h:114-122)."""
    xf = _flat(x)[: heads * v].view(heads, v).float()
    zf = _flat(z)[: heads * v].view(heads, v).float()
    inv = torch.rsqrt(xf.square().sum(-1, keepdim=True) * (1.0 / v) + eps)
    return (xf * inv * _flat(norm_weight)[:v].float() * _silu(zf)).view(-1)


def norm_gemv_fp8_pert(x, z, norm_weight, gemv_weight, gemv_scale, output, HV, V, eps):
    """y = the gated norm of each of HV heads of V (x: [HV, V], the norm
    over the head, weight [V] as given, times silu(z)); output[n] = (sum_k
    y[k] * fp8(gemv_weight[n, k])) * gemv_scale, K = HV * V
    (NormGEMV_fp8_pert_kernel, norm_gemv_fused.h:74; its E4M3 decoding,
    fp8_dequant_norm, keeps subnormals; its E5M2 flushes them). Writes
    output only; returns it. gemv_scale must be fp32 (data_ptr<float>(),
    esimd_kernel.sycl:367). N = gemv_weight.size(0); its rows K bytes
    apart. The kernel loads 128 a head whatever V is: V = 128 is what it
    computes."""
    _typed(gemv_scale, torch.float32)
    n, k = gemv_weight.size(0), HV * V
    y = _gated_heads(x, z, norm_weight, HV, V, eps)
    values = _fp8(gemv_weight, n * k, _e5m2(gemv_weight), True).view(n, k)
    _flat(output)[:n].copy_((values @ y) * _flat(gemv_scale)[0])
    return output


def _norm_gemv_int4_heads(n: int, hv: int) -> int:
    """How many heads the int4 gated-norm GEMV walks: K_SPLIT threads of
    HV // K_SPLIT heads each (norm_gemv_int4.h:84-86, host :182-187: 8, 4
    or 2 threads for N <= 512), so HV % K_SPLIT heads are left out."""
    split = 1
    if n <= 512:
        split = 8 if hv >= 8 else 4 if hv >= 4 else 2 if hv >= 2 else 1
    return hv // split * split


def norm_gemv_int4_pert(x, z, norm_weight, gemv_weight, gemv_scale, output, HV, V, eps):
    """y = the gated norm of each head (as norm_gemv_fp8_pert); output[n] =
    sum_k y[k] * (nibble[n, k] - 8) * gemv_scale[n, h] for k in head h
    (NormGEMV_int4_kernel, norm_gemv_int4.h:55: one scale per head, the
    group of 128 when V = 128). Writes output only; returns it. gemv_weight
    must be int32 [N, K/8], K = HV * V (data_ptr<int32_t>(),
    esimd_kernel.sycl:456); scale fp16 [N, K/128]. Heads walked:
    _norm_gemv_int4_heads (HV = 12 with N <= 512: 8 of them). V = 128 is
    what the kernel computes."""
    _typed(gemv_weight, torch.int32)
    n, k = gemv_weight.size(0), HV * V
    heads = _norm_gemv_int4_heads(n, HV)
    y = _gated_heads(x, z, norm_weight, heads, V, eps)
    q = (_nibbles(gemv_weight, n, k) - 8).float()[:, : heads * V]
    groups = k // 128
    scale = _flat(gemv_scale)[: n * groups].view(n, groups)[:, :heads].float()
    weight = q * scale.repeat_interleave(V, 1)
    _flat(output)[:n].copy_(weight @ y)
    return output


def moe_gelu_tanh_mul(input, output, N_gate_up, N_half, total_rows):
    """output[r, j] = gelu_tanh(input[r, j]) * input[r, N_half + j] for
    rows r < total_rows (input rows N_gate_up apart, output rows N_half),
    gelu_tanh(x) = 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))), tanh
    as (e^2z - 1) / (e^2z + 1) with 2z clamped to [-30, 30]
    (MoE_GeluTanh_Mul_Kernel, moe_ops.h:683). Writes output; returns it.
    The kernel walks N_half in chunks of 64: N_half a multiple of 64 is
    what it computes (else it writes into the next row)."""
    rows = _flat(input)[: total_rows * N_gate_up].view(total_rows, N_gate_up)
    x = rows[:, :N_half].float()
    up = rows[:, N_half : 2 * N_half].float()
    inner = 0.7978845608 * (x + 0.044715 * (x * x * x))
    e2z = torch.exp((2.0 * inner).clamp(-30.0, 30.0))
    gelu = 0.5 * x * (1.0 + (e2z - 1.0) / (e2z + 1.0))
    _flat(output)[: total_rows * N_half].copy_((gelu * up).view(-1))
    return output


def moe_topk(router_logits, top_values, top_indices, T):
    """For each row r < T of router_logits [T, 128] (fp16): p = softmax in
    fp32 (exp(x - max) / sum); the 8 largest p, each round the largest
    left, the lowest expert id among equal ones (moe_ops.h:320-350: the
    first 64 win a tie with the last 64, the lowest index within); their
    values divided by their sum into top_values[r] (fp16), their ids into
    top_indices[r] (int32) (MoE_TopK_Kernel, moe_ops.h:278-365: 128
    experts, top 8, fixed). Writes both; returns top_values."""
    _typed(top_indices, torch.int32)
    experts, k = 128, 8
    logits = _flat(router_logits)[: T * experts].view(T, experts).float()
    probs = torch.softmax(logits, dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    chosen = probs.gather(-1, order)
    chosen = chosen * (1.0 / chosen.sum(-1, keepdim=True))
    _flat(top_values)[: T * k].copy_(chosen.reshape(-1))
    _flat(top_indices)[: T * k].copy_(order.reshape(-1).to(torch.int32))
    return top_values


# Qwen3-Next's full attention at decode (qwen3_next.py _esimd_qkv_core):
# csrc/xpu/esimd_kernels/qkv_split_norm_rope.h of 25095b4, the kernel
# qkv_split_norm_rope_kernel, one work item per (head, token); headDim 256
QKV_HEAD_DIM = 256
QKV_EPS = 1e-6


def _qkv_rope(x, cos_sin, position: int, rotary_dim: int):
    """The kernel's RoPE of one normed head x [256] (fp32), reading the
    cache's fp16 bytes at position * rotary_dim: rotary_dim 64 rotates
    x[0:32] with x[32:64] by [cos(32) | sin(32)] (:94); any other rotates
    all 256, x[0:128] with x[128:256], by 128 cos then 128 sin (:107)."""
    at = position * rotary_dim
    half = 32 if rotary_dim == 64 else 128
    _check(at + 2 * half <= cos_sin.numel(), "reads past cos_sin_cache")
    cos = cos_sin[at : at + half].float()
    sin = cos_sin[at + half : at + 2 * half].float()
    x1, x2 = x[:half].clone(), x[half : 2 * half].clone()
    x[:half] = x1 * cos - x2 * sin
    x[half : 2 * half] = x2 * cos + x1 * sin
    return x


def qkv_split_norm_rope(
    qkv_state,
    q_out,
    gate_out,
    k_out,
    v_out,
    norm_wq,
    norm_wk,
    positions,
    q_heads,
    kv_heads,
    attn_output_gate,
    rotary_dim,
    cos_sin_cache,
):
    """Each 256-wide head of each token of qkv_state [T, hiddenDim] (fp16):
    the heads the host dispatches (2 q_heads + 2 kv_heads with
    attn_output_gate, else q_heads + 2 kv_heads, :259), each mapped by
    hiddenDim (gated: hiddenDim == 256 (2 q_heads + 2 kv_heads), :53) to
    Q (head 2i, gated; i), G (2i + 1), K, V. Q and K: x * (w + 1) *
    rsqrt(mean(x^2) + 1e-6), then RoPE (_qkv_rope), into q_out / k_out; G:
    sigmoid(x) into gate_out; V copied into v_out. Rows at q_heads * 256 *
    token (Q, G) and kv_heads * 256 * token (K, V), dense; positions read
    as uint32 and the cache as fp16 from their bytes. The op (the lambda of
    torch_extension.cc:73) returns nothing."""
    tokens, hidden = qkv_state.shape
    d = QKV_HEAD_DIM
    total = (
        (2 * q_heads + 2 * kv_heads) if attn_output_gate else (q_heads + 2 * kv_heads)
    )
    gated = hidden == d * (2 * q_heads + 2 * kv_heads)
    qkv = _flat(qkv_state)
    where = {
        "q": _flat(q_out),
        "g": _flat(gate_out),
        "k": _flat(k_out),
        "v": _flat(v_out),
    }
    position = _bytes(positions).view(torch.int32)
    cos_sin = _bytes(cos_sin_cache).view(torch.float16)
    wq = _flat(norm_wq)[:d].float() + 1.0
    wk = _flat(norm_wk)[:d].float() + 1.0
    for token in range(tokens):
        at = int(position[token]) & 0xFFFFFFFF
        for head in range(total):
            x = qkv[token * hidden + head * d : token * hidden + (head + 1) * d].float()
            if gated and head < 2 * q_heads:
                kind, out_head = ("q", "g")[head & 1], head >> 1
            elif head < (2 * q_heads if gated else q_heads):
                kind, out_head = "q", head
            elif head < (2 * q_heads if gated else q_heads) + kv_heads:
                kind, out_head = "k", head - (2 * q_heads if gated else q_heads)
            else:
                kind = "v"
                out_head = head - (2 * q_heads if gated else q_heads) - kv_heads
            if kind in ("q", "k"):
                weight = wq if kind == "q" else wk
                x = x * weight * torch.rsqrt(x.square().mean() + QKV_EPS)
                x = _qkv_rope(x, cos_sin, at, rotary_dim)
            elif kind == "g":
                x = torch.sigmoid(x)
            rows = q_heads if kind in ("q", "g") else kv_heads
            start = rows * d * token + out_head * d
            where[kind][start : start + d] = x.to(where[kind].dtype)


# op name (without its namespace) -> reference
REFERENCES: dict[str, Callable] = {
    "esimd_gemm_fp8_blockscale": gemm_fp8_blockscale,
    "esimd_gemm_fp8_pert": gemm_fp8_pert,
    "esimd_gemv_fp8_pert": gemv_fp8_pert,
    "esimd_rms_norm": rms_norm,
    "esimd_fused_add_rms_norm": fused_add_rms_norm,
    "esimd_fused_add_rms_norm_batched": fused_add_rms_norm_batched,
    "esimd_fused_scaled_add_rms_norm": fused_scaled_add_rms_norm,
    "esimd_gemm_int4_pgrp": gemm_int4_pgrp,
    "esimd_gemv_fp16": gemv_fp16,
    "esimd_gemv_fp8_pert_fused2": gemv_fp8_pert_fused2,
    "esimd_gemv_int4": gemv_int4,
    "esimd_gemv_int4_fused2": gemv_int4_fused2,
    "esimd_moe_gelu_tanh_mul": moe_gelu_tanh_mul,
    "esimd_moe_topk": moe_topk,
    "esimd_norm_add_norm": norm_add_norm,
    "esimd_norm_gemv_fp8_pert": norm_gemv_fp8_pert,
    "esimd_norm_gemv_int4_pert": norm_gemv_int4_pert,
    "esimd_norm_gemv_norm_fp16": norm_gemv_norm_fp16,
    "esimd_resadd_norm_gemv_fp8_pert": resadd_norm_gemv_fp8_pert,
    "esimd_resadd_norm_gemv_int4_pert": resadd_norm_gemv_int4_pert,
    "esimd_rms_norm_gated": rms_norm_gated,
    "esimd_qkv_split_norm_rope": qkv_split_norm_rope,
    # 25095b4's MoE ops (moe_ops::, moe_int4_prefill_ops::): esimd_moe_kernels.py
    "moe_forward_full": esimd_moe_kernels.moe_forward_full,
    "moe_forward_full_v2": esimd_moe_kernels.moe_forward_full_v2,
    "moe_prefill_gather_forward_v2": esimd_moe_kernels.moe_prefill_gather_forward_v2,
    "moe_up_fp8_grouped": esimd_moe_kernels.moe_up_fp8_grouped,
    "moe_down_fp8_grouped": esimd_moe_kernels.moe_down_fp8_grouped,
    "moe_forward_full_fp8_grouped": esimd_moe_kernels.moe_forward_full_fp8_grouped,
    "moe_topk": esimd_moe_kernels.moe_topk,
    "moe_forward_full_gelu_tanh": esimd_moe_kernels.moe_forward_full_gelu_tanh,
    "moe_forward_full_gelu_tanh_routed": (
        esimd_moe_kernels.moe_forward_full_gelu_tanh_routed
    ),
    "moe_forward_full_gelu_tanh_routed_no_accum": (
        esimd_moe_kernels.moe_forward_full_gelu_tanh_routed_no_accum
    ),
    "moe_forward_full_gelu_tanh_routed_decode": (
        esimd_moe_kernels.moe_forward_full_gelu_tanh_routed_decode
    ),
    "moe_forward_full_gelu_tanh_decode": (
        esimd_moe_kernels.moe_forward_full_gelu_tanh_decode
    ),
}
