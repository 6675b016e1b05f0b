"""The reference math of the kernels the stand-ins stand for, as CPU
kernels (torch only): vLLM's and IPEX's norms, rotary embedding and
activations, IPEX's Punica LoRA ops, the fp8 quantization that runs while
the weights load, vllm-xpu-kernels' `_C` activations. Every stand-in
computes it, so that an eager run (a wrapper op's opcheck on the CPU) has a
result to compare."""

from collections.abc import Callable

import torch


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        out = out * weight.float()
    return out.to(x.dtype)


def rms_norm(out: torch.Tensor, input: torch.Tensor, weight, epsilon) -> None:
    """vLLM's `rms_norm(out, input, weight, epsilon)`: writes `out`."""
    out.copy_(_rms(input, weight, epsilon))


def fused_add_rms_norm(input, residual, weight, epsilon) -> None:
    """vLLM's `fused_add_rms_norm`: residual += input; input = rms(residual)."""
    residual.add_(input)
    input.copy_(_rms(residual, weight, epsilon))


def _rotate(x: torch.Tensor, cos, sin, rot_dim: int, is_neox: bool) -> None:
    """Rotate the first rot_dim of each head of x [tokens, heads, head] in
    place (cos, sin: [tokens, rot_dim / 2])."""
    rot = x[..., :rot_dim].float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    x[..., :rot_dim] = out.to(x.dtype)


def rotary_embedding(
    positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim=None, offsets=None
) -> None:
    """vLLM's and IPEX's `rotary_embedding(positions, query, key, head_size,
    cos_sin_cache, is_neox[, rot_dim[, offsets]])`: rotates query and key in
    place. Positions [num_tokens], or [3, num_tokens] for MRoPE, of which the
    first row is taken (text positions are equal in all three)."""
    if positions.dim() == 2:
        positions = positions[0]
    positions = positions.reshape(-1)
    if offsets is not None:
        positions = positions + offsets.reshape(-1)
    rot_dim = rot_dim or cos_sin_cache.size(-1)
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    tokens = positions.numel()
    for x in (query, key):
        if x is not None:
            _rotate(x.view(tokens, -1, head_size), cos, sin, rot_dim, is_neox)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    d = x.size(-1) // 2
    return out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])


def gelu_and_mul(x: torch.Tensor, out: torch.Tensor, approximate: str = "none"):
    d = x.size(-1) // 2
    gelu = torch.nn.functional.gelu(x[..., :d], approximate=approximate)
    return out.copy_(gelu * x[..., d:])


def gelu_quick(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out.copy_(x * torch.sigmoid(1.702 * x))


def ipex_rms_norm(x, normalized_shape, weight, eps):
    """IPEX `rms_norm_fw`: a new contiguous output of x's shape, and rstd."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out.copy_(_rms(x, weight, eps))
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
    return out, rstd


def ipex_add_rms_norm(add, x, normalized_shape, weight, bias, eps, add_back):
    """IPEX `add_rms_norm`: rms(x + add); with add_back, add = x + add. A new
    contiguous output of x's shape (AddNormFusion.cpp, `at::empty(input.sizes(),
    input.options())`)."""
    total = x + add if add is not None else x
    if add is not None and add_back:
        add.copy_(total)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out.copy_(_rms(total, weight, eps))
    if bias is not None:
        out.add_(bias)
    return out


def bgmv_shrink(out, inputs, weights, indices, scaling) -> None:
    """IPEX Punica bgmv_shrink: out[i] = inputs[i] @ weights[indices[i]].T *
    scaling (rows whose index is -1 are left as they are)."""
    for i, index in enumerate(indices.tolist()):
        if index >= 0:
            row = inputs[i].float() @ weights[index].float().t() * scaling
            out[i] = row.to(out.dtype)


def bgmv_expand_with_slice(out, inputs, weights, indices, offset, add) -> None:
    """IPEX Punica bgmv_expand_with_slice: out[i, offset:offset + n] (+)=
    inputs[i] @ weights[indices[i]].T, n = weights.size(-2)."""
    n = weights.size(-2)
    for i, index in enumerate(indices.tolist()):
        if index >= 0:
            row = inputs[i].float() @ weights[index].float().t()
            if add:
                row = row + out[i, offset : offset + n].float()
            out[i, offset : offset + n] = row.to(out.dtype)


def dynamic_scaled_fp8_quant(result, input, scale) -> None:
    """Per-tensor dynamic fp8 quantization (online fp8 quantizes the weights
    with it while loading): scale = amax / fp8 max."""
    finfo = torch.finfo(result.dtype)
    amax = input.abs().amax().float().clamp(min=1e-12)
    scale.fill_(amax / finfo.max)
    result.copy_((input.float() / scale).clamp(finfo.min, finfo.max).to(result.dtype))


def static_scaled_fp8_quant(result, input, scale, group_shape=None) -> None:
    """fp8 quantization by a given scale (a scalar, or one that broadcasts
    over the input as `group_shape` says: per channel or per token)."""
    finfo = torch.finfo(result.dtype)
    if scale.numel() > 1 and scale.dim() == 1:
        per_token = group_shape is not None and group_shape[1] != 1
        scale = scale.view(-1, 1) if per_token else scale.view(1, -1)
    quantized = (input.float() / scale.float()).clamp(finfo.min, finfo.max)
    result.copy_(quantized.to(result.dtype))


def and_mul(activation: Callable) -> Callable:
    """`<act>_and_mul(out, input)`: out = act(input[:d]) * input[d:]."""

    def kernel(out: torch.Tensor, input: torch.Tensor) -> None:
        d = input.size(-1) // 2
        out.copy_(activation(input[..., :d].float()) * input[..., d:].float())

    return kernel


def elementwise(activation: Callable) -> Callable:
    def kernel(out: torch.Tensor, input: torch.Tensor) -> None:
        out.copy_(activation(input.float()))

    return kernel


def mul_and_silu(out: torch.Tensor, input: torch.Tensor) -> None:
    """`mul_and_silu(out, input)`: out = input[:d] * silu(input[d:])."""
    d = input.size(-1) // 2
    out.copy_(input[..., :d].float() * torch.nn.functional.silu(input[..., d:].float()))


def dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub) -> None:
    """Per-token dynamic fp8: each row's scale = its amax (at most scale_ub)
    / fp8 max, the row divided by it."""
    finfo = torch.finfo(result.dtype)
    amax = input.abs().float().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub.float())
    row_scale = (amax / finfo.max).clamp(min=1.0 / (finfo.max * 512.0))
    scale.copy_(row_scale.view(scale.shape))
    quantized = (input.float() / row_scale).clamp(finfo.min, finfo.max)
    result.copy_(quantized.to(result.dtype))


def per_token_group_fp8_quant(
    input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0, *_
) -> None:
    """vLLM's `per_token_group_fp8_quant`: each group of `group_size` along
    the last dimension scaled by max(|x|, eps) / fp8_max (a power of two
    above it with `scale_ue8m0`), quantized into output_q, the scales into
    output_s ([tokens, groups], or its transpose)."""
    x = input.float().reshape(*input.shape[:-1], -1, group_size)
    scale = x.abs().amax(-1, keepdim=True).clamp(min=eps) / fp8_max
    if scale_ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (x / scale).clamp(fp8_min, fp8_max).reshape(input.shape)
    output_q.copy_(q.to(output_q.dtype))
    scales = scale.squeeze(-1).reshape(-1, x.shape[-2])
    if tuple(output_s.shape) != tuple(scales.shape):
        scales = scales.t()
    output_s.copy_(scales.reshape(output_s.shape))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")
