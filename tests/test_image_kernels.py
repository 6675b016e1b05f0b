"""The stand-in of an image's own build of the kernels
(proof/xpu/image_kernels.py) and our fake for it: llm-scaler 0.21.0-b3.1's
block-scaled `_xpu_C::fp8_gemm_w8a16(..., int group_size=0)`.

The stand-in is checked against a plain torch reference (the weight times
its scale grid, each scale over a g x g block); our fake for that schema
(`fp8_gemm_w8a16_grouped_fake`) against the stand-in with
torch.library.opcheck (shape, strides, dtype, device of every output,
symbolic sizes), with the checks it mirrors. Negative controls: upstream's
fake registered for the image's op fails opcheck on the call with the
image's extra argument, and a stand-in that ignores the scale grid fails
the reference. Forked: ops are process-global."""

import sys

import pytest
import torch

from support import images
from support.images import W8A16, image_schema
from xpufakes.common import paths
from xpufakes.proof.xpu import image_kernels, reference

pytestmark = pytest.mark.forked

B31 = "25095b4"
# test_schema runs the op on copies it compares with arithmetic that the CPU
# has no float8 kernel for; the in-tree test leaves it to the XPU kernels too
UTILS = ("test_faketensor", "test_aot_dispatch_dynamic")


def _fakes():
    sys.path.insert(0, str(paths.OVERLAY))
    import vllm._xpu_gemm_fakes as fakes

    return fakes


def _args(m=(7,), k=256, n=384, g=128, dtype=torch.float16):
    torch.manual_seed(0)
    A = torch.randn(*m, k, dtype=dtype)
    B = (torch.randn(k, n) * 2).to(torch.float8_e4m3fn)
    scale = torch.rand(k // g, n // g) + 0.5
    return A, B, scale, None, g


def _plain(A, B, scale, bias, g):
    w = B.float() * torch.kron(scale, torch.ones(g, g))
    return (A.float() @ w).to(A.dtype)


def test_the_standin_has_the_image_schema_and_computes_it():
    (library,) = reference.define_standins(f"{image_kernels.PACKAGE} {B31}")  # noqa: F841
    op = torch.ops._xpu_C.fp8_gemm_w8a16.default
    assert str(op._schema) == "_xpu_C::" + image_schema(images.kernels_patch(), W8A16)
    for m in [(1,), (7,), (2, 5)]:
        args = _args(m)
        torch.testing.assert_close(op(*args), _plain(*args), rtol=2e-3, atol=2e-2)
    A, B, scale, _, _ = _args()
    # without a group: the per-tensor scale, as upstream's kernel
    torch.testing.assert_close(
        op(A, B, scale[:1, :1].reshape(1), None),
        (A.float() @ (B.float() * scale[0, 0])).to(A.dtype),
        rtol=2e-3,
        atol=2e-2,
    )
    with pytest.raises(RuntimeError, match="must have shape"):
        op(A, B, scale.t().contiguous(), None, 128)
    with pytest.raises(RuntimeError, match="require float16"):
        op(A.bfloat16(), B, scale, None, 128)


def test_a_standin_that_ignores_the_grid_fails_the_reference():
    """The negative control of the reference comparison."""
    args = _args()
    A, B, scale, _, _ = args
    ignoring = (A.float() @ (B.float() * scale.mean())).to(A.dtype)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(ignoring, _plain(*args), rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("fake", ["grouped", "upstream"])
def test_our_fake_for_the_image_schema_passes_opcheck(fake):
    libraries = reference.define_standins(f"{image_kernels.PACKAGE} {B31}")  # noqa: F841
    fakes = _fakes()
    chosen = (
        fakes.fp8_gemm_w8a16_grouped_fake
        if fake == "grouped"
        else fakes.fp8_gemm_w8a16_fake
    )
    lib = torch.library.Library("_xpu_C", "FRAGMENT")  # noqa: F841
    torch.library.register_fake(W8A16, chosen, lib=lib)
    op = torch.ops._xpu_C.fp8_gemm_w8a16.default
    cases = [_args((7,)), _args((2, 5)), _args((3,), g=64)]
    # a strided activation (the transposed [m, b, k] view): the output's
    # strides follow it
    A = torch.randn(5, 2, 256, dtype=torch.float16).transpose(0, 1)
    cases.append((A, *_args()[1:]))
    if fake == "upstream":
        with pytest.raises(Exception, match="positional argument"):
            torch.library.opcheck(op, cases[0], test_utils=UTILS)
        return
    for args in cases:
        torch.library.opcheck(op, args, test_utils=UTILS)
    # the checks it mirrors fail at trace time, with the kernel's message
    A, B, scale, _, _ = _args()
    with torch._subclasses.FakeTensorMode() as mode:
        fa, fb, fs = (mode.from_tensor(t) for t in (A, B, scale))
        with pytest.raises(RuntimeError, match="must have shape"):
            op(fa, fb, fs.t().contiguous(), None, 128)
        with pytest.raises(RuntimeError, match="require float16"):
            op(fa.bfloat16(), fb, fs, None, 128)
