"""The plugin's facts are written once, in the plugin's own files, and the
tool, the tests and the build backend read them there (the plugin ships
alone and cannot import the tool): its package and entry point
(plugin/pyproject.toml), the vLLM modules that register vLLM's own XPU
fakes (plugin.py's REGISTERING_MODULES). Cheap: text only.

Negative controls: a copy of the plugin's files with the entry point, or
REGISTERING_MODULES, changed: what the tool reads follows the copy; a
plugin.py without REGISTERING_MODULES is refused."""

import ast
import shutil

import pytest

from support import plugin as plugin_support
from xpufakes.common import paths, pluginsource
from xpufakes.proof import plugin as installed_plugin


@pytest.fixture
def plugin_copy(tmp_path, monkeypatch):
    """plugin/ copied, and what the tool reads of it read from the copy."""
    copy = tmp_path / "plugin"
    shutil.copytree(pluginsource.DIRECTORY, copy)
    monkeypatch.setattr(pluginsource, "DIRECTORY", copy)
    monkeypatch.setattr(paths, "REPO", tmp_path)
    pluginsource.entry_point.cache_clear()
    pluginsource.registering_modules.cache_clear()
    yield copy
    pluginsource.entry_point.cache_clear()
    pluginsource.registering_modules.cache_clear()


def _assigned(path, name):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == name:
            return node


def test_the_plugins_package_is_the_one_its_entry_point_names():
    package = pluginsource.package()
    init = pluginsource.DIRECTORY / package / "__init__.py"
    assert "\ndef register(" in init.read_text()
    assert package == plugin_support.PACKAGE
    assert package == plugin_support.backend().PACKAGE
    # the audit looks for that package where a tree is installed
    site = paths.REPO / "plugin"
    assert installed_plugin.find(site).directory == site


def test_renaming_the_entry_point_renames_the_package(plugin_copy):
    pyproject = plugin_copy / "pyproject.toml"
    text = pyproject.read_text()
    old = f'xpu_fakes = "{pluginsource.package()}:register"'
    assert old in text
    pyproject.write_text(text.replace(old, 'other_fakes = "other_package:register"'))
    pluginsource.entry_point.cache_clear()
    assert pluginsource.entry_point() == ("other_fakes", "other_package:register")
    assert pluginsource.package() == "other_package"
    said = installed_plugin.loaded_by_vllm({"VLLM_PLUGINS": "xpu_fakes"})
    assert "does not name 'other_fakes'" in said


def test_the_tool_imports_the_registering_modules_the_plugin_names(plugin_copy):
    source = plugin_copy / pluginsource.package() / "plugin.py"
    text = source.read_text()
    node = _assigned(source, "REGISTERING_MODULES")
    modules = ast.literal_eval(node.value)
    assert [m for m, _ in pluginsource.registering_modules()] == [m for m, _ in modules]
    assert {m for m, _ in modules} == {"vllm._xpu_ops", "vllm._ipex_ops"}
    lines = text.splitlines(keepends=True)
    lines[node.lineno - 1 : node.end_lineno] = [
        'REGISTERING_MODULES = (("vllm._other_ops", "other_kernels"),)\n'
    ]
    source.write_text("".join(lines))
    pluginsource.registering_modules.cache_clear()
    assert pluginsource.registering_modules() == (("vllm._other_ops", "other_kernels"),)
    source.write_text(text.replace("REGISTERING_MODULES", "SOMETHING_ELSE"))
    pluginsource.registering_modules.cache_clear()
    with pytest.raises(LookupError, match="no REGISTERING_MODULES"):
        pluginsource.registering_modules()
