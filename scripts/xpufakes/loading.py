"""Load a vLLM tree's own XPU fake registrations into this process, and the
reference kernels (stand-ins) that carry the kernels' schemas.

Needs torch. Used by verify-xpu and audit (in a separate process each:
registrations are process-global) and by the tests.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import types
from pathlib import Path

from . import paths

REFERENCE = (
    paths.OVERLAY / "tests" / "kernels" / "quantization" / "xpu_gemm_reference.py"
)

# vLLM modules that register fakes for XPU ops, newest first.
REGISTERING_MODULES = ("vllm._xpu_ops", "vllm._ipex_ops")


def reference():
    """The reference-kernel module of this project (loaded once)."""
    name = "xpu_gemm_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REFERENCE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def newest_xpu_kernels() -> str:
    """The newest vllm-xpu-kernels release the reference kernels know
    (read from the file, without importing torch)."""
    match = re.search(r'^NEWEST_XPU_KERNELS = "([^"]+)"', REFERENCE.read_text(), re.M)
    return match.group(1)


def define_standins(kernels: str) -> list:
    """Define stand-in ops for a kernel package release, e.g.
    "vllm-xpu-kernels 0.1.12" or "intel-extension-for-pytorch 2.9.10.post0+xpu".
    Several, for a tree that calls both families, are separated by ";".
    Returns the libraries; keep them referenced."""
    if ";" in kernels:
        return [
            library
            for part in kernels.split(";")
            for library in define_standins(part.strip())
        ]
    package, _, release = kernels.partition(" ")
    ref = reference()
    if package == "intel-extension-for-pytorch":
        return [ref.define_torch_ipex_kernels()]
    if package == "vllm-xpu-kernels":
        return [ref.define_xpu_c_kernels(release)]
    raise ValueError(f"unknown kernel package {package!r}")


def stub_xpu_kernel_package() -> None:
    """vllm_xpu_kernels needs an Intel GPU runtime; vLLM imports two of its
    functions at module level, which the GEMM fakes never call."""
    package = types.ModuleType("vllm_xpu_kernels")
    package.__path__ = []
    sys.modules["vllm_xpu_kernels"] = package
    for name, functions in {
        "flash_attn_interface": ["flash_attn_varlen_func"],
        "rotary": ["apply_rotary_emb"],
    }.items():
        module = types.ModuleType(f"vllm_xpu_kernels.{name}")
        for function in functions:
            setattr(module, function, _unavailable(function))
        sys.modules[module.__name__] = module
        setattr(package, name, module)


class _CompiledExtensionStubs(importlib.abc.MetaPathFinder):
    """Empty modules for vLLM's compiled extensions (vllm._C, vllm._moe_C,
    ...), which a source tree does not have; consulted after every other
    finder, so a built extension is used when there is one."""

    NAME = re.compile(r"vllm\._(\w+_)?C")

    def find_spec(self, fullname, path=None, target=None):
        if not self.NAME.fullmatch(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        pass


def stub_vllm_extensions() -> None:
    """Let a tree import vllm._C and the like at module level (a downstream
    tree's _xpu_ops.py does): the GEMM fakes never use them."""
    if not any(isinstance(f, _CompiledExtensionStubs) for f in sys.meta_path):
        sys.meta_path.append(_CompiledExtensionStubs())


def _unavailable(name: str):
    def function(*args, **kwargs):
        raise RuntimeError(f"vllm_xpu_kernels.{name} is a stand-in stub")

    return function


def import_registering_module(root: Path | None):
    """Import the tree's module that registers the XPU GEMM fakes
    (vllm/_xpu_ops.py, or vllm/_ipex_ops.py in the IPEX era), from `root`
    or, with None, the installed vLLM."""
    if root is not None:
        if "vllm" in sys.modules:
            raise RuntimeError("vllm was imported before the tree was chosen")
        sys.path.insert(0, str(root))
    for name in REGISTERING_MODULES:
        if importlib.util.find_spec(name) is not None:
            module = importlib.import_module(name)
            if root is not None and not Path(module.__file__).is_relative_to(root):
                raise RuntimeError(f"{name} came from {module.__file__}, not {root}")
            return module
    raise ModuleNotFoundError("no vllm/_xpu_ops.py or vllm/_ipex_ops.py")


def fake_of(qualname: str):
    """The fake kernel registered for an op overload, or None."""
    from torch._library.simple_registry import singleton

    entry = singleton.find(qualname)
    return entry.fake_impl.kernel if entry.fake_impl.kernel is not None else None
