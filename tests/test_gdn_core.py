"""The GatedDeltaNet core the whole-model proof computes where the forward
has no attention metadata (proof/xpu/gdn_core.py; numbers.gdn_that_computes,
for Qwen3-Next's linear-attention layers): against the rule written out here
on its own, in float64, in its matrix form

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,
    o_t = S_t^T q_t,

with the convolution as torch's grouped conv1d (left padding K - 1) and the
interleaved packing taken apart index by index. Each check is shown able to
fail: the same check of a variant with the packing read as sequential, the
gate dropped, or the convolution not causal fails. Under a second."""

import math

import pytest
import torch
import torch.nn.functional as F

from xpufakes.proof.xpu import gdn_core
from xpufakes.proof.xpu.uncomputed import NoCPUReference

KEY_HEADS, VALUE_HEADS, DK, DV, WIDTH, TOKENS = 2, 4, 8, 6, 4, 7


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = VALUE_HEADS // KEY_HEADS
    qkvz = torch.randn(TOKENS, KEY_HEADS * (2 * DK + 2 * r * DV), generator=g)
    ba = torch.randn(TOKENS, KEY_HEADS * 2 * r, generator=g)
    conv = torch.randn(2 * KEY_HEADS * DK + VALUE_HEADS * DV, WIDTH, generator=g)
    a_log = torch.randn(VALUE_HEADS, generator=g) * 0.5
    dt_bias = torch.randn(VALUE_HEADS, generator=g) * 0.5
    return qkvz, ba, conv, a_log, dt_bias


def _unpack(qkvz, ba):
    """Index by index: key head h's block of qkvz is [q | k | v of its r
    value heads | z of them], of ba [b of its r value heads | a of them]."""
    r = VALUE_HEADS // KEY_HEADS
    block = 2 * DK + 2 * r * DV
    q = torch.zeros(TOKENS, KEY_HEADS, DK, dtype=torch.float64)
    k = torch.zeros_like(q)
    v = torch.zeros(TOKENS, VALUE_HEADS, DV, dtype=torch.float64)
    z = torch.zeros_like(v)
    b = torch.zeros(TOKENS, VALUE_HEADS, dtype=torch.float64)
    a = torch.zeros_like(b)
    for t in range(TOKENS):
        for h in range(KEY_HEADS):
            row = qkvz[t, h * block : (h + 1) * block].double()
            q[t, h] = row[:DK]
            k[t, h] = row[DK : 2 * DK]
            for j in range(r):
                v[t, h * r + j] = row[2 * DK + j * DV : 2 * DK + (j + 1) * DV]
                at = 2 * DK + r * DV + j * DV
                z[t, h * r + j] = row[at : at + DV]
                b[t, h * r + j] = ba[t, h * 2 * r + j]
                a[t, h * r + j] = ba[t, h * 2 * r + r + j]
    return q, k, v, z, b, a


def expected(qkvz, ba, conv, a_log, dt_bias, causal=True, gated=True):
    q, k, v, z, b, a = _unpack(qkvz, ba)
    mixed = torch.cat(
        [q.reshape(TOKENS, -1), k.reshape(TOKENS, -1), v.reshape(TOKENS, -1)], -1
    )
    x = mixed.t()[None]  # [1, C, T]
    pad = (WIDTH - 1, 0) if causal else ((WIDTH - 1) // 2, WIDTH - 1 - (WIDTH - 1) // 2)
    y = F.conv1d(F.pad(x, pad), conv.double()[:, None, :], groups=conv.shape[0])
    mixed = F.silu(y[0].t())
    qs, ks, vs = mixed.split([KEY_HEADS * DK, KEY_HEADS * DK, VALUE_HEADS * DV], -1)
    r = VALUE_HEADS // KEY_HEADS
    out = torch.zeros(TOKENS, VALUE_HEADS, DV, dtype=torch.float64)
    for head in range(VALUE_HEADS):
        state = torch.zeros(DK, DV, dtype=torch.float64)
        key_head = head // r
        for t in range(TOKENS):
            qt = qs[t, key_head * DK : (key_head + 1) * DK]
            kt = ks[t, key_head * DK : (key_head + 1) * DK]
            qt = qt / qt.norm() / math.sqrt(DK)
            kt = kt / kt.norm()
            vt = vs[t, head * DV : (head + 1) * DV]
            decay = 1.0
            if gated:
                softplus = math.log1p(math.exp(float(a[t, head] + dt_bias[head])))
                decay = math.exp(-math.exp(float(a_log[head])) * softplus)
            beta = 1 / (1 + math.exp(-float(b[t, head])))
            eye = torch.eye(DK, dtype=torch.float64)
            state = decay * (eye - beta * torch.outer(kt, kt)) @ state
            state = state + beta * torch.outer(kt, vt)
            out[t, head] = state.t() @ qt
    return out, z


def _computed(qkvz, ba, conv, a_log, dt_bias, **kwargs):
    return gdn_core.gdn_core(
        qkvz, ba, conv, a_log, dt_bias, KEY_HEADS, VALUE_HEADS, DK, DV, **kwargs
    )


def test_the_core_is_the_gated_delta_rule():
    case = _case()
    out, z = _computed(*case)
    want_out, want_z = expected(*case)
    assert out.shape == (TOKENS, VALUE_HEADS, DV) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z.double(), want_z, rtol=0, atol=0)


@pytest.mark.parametrize("wrong", ["not causal", "no gate"])
def test_the_check_can_fail(wrong):
    case = _case(1)
    out, _ = _computed(*case)
    want, _ = expected(*case, causal=wrong != "not causal", gated=wrong != "no gate")
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)


def test_the_packing_is_read_interleaved():
    """The control: the same projections packed sequentially ([all q | all
    k | all v | all z]), read as the interleaved packing, give another z."""
    qkvz, ba, *_ = _case(2)
    r = VALUE_HEADS // KEY_HEADS
    sequential = qkvz[:, : KEY_HEADS * DK]  # what a sequential reader takes as q
    q, *_ = gdn_core.unpack_interleaved(qkvz, ba, KEY_HEADS, VALUE_HEADS, DK, DV)
    assert not torch.equal(q.reshape(TOKENS, -1), sequential)
    q_ref, *_ = _unpack(qkvz, ba)
    torch.testing.assert_close(q.double(), q_ref, rtol=0, atol=0)
    assert r == 2


def test_the_sequential_packing_is_not_computed():
    with pytest.raises(NoCPUReference, match="sequential"):
        _computed(*_case(), interleaved=False)
