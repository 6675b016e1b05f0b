"""Everything the plugin changes in vLLM, and why: ``OVERRIDES``, one place.

The rule: route vLLM's own XPU quantization methods and kernels onto the CPU
stand-ins by changing only *which* code vLLM picks (platform checks, kernel
tables) and the weight-loading helpers that call XPU- or CUDA-only ops; never
the code under test: the linear methods' and kernels' ``apply`` /
``apply_weights``, the GEMM calls, the fakes, vLLM's model code, compile
configuration and backend, warm-up, engine and workers all run as released
(or as patched by this project). Nothing is written to disk: every change is
made in memory, in each process, when vLLM loads its plugins.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Override:
    era: str  # "ipex" (vLLM 0.10.2 - 0.14.1) or "kernels" (0.16.0 on)
    target: str  # what in vLLM
    why: str
    apply: Callable[[], None]


class XPUPlatformView:
    """The CPU platform, except that ``is_xpu()`` is True: given to the
    modules whose only use of ``current_platform`` is an is-this-an-XPU
    check in front of XPU code."""

    def __init__(self, platform):
        self._platform = platform

    def is_xpu(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._platform, name)


def _view_platform_in(module_name: str) -> None:
    module = importlib.import_module(module_name)
    if not isinstance(module.current_platform, XPUPlatformView):
        module.current_platform = XPUPlatformView(module.current_platform)


# ---------------------------------------------------------------------------
# IPEX era
# ---------------------------------------------------------------------------


def _fp8_config_xpu_method() -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    def get_quant_method(self, layer, prefix):
        return self.get_xpu_quant_method(layer, prefix)

    Fp8Config.get_quant_method = get_quant_method


def _ipex_quant_platform() -> None:
    _view_platform_in("vllm.model_executor.layers.quantization.ipex_quant")


# ---------------------------------------------------------------------------
# Kernels era
# ---------------------------------------------------------------------------

XPU_KERNEL_MODULES = (
    "vllm.model_executor.kernels.linear.scaled_mm.xpu",
    "vllm.model_executor.kernels.linear.mixed_precision.xpu",
    "vllm.model_executor.kernels.linear.mxfp4.xpu",
)

KERNEL_TABLES = (
    "_POSSIBLE_FP8_KERNELS",  # fp8 W8A16 / W8A8 (per-tensor or per-token)
    "_POSSIBLE_WFP8A16_KERNELS",  # fp8 weight-only schemes
    "_POSSIBLE_KERNELS",  # mixed precision: int4 w4a16 / w4a8
    "_POSSIBLE_MXFP4_KERNELS",  # MXFP4 W4A4 (0.22+)
)


def _xpu_kernel_modules_platform() -> None:
    for name in XPU_KERNEL_MODULES:
        _view_platform_in(name)


def _kernel_tables() -> None:
    linear = importlib.import_module("vllm.model_executor.kernels.linear")
    from vllm.platforms import PlatformEnum

    for name in KERNEL_TABLES:
        table = getattr(linear, name)
        table[PlatformEnum.CPU] = list(table[PlatformEnum.XPU])


def _scaled_fp8_quant() -> None:
    import torch
    from vllm import _custom_ops

    def scaled_fp8_quant(
        input,
        scale=None,
        num_token_padding=None,
        scale_ub=None,
        use_per_token_if_dynamic=False,
        output=None,
        group_shape=None,
    ):
        """What the CUDA kernels compute, for the weight loaders that call
        it: static (given scale, per tensor) or dynamic per-tensor."""
        assert num_token_padding is None and scale_ub is None
        assert not use_per_token_if_dynamic and output is None
        dtype = torch.float8_e4m3fn
        finfo = torch.finfo(dtype)
        if scale is None:
            amax = input.abs().amax().float().clamp(min=1e-12)
            scale = (amax / finfo.max).reshape(1)
        value = input.float() / scale.float().reshape(-1)[0]
        return value.clamp(finfo.min, finfo.max).to(dtype), scale

    _custom_ops.scaled_fp8_quant = scaled_fp8_quant


OVERRIDES: tuple[Override, ...] = (
    Override(
        "ipex",
        "Fp8Config.get_quant_method (quantization/fp8.py)",
        "vLLM takes its XPU fp8 branch (get_xpu_quant_method: "
        "XPUFp8LinearMethod, the report's path) only if "
        "current_platform.is_xpu(); the override calls that branch",
        _fp8_config_xpu_method,
    ),
    Override(
        "ipex",
        "current_platform in quantization/ipex_quant.py",
        "IPEXConfig.override_quantization_method routes AWQ / GPTQ "
        "checkpoints to the IPEX methods only if is_xpu(); the module uses "
        "current_platform for nothing else on these paths (fp8_dtype() in "
        "the fp8 MoE method, which the view passes through)",
        _ipex_quant_platform,
    ),
    Override(
        "kernels",
        "current_platform in kernels/linear/{scaled_mm,mixed_precision,mxfp4}/xpu.py",
        "each XPU kernel's is_supported / can_implement starts with "
        "`if not current_platform.is_xpu(): return False`; these modules use "
        "current_platform for nothing else",
        _xpu_kernel_modules_platform,
    ),
    Override(
        "kernels",
        "the CPU entries of kernels/linear/__init__.py " + ", ".join(KERNEL_TABLES),
        "vLLM chooses linear kernels from tables keyed by the platform; the "
        "CPU entry becomes the XPU entry (same kernels, same order), so the "
        "CPU platform chooses what an XPU chooses, and nothing else",
        _kernel_tables,
    ),
    Override(
        "kernels",
        "vllm._custom_ops.scaled_fp8_quant",
        "weight loading of online fp8 quantizes the weights with it; it "
        "calls _C::static_scaled_fp8_quant / dynamic_scaled_fp8_quant, which "
        "the CPU build of _C has only as `() -> ()` placeholders (the "
        "activations are quantized by QuantFP8's native torch code on CPU "
        "and XPU, not by this)",
        _scaled_fp8_quant,
    ),
)


def apply(era: str) -> list[str]:
    applied = []
    for override in OVERRIDES:
        if override.era == era:
            override.apply()
            applied.append(override.target)
    return applied
