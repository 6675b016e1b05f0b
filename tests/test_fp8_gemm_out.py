"""_xpu_C::fp8_gemm_out: the kernel returns `out` itself, although its
schema (`Tensor(a!) out ... -> Tensor`) does not declare the return an alias
of `out`. What the fake does about it and why: docs/fp8-gemm-out-aliasing.md.

Forked: fake registrations are process-global.
"""

import importlib
import sys
from unittest.mock import patch

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from support import standins
from xpufakes.common import paths

pytestmark = pytest.mark.forked

ref = standins.reference()
SCHEMA_ERROR = "Argument out is not defined to alias output but was aliasing"


def _setup():
    libraries = [ref.define_xpu_c_kernels()]
    sys.path.insert(0, str(paths.OVERLAY))
    fakes = importlib.import_module("vllm._xpu_gemm_fakes")
    assert "_xpu_C::fp8_gemm_out" in fakes.register_xpu_gemm_fakes()
    return libraries, fakes


def _args():
    A = torch.randn(4, 64).to(torch.float8_e4m3fn)
    B = torch.randn(48, 64).to(torch.float8_e4m3fn).t()
    return (torch.zeros(4, 48, dtype=torch.bfloat16), A, B, None, None, None, None)


def _fp8_allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """torch.allclose for fp8 on the CPU, as vLLM's tests/kernels/utils.py
    opcheck patches it in (SchemaCheckMode compares inputs with it)."""
    return torch._refs.allclose(
        a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=equal_nan
    )


def _opcheck(op, test_util: str, args=None):
    with patch("torch.allclose", new=_fp8_allclose):
        torch.library.opcheck(op, args or _args(), test_utils=(test_util,))


def test_the_reference_kernel_returns_out_itself():
    libraries, _ = _setup()  # noqa: F841
    args = _args()
    assert torch.ops._xpu_C.fp8_gemm_out(*args) is args[0]


def test_the_fake_returns_out_itself_and_matches_the_kernel():
    libraries, _ = _setup()  # noqa: F841
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(a) if a is not None else None for a in _args()]
        assert torch.ops._xpu_C.fp8_gemm_out(*args) is args[0]
    _opcheck(torch.ops._xpu_C.fp8_gemm_out.default, "test_faketensor")


def test_a_fresh_output_fake_fails_the_aliasing_cross_check():
    """Negative control: a fake that returns a new tensor with out's
    metadata (what the schema claims) does not behave like the kernel, and
    test_faketensor says so."""
    libraries, fakes = _setup()  # noqa: F841

    def fresh(out, A, B, out_dtype, A_scale, B_scale, bias):
        fakes.fp8_gemm_out_fake(out, A, B, out_dtype, A_scale, B_scale, bias)
        return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype)

    torch.library.register_fake("_xpu_C::fp8_gemm_out", fresh, allow_override=True)
    with pytest.raises(Exception, match="outputs_alias_inputs"):
        _opcheck(torch.ops._xpu_C.fp8_gemm_out.default, "test_faketensor")


def test_test_schema_fails_on_the_kernel_whatever_the_fake():
    """test_schema runs the kernel alone (no fake) and checks its aliasing
    against the schema: it fails for the kernel's schema, and passes for the
    same kernel under a schema that declares the alias (`-> Tensor(a!)`),
    which is the fix, in vllm-xpu-kernels."""
    libraries, _ = _setup()  # noqa: F841
    with pytest.raises(Exception, match=SCHEMA_ERROR):
        _opcheck(torch.ops._xpu_C.fp8_gemm_out.default, "test_schema")
    lib = torch.library.Library("xpu_fakes_test", "DEF")
    lib.define(
        "fp8_gemm_out(Tensor(a!) out, Tensor A, Tensor B, ScalarType? out_dtype, "
        "Tensor? A_scale_, Tensor? B_scale_, Tensor? bias_) -> Tensor(a!)"
    )
    lib.impl(
        "fp8_gemm_out",
        lambda *args: torch.ops._xpu_C.fp8_gemm_out(*args),
        "CompositeExplicitAutograd",
    )
    _opcheck(torch.ops.xpu_fakes_test.fp8_gemm_out.default, "test_schema")
