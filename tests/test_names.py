"""The one reading of dotted names in a tree's Python (trees/names.py),
which the scan, the search for untraceable calls and the native modules'
stand-ins share: what an import statement binds is what Python binds (each
statement executed here, the negative control being the scan's old rule,
which bound `import os.path` to os.path), and a dotted expression is
qualified through those bindings."""

import ast
import importlib

import pytest

from xpufakes.trees import names

STATEMENTS = [
    "import os.path",
    "import os.path as p",
    "import json, email.mime",
    "from os import path",
    "from os import path as p, sep",
    "from email.mime import text",
]


def _object(dotted: str):
    """What a dotted name is: a module, or a name of one."""
    try:
        return importlib.import_module(dotted)
    except ImportError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("statement", STATEMENTS)
def test_an_import_binds_what_python_binds(statement):
    scope: dict = {}
    exec(statement, scope)  # noqa: S102 - standard library imports only
    scope.pop("__builtins__")
    node = ast.parse(statement).body[0]
    bound = dict(names.bindings(node, "vllm.model_executor.models.llama"))
    assert set(bound) == set(scope)
    for name, target in bound.items():
        assert _object(target) is scope[name], (name, target)


def test_the_old_rule_of_the_scan_is_not_pythons():
    """The scan bound `import os.path` as os -> os.path; Python binds os to
    os, so `os.getcwd()` is os.getcwd, not os.path.getcwd."""
    node = ast.parse("import os.path").body[0]
    old = {alias.name.split(".")[0]: alias.name for alias in node.names}
    assert old != dict(names.bindings(node, "m")) == {"os": "os"}
    assert names.qualify("os.getcwd", dict(names.bindings(node, "m"))) == "os.getcwd"
    assert names.qualify("os.getcwd", old) == "os.path.getcwd"


def test_relative_imports_start_from_the_package():
    module, package = "vllm.model_executor.layers.linear", "vllm.model_executor"
    cases = {
        ("from . import utils", False): {"utils": "vllm.model_executor.layers.utils"},
        ("from .. import models as m", False): {"m": "vllm.model_executor.models"},
        ("from .layers import linear", True): {
            "linear": "vllm.model_executor.layers.linear"
        },
    }
    for (statement, is_package), expected in cases.items():
        node = ast.parse(statement).body[0]
        within = package if is_package else module
        assert dict(names.bindings(node, within, is_package)) == expected, statement


def test_module_names_and_dotted_expressions():
    assert names.module_name("vllm/a/b.py") == "vllm.a.b"
    assert names.module_name("vllm/a/__init__.py") == "vllm.a"
    expr = ast.parse("ops.rms_norm(x)").body[0].value.func
    assert names.dotted(expr) == "ops.rms_norm"
    assert names.dotted(ast.parse("f()(x)").body[0].value.func) == ""
    imports = {"ops": "vllm._C.ops"}
    assert names.qualify("ops.rms_norm", imports) == "vllm._C.ops.rms_norm"
    assert names.qualify("other.rms_norm", imports) == ""
