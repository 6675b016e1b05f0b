"""gpt-oss's MXFP4 experts on the CPU (gpt_oss_mxfp4 on llm-scaler's
0.21.0-b3.1): vllm-xpu-kernels' grouped GEMM with an MXFP4 B
(proof/xpu/moe_kernels.py, read from 3cab97a's
grouped_gemm_xe2_interface.hpp and gemm_xe2.hpp), its swigluoai activation
(proof/xpu/xpu_kernels.py, csrc/activation.cpp) and the package's glue
(proof/xpu/fused_moe_standin.py) against the math written out here on its
own: e2m1 codes decoded value by value from their bits, the e8m0 scale as
2 ** (s - 127), the activation element by element, the MoE token by token.
Each check is shown able to fail: the high nibble read first, the scale's
exponent off by one, the bias left out, the activation's halves taken as
[gate | up] instead of interleaved. Under a second."""

import math

import pytest
import torch

from xpufakes.proof.xpu import moe_kernels, xpu_kernels


def e2m1(code: int) -> float:
    """An e2m1 value from its 4 bits: sign, 2 exponent bits (bias 1), 1
    mantissa bit; exponent 0 is subnormal (0 or 0.5)."""
    sign = -1.0 if code & 0b1000 else 1.0
    exponent, mantissa = (code >> 1) & 0b11, code & 1
    if exponent == 0:
        return sign * 0.5 * mantissa
    return sign * 2.0 ** (exponent - 1) * (1 + 0.5 * mantissa)


