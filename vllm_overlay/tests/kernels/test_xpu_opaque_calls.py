# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tests of vllm/_xpu_opaque_calls.py: each XPU kernel call that
torch.compile cannot trace runs as one custom op, which must behave as the
kernel does (opcheck: the schema's declared mutations are the kernel's, the
fake's output is the kernel's, the op works under AOT dispatch).

On an XPU host the ops call the real kernels (a kernel the installed IPEX or
build does not have is skipped, naming it). Elsewhere the tests skip, unless
VLLM_XPU_FAKES_CPU_REFERENCE=1 asks for the CPU references below, which then
stand in for the kernels. Every test id names which ran.

Run: pytest tests/kernels/test_xpu_opaque_calls.py
"""

import os
from collections.abc import Callable

import pytest
import torch

from tests.kernels.utils import opcheck
from vllm import _xpu_opaque_calls as calls

ON_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()
CPU_REFERENCE = os.environ.get("VLLM_XPU_FAKES_CPU_REFERENCE") == "1"
KERNELS = "xpu" if ON_XPU else "cpu-reference"
DEVICE = "xpu" if ON_XPU else "cpu"

pytestmark = pytest.mark.skipif(
    not ON_XPU and not CPU_REFERENCE,
    reason="needs an Intel XPU (or VLLM_XPU_FAKES_CPU_REFERENCE=1)",
)

TOKENS, HEADS, KV_HEADS, HEAD, HIDDEN, RANK, LORAS = 5, 4, 2, 64, 128, 16, 2


def _rms(x, weight, eps):
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def _rope(positions, query, key, head_size, cache, is_neox, rot_dim=None):
    rot_dim = rot_dim or cache.size(-1)
    cos, sin = cache[positions.reshape(-1)].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    for x in (query, key):
        view = x.view(positions.numel(), -1, head_size)
        rot = view[..., :rot_dim].float()
        if is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
        else:
            x1, x2 = rot[..., ::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
            out = out.flatten(-2)
        view[..., :rot_dim] = out.to(x.dtype)


def _add_norm(x, residual, weight, eps):
    residual.add_(x)
    x.copy_(_rms(residual, weight, eps))


def _silu_and_mul(x, out):
    d = x.size(-1) // 2
    out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])


def _gelu_and_mul(x, out):
    d = x.size(-1) // 2
    out.copy_(torch.nn.functional.gelu(x[..., :d]) * x[..., d:])


def _add_rms_norm(residual, x, weight, bias, eps, add_back):
    total = x + residual
    if add_back:
        residual.copy_(total)
    return _rms(total, weight, eps)


def _bgmv(inputs, weights, out, indices, scale_or_add, offset=0, size=None):
    """Shrink (scale_or_add a float) or expand (a bool: add to out)."""
    for i, index in enumerate(indices.tolist()):
        if index < 0:
            continue
        row = inputs[i].float() @ weights[index].float().t()
        n = row.numel()
        if isinstance(scale_or_add, bool):
            if scale_or_add:
                row = row + out[i, offset : offset + n].float()
        else:
            row = row * scale_or_add
        out[i, offset : offset + n] = row.to(out.dtype)


# The CPU references of the callees, by callee.
REFERENCES: dict[str, Callable] = {
    "vllm._C.ops.rotary_embedding": _rope,
    "vllm._C.ops.rms_norm": lambda out, x, w, eps: out.copy_(_rms(x, w, eps)),
    "vllm._C.ops.fused_add_rms_norm": _add_norm,
    "intel_extension_for_pytorch.llm.functional.silu_and_mul": _silu_and_mul,
    "intel_extension_for_pytorch.llm.functional.gelu_and_mul": _gelu_and_mul,
    "intel_extension_for_pytorch.llm.functional.gelu_quick": (
        lambda x, out: out.copy_(x * torch.sigmoid(1.702 * x))
    ),
    "intel_extension_for_pytorch.llm.functional.rotary_embedding_batched": (
        lambda p, q, k, h, c, neox, rot, offsets=None: _rope(p, q, k, h, c, neox, rot)
    ),
    "intel_extension_for_pytorch.llm.functional.rms_norm": _rms,
    "intel_extension_for_pytorch.llm.functional.add_rms_norm": _add_rms_norm,
    "intel_extension_for_pytorch.llm.functional.bgmv_shrink": _bgmv,
    "intel_extension_for_pytorch.llm.functional.bgmv_expand": _bgmv,
    "intel_extension_for_pytorch.llm.functional.bgmv_expand_slice": (
        lambda i, w, o, idx, offset, size, add: _bgmv(i, w, o, idx, add, offset)
    ),
    "torch.ops.torch_ipex.rms_norm_vllm": (
        lambda out, x, w, eps: out.copy_(_rms(x, w, eps))
    ),
    "torch.ops.torch_ipex.fused_add_rms_norm_vllm": _add_norm,
    "torch.ops.torch_ipex.rotary_embedding": _rope,
}


def _t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def _rope_args():
    positions = torch.arange(TOKENS, device=DEVICE)
    cache = _t(64, HEAD)
    return (positions, _t(TOKENS, HEADS * HEAD), _t(TOKENS, KV_HEADS * HEAD)), cache


def _args(callee: str) -> tuple:
    """The arguments of a call of the callee, as vLLM's call site passes them."""
    x, w, eps = _t(TOKENS, HIDDEN), _t(HIDDEN), 1e-6
    indices = torch.tensor([0, 1, -1, 1, 0], device=DEVICE)
    name = callee.rsplit(".", 1)[1]
    if "rotary" in name:
        (positions, query, key), cache = _rope_args()
        args = (positions, query, key, HEAD, cache, True)
        return args + ((HEAD,) if name == "rotary_embedding_batched" else ())
    if name in ("rms_norm", "rms_norm_vllm") and callee.startswith(
        ("vllm._C", "torch.ops")
    ):
        return (torch.empty_like(x), x, w, eps)
    if name in ("fused_add_rms_norm", "fused_add_rms_norm_vllm"):
        return (x, _t(TOKENS, HIDDEN), w, eps)
    if name in ("silu_and_mul", "gelu_and_mul"):
        return (_t(TOKENS, 2 * HIDDEN), _t(TOKENS, HIDDEN))
    if name == "gelu_quick":
        return (x, torch.empty_like(x))
    if name == "rms_norm":
        return (x, w, eps)
    if name == "add_rms_norm":
        return (_t(TOKENS, HIDDEN), x, w, None, eps, True)
    if name == "bgmv_shrink":
        out = torch.zeros(TOKENS, RANK, dtype=torch.float32, device=DEVICE)
        return (x, _t(LORAS, RANK, HIDDEN), out, indices, 0.5)
    if name == "bgmv_expand":
        return (_t(TOKENS, RANK), _t(LORAS, HIDDEN, RANK), x, indices, True)
    if name == "bgmv_expand_slice":
        wide = _t(TOKENS, 2 * HIDDEN)
        return (_t(TOKENS, RANK), _t(LORAS, HIDDEN, RANK), wide, indices, 64, 128, True)
    raise AssertionError(f"no case for {callee}")


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """On the CPU, the references stand in for the callees (this module only)."""
    if ON_XPU:
        yield
        return
    saved = dict(calls._callees)
    calls._callees.update(REFERENCES)
    yield
    calls._callees.clear()
    calls._callees.update(saved)


@pytest.mark.parametrize(
    "callee", sorted(calls.CONTRACTS), ids=lambda c: f"{KERNELS}-{c}"
)
def test_op_behaves_as_its_kernel(callee: str):
    if callee not in REFERENCES:
        pytest.skip(f"[{KERNELS}] no case for {callee} yet (an image's ESIMD op)")
    try:
        calls.callee(callee)
    except (ImportError, AttributeError) as e:
        pytest.skip(f"[{KERNELS}] {callee} is not available here: {e}")
    op = getattr(torch.ops.vllm, calls.CONTRACTS[callee][0])
    opcheck(op.default, _args(callee))


# callees with no case here: an image's ESIMD and MoE ops (their shapes are
# the image's kernels'), whose contracts schema truth derives from their C++
NO_CASE_YET = ("custom_esimd_kernels_vllm.", "torch.ops.moe_ops.")


def test_every_callee_has_a_case():
    with_case = {c for c in calls.CONTRACTS if not c.startswith(NO_CASE_YET)}
    assert set(REFERENCES) == with_case
    for callee in with_case:
        assert _args(callee)
