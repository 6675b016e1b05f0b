"""A module loaded from a file by its path, once: a file that is no
package's module (the reference kernels of vllm_overlay/tests, a test file),
imported under a name of its own and kept in sys.modules. The one such
helper of the tool, the tests and make e2e's plugin (which put the
checkout's scripts/ on sys.path for it)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load(name: str, path: Path) -> ModuleType:
    """The module `name`, loaded from `path` if sys.modules has none of that
    name (a module that fails while it is loaded is not kept)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]