def dequant_written_out(packed, scales, high_first=False, exponent_bias=127):
    n, half = packed.shape
    group = 2 * half // scales.shape[1]
    out = torch.zeros(n, 2 * half, dtype=torch.float64)
    for row in range(n):
        for j in range(half):
            byte = int(packed[row, j])
            first, second = (
                (byte >> 4, byte & 0xF) if high_first else (byte & 0xF, byte >> 4)
            )
            for k, code in ((2 * j, first), (2 * j + 1, second)):
                s = int(scales[row, k // group])
                out[row, k] = e2m1(code) * 2.0 ** (s - exponent_bias)
    return out


def _case(seed=0, experts=3, n=64, k=64):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (experts, n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(
        120, 130, (experts, n, k // 32), generator=g, dtype=torch.uint8
    )
    bias = (torch.randn(experts, n, generator=g) * 0.1).to(torch.bfloat16)
    return packed, scales, bias


def test_the_e2m1_codes():
    assert [e2m1(c) for c in range(8)] == list(moe_kernels.E2M1)
    assert [e2m1(c) for c in range(8, 16)] == [-v for v in moe_kernels.E2M1]


def test_the_grouped_gemm_of_mxfp4_experts():
    """ptr_D's rows of each expert = A's rows @ dequant(B[e])^T + bias[e]
    (experts 0 and 2; 1 has no row); it returns ptr_D; its refusals are the
    C++'s."""
    packed, scales, bias = _case()
    experts, n, k = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    a = torch.randn(4, k, generator=torch.Generator().manual_seed(1))
    a = a.to(torch.bfloat16)
    counts = torch.tensor([1, 0, 3], dtype=torch.int32)
    d = torch.full((4, n), float("nan"), dtype=torch.bfloat16)
    gemm = moe_kernels.cutlass_grouped_gemm_interface
    assert gemm(a, packed, scales, bias, d, counts, n, k, experts, False, True) is d

    def want(with_bias=True, **wrong):
        out = torch.zeros(4, n, dtype=torch.float64)
        for e, start, count in ((0, 0, 1), (2, 1, 3)):
            w = dequant_written_out(packed[e], scales[e], **wrong)
            out[start : start + count] = a[start : start + count].double() @ w.t()
            if with_bias:
                out[start : start + count] += bias[e].double()
        return out

    def close(expected):
        return torch.allclose(d.double(), expected, rtol=2e-2, atol=5e-2)

    assert close(want())
    assert not close(want(high_first=True))
    assert not close(want(exponent_bias=126))
    assert not close(want(with_bias=False))
    flat = scales[..., 0].contiguous()
    with pytest.raises(RuntimeError, match="ptr_scales of int4 must be 3D"):
        gemm(a, packed, flat, bias, d, counts, n, k, experts, False, True)
    twice = scales.repeat(1, 1, 2)
    with pytest.raises(RuntimeError, match="group_size must be 32, 64, 128 or 256"):
        gemm(a, packed, twice, bias, d, counts, n, k, experts, False, True)


def swigluoai_written_out(x, alpha=1.702, limit=7.0, halves=False):
    rows, width = x.shape
    out = torch.zeros(rows, width // 2, dtype=torch.float64)
    for r in range(rows):
        for i in range(width // 2):
            if halves:
                gate, up = float(x[r, i]), float(x[r, width // 2 + i])
            else:
                gate, up = float(x[r, 2 * i]), float(x[r, 2 * i + 1])
            gate = min(gate, limit)
            up = max(-limit, min(up, limit))
            out[r, i] = (up + 1) * gate / (1 + math.exp(-gate * alpha))
    return out


def test_swigluoai_and_mul():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 16, generator=g) * 5).to(torch.bfloat16)
    out = torch.zeros(3, 8, dtype=torch.bfloat16)
    assert xpu_kernels.swigluoai_and_mul(out, x) is None
    assert torch.allclose(out.double(), swigluoai_written_out(x), rtol=2e-2, atol=2e-2)
    wrong = swigluoai_written_out(x, halves=True)
    assert not torch.allclose(out.double(), wrong, rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def moe_ops():
    """The b3.1 image's MoE ops with their CPU references, and `_C`'s
    swigluoai_and_mul as vllm-xpu-kernels 0.1.7 registers it."""
    from xpufakes.proof.xpu import xpu_moe

    entry = xpu_moe.image_entry("25095b4", "0.21.0")
    schemas = xpu_kernels.xpu_kernels_c_schemas("vllm-xpu-kernels 0.1.7")
    return [
        xpu_moe.define_ops(entry["ops"]),
        xpu_kernels.define_xpu_kernels_c_ops(
            {"swigluoai_and_mul": schemas["swigluoai_and_mul"]}
        ),
    ]


def test_the_mxfp4_experts_compute_each_tokens_experts(moe_ops):
    """fused_moe_interface.XpuFusedMoe with MXFP4 weights (w13 [E, 2I, H/2],
    w2 [E, H, I/2], their e8m0 scales and biases, the swigluoai activation:
    gpt-oss's) against the MoE written out token by token: each chosen
    expert's swigluoai(x W13^T + b13) W2^T + b2, times its weight. Control:
    the activation's halves as [gate | up] give another result."""
    from xpufakes.proof.xpu.fused_moe_standin import XpuFusedMoe

    g = torch.Generator().manual_seed(3)
    tokens, hidden, inter, experts, top_k = 3, 64, 32, 4, 2
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    w13 = torch.randint(0, 256, (experts, 2 * inter, hidden // 2), generator=g)
    w2 = torch.randint(0, 256, (experts, hidden, inter // 2), generator=g)
    w13, w2 = w13.to(torch.uint8), w2.to(torch.uint8)
    s13 = torch.randint(118, 124, (experts, 2 * inter, hidden // 32), generator=g)
    s2 = torch.randint(118, 124, (experts, hidden, inter // 32), generator=g)
    s13, s2 = s13.to(torch.uint8), s2.to(torch.uint8)
    b13 = (torch.randn(experts, 2 * inter, generator=g) * 0.1).to(torch.bfloat16)
    b2 = (torch.randn(experts, hidden, generator=g) * 0.1).to(torch.bfloat16)
    ids = torch.tensor([[0, 2], [3, 1], [2, 3]], dtype=torch.int32)
    weights = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])

    moe = XpuFusedMoe(
        w13, s13, b13, w2, s2, b2, top_k, "swigluoai", experts, is_mxfp4=True
    )
    out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16)
    moe.apply(out, x, weights, ids)

    def written_out(halves=False):
        want = torch.zeros(tokens, hidden, dtype=torch.float64)
        for t in range(tokens):
            for j in range(top_k):
                e = int(ids[t, j])
                up = dequant_written_out(w13[e], s13[e]) @ x[t].double()
                up = (up + b13[e].double()).unsqueeze(0)
                act = swigluoai_written_out(up, halves=halves)[0]
                down = dequant_written_out(w2[e], s2[e]) @ act + b2[e].double()
                want[t] += float(weights[t, j]) * down
        return want

    want = written_out()
    scale = float(want.abs().max())
    assert scale > 0
    assert float((out.double() - want).abs().max()) <= 0.03 * scale
    assert float((out.double() - written_out(halves=True)).abs().max()) > 0.1 * scale
