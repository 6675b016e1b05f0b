# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tests of vllm::ipex_woq_linear, which runs IPEX's weight-only-quantized
int4 linear (the AWQ / GPTQ / wNa16 methods of the IPEX releases) as one op
that torch.compile can trace.

opcheck's test_faketensor runs the op and its fake side by side for the
weight formats vLLM's AWQ and GPTQ paths produce. On an XPU host the modules
are IPEX's own; elsewhere the reference module of xpu_gemm_reference.py,
whose forward calls the torch_ipex ops (defined there as IPEX defines them,
CompositeImplicitAutograd) the way IPEX's XPU forward does. Every test id
names which: ``[xpu-...]`` or ``[cpu-reference-...]``. Off XPU the tests
skip unless VLLM_XPU_FAKES_CPU_REFERENCE=1 asks for the reference ops, which
then exist for this module's tests only.
"""

import itertools
import os

import pytest
import torch

from tests.kernels.quantization import xpu_gemm_reference as reference
from tests.kernels.utils import opcheck
from vllm._ipex_woq_linear import opaque_ipex_woq_linear

ON_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()
CPU_REFERENCE = os.environ.get("VLLM_XPU_FAKES_CPU_REFERENCE") == "1"
KERNELS = "xpu" if ON_XPU else "cpu-reference"
DEVICE = "xpu" if ON_XPU else "cpu"

pytestmark = pytest.mark.skipif(
    not ON_XPU and not CPU_REFERENCE,
    reason="needs an Intel XPU (or VLLM_XPU_FAKES_CPU_REFERENCE=1)",
)


@pytest.fixture(scope="module", autouse=True)
def torch_ipex_woq_ops():
    """Off XPU: the CPU reference torch_ipex WOQ ops, for this module only."""
    if ON_XPU:
        yield
        return
    with reference.stand_in_ops([reference.define_torch_ipex_woq_kernels], []):
        yield


K, N, GROUP = 256, 128, 64
# test_schema too (x is fp16/bf16, key int64). Not test_autograd_registration:
# IPEX registers the torch_ipex int4 ops as CompositeImplicitAutograd kernels,
# so whether an output of the module records autograd history with an input
# that requires grad is IPEX's, not this op's (vLLM runs it in inference mode).
TEST_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic", "test_schema")


def make_module(
    method: str,
    engine: str,
    bias: bool,
    act_order: bool,
    w4a8: bool,
    dtype: torch.dtype,
    k: int = K,
    n: int = N,
):
    """An IPEX WOQ linear module (k inputs, n outputs) made the way vLLM's
    methods make it."""
    torch.manual_seed(0)
    scales = (torch.rand(k // GROUP, n) / 8).to(dtype)
    zeros = (
        reference.pack_int4_rows(torch.randint(0, 16, (n, k // GROUP))).t().contiguous()
    )
    if method == "gptq":
        qweight = reference.pack_int4_rows(torch.randint(0, 16, (k, n)))  # [K/8, N]
    else:
        qweight = (
            reference.pack_int4_rows(torch.randint(0, 16, (n, k))).t().contiguous()
        )  # [K, N/8]
    g_idx = (torch.arange(k) // GROUP)[torch.randperm(k)].to(torch.int32)
    b = torch.randn(n, dtype=dtype) if bias else None
    g = g_idx if act_order else None
    quant_method = 0 if method == "gptq" else 1
    qweight, scales, zeros = (t.to(DEVICE) for t in (qweight, scales, zeros))
    if ON_XPU:
        import intel_extension_for_pytorch as ipex

        qconfig = ipex.quantization.get_weight_only_quant_qconfig_mapping(
            weight_dtype=ipex.quantization.WoqWeightDtype.INT4,
            lowp_mode=ipex.quantization.WoqLowpMode.INT8,
            act_quant_mode=ipex.quantization.WoqActQuantMode.PER_BATCH,
            group_size=GROUP,
        )
        woq = ipex.llm.quantization.woq_linear.IPEXWeightOnlyQuantizedLinear
        return woq.from_weight(
            qweight,
            scales,
            zeros,
            k,
            n,
            qconfig=qconfig,
            bias=b,
            group_size=GROUP,
            g_idx=g,
            quant_method=quant_method,
        )
    return reference.ReferenceWOQLinear.from_weight(
        qweight,
        scales,
        zeros,
        k,
        n,
        bias=b,
        group_size=GROUP,
        g_idx=g,
        quant_method=quant_method,
        engine=engine,
        w4a8=w4a8,
    )


FORMATS = [
    (method, engine, bias, act_order, w4a8)
    for method, engine, bias, act_order, w4a8 in itertools.product(
        ("gptq", "awq"),
        ("onednn", "xetla"),
        (False, True),
        (False, True),
        (False, True),
    )
    if not (act_order and method == "awq")  # AWQ has no act-order
    and not (w4a8 and engine == "xetla")  # W4A8 compute is oneDNN only
    and not (ON_XPU and (engine == "xetla" or w4a8))  # the device decides
]
CASES = list(itertools.product(FORMATS, (1, 7), (torch.float16, torch.bfloat16)))


def _id(case) -> str:
    (method, engine, bias, act_order, w4a8), tokens, dtype = case
    parts = [KERNELS, method, engine, "bias" if bias else "no-bias"]
    parts += ["act-order"] if act_order else []
    parts += ["w4a8"] if w4a8 else []
    return "-".join([*parts, f"{tokens}tok", str(dtype).removeprefix("torch.")])


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_woq_linear_op_fake_matches_module(case):
    (method, engine, bias, act_order, w4a8), tokens, dtype = case
    module = make_module(method, engine, bias, act_order, w4a8, dtype)
    op = opaque_ipex_woq_linear(module, N)
    x = torch.randn(tokens, K, dtype=dtype, device=DEVICE)
    torch.testing.assert_close(op(x), module(x))
    opcheck(
        torch.ops.vllm.ipex_woq_linear.default,
        (x, op.key, N),
        test_utils=TEST_UTILS,
    )


@pytest.mark.parametrize("method", ["gptq", "awq"], ids=lambda m: f"{KERNELS}-{m}")
def test_compiled_woq_block(method):
    """AWQ/GPTQ-style block: one compilation for 2..64 tokens, no graph
    break (fullgraph), the same result as eager."""
    fp16 = torch.float16
    up = opaque_ipex_woq_linear(
        make_module(method, "onednn", True, False, False, fp16), N
    )
    down = opaque_ipex_woq_linear(
        make_module(method, "onednn", False, False, False, fp16, k=N, n=K), K
    )

    def block(x):
        return (x + down(torch.nn.functional.silu(up(x)))).sum(0)

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    for tokens in range(2, 65):
        x = torch.randn(tokens, K, dtype=torch.float16, device=DEVICE)
        torch._dynamo.mark_dynamic(x, 0)
        stance = "default" if tokens == 2 else "fail_on_recompile"
        with torch.compiler.set_stance(stance):
            torch.testing.assert_close(compiled(x), block(x), rtol=2e-2, atol=2e-1)


def test_the_module_itself_cannot_be_compiled():
    """Why the op exists: IPEX's forward, traced, runs the torch_ipex ops'
    kernels on fake tensors."""
    module = make_module("gptq", "onednn", False, False, False, torch.float16)
    compiled = torch.compile(module, fullgraph=True)
    with pytest.raises(
        (torch._dynamo.exc.TorchRuntimeError, torch._dynamo.exc.Unsupported)
    ):
        compiled(torch.randn(4, K, dtype=torch.float16, device=DEVICE))
