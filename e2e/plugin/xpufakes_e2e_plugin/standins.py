"""The CPU stand-ins of what only exists on an Intel XPU.

* The XPU GEMMs, with their exact schemas: this repository's reference
  kernels (``define_xpu_c_kernels`` at the vllm-xpu-kernels release that
  ``patches/pins.toml`` says the vLLM release pins, ``define_torch_ipex_kernels``,
  ``define_torch_ipex_woq_kernels``), loaded from the checkout
  ``$XPUFAKES_E2E_REPO``, not copied.
* ``intel_extension_for_pytorch``: the IPEX stand-in the tests use
  (``tests/support/woq_probe.py``: its WOQ linear module is the reference
  one, whose forward calls the torch_ipex WOQ ops as IPEX's does).
* ``vllm_xpu_kernels``: an empty package with the two functions that
  ``vllm/_xpu_ops.py`` imports at module level (never called here).
* Two quantization ops the reference does not have, used outside the GEMMs
  under test (``OWN_OPS``): IPEX's ``dynamic_scaled_fp8_quant`` (0.14.1's
  online fp8 quantizes the weights with it while loading) and
  vllm-xpu-kernels' ``_C::per_token_group_quant_mxfp4`` (run inside vLLM's
  own opaque ``vllm::xpu_mxfp4_quantize`` op, which has its own fake).
"""

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import tomllib
import types
from pathlib import Path

REFERENCE = Path("vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py")
IPEX_STANDIN = Path("tests/support/woq_probe.py")
PINS = Path("patches/pins.toml")

# vLLM's module that registers the XPU GEMM fakes, by era. On an XPU, vLLM
# imports it at start-up (the XPU attention backend and ops import
# vllm/_xpu_ops.py; the IPEX methods vllm/_ipex_ops.py); on the CPU platform
# nothing would, so the plugin does.
REGISTERING_MODULE = {"kernels": "vllm._xpu_ops", "ipex": "vllm._ipex_ops"}

# The ops whose registered fake the e2e tests check (qualified names).
CHECKED_OPS = {
    "kernels": (
        "_xpu_C::fp8_gemm",
        "_xpu_C::fp8_gemm_out",
        "_xpu_C::fp8_bmm",
        "_xpu_C::fp8_gemm_w8a16",
        "_xpu_C::fp4_gemm",
        "_xpu_C::int4_gemm_w4a16",
        "_xpu_C::int4_gemm_w4a8",
    ),
    "ipex": ("torch_ipex::fp8_gemm_w8a16.xpu", "vllm::ipex_woq_linear"),
}

_LIBRARIES: list = []  # torch.library.Library objects, kept alive


def repo() -> Path:
    value = os.environ.get("XPUFAKES_E2E_REPO")
    if not value:
        raise RuntimeError(
            "xpufakes-e2e-plugin: XPUFAKES_E2E_REPO is not set (the checkout "
            "whose reference kernels are the stand-ins); this plugin is for "
            "the venvs of make e2e only"
        )
    root = Path(value)
    if not (root / REFERENCE).is_file():
        raise RuntimeError(f"xpufakes-e2e-plugin: no {REFERENCE} under {root}")
    return root


