# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Run IPEX's weight-only-quantized (WOQ) linear as one opaque custom op.

The AWQ / GPTQ / wNa16 linear methods of the IPEX releases call
``layer.ipex_qlinear(x)`` in their ``apply``, which torch.compile traces.
That module's forward (IPEX ``WeightOnlyQuantizedLinear.forward``) calls
``torch_ipex`` ops -- ``mm_int4``, ``mm_bias_int4``, ``mm_low_bits``,
``int4x8_dequantize``, ``mm_common``, ``mm_w4a8``, ``mm_bias_w4a8`` -- that
IPEX registers without a dispatch key, which makes them
CompositeImplicitAutograd kernels. No fake can be registered for such an op
(``register_fake`` refuses it), and under fake tensors its C++ body runs and
fails on the first data access ("Cannot access data pointer of Tensor").

So the whole module call becomes one custom op, ``vllm::ipex_woq_linear``,
whose fake returns what every int4 branch of that forward returns: a new
contiguous ``x.shape[:-1] + (out_features,)`` tensor with x's dtype and
device (``vllm/_xpu_gemm_fakes.py``). The modules are kept in a process-local
registry; the op takes the module's index.

This module imports only torch and the standard library.
"""

import torch

from vllm._xpu_gemm_fakes import ipex_woq_linear_fake

_MODULES: list[torch.nn.Module] = []


@torch.library.custom_op("vllm::ipex_woq_linear", mutates_args=())
def ipex_woq_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    """Run the registered IPEX WOQ linear module `handle` on x."""
    return _MODULES[handle](x)


ipex_woq_linear.register_fake(ipex_woq_linear_fake)


class IPEXWoqLinearOp(torch.nn.Module):
    """Stands in for an IPEX WOQ linear module: calling it runs the module
    through the ``vllm::ipex_woq_linear`` op."""

    def __init__(self, module: torch.nn.Module, out_features: int):
        super().__init__()
        self.module = module
        self.handle = len(_MODULES)
        self.out_features = out_features
        _MODULES.append(module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.vllm.ipex_woq_linear(x, self.handle, self.out_features)


def opaque_ipex_woq_linear(
    module: torch.nn.Module, out_features: int
) -> IPEXWoqLinearOp:
    """Wrap an IPEX WOQ linear module (``IPEXWeightOnlyQuantizedLinear``)
    with ``out_features`` outputs so that torch.compile sees one op."""
    return IPEXWoqLinearOp(module, out_features)
