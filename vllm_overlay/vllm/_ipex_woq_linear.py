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
device (``vllm/_xpu_gemm_fakes.py``).

How the op finds its module: the wrapper owns the module (it lives and dies
with its layer) and a one-element buffer, ``key``, whose value names the
module in a registry of weak references. The op takes that buffer, not a
number: in a traced graph the buffer is an input (the layer's own, found by
its place in the model), so the graph is the same whatever order modules
were made in, in whichever process, and a graph reused for another model
(vLLM's compile cache, a second model in the process) calls that model's
modules. Nothing here keeps a module alive.

Why not the forward context (``no_compile_layers[prefix]``, as attention
does): a layer is registered there when it is constructed, but the modules
are made in ``process_weights_after_loading``, which in vLLM 0.10.2-0.13.0
runs without a current vLLM config (the worker's ``load_model`` sets none),
so there is no engine to register them with at that point.
"""

import itertools
import weakref

import torch

from vllm._xpu_gemm_fakes import ipex_woq_linear_fake
from vllm.platforms import current_platform

try:
    from vllm.utils.torch_utils import direct_register_custom_op
except ImportError:  # vLLM < 0.11.1
    from vllm.utils import direct_register_custom_op

# key -> module; weak, so a module is freed with the layer that owns it.
_MODULES: "weakref.WeakValueDictionary[int, torch.nn.Module]" = (
    weakref.WeakValueDictionary()
)
_keys = itertools.count(1)


def _ipex_woq_linear(
    x: torch.Tensor, key: torch.Tensor, out_features: int
) -> torch.Tensor:
    """Run the IPEX WOQ linear module that `key` names on x."""
    module = _MODULES.get(int(key.item()))
    if module is None:
        raise RuntimeError(
            "vllm::ipex_woq_linear: the IPEX WOQ linear module of this layer "
            "no longer exists"
        )
    return module(x)


direct_register_custom_op(
    op_name="ipex_woq_linear",
    op_func=_ipex_woq_linear,
    mutates_args=[],
    fake_impl=ipex_woq_linear_fake,
    dispatch_key=current_platform.dispatch_key,
)


class IPEXWoqLinearOp(torch.nn.Module):
    """Stands in for an IPEX WOQ linear module: calling it runs the module
    through the ``vllm::ipex_woq_linear`` op."""

    def __init__(self, module: torch.nn.Module, out_features: int):
        super().__init__()
        self.module = module
        self.out_features = out_features
        key = next(_keys)
        # On the CPU: the op reads it on the host. Not in the state dict.
        self.register_buffer(
            "key",
            torch.tensor([key], dtype=torch.int64, device="cpu"),
            persistent=False,
        )
        _MODULES[key] = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.vllm.ipex_woq_linear(x, self.key, self.out_features)


def opaque_ipex_woq_linear(
    module: torch.nn.Module, out_features: int
) -> IPEXWoqLinearOp:
    """Wrap an IPEX WOQ linear module (``IPEXWeightOnlyQuantizedLinear``)
    with ``out_features`` outputs so that torch.compile sees one op."""
    return IPEXWoqLinearOp(module, out_features)
