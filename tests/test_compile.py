"""torch.compile with Inductor over a small quantized block, as vLLM traces
it: RMSNorm -> fp8 linear -> SiLU -> fp8 linear -> residual, then a reduction
over the token dimension (which a wrong rank or stride in a fake breaks).

Forked: each test imports a release's own vLLM file.
"""

import sys

import pytest
import torch
import torch._dynamo.testing
from torch._dynamo.utils import counters

from support import releases, standins

pytestmark = pytest.mark.forked

HIDDEN, INTER = 64, 128
TOKENS = range(2, 257)


def _load(tree, release):
    sys.dont_write_bytecode = True
    libraries = standins.define_standins(release)
    standins.import_vllm_module(tree, release)
    return libraries


def _weights(era: str):
    torch.manual_seed(0)
    w1 = torch.randn(INTER, HIDDEN).to(torch.float8_e4m3fn)  # [N, K]
    w2 = torch.randn(HIDDEN, INTER).to(torch.float8_e4m3fn)
    s1, s2 = torch.tensor([0.05]), torch.tensor([0.05])
    bias = torch.randn(HIDDEN, dtype=torch.bfloat16)
    norm = torch.rand(HIDDEN, dtype=torch.bfloat16) + 0.5

    if era == "ipex":

        def linear1(h):
            return torch.ops.torch_ipex.fp8_gemm_w8a16(h, w1, True, s1, None)

        def linear2(h):
            return torch.ops.torch_ipex.fp8_gemm_w8a16(h, w2, True, s2, bias)

    else:  # vLLM passes the [K, N] view of the [N, K] weight

        def linear1(h):
            return torch.ops._xpu_C.fp8_gemm_w8a16(h, w1.t(), s1, None)

        def linear2(h):
            return torch.ops._xpu_C.fp8_gemm_w8a16(h, w2.t(), s2, bias)

    def block(x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        h = (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype) * norm
        h = torch.nn.functional.silu(linear1(h))
        out = linear2(h) + x
        return out.sum(dim=-2)  # over tokens (3-D) / features of rows (2-D)

    return block


def _input(layout: str, tokens: int) -> tuple[torch.Tensor, int]:
    """The activation and its token dimension."""
    if layout == "2d":
        return torch.randn(tokens, HIDDEN, dtype=torch.bfloat16), 0
    x = torch.randn(2, tokens, HIDDEN, dtype=torch.bfloat16)
    if layout == "3d-mbk":
        return x.transpose(0, 1), 0
    return x, 1


def _compile_and_run(block, layout: str) -> int:
    """Compile once at 2 tokens, then run 3..256 tokens with recompiles
    forbidden, comparing with eager each time; the number of compilations."""
    torch._dynamo.reset()
    counters.clear()
    backend = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    for tokens in TOKENS:
        x, token_dim = _input(layout, tokens)
        torch._dynamo.mark_dynamic(x, token_dim)
        stance = "default" if tokens == TOKENS[0] else "fail_on_recompile"
        with torch.compiler.set_stance(stance):
            got = compiled(x)
        torch.testing.assert_close(got, block(x), rtol=2e-2, atol=2e-1)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    return backend.frame_count


@pytest.mark.parametrize("layout", ["2d", "3d", "3d-mbk"])
def test_patched_block_compiles_once_and_matches_eager(release, layout):
    libraries = _load(releases.patched(release), release)  # noqa: F841
    block = _weights(releases.era(release))
    assert _compile_and_run(block, layout) == 1


def test_unpatched_ipex_release_cannot_compile(ipex_release):
    """Negative control, the seed bug: no fake for torch_ipex::fp8_gemm_w8a16."""
    libraries = _load(releases.pristine(ipex_release), ipex_release)  # noqa: F841
    block = _weights("ipex")
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="inductor", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="fake tensors"):
        compiled(_input("2d", 4)[0])


@pytest.mark.parametrize("layout", ["3d", "3d-mbk"])
def test_unpatched_kernels_release_cannot_compile_a_3d_block(kernels_release, layout):
    """Negative control: with vLLM's own fake (a 2-D output, and a .view() of
    the input) tracing the 3-D block fails: the residual add sees [b*t, n]
    against [b, t, n], or the view of the transposed input raises."""
    libraries = _load(releases.pristine(kernels_release), kernels_release)  # noqa: F841
    block = _weights("kernels")
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="fake tensor"):
        _compile_and_run(block, layout)
