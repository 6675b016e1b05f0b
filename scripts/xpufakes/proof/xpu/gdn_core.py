"""The core of a GatedDeltaNet layer (Qwen3-Next's linear attention) over
one sequence from its start, on the CPU, torch only: what vllm-xpu-kernels'
`_xpu_C::gdn_attention` computes for a prefill with no initial state
(vLLM's `vllm::gdn_attention_core_xpu` calls it with the attention
metadata). The whole-model proof runs its forward without metadata (the
profile run's case, where the op writes nothing), and uses this instead
(numbers.gdn_that_computes), as it makes the attention layers compute.

The math is the gated delta rule as Qwen3-Next's model card and vLLM's
layer define it, written out here:

* the projections, as Qwen3-Next's checkpoint packs them ("interleaved":
  per key head, [q (dk) | k (dk) | v (r*dv) | z (r*dv)] of in_proj_qkvz and
  [b (r) | a (r)] of in_proj_ba, r = value heads per key head);
* a causal depthwise convolution over [q | k | v] (kernel K, zero before
  the sequence), then SiLU;
* q and k L2-normalised per head, q scaled by dk^-0.5, each key head
  serving r value heads;
* g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b);
* per value head, a state S [dk, dv] from zero: S <- S * exp(g_t);
  S <- S + k_t (beta_t (v_t - k_t S)); o_t = q_t S.

It writes o into core_attn_out [T, Hv, dv] and z into z [T, Hv, dv]."""

import torch
import torch.nn.functional as F

from xpufakes.proof.xpu.uncomputed import NoCPUReference


def unpack_interleaved(qkvz, ba, key_heads: int, value_heads: int, dk: int, dv: int):
    """q, k [T, Hk, dk], v, z [T, Hv, dv], b, a [T, Hv] of the interleaved
    packing (above)."""
    tokens = qkvz.shape[0]
    r = value_heads // key_heads
    grouped = qkvz.reshape(tokens, key_heads, 2 * dk + 2 * r * dv)
    q, k, v, z = grouped.split([dk, dk, r * dv, r * dv], dim=-1)
    b, a = ba.reshape(tokens, key_heads, 2 * r).split([r, r], dim=-1)
    return (
        q,
        k,
        v.reshape(tokens, value_heads, dv),
        z.reshape(tokens, value_heads, dv),
        b.reshape(tokens, value_heads),
        a.reshape(tokens, value_heads),
    )


def causal_conv_silu(x, weight):
    """out[t, c] = silu(sum_j weight[c, j] * x[t - (K - 1) + j, c]), x [T, C],
    weight [C, K], zero before t = 0."""
    width = weight.shape[1]
    padded = torch.cat([x.new_zeros(width - 1, x.shape[1]), x])
    out = torch.zeros_like(x)
    for j in range(width):
        out += weight[:, j] * padded[j : j + x.shape[0]]
    return F.silu(out)


def gated_delta_rule(q, k, v, g, beta):
    """o [T, H, dv] of the recurrence (above), q, k [T, H, dk] (normalised,
    q scaled), v [T, H, dv], g, beta [T, H]; fp32."""
    tokens, heads, dk = k.shape
    state = q.new_zeros(heads, dk, v.shape[-1])
    out = []
    for t in range(tokens):
        state = state * g[t].exp()[:, None, None]
        remembered = torch.einsum("hk,hkv->hv", k[t], state)
        delta = (v[t] - remembered) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out.append(torch.einsum("hk,hkv->hv", q[t], state))
    return torch.stack(out)


def gdn_core(
    qkvz,
    ba,
    conv_weight,
    A_log,
    dt_bias,
    key_heads: int,
    value_heads: int,
    dk: int,
    dv: int,
    activation: str = "silu",
    interleaved: bool = True,
):
    """(core_attn_out, z), each [T, Hv, dv] in qkvz's dtype, of one sequence
    from its start (no initial state). conv_weight [conv_dim, K]."""
    if not interleaved:
        raise NoCPUReference(
            "the GDN core of the sequential [q|k|v|z] packing (Qwen3.5) has no "
            "CPU reference here (proof/xpu/gdn_core.py)"
        )
    if activation not in ("silu", "swish"):
        raise NoCPUReference(f"the GDN core with activation {activation!r}")
    q, k, v, z, b, a = unpack_interleaved(
        qkvz.float(), ba.float(), key_heads, value_heads, dk, dv
    )
    tokens = qkvz.shape[0]
    mixed = torch.cat(
        [q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)], -1
    )
    mixed = causal_conv_silu(mixed, conv_weight.float())
    q, k, v = mixed.split([key_heads * dk, key_heads * dk, value_heads * dv], -1)
    r = value_heads // key_heads
    q = F.normalize(q.reshape(tokens, key_heads, dk), dim=-1) * dk**-0.5
    k = F.normalize(k.reshape(tokens, key_heads, dk), dim=-1)
    q = q.repeat_interleave(r, dim=1)
    k = k.repeat_interleave(r, dim=1)
    v = v.reshape(tokens, value_heads, dv)
    g = -A_log.float().exp() * F.softplus(a + dt_bias.float())
    beta = b.sigmoid()
    out = gated_delta_rule(q, k, v, g, beta)
    return out.to(qkvz.dtype), z.to(qkvz.dtype)
