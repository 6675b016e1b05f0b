"""A third party's module (neither vLLM's nor IPEX's), as ipex_calls.py
imports it before vLLM loads its plugins: it took IPEX's functions by name
(`from ... import`), holds one as a class attribute, and makes an IPEX WOQ
linear module. The vLLM plugin must leave all of it as IPEX made it."""

from intel_extension_for_pytorch.llm.functional import (
    add_rms_norm,
    bgmv_expand,
    bgmv_expand_slice,
    bgmv_shrink,
    rms_norm,
)
from intel_extension_for_pytorch.llm.quantization.woq_linear import (
    IPEXWeightOnlyQuantizedLinear,
)

NAMES = ("rms_norm", "add_rms_norm", "bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


class Kernels:
    """The same functions as class attributes (plain functions: called
    through the class, as `Kernels.add_rms_norm(...)`)."""

    rms_norm = rms_norm
    add_rms_norm = add_rms_norm
    bgmv_shrink = bgmv_shrink
    bgmv_expand = bgmv_expand
    bgmv_expand_slice = bgmv_expand_slice


def make_woq_linear(*args, **kwargs):
    """IPEX's WOQ linear module, made by this (non-vLLM) module."""
    return IPEXWeightOnlyQuantizedLinear.from_weight(*args, **kwargs)
