# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tests of the fake (meta) kernels of the Intel XPU quantized GEMMs.

torch.compile traces the quantized linear layers with fake tensors, so each
GEMM's fake must return what the kernel returns. opcheck's test_faketensor
runs the kernel and its fake side by side and compares the outputs' shape,
strides, dtype and device.

On an XPU host the real kernels are tested. Elsewhere the tests skip, unless
VLLM_XPU_FAKES_CPU_REFERENCE=1 asks for the CPU reference kernels of
xpu_gemm_reference.py, which have the kernels' schemas: then the ops are
defined for this module's tests only and removed afterwards. Every test id
names which kernels ran: ``[xpu-...]`` or ``[cpu-reference-...]``.

Run: pytest tests/kernels/quantization/test_xpu_gemm_fakes.py
"""

import importlib.util
import logging
import os
from collections.abc import Callable

import pytest
import regex as re
import torch

from tests.kernels.quantization import xpu_gemm_reference as reference
from tests.kernels.utils import opcheck
from vllm import _xpu_gemm_fakes as fakes

ON_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()
CPU_REFERENCE = os.environ.get("VLLM_XPU_FAKES_CPU_REFERENCE") == "1"
KERNELS = "xpu" if ON_XPU else "cpu-reference"
DEVICE = "xpu" if ON_XPU else "cpu"

# The module that registers the fakes when vLLM starts.
REGISTERED_BY = "vllm._xpu_ops"
# xpufakes: ipex-only begin
if importlib.util.find_spec(REGISTERED_BY) is None:
    REGISTERED_BY = "vllm._ipex_ops"
# xpufakes: ipex-only end

pytestmark = pytest.mark.skipif(
    not ON_XPU and not CPU_REFERENCE,
    reason="needs an Intel XPU (or VLLM_XPU_FAKES_CPU_REFERENCE=1)",
)


@pytest.fixture(scope="module", autouse=True)
def xpu_gemm_ops():
    """The ops under test, with their fakes registered."""
    if ON_XPU:
        # Import the module that registers the fakes, as vLLM does at start-up.
        importlib.import_module(REGISTERED_BY)
        yield
        return
    # The reference kernels must exist before the fakes are registered.
    definers: list[Callable[[], dict]] = [reference.define_xpu_c_kernels]
    registrations: list[Callable[[], object]] = [fakes.register_xpu_gemm_fakes]
    # xpufakes: ipex-only begin
    definers.append(reference.define_torch_ipex_kernels)
    registrations.append(fakes.register_ipex_gemm_fakes)
    # xpufakes: ipex-only end
    with reference.stand_in_ops(definers, registrations, fakes.unregister_fakes):
        yield


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


def _needs_xpu_c_gemms() -> None:
    if not hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"):
        pytest.skip("no _xpu_C GEMMs")


@pytest.mark.parametrize(
    "layout", ["2d", "3d", "3d-mbk"], ids=lambda x: f"{KERNELS}-{x}"
)
def test_compiled_fp8_linear_matches_eager(layout):
    """Inductor plans the graph around the fake's output: a wrong rank or
    stride breaks the reduction over dim 1 downstream."""
    _needs_xpu_c_gemms()
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


@pytest.mark.parametrize("case", sorted(BAD_INPUTS), ids=lambda x: f"{KERNELS}-{x}")
def test_fake_rejects_what_the_kernel_rejects(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    _needs_xpu_c_gemms()
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
    try:
        lib.define("gemm(Tensor A, Tensor B, bool trans_B) -> Tensor")
        expected = "_xpu_gemm_fakes_test::gemm(Tensor A, Tensor B) -> Tensor"
        with caplog.at_level(logging.WARNING):
            ok = fakes._register(
                "_xpu_gemm_fakes_test::gemm", expected, fakes.fp8_gemm_fake
            )
    finally:
        lib._destroy()
    assert not ok
    assert "Not registering a fake for _xpu_gemm_fakes_test::gemm" in caplog.text
    assert not fakes._register("_xpu_gemm_fakes_test::absent", expected, lambda: None)
