"""Load a vLLM tree's own XPU fake registrations into this process, and the
reference kernels (stand-ins) that carry the kernels' schemas.

Needs torch. Used by verify-xpu and audit (in a separate process each:
registrations are process-global) and by the tests. The stand-ins for a
build's native modules answer every name below one as the tree uses it: a
module, or a builtin function that Dynamo refuses to trace as it refuses the
real pybind11 one (natives.py, standins.py).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import tomllib
import traceback
import types
from pathlib import Path

from xpufakes.changes.kernels import REFERENCE
from xpufakes.common import paths
from xpufakes.common.errors import Refusal
from xpufakes.proof import quantize_convert_standin, standins
from xpufakes.trees import natives, tree

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


XPU_KERNELS_C = paths.DATA / "xpu_kernels_c.toml"


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
    data = tomllib.loads(XPU_KERNELS_C.read_text())["_C"]
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
    first = tomllib.loads(XPU_KERNELS_C.read_text())["first_release"]
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
        standins.define_xpu_kernels_c_ops(schemas),
        standins.define_xpu_device_queries(xpu_c),
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
    name is a builtin function (standins.native_function: `from
    vllm._C.ops import rms_norm`, `vllm._C.ops.rms_norm(...)`), which Dynamo
    refuses to trace as it refuses the real one. Calling one runs its
    reference if it has one, else raises, naming it."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        qualname = f"{self.__name__}.{name}"
        if qualname in _module_names():
            return importlib.import_module(qualname)
        function = standins.native_function(qualname)
        setattr(self, name, function)  # one object per name
        return function

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
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


PLUGIN_PACKAGE = "vllm_xpu_fakes"  # this project's vLLM plugin (plugin/)


def load_plugin(directory: Path, any_platform: bool = False) -> dict:
    """This project's vLLM plugin, installed in `directory` (a site-packages,
    or its wheel unpacked): its register(), as vLLM's plugin loader runs it
    at start-up (after the platform and the kernels exist, before a model is
    built); returns what it did. `any_platform`: let it act on a platform
    that is not XPU (the stand-ins on a CPU)."""
    import os

    if any_platform:
        os.environ["VLLM_XPU_FAKES_ANY_PLATFORM"] = "1"
    directory = Path(directory).resolve()
    sys.path.insert(0, str(directory))
    plugin = importlib.import_module(PLUGIN_PACKAGE)
    if not Path(plugin.__file__).is_relative_to(directory):
        raise RuntimeError(f"{PLUGIN_PACKAGE} came from {plugin.__file__}")
    plugin.register()
    # what the sweep could not rebind: the plugin's whole-heap search, which
    # its register() never runs at start-up
    getattr(importlib.import_module(f"{PLUGIN_PACKAGE}.plugin"), "unreached", list)()
    return plugin.state()


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
