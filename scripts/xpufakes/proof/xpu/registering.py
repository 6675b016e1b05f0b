"""A vLLM tree's own XPU fake registrations loaded into this process (its
registering module, against the stand-ins), and this project's vLLM plugin's
register(), as vLLM runs it at start-up.

Needs torch. Used by verify-xpu and audit (in a separate process each:
registrations are process-global), by the model proof and by the tests.
"""

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

from xpufakes.common import pluginsource
from xpufakes.common.errors import Refusal


def import_registering_module(root: Path | None):
    """Import the tree's module that registers the XPU GEMM fakes
    (vllm/_xpu_ops.py, or vllm/_ipex_ops.py in the IPEX era), from `root`
    or, with None, the installed vLLM."""
    if root is not None:
        if "vllm" in sys.modules:
            raise RuntimeError("vllm was imported before the tree was chosen")
        sys.path.insert(0, str(root))
    for name, _ in pluginsource.registering_modules():
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
    package = pluginsource.package()
    plugin = importlib.import_module(package)
    if not Path(plugin.__file__).is_relative_to(directory):
        raise RuntimeError(f"{package} came from {plugin.__file__}")
    plugin.register()
    # what the sweep could not rebind: the plugin's whole-heap search, which
    # its register() never runs at start-up
    getattr(importlib.import_module(f"{package}.plugin"), "unreached", list)()
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
