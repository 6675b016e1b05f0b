"""vllm-xpu-kernels (the kernels era's XPU kernel package) as a tree finds
it on an XPU host, stood in: the package (its Python modules, which need an
Intel GPU runtime: empty, or stand-ins), its `_C` activations, norms and
rotary embedding as the tree's release registers them
(data/xpu_kernels_c.toml: CPU kernels, no fake of their own, as the package
registers them) and its `_xpu_C` device queries (device.py)."""

import importlib.abc
import importlib.machinery
import sys
import tomllib
import types
from collections.abc import Callable

import torch

from xpufakes.common import paths
from xpufakes.proof.xpu import defining, quantize_convert_standin
from xpufakes.proof.xpu.cpu_kernels import (
    and_mul,
    dynamic_per_token_scaled_fp8_quant,
    elementwise,
    fused_add_rms_norm,
    gelu_tanh,
    mul_and_silu,
    per_token_group_fp8_quant,
    rms_norm,
    rotary_embedding,
)
from xpufakes.proof.xpu.device import XPU_DEVICE
from xpufakes.proof.xpu.uncomputed import NoCPUReference

# ---------------------------------------------------------------------------
# vllm-xpu-kernels' `_C`: the activations, norms and rotary embedding a
# kernels-era tree calls on a model's dense path (its CustomOps take them in
# __init__, `self.op = torch.ops._C.silu_and_mul`)
# ---------------------------------------------------------------------------


def swigluoai_and_mul(out, input, alpha: float = 1.702, limit: float = 7.0):
    """gpt-oss's activation (vllm-xpu-kernels 3cab97a csrc/activation.cpp:279,
    the kernel :317): gate = input[..., 0::2], up = input[..., 1::2]
    (interleaved), gate clamped above at limit, up to [-limit, limit];
    out = (up + 1) * gate * sigmoid(gate * alpha), fp32, cast to out's
    dtype."""
    x = input.float()
    gate = x[..., 0::2].clamp(max=limit)
    up = x[..., 1::2].clamp(-limit, limit)
    out.copy_((up + 1.0) * gate * torch.sigmoid(gate * alpha))


# op -> its CPU kernel (the arguments in the schema's order); the schemas are
# data (data/xpu_kernels_c.toml, by release), given to define_xpu_kernels_c_ops
XPU_KERNELS_C: dict[str, Callable] = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "silu_and_mul": and_mul(torch.nn.functional.silu),
    "mul_and_silu": mul_and_silu,
    "gelu_and_mul": and_mul(torch.nn.functional.gelu),
    "gelu_tanh_and_mul": and_mul(gelu_tanh),
    "swigluoai_and_mul": swigluoai_and_mul,
    "gelu_fast": elementwise(gelu_tanh),
    "gelu_new": elementwise(gelu_tanh),
    "gelu_quick": elementwise(lambda x: x * torch.sigmoid(1.702 * x)),
    "rotary_embedding": rotary_embedding,
    "dynamic_per_token_scaled_fp8_quant": dynamic_per_token_scaled_fp8_quant,
    "per_token_group_fp8_quant": per_token_group_fp8_quant,
}


def define_xpu_kernels_c_ops(schemas: dict[str, str]) -> torch.library.Library:
    """Define vllm-xpu-kernels' `_C` ops of `schemas` (op -> schema, of the
    tree's release) that are not defined yet, each with its CPU kernel
    (XPU_KERNELS_C; an op only named by vLLM's fusion passes has none) and,
    as the package registers them, no Meta or fake kernel (an op that
    returns nothing gets torch's own trivial fake, as on the XPU). Keep the
    returned library referenced."""
    lib = torch.library.Library("_C", "FRAGMENT")
    for name, schema in schemas.items():
        if defining.defined(f"_C::{name}"):
            continue
        lib.define(schema)
        if name in XPU_KERNELS_C:
            lib.impl(name, XPU_KERNELS_C[name], "CPU")
    return lib


def define_xpu_device_queries(schemas: dict[str, str]) -> torch.library.Library:
    """Define the `_xpu_C` device queries of XPU_DEVICE (their schemas given,
    as the package registers them: no dispatch key) that are not defined
    yet. Keep the returned library referenced."""
    lib = torch.library.Library("_xpu_C", "FRAGMENT")
    for name, answer in XPU_DEVICE.items():
        if defining.defined(f"_xpu_C::{name}"):
            continue

        def query(device_index: int = -1, answer: bool = answer) -> bool:
            return answer

        lib.define(schemas[name])
        lib.impl(name, query, "CompositeImplicitAutograd")
    return lib


