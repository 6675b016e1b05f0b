"""Load a vLLM tree's own XPU fake registrations into this process, and the
reference kernels (stand-ins) that carry the kernels' schemas.

Needs torch (the stand-ins for vLLM's native modules do not). Used by
verify-xpu and audit (in a separate process each: registrations are
process-global) and by the tests.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import traceback
import types
from pathlib import Path

from .errors import Refusal
from .kernels import REFERENCE

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


# What a vLLM build adds to the tree and a source tree (or the proof's copy
# of a tree) does not have: its compiled extensions -- every
# `CMakeExtension(name=...)` of the pinned sdists' setup.py and every
# `define_extension_target` of their CMake files (tests/test_native_standins.py
# checks this list against them). A downstream build's own extension named in
# vLLM's style (`vllm._xpu_C`, `vllm.<package>._<name>_C`) is one too
# (NATIVE_STYLE). Not the pure-Python packages a build copies into
# vllm/third_party/ (triton_kernels, deep_gemm, ...): vLLM treats them as
# optional and probes for them (`find_spec`, then reads `__file__`), so a
# stand-in would tell it they are there; a tree without them is a build
# without them.
NATIVE_MODULES = frozenset(
    {
        "vllm._C",
        "vllm._C_AVX2",
        "vllm._C_AVX512",
        "vllm._C_stable_libtorch",
        "vllm._moe_C",
        "vllm._moe_C_stable_libtorch",
        "vllm._rocm_C",
        "vllm._flashmla_C",
        "vllm._flashmla_extension_C",
        "vllm._deep_gemm_C",
        "vllm._deepselect_C",
        "vllm._flashkda_C",
        "vllm._qutlass_C",
        "vllm.cumem_allocator",
        "vllm.fs_io_C",
        "vllm.spinloop",
        "vllm.vllm_flash_attn._vllm_fa2_C",
        "vllm.vllm_flash_attn._vllm_fa3_C",
        "vllm.vllm_flash_attn._vllm_fa4_cutedsl_C",
        "vllm.triton_kernels",
        "vllm.fmha_sm100",
        "vllm.tml_fa4",
    }
)
NATIVE_STYLE = re.compile(r"vllm(\.\w+)*\._(\w+_)?C(_\w+)?")


def is_native(name: str) -> bool:
    """Whether a module name is one of a vLLM build's (NATIVE_MODULES)."""
    return name in NATIVE_MODULES or NATIVE_STYLE.fullmatch(name) is not None


class NativeStandIn(types.ModuleType):
    """A stand-in for a native module of vLLM: a package, so `import
    vllm._C.ops` and `from vllm._C import ops` work, whose every attribute is
    another stand-in (`from vllm._C.ops import rms_norm`, `vllm._C.ops.x.y`);
    calling one raises, naming it. The GEMM fakes never call them."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return importlib.import_module(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self.__name__} is a stand-in for vLLM's native extension "
            "(not loaded here): the tree calls it while it is imported"
        )


class _NativeStandIns(importlib.abc.MetaPathFinder):
    """Stand-ins for a vLLM build's native modules (NATIVE_MODULES) and for
    everything below one. The tree's own Python module of such a name is
    imported for real (with its own errors); a built extension (`.so`) is
    not loaded: it needs the device's runtime, and the fakes never use it."""

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
        module = NativeStandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def stub_vllm_extensions() -> None:
    """Let a tree import its native modules at module level, in any form
    (a downstream tree's _ipex_ops.py does `import vllm._C.ops`)."""
    if not any(isinstance(f, _NativeStandIns) for f in sys.meta_path):
        sys.meta_path.insert(0, _NativeStandIns())


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
            try:
                module = importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 - said with where it failed
                if (getattr(e, "name", None) or "").partition(".")[0] == "torch":
                    raise
                raise Refusal(f"{name} cannot be imported: {failure(e, root)}") from e
            if root is not None and not Path(module.__file__).is_relative_to(root):
                raise RuntimeError(f"{name} came from {module.__file__}, not {root}")
            return module
    raise ModuleNotFoundError("no vllm/_xpu_ops.py or vllm/_ipex_ops.py")


def failure(error: BaseException, root: Path | None) -> str:
    """'<file>, line <n>: <Error>: <message>' for an error raised while a
    tree is imported: the tree's file and line where it happened (a syntax
    error's own), the path relative to the tree."""
    where = None
    if isinstance(error, SyntaxError) and error.filename:
        where = (error.filename, error.lineno)
    else:
        for frame, line in traceback.walk_tb(error.__traceback__):
            if _in_tree(frame.f_code.co_filename, root):
                where = (frame.f_code.co_filename, line)
    text = f"{type(error).__name__}: {getattr(error, 'msg', None) or error}"
    if where is None:
        return text
    path = Path(where[0])
    if root is not None and path.is_relative_to(root):
        path = path.relative_to(root)
    return f"{path}, line {where[1]}: {text}"


def _in_tree(filename: str, root: Path | None) -> bool:
    path = Path(filename)
    if root is not None:
        return path.is_relative_to(root)
    return "vllm" in path.parts


def fake_of(qualname: str):
    """The fake kernel registered for an op overload, or None."""
    from torch._library.simple_registry import singleton

    entry = singleton.find(qualname)
    return entry.fake_impl.kernel if entry.fake_impl.kernel is not None else None
