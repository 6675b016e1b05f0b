# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tests of the fake (meta) kernels of the Intel XPU quantized GEMMs.

torch.compile traces the quantized linear layers with fake tensors, so each
GEMM's fake must return what the kernel returns. opcheck's test_faketensor
runs the kernel and its fake side by side and compares the outputs' shape,
strides, dtype and device.

On an XPU host the real kernels (vllm-xpu-kernels, or IPEX on the releases
that use it) are tested; elsewhere the ops are defined with the kernels'
schemas and CPU reference implementations (xpu_gemm_reference.py). Every
test id names which: ``[xpu-...]`` or ``[cpu-reference-...]``.

Run: pytest tests/kernels/quantization/test_xpu_gemm_fakes.py
"""

import importlib.util
import logging
import re

import pytest
import torch

from tests.kernels.quantization import xpu_gemm_reference as reference
from tests.kernels.utils import opcheck

ON_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()
KERNELS = "xpu" if ON_XPU else "cpu-reference"
DEVICE = "xpu" if ON_XPU else "cpu"

if ON_XPU:
    # Import the module that registers the fakes, as vLLM does at start-up.
    if importlib.util.find_spec("vllm._xpu_ops") is not None:
        import vllm._xpu_ops  # noqa: F401
    else:
        import vllm._ipex_ops  # noqa: F401
    _LIBRARIES: list = []
else:
    # The reference kernels must exist before the fakes are registered.
    _LIBRARIES = [
        reference.define_xpu_c_kernels(),
        reference.define_torch_ipex_kernels(),
    ]

from vllm import _xpu_gemm_fakes as fakes  # noqa: E402

if not ON_XPU:
    fakes.register_xpu_gemm_fakes()
    fakes.register_ipex_gemm_fakes()

TEST_UTILS = reference.FAKE_CHECKS
CASES = reference.opcheck_cases(full=True)


@pytest.mark.parametrize("case", CASES, ids=[f"{KERNELS}-{c.id}" for c in CASES])
def test_fake_matches_kernel(case: reference.OpcheckCase):
    if not case.available():
        pytest.skip(f"{case.namespace}::{case.name} is not in this build")
    opcheck(case.op(), case.args(DEVICE), test_utils=TEST_UTILS)
    # The kernel's own registration (reference.SCHEMA_CHECK_SKIPPED: where
    # test_schema cannot run, and why); test_autograd_registration needs an
    # input that requires grad.
    checks = case.kernel_checks()
    if "test_schema" in checks:
        opcheck(case.op(), case.args(DEVICE), test_utils=("test_schema",))
    opcheck(
        case.op(),
        reference.with_grad(case.args(DEVICE)),
        test_utils=("test_autograd_registration",),
    )


# ---------------------------------------------------------------------------
# Compilation, bad input, registration
# ---------------------------------------------------------------------------


@pytest.mark.skipif(
    not hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"), reason="no _xpu_C GEMMs"
)
@pytest.mark.parametrize(
    "layout", ["2d", "3d", "3d-mbk"], ids=lambda x: f"{KERNELS}-{x}"
)
def test_compiled_fp8_linear_matches_eager(layout):
    """Inductor plans the graph around the fake's output: a wrong rank or
    stride breaks the reduction over dim 1 downstream."""
    torch._dynamo.reset()
    B = reference.fp8_weight(torch.float8_e4m3fn, "nt", DEVICE)
    scale = torch.tensor([0.5], device=DEVICE)

    def block(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops._xpu_C.fp8_gemm_w8a16(x, B, scale, None)
        return torch.nn.functional.silu(y).sum(dim=1)

    x = reference.activation(layout, torch.bfloat16, DEVICE)
    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    torch.testing.assert_close(compiled(x), block(x), rtol=2e-2, atol=2e-2)


BAD_INPUTS = {
    "wrong-rank": (
        lambda: torch.randn(2, 3, 4, reference.K),
        "only support 2D and 3D inputs",
    ),
    "zero-k": (lambda: torch.randn(4, 0), "(K) is 0"),
}


@pytest.mark.skipif(
    not hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"), reason="no _xpu_C GEMMs"
)
@pytest.mark.parametrize("case", sorted(BAD_INPUTS), ids=lambda x: f"{KERNELS}-{x}")
def test_fake_rejects_what_the_kernel_rejects(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    make_input, message = BAD_INPUTS[case]
    k = 0 if case == "zero-k" else reference.K
    n = reference.N
    with FakeTensorMode():
        A = make_input().to(torch.bfloat16)
        B = torch.empty(n, k, dtype=torch.float8_e4m3fn).t()
        with pytest.raises(RuntimeError, match=re.escape(message)):
            torch.ops._xpu_C.fp8_gemm_w8a16(A, B, None, None)


def test_registration_skips_a_mismatched_schema(caplog):
    lib = torch.library.Library("_xpu_gemm_fakes_test", "FRAGMENT")
    lib.define("gemm(Tensor A, Tensor B, bool trans_B) -> Tensor")
    expected = "_xpu_gemm_fakes_test::gemm(Tensor A, Tensor B) -> Tensor"
    with caplog.at_level(logging.WARNING):
        ok = fakes._register(
            "_xpu_gemm_fakes_test::gemm", expected, fakes.fp8_gemm_fake
        )
    assert not ok
    assert "Not registering a fake for _xpu_gemm_fakes_test::gemm" in caplog.text
    assert not fakes._register("_xpu_gemm_fakes_test::absent", expected, lambda: None)
