"""A vLLM build's native extensions (its compiled modules: `vllm._C`, ...),
stood in. The stand-ins answer every name below one as the tree uses it: a
module, or a builtin function that Dynamo refuses to trace as it refuses the
real pybind11 one (builtin.py; which names a tree uses as modules:
trees/natives.py). A function with a reference (a downstream's pybind11
`vllm._C.ops.rms_norm`, ...) computes it when called eagerly."""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from pathlib import Path

from xpufakes.proof.xpu.builtin import builtin, unavailable
from xpufakes.proof.xpu.cpu_kernels import (
    fused_add_rms_norm,
    gelu_and_mul,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
)
from xpufakes.proof.xpu.uncomputed import NoCPUReference
from xpufakes.trees import natives, tree

# Known native functions (a downstream's pybind11 `vllm._C`, csrc/xpu/
# pybind.cpp of intel/llm-scaler's vllm_for_multi_arc.patch) -> reference.
NATIVE_REFERENCES: dict[str, Callable] = {
    "vllm._C.ops.rms_norm": rms_norm,
    "vllm._C.ops.fused_add_rms_norm": fused_add_rms_norm,
    "vllm._C.ops.rotary_embedding": rotary_embedding,
    "vllm._C.ops.silu_and_mul": lambda out, x: silu_and_mul(x, out),
    "vllm._C.ops.gelu_and_mul": lambda out, x: gelu_and_mul(x, out),
    "vllm._C.ops.gelu_tanh_and_mul": lambda out, x: gelu_and_mul(x, out, "tanh"),
}


def native_function(qualname: str):
    """The stand-in builtin for a native function, e.g.
    "vllm._C.ops.rms_norm": its reference, or one that raises, naming it."""
    module, _, name = qualname.rpartition(".")
    return builtin(name, module, NATIVE_REFERENCES.get(qualname, unavailable(qualname)))


# A vLLM build's native modules: natives.py (data, no torch).
NATIVE_MODULES, NATIVE_STYLE, is_native = (
    natives.NATIVE_MODULES,
    natives.NATIVE_STYLE,
    natives.is_native,
)
# The names below a native module that the tree uses as modules
# (natives.used_as_modules); every other name there is a function.
_MODULE_NAMES: set[str] = set()
# The trees whose sources still have to be read into _MODULE_NAMES: read
# when a stand-in is first asked for a name (most trees never ask while
# they are imported, and reading a kernels-era tree's sources costs seconds).
_TREES_UNREAD: list[Path] = []


def _module_names() -> set[str]:
    """_MODULE_NAMES, with the sources of every tree given read into it."""
    while _TREES_UNREAD:
        root = _TREES_UNREAD.pop(0)
        _MODULE_NAMES.update(natives.used_as_modules(tree.python_sources(root)))
    return _MODULE_NAMES


class NativeStandIn(types.ModuleType):
    """A stand-in for a native module of vLLM (or a submodule of one), as a
    pybind11 extension is: `import vllm._C.ops` and `from vllm._C import ops`
    give a module (so does every name the tree uses as one), every other
    name is a builtin function (native_function: `from
    vllm._C.ops import rms_norm`, `vllm._C.ops.rms_norm(...)`), which Dynamo
    refuses to trace as it refuses the real one. Calling one runs its
    reference if it has one, else raises, naming it."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        qualname = f"{self.__name__}.{name}"
        if qualname in _module_names():
            return importlib.import_module(qualname)
        function = native_function(qualname)
        setattr(self, name, function)  # one object per name
        return function

    def __call__(self, *args, **kwargs):
        raise NoCPUReference(
            f"{self.__name__} is a stand-in for vLLM's native extension "
            "(not loaded here): the tree calls it while it is imported"
        )


class _NativeStandIns(importlib.abc.MetaPathFinder):
    """Stand-ins for a vLLM build's native modules (NATIVE_MODULES) and for
    everything below one that is imported as a module. The tree's own Python
    module of such a name is imported for real (with its own errors); a
    built extension (`.so`) is not loaded: it needs the device's runtime,
    and the fakes never use it."""

    def find_spec(self, fullname, path=None, target=None):
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if not isinstance(parent, NativeStandIn):
            if not is_native(fullname):
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and not isinstance(
                spec.loader, importlib.machinery.ExtensionFileLoader
            ):
                return None  # the tree's own Python
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        _MODULE_NAMES.add(spec.name)  # imported as a module: one from now on
        module = NativeStandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def stub_vllm_extensions(root: Path | None = None) -> None:
    """Let a tree import its native modules at module level, in any form
    (a downstream tree's _ipex_ops.py does `import vllm._C.ops`), and call
    their functions as builtins. `root`: the tree, whose sources say which
    names below a native module it uses as modules (None: only those
    imported as modules are), read when a stand-in is first asked for a
    name."""
    if root is not None:
        _TREES_UNREAD.append(root)
    if not any(isinstance(f, _NativeStandIns) for f in sys.meta_path):
        sys.meta_path.insert(0, _NativeStandIns())
