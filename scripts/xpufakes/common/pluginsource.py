"""This project's vLLM plugin (plugin/) as the tool knows it, read from the
plugin's own files, where each fact is written once: the plugin ships
alone in a wheel and cannot import the tool, so the tool reads them by path.

* its package and entry point: plugin/pyproject.toml, the
  `vllm.general_plugins` entry point `<name> = "<package>:register"`;
* the vLLM modules that register vLLM's own XPU fakes, newest first, each
  with the kernel package it needs: REGISTERING_MODULES of
  plugin/<package>/plugin.py.
"""

import ast
import functools
import tomllib

from xpufakes.common import paths

DIRECTORY = paths.REPO / "plugin"
GROUP = "vllm.general_plugins"


@functools.cache
def entry_point() -> tuple[str, str]:
    """(the entry point's name, "<package>:<function>")."""
    project = tomllib.loads((DIRECTORY / "pyproject.toml").read_text())["project"]
    ((name, target),) = project["entry-points"][GROUP].items()
    return name, target


def package() -> str:
    """The plugin's import package (vllm_xpu_fakes)."""
    return entry_point()[1].partition(":")[0]


def module_source() -> str:
    """plugin/<package>/plugin.py, repository-relative."""
    return f"plugin/{package()}/plugin.py"


@functools.cache
def registering_modules() -> tuple[tuple[str, str], ...]:
    """(vLLM module, the kernel package it needs), newest first: the
    plugin's REGISTERING_MODULES, the literal of its assignment."""
    source = paths.REPO / module_source()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and [
            getattr(target, "id", "") for target in node.targets
        ] == ["REGISTERING_MODULES"]:
            return tuple(tuple(pair) for pair in ast.literal_eval(node.value))
    raise LookupError(f"{source}: no REGISTERING_MODULES")
