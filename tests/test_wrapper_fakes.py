"""vLLM's own ops that return one of the _xpu_C GEMMs' outputs unchanged
(vllm::xpu_fp8_bmm, vLLM 0.27.0+): their fake is the one Dynamo traces, so
it must give the kernel's layout too.

Each test imports the release's own vllm/_xpu_ops.py (patched or pristine)
with the stand-in kernels, in a forked process (registrations are
process-global).
"""

import sys

import pytest
import torch

from support import releases, standins
from xpufakes.trees.pins import version_tuple

pytestmark = pytest.mark.forked

WRAPPER_SINCE = (0, 27, 0)
G, M, K, N = 3, 5, 64, 48
# Not test_schema: its SchemaCheckMode compares every input before and after
# the call with torch.allclose, which has no CPU kernel for float8 ("mul_cpu_
# reduced_float" not implemented for 'Float8_e4m3fn'). Not
# test_autograd_registration: fp8 tensors cannot require grad, and opcheck
# skips that test when no input does.
TEST_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic")


def _load(release: str, patched: bool):
    sys.dont_write_bytecode = True
    tree = releases.patched(release) if patched else releases.pristine(release)
    libraries = standins.define_standins(release)
    standins.import_vllm_module(tree, release)
    assert hasattr(torch.ops.vllm, "xpu_fp8_bmm"), "the release has no wrapper"
    return libraries


def _fp8(shape, transposed: bool = False) -> torch.Tensor:
    """fp8 data of `shape`; transposed: the [d1, d0, ...] tensor's
    transpose(0, 1) view (DeepSeek-V4's o_fp8.transpose(0, 1))."""
    if transposed:
        shape = (shape[1], shape[0], *shape[2:])
    x = torch.randn(shape).to(torch.float8_e4m3fn)
    return x.transpose(0, 1) if transposed else x


def _cases():
    """(id, args) of xpu_fp8_bmm: 3-D and the transposed [M, G, K] view,
    NT and NN weights, both output dtypes, per-tensor scales and bias."""
    scale = torch.tensor([0.5])
    for layout in ("3d", "mgk-transposed"):
        for weight in ("nt", "nn"):
            for out_dtype in (torch.bfloat16, torch.float16):
                A = _fp8((G, M, K), transposed=layout == "mgk-transposed")
                w = torch.randn(G, N, K).to(torch.float8_e4m3fn).transpose(1, 2)
                B = w if weight == "nt" else w.contiguous()
                bias = torch.randn(N) if weight == "nn" else None
                name = f"{layout}-{weight}-{str(out_dtype)[6:]}"
                yield name, (A, B, out_dtype, scale, scale, bias)


def _opcheck_failures() -> dict[str, str]:
    failures = {}
    for name, args in _cases():
        try:
            torch.library.opcheck(
                torch.ops.vllm.xpu_fp8_bmm.default, args, test_utils=TEST_UTILS
            )
        except Exception as e:  # noqa: BLE001 - every failure is a result
            failures[name] = str(e).splitlines()[0]
    return failures


def test_patched_wrapper_fake_is_the_kernel_rule(kernels_release):
    if version_tuple(kernels_release) < WRAPPER_SINCE:
        pytest.skip("vllm::xpu_fp8_bmm arrived in vLLM 0.27.0")
    libraries = _load(kernels_release, patched=True)  # noqa: F841
    assert _opcheck_failures() == {}
    # The fake the tree registered for the wrapper is the canonical rule
    # itself, and it gives the kernel's strides for the o-proj view.
    from torch._subclasses.fake_tensor import FakeTensorMode

    A = _fp8((G, M, K), transposed=True)  # [G, M, K], strides (K, G*K, 1)
    B = torch.randn(G, K, N).to(torch.float8_e4m3fn)
    scale = torch.tensor([1.0])
    real = torch.ops.vllm.xpu_fp8_bmm(A, B, torch.bfloat16, scale, scale, None)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.vllm.xpu_fp8_bmm(A, B, torch.bfloat16, scale, scale, None)
    assert real.stride() == (N, G * N, 1)
    assert (fake.shape, fake.stride()) == (real.shape, real.stride())