XPU_KERNELS_C_DATA = paths.DATA / "xpu_kernels_c.toml"


def xpu_kernels_c_schemas(kernels: str) -> dict[str, str]:
    """vllm-xpu-kernels' `_C` ops of data/xpu_kernels_c.toml as the release
    named in `kernels` ("vllm-xpu-kernels 0.1.15.4"; several separated by
    ";") registers them: op -> its schema. {} if no part of `kernels` is a
    vllm-xpu-kernels release."""
    releases = [
        part.strip().partition(" ")[2]
        for part in kernels.split(";")
        if part.strip().startswith("vllm-xpu-kernels ")
    ]
    if not releases:
        return {}

    release = _kernels_version(releases[0])
    data = tomllib.loads(XPU_KERNELS_C_DATA.read_text())["_C"]
    schemas = {}
    for name, history in data.items():
        known = [s for since, s in history if _kernels_version(since) <= release]
        if known:
            schemas[name] = known[-1]
    return schemas


def _kernels_version(text: str) -> tuple[float, ...]:
    """A vllm-xpu-kernels release as numbers; "main" after every release."""
    if text == "main":
        return (float("inf"),)
    return tuple(int(n) for n in text.split("+")[0].split(".") if n.isdigit())


def xpu_kernels_c_has(kernels: str, op: str) -> bool | None:
    """Whether the vllm-xpu-kernels release named in `kernels` defines
    `_C::<op>` (data/xpu_kernels_c.toml); None if `kernels` names none."""
    releases = [
        part.strip().partition(" ")[2]
        for part in kernels.split(";")
        if part.strip().startswith("vllm-xpu-kernels ")
    ]
    if not releases:
        return None
    first = tomllib.loads(XPU_KERNELS_C_DATA.read_text())["first_release"]
    since = first.get(op)
    return since is not None and _kernels_version(since) <= _kernels_version(
        releases[0]
    )


def define_xpu_kernels_c(kernels: str) -> list:
    """The `_C` ops of a vllm-xpu-kernels release (xpu_kernels_c_schemas)
    defined with CPU kernels, and its `_xpu_C` device queries (their schemas
    from data/op_schemas.toml); [] for other kernels. Keep it referenced."""
    schemas = xpu_kernels_c_schemas(kernels)
    if not schemas:
        return []
    xpu_c = tomllib.loads((paths.DATA / "op_schemas.toml").read_text())["_xpu_C"]
    return [
        define_xpu_kernels_c_ops(schemas),
        define_xpu_device_queries(xpu_c),
    ]


def stub_xpu_kernel_package() -> None:
    """vllm_xpu_kernels needs an Intel GPU runtime; vLLM imports two of its
    functions at module level, which the GEMM fakes never call, and
    downstream trees its int4 layout helpers (quantize_convert_standin.py:
    CPU stand-ins that lay the weights out as the package does)."""
    package = types.ModuleType("vllm_xpu_kernels")
    package.__path__ = []
    sys.modules["vllm_xpu_kernels"] = package
    quantization = types.ModuleType("vllm_xpu_kernels.quantization")
    quantization.__path__ = []
    package.quantization = quantization
    sys.modules[quantization.__name__] = quantization
    convert = "vllm_xpu_kernels.quantization._quantize_convert"
    sys.modules[convert] = quantize_convert_standin
    quantization._quantize_convert = quantize_convert_standin
    for name, functions in {
        "flash_attn_interface": ["flash_attn_varlen_func"],
        "rotary": ["apply_rotary_emb"],
    }.items():
        module = types.ModuleType(f"vllm_xpu_kernels.{name}")
        for function in functions:
            setattr(module, function, _unavailable(function))
        sys.modules[module.__name__] = module
        setattr(package, name, module)


def _unavailable(name: str):
    def function(*args, **kwargs):
        raise NoCPUReference(f"vllm_xpu_kernels.{name} is a stand-in stub")

    return function


class _XPUKernelModule(types.ModuleType):
    """A module below vllm_xpu_kernels the tree imports (its native `_C`,
    `_xpu_C`, `_moe_C`): every name is a function that raises when called
    (vLLM calls them inside its own opaque ops, or not at all here)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise NoCPUReference(f"{self.__name__}.{name} is a stand-in")

        setattr(self, name, unavailable)
        return unavailable


class XPUKernelModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any module below the vllm_xpu_kernels stand-in package that
    stub_xpu_kernel_package does not make (the model proof adds it)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("vllm_xpu_kernels."):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return _XPUKernelModule(spec.name)

    def exec_module(self, module):
        pass
