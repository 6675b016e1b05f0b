"""The ops vLLM runs while it loads the weights (not traced), with a CPU
kernel: the quantization ops online fp8 quantizes the weights with, which
the XPU builds register for the XPU key only."""

from collections.abc import Callable

import torch

from xpufakes.proof.xpu import defining
from xpufakes.proof.xpu.cpu_kernels import (
    dynamic_scaled_fp8_quant,
    static_scaled_fp8_quant,
)

# "ns::name.overload" -> (schema, CPU kernel): the quantization ops that run
# while loading (online fp8 quantizes the weights with them), registered by
# the XPU builds for the XPU key only: IPEX's (data/untraceable.toml, its
# schema as IPEX infers it) and vllm-xpu-kernels' _C ones (0.21.0's
# ops.scaled_fp8_quant). Here they have CPU kernels, so that loading runs on
# the CPU. They are never traced: weight loading is not.
LOADING_OPS: dict[str, tuple[str, Callable]] = {
    "torch_ipex::dynamic_scaled_fp8_quant.xpu": (
        "dynamic_scaled_fp8_quant.xpu(Tensor _0, Tensor _1, Tensor _2) -> ()",
        dynamic_scaled_fp8_quant,
    ),
    "_C::dynamic_scaled_fp8_quant": (
        "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()",
        dynamic_scaled_fp8_quant,
    ),
    "_C::static_scaled_fp8_quant": (
        "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, "
        "int[]? group_shape=None) -> ()",
        static_scaled_fp8_quant,
    ),
}


def define_loading_ops(namespace: str) -> torch.library.Library:
    """Define the ops of LOADING_OPS in `namespace` ("torch_ipex": IPEX's;
    "_C": vllm-xpu-kernels') that are not defined yet, with their CPU
    kernels. Keep the returned library referenced."""
    libraries = {namespace: torch.library.Library(namespace, "FRAGMENT")}
    for op, (schema, kernel) in LOADING_OPS.items():
        if not op.startswith(f"{namespace}::") or defining.defined(op):
            continue
        named_overload = "." in op.partition("::")[2]
        alias_analysis = "CONSERVATIVE" if named_overload else ""
        defining.define(libraries, op, schema, kernel, alias_analysis)
    return libraries[namespace]