def test_patched_wrapper_rejects_2d_input_at_trace_time():
    """The kernel accepts only 3-D A; so does the patched fake (the same
    message), where vLLM's own fake returned a tensor."""
    libraries = _load("0.33.0", patched=True)  # noqa: F841
    from torch._subclasses.fake_tensor import FakeTensorMode

    A = torch.randn(M, K).to(torch.float8_e4m3fn)
    B = torch.randn(G, K, N).to(torch.float8_e4m3fn)
    scale = torch.tensor([1.0])
    with pytest.raises(RuntimeError, match="fp8_bmm expects A to be a 3D tensor"):
        torch.ops.vllm.xpu_fp8_bmm(A, B, torch.bfloat16, scale, scale, None)
    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        pytest.raises(RuntimeError, match="fp8_bmm expects A to be a 3D tensor"),
    ):
        torch.ops.vllm.xpu_fp8_bmm(A, B, torch.bfloat16, scale, scale, None)


def test_unpatched_wrapper_fake_fails_the_same_checks():
    """Negative control: vLLM 0.33.0's own fake (a new contiguous tensor)
    fails opcheck on the transposed view and passes on contiguous 3-D."""
    libraries = _load("0.33.0", patched=False)  # noqa: F841
    failures = _opcheck_failures()
    transposed = {name for name, _ in _cases() if name.startswith("mgk")}
    assert transposed and transposed <= set(failures), failures
    assert not [name for name in failures if name.startswith("3d")], failures
    # and it traces a 2-D input the kernel rejects
    from torch._subclasses.fake_tensor import FakeTensorMode

    A = torch.randn(M, K).to(torch.float8_e4m3fn)
    B = torch.randn(G, K, N).to(torch.float8_e4m3fn)
    scale = torch.tensor([1.0])
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.ops.vllm.xpu_fp8_bmm(A, B, torch.bfloat16, scale, scale, None)


def _o_proj(o_fp8, wo_a, o_scale_gm, wo_a_scale):
    """DeepSeek-V4's XPU o-proj (vllm/models/deepseek_v4/xpu/xpu_sparse.py):
    the batched GEMM on the transposed view, then transpose and flatten.

    The model passes ``o_scale.transpose(0, 1).contiguous()``; here that
    copy is made before the compiled region, because Inductor (torch 2.13,
    CPU) lays the copy out as the transposed view it came from, which the
    kernel's contiguity check rejects -- a matter of the scale's layout, not
    of the wrapper's fake, which is what this tests."""
    z = torch.ops.vllm.xpu_fp8_bmm(
        o_fp8.transpose(0, 1), wo_a, torch.bfloat16, o_scale_gm, wo_a_scale, None
    )
    return torch.nn.functional.silu(z.transpose(0, 1).flatten(1)) * 2


def _o_proj_compiled_vs_eager():
    torch.manual_seed(0)
    o_fp8 = torch.randn(M, G, K).to(torch.float8_e4m3fn)  # [tokens, groups, K]
    wo_a = torch.randn(G, N, K).to(torch.float8_e4m3fn).transpose(1, 2)
    # block scales [groups, tokens, K / 32]
    o_scale = (torch.rand(M, G, K // 32) + 0.5).transpose(0, 1).contiguous()
    wo_a_scale = torch.tensor([0.25])
    torch._dynamo.reset()
    compiled = torch.compile(_o_proj, backend="inductor", fullgraph=True)
    # Inductor's on-disk caches key on the graph, not on the op's fake: a
    # graph compiled with the other fake would be reused.
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        got = compiled(o_fp8, wo_a, o_scale, wo_a_scale)
    torch.testing.assert_close(got, _o_proj(o_fp8, wo_a, o_scale, wo_a_scale))
    return got


def test_inductor_compiles_the_deepseek_v4_o_proj_patched():
    libraries = _load("0.33.0", patched=True)  # noqa: F841
    assert _o_proj_compiled_vs_eager().shape == (M, G * N)


def test_inductor_o_proj_fails_unpatched():
    """Negative control: with vLLM's own fake, Inductor plans the flatten on
    a contiguous [G, M, N] that the kernel does not return."""
    libraries = _load("0.33.0", patched=False)  # noqa: F841
    with pytest.raises(AssertionError, match="incorrect fake"):
        _o_proj_compiled_vs_eager()
