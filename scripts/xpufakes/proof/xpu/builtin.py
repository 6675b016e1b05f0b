"""A C extension's function: a real `builtin_function_or_method`, bound to
a capsule as pybind11 binds it, so that its `__qualname__` is
`PyCapsule.<name>` (a downstream build's pybind11 `vllm._C`, whose `ops`
submodule holds `rms_norm`, `rotary_embedding`, ...). Dynamo refuses to
trace it: "Attempted to call function marked as skipped ... third-party
C/C++ Python extension"."""

import ctypes
from collections.abc import Callable

from xpufakes.proof.xpu.uncomputed import NoCPUReference


class _PyMethodDef(ctypes.Structure):
    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


_METH_VARARGS, _METH_KEYWORDS = 0x1, 0x2
_api = ctypes.pythonapi
_api.PyCFunction_NewEx.restype = ctypes.py_object
_api.PyCFunction_NewEx.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
# The C function of every stand-in builtin: PyObject_Call(self, args, kwargs),
# with `self` the capsule below.
_CALL = ctypes.cast(_api.PyObject_Call, ctypes.c_void_p).value
_DEFS: list = []  # each PyMethodDef must outlive its function


class PyCapsule:
    """pybind11 binds every function to a capsule, so its builtins'
    `__qualname__` is `PyCapsule.<name>`; this one calls `func`."""

    def __init__(self, func: Callable):
        self.func = func

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)


def builtin(name: str, module: str, func: Callable):
    """A `builtin_function_or_method` named `module.name` (as a pybind11
    function of that module is) that calls `func`."""
    definition = _PyMethodDef(
        name.encode(), _CALL, _METH_VARARGS | _METH_KEYWORDS, None
    )
    _DEFS.append(definition)
    return _api.PyCFunction_NewEx(ctypes.addressof(definition), PyCapsule(func), module)


def unavailable(qualname: str) -> Callable:
    """What a native function without a reference does when called."""

    def function(*args, **kwargs):
        raise NoCPUReference(
            f"{qualname} is a stand-in for vLLM's native extension "
            "(not loaded here): the tree calls it while it is imported"
        )

    return function