def _load(name: str, path: Path):
    """The module at `path`, loaded once, by the checkout's tool's helper
    (the checkout's scripts/ put on sys.path for it)."""
    scripts = str(repo() / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from xpufakes.common import bypath

    return bypath.load(name, path)


def reference():
    # under the name the tool loads them by (xpufakes.proof.xpu.reference)
    return _load("xpu_gemm_reference", repo() / REFERENCE)


def vllm_era_and_release() -> tuple[str, str]:
    import vllm

    match = re.match(r"\d+\.\d+\.\d+", vllm.__version__)
    if not match:
        raise RuntimeError(f"xpufakes-e2e-plugin: vLLM version {vllm.__version__}")
    era = "kernels" if importlib.util.find_spec("vllm._xpu_ops") else "ipex"
    return era, match.group(0)


def kernels_package(release: str) -> str:
    """The XPU kernel package and release vLLM `release` pins."""
    pins = tomllib.loads((repo() / PINS).read_text())
    return pins["releases"][release]["kernels"]


def install(era: str, release: str) -> tuple[list[str], str | None]:
    """Define the stand-ins; returns the ops defined and the deliberately
    wrong one (negative.py), if asked for."""
    from . import negative

    ref = reference()
    if era == "ipex":
        _ipex_package(ref)
        version = None
        definers = [ref.define_torch_ipex_kernels, ref.define_torch_ipex_woq_kernels]
    else:
        _xpu_kernels_package()
        package, _, version = kernels_package(release).partition(" ")
        assert package == "vllm-xpu-kernels", package
        definers = [lambda: ref.define_xpu_c_kernels(version)]
    wrong = negative.define(ref, version)
    defined = [wrong] if wrong else []
    for define in definers:
        result = define()
        _LIBRARIES.append(result["library"])
        defined += [f"{result['library'].ns}::{op}" for op in result["ops"]]
    return defined + _define_own_ops(era), wrong


def _with_spec(module: types.ModuleType, package: bool) -> types.ModuleType:
    """A spec, so that importlib.util.find_spec() on the name works."""
    module.__spec__ = importlib.machinery.ModuleSpec(
        module.__name__, None, is_package=package
    )
    return module


def _ipex_package(ref) -> None:
    probe = _load("xpufakes_woq_probe", repo() / IPEX_STANDIN)
    # oneDNN: the layout IPEX picks on devices with XMX (Arc, Data Center Max)
    probe.stub_ipex(ref, "onednn")
    for name, module in list(sys.modules.items()):
        if name == "intel_extension_for_pytorch" or name.startswith(
            "intel_extension_for_pytorch."
        ):
            _with_spec(module, package=True)


def _xpu_kernels_package() -> None:
    package = _with_spec(types.ModuleType("vllm_xpu_kernels"), package=True)
    package.__path__ = []
    sys.modules["vllm_xpu_kernels"] = package
    for name, function in (
        ("flash_attn_interface", "flash_attn_varlen_func"),
        ("rotary", "apply_rotary_emb"),
    ):
        module = _with_spec(types.ModuleType(f"vllm_xpu_kernels.{name}"), package=False)
        setattr(module, function, _unavailable(f"vllm_xpu_kernels.{name}.{function}"))
        sys.modules[module.__name__] = module
        setattr(package, name, module)


def _unavailable(name: str):
    def function(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in stub (no Intel GPU here)")

    return function


# ---------------------------------------------------------------------------
# Quantization ops outside the GEMMs under test
# ---------------------------------------------------------------------------


def _dynamic_scaled_fp8_quant(result, input, scale):
    """IPEX's per-tensor dynamic fp8 quantization: scale = amax / fp8 max."""
    import torch

    finfo = torch.finfo(result.dtype)
    amax = input.abs().amax().float().clamp(min=1e-12)
    scale.fill_(amax / finfo.max)
    value = (input.float() / scale).clamp(finfo.min, finfo.max)
    result.copy_(value.to(result.dtype))


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def mxfp4_quantize(input, output_q, output_s, group_size, eps):
    """OCP MXFP4 of each group of `group_size` values along the last
    dimension: scale 2**ceil(log2(amax / 6)), values rounded to the nearest
    e2m1 (low nibble = even element); output_s gets the scale as a float."""
    import torch

    m, k = input.shape
    x = input.float().reshape(m, k // group_size, group_size)
    amax = x.abs().amax(-1, keepdim=True).clamp(min=eps)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scale = torch.pow(2.0, exponent)
    scaled = (x / scale).reshape(m, k)
    table = torch.tensor(_E2M1_VALUES)
    magnitude = (scaled.abs().clamp(max=6.0).unsqueeze(-1) - table).abs().argmin(-1)
    codes = magnitude | ((scaled < 0).long() << 3)
    pairs = codes.reshape(m, k // 2, 2)
    output_q.copy_((pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8))
    output_s.copy_(scale.reshape(m, k // group_size))


# era -> (namespace, schema, kernel); defined only where the op is missing.
OWN_OPS = {
    "ipex": [
        (
            "torch_ipex",
            "dynamic_scaled_fp8_quant(Tensor(a!) result, Tensor input, "
            "Tensor(b!) scale) -> ()",
            _dynamic_scaled_fp8_quant,
        )
    ],
    "kernels": [
        (
            "_C",
            "per_token_group_quant_mxfp4(Tensor input, Tensor(a!) output_q, "
            "Tensor(b!) output_s, int group_size, float eps) -> ()",
            mxfp4_quantize,
        )
    ],
}


def _define_own_ops(era: str) -> list[str]:
    import torch

    defined = []
    for namespace, schema, kernel in OWN_OPS[era]:
        name = schema.partition("(")[0]
        if hasattr(getattr(torch.ops, namespace), name):
            continue
        library = torch.library.Library(namespace, "FRAGMENT")
        library.define(schema)
        library.impl(name, kernel, "CPU")
        _LIBRARIES.append(library)
        defined.append(f"{namespace}::{name}")
    return defined


def import_registering_module(era: str) -> str:
    name = REGISTERING_MODULE[era]
    module = importlib.import_module(name)
    return module.__file__


def _describe(kernel) -> dict:
    func = getattr(kernel, "func", kernel)
    # torch wraps a registered fake (_check_pystubs_once ... inner)
    for cell in getattr(func, "__closure__", None) or ():
        inner = cell.cell_contents
        if callable(inner) and getattr(inner, "__module__", "").startswith("vllm"):
            func = inner
            break
    return {
        "function": f"{getattr(func, '__module__', '?')}."
        f"{getattr(func, '__qualname__', '?')}",
        "registered_at": getattr(kernel, "source", None),
    }


def fake_owners() -> dict[str, dict | None]:
    """For each checked op that exists: the module and name of the fake
    registered for it (None: no fake)."""
    import torch
    from torch._library.simple_registry import singleton

    owners = {}
    for qualname in CHECKED_OPS[vllm_era_and_release()[0]]:
        namespace, _, rest = qualname.partition("::")
        name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is None:
            continue
        kernel = singleton.find(qualname).fake_impl.kernel
        owners[qualname] = None if kernel is None else _describe(kernel)
    return owners
