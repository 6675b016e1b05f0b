"""Packages a tree imports beside vLLM, stood in where they cannot be
imported here: torchvision (a multimodal model's module imports an image
processor at module level; the vision path is not run) and a downstream
image's own kernel packages."""

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable

# ---------------------------------------------------------------------------
# torchvision, for the module-level imports of a multimodal model's module
# ---------------------------------------------------------------------------


class _Anything(type):
    """A torchvision name: a class whose every attribute is another one
    (`InterpolationMode.BICUBIC`), which raises when it is made or called."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        made = _Anything(name, (_TorchvisionName,), {"__module__": cls.__module__})
        setattr(cls, name, made)
        return made


class _TorchvisionName(metaclass=_Anything):
    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__module__}.{type(self).__name__} is a torchvision "
            "stand-in: the vision path is not run here"
        )


class _NamesModule(types.ModuleType):
    """A stand-in module: each name asked of it is made once, by
    ``make(module name, name)``, and kept."""

    def __init__(self, name: str, make: Callable[[str, str], object]):
        super().__init__(name)
        self._make = make

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        made = self._make(self.__name__, name)
        setattr(self, name, made)
        return made


def _torchvision_name(module: str, name: str) -> type:
    return _Anything(name, (_TorchvisionName,), {"__module__": module})


class _Torchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _NamesModule(spec.name, _torchvision_name)
        module.__path__ = []
        # transformers reads the version once it finds the package: one
        # below every version it asks for, so that where it has a choice it
        # takes the path that needs the least of torchvision
        module.__version__ = "0.0"
        return module

    def exec_module(self, module):
        pass


def install_torchvision() -> bool:
    """If torchvision cannot be imported, let `torchvision` and every module
    below it import as stand-ins whose names raise when used. A multimodal
    model's module imports an image processor at module level (transformers'
    image_processing_qwen2_vl imports torchvision.transforms.v2); the
    language model never runs it. Returns whether it installed them."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or built for another torch
        for name in [n for n in sys.modules if n.partition(".")[0] == "torchvision"]:
            del sys.modules[name]
        if not any(isinstance(f, _Torchvision) for f in sys.meta_path):
            sys.meta_path.insert(0, _Torchvision())
        return True
    return False


# ---------------------------------------------------------------------------
# A downstream image's own kernel packages, beside vLLM
# ---------------------------------------------------------------------------

# name -> what it is and where a tree imports it. Its real functions are
# Python wrappers of torch ops its C++ registers for the XPU only
# (custom_esimd_kernels_vllm/ops.py: `torch.ops.custom_esimd_kernels_vllm.*`),
# so a trace that reaches one fails on the XPU as it fails here. Each name
# below the package is stood in by a callable that raises, naming itself.
DOWNSTREAM_PACKAGES = {
    "custom_esimd_kernels_vllm": "intel/llm-scaler's ESIMD kernels "
    "(vllm/custom-esimd-kernels-vllm): 0a85564 (0.14.0) imports three of "
    "them in ipex_quant.py at module level, b18beee (0.21.0) in esimd_utils.py",
}


class _DownstreamName:
    """A name of a downstream kernel package: its attributes are names
    too, and calling it raises, naming it."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _DownstreamName(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._qualname} is a stand-in: the image's kernel package is "
            "not here, and the traced path reached it"
        )


class _Downstream(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in DOWNSTREAM_PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _NamesModule(spec.name, lambda m, n: _DownstreamName(f"{m}.{n}"))
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_downstream_packages() -> list[str]:
    """Stand-ins for the packages of DOWNSTREAM_PACKAGES that cannot be
    imported here. Returns their names."""
    import importlib.util

    missing = [n for n in DOWNSTREAM_PACKAGES if importlib.util.find_spec(n) is None]
    if missing and not any(isinstance(f, _Downstream) for f in sys.meta_path):
        sys.meta_path.append(_Downstream())
    return missing
