"""The edit that makes vLLM's `logger.<level>_once(...)` traceable where the
compiled forward runs it (intel/llm-scaler #699: a `logger.info_once` in the
traced sym_int4 `apply()` stops every compiled mode).

Dynamo refuses any method of a logging.Logger ("logging.Logger method not
supported for non-export cases", torch 2.13; every level, every `scope=`).
The edit is vLLM's own form (vllm/ir/op.py: "Logging not compatible with
Dynamo tracing"): the statement under `if not torch.compiler.is_compiling():`,
so the message is still logged when the code runs eagerly.

Which calls, from the file alone (trees/logonce.py): in a class's traced
method (`forward`, `forward_native`, `forward_xpu`, `apply`,
`apply_weights`) and in the functions of the same file it calls by name
(`self.<name>(...)`, `<name>(...)`), transitively; not set-up, not a call
already guarded or in another platform's branch. A call the audit finds
further away (a helper of another module) stays a finding: the recipe
path's proof refuses the tree and says where.

Pure text and AST: no torch, no vLLM import.
"""

import ast
import re
import tomllib

from xpufakes.common import paths
from xpufakes.trees import logonce, names

_DATA = tomllib.loads((paths.DATA / "untraceable.toml").read_text())
# the modules the compiled forward never runs on XPU, as the audit reads
# them (reach.py _outside_forward, its opaque regions): not edited
_NOT_TRACED = (
    *_DATA["outside_forward"]["modules"],
    *(m for r in _DATA["opaque_regions"].values() for m in r["modules"]),
)
_OTHER_PLATFORMS = frozenset(_DATA["other_platforms"]["name_parts"])
GUARD = "if not torch.compiler.is_compiling():"

# a module the edit may change: a `*_once` and a method the forward enters by
mentions = logonce.may_trace


class Refused(Exception):
    """A call the edit must guard and cannot (it shares its line, or its
    text holds a string over several lines that indenting would change)."""


def _functions(module: ast.Module) -> dict[str, ast.AST]:
    """qualname -> def, of module-level functions and methods (nested
    classes included)."""
    found: dict[str, ast.AST] = {}

    def visit(body, stack):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, [*stack, node.name])
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[".".join([*stack, node.name])] = node

    visit(module.body, [])
    return found


def _traced(functions: dict[str, ast.AST]) -> list[str]:
    """The functions of the file the traced forward runs (logonce.py)."""
    return sorted(logonce.traced_closure(functions))


def traced_module(path: str) -> bool:
    """Whether the compiled forward may run a module's code on XPU."""
    module = names.module_name(path)
    if f"{module}.".startswith(_NOT_TRACED):
        return False
    lowered = module.lower()
    if "xpu" in lowered or "ipex" in lowered:
        return True
    return not set(re.split(r"[._]", lowered)) & _OTHER_PLATFORMS


def sites(text: str, path: str = "vllm/module.py") -> list[ast.Expr]:
    """The `*_once` statements the edit guards, in source order."""
    if not traced_module(path):
        return []
    module = ast.parse(text)
    imports = logonce.module_imports(module, names.module_name(path))
    aliases = {
        t.id: node.value
        for node in module.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    def qualify(name: str, scope: str = "") -> list[str]:
        found = names.qualify(name, imports)
        return [found] if found else []

    bound = logonce.loggers(aliases, imports, qualify)
    if not bound and not any(t in logonce.LOGGERS for t in imports.values()):
        return []
    functions = _functions(module)
    found: dict[int, ast.Expr] = {}
    for qual in _traced(functions):
        function = functions[qual]
        guarded = logonce.guarded_lines(function, qualify)
        local = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Import | ast.ImportFrom):
                local.update(names.bindings(node, names.module_name(path)))
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call)
                and node.lineno not in guarded
                and logonce.logs_once(names.dotted(node.value.func), bound, local)
            ):
                found[node.lineno] = node
    return [found[line] for line in sorted(found)]


def edit(text: str, path: str = "vllm/module.py") -> str:
    """Each site under `if not torch.compiler.is_compiling():` (the module
    imports torch if it does not); a site that is the whole body of an `if`
    has the guard joined to that `if`'s test instead (`if <test> and not
    torch.compiler.is_compiling():`), the form the trees' ruff asks for
    (SIM102), where it fits on the line."""
    if not mentions(text):
        return text
    chosen = sites(text, path)
    if not chosen:
        return text
    lines = text.splitlines(keepends=True)
    sole = _sole_statements(ast.parse(text))
    for stmt in reversed(chosen):
        header = sole.get(stmt.lineno)
        if header is not None and _join_guard(lines, header):
            continue
        first = lines[stmt.lineno - 1]
        indent = first[: stmt.col_offset]
        if indent.strip():
            raise Refused(f"line {stmt.lineno}: the call shares its line")
        body = lines[stmt.lineno - 1 : stmt.end_lineno]
        if len(body) > 1 and any('"""' in line or "'''" in line for line in body):
            raise Refused(f"line {stmt.lineno}: a string over several lines")
        body = [
            "    " + line if line.strip() else line
            for line in lines[stmt.lineno - 1 : stmt.end_lineno]
        ]
        lines[stmt.lineno - 1 : stmt.end_lineno] = [f"{indent}{GUARD}\n", *body]
    edited = "".join(lines)
    if not _imports_torch(ast.parse(text)):
        edited = _add_torch_import(edited)
    return edited


# The trees' line length (ruff's default, vLLM's pyproject.toml)
LINE_LENGTH = 88
# tests that `and` would bind into (lower precedence, or a walrus): in
# parentheses when the guard joins them (and an `or`, below)
_LOOSER = (ast.IfExp, ast.Lambda, ast.NamedExpr)


def _sole_statements(module: ast.Module) -> dict[int, ast.If]:
    """line -> the `if` whose whole body is the statement on that line (no
    else): a guard nested in it is what the trees' ruff refuses (SIM102,
    collapsible if), so the guard joins its test."""
    return {
        node.body[0].lineno: node
        for node in ast.walk(module)
        if isinstance(node, ast.If) and len(node.body) == 1 and not node.orelse
    }


def _join_guard(lines: list[str], header: ast.If) -> bool:
    """`if <test>:` made `if <test> and not torch.compiler.is_compiling():`
    in place, where the test is on the `if`'s own line and the line stays
    within LINE_LENGTH; False (nothing changed) otherwise."""
    test = header.test
    if not test.lineno == test.end_lineno == header.lineno:
        return False
    line = lines[header.lineno - 1].encode()  # ast's columns are UTF-8 bytes
    start, end = test.col_offset, test.end_col_offset
    inner = line[start:end]
    if isinstance(test, _LOOSER) or (
        isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)
    ):
        inner = b"(" + inner + b")"
    guard = GUARD.removeprefix("if ").removesuffix(":").encode()
    joined = (line[:start] + inner + b" and " + guard + line[end:]).decode()
    if len(joined.rstrip("\n")) > LINE_LENGTH:
        return False
    lines[header.lineno - 1] = joined
    return True


def _imports_torch(module: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Import)
        and any(a.name == "torch" and a.asname is None for a in node.names)
        for node in module.body
    )


def _add_torch_import(text: str) -> str:
    """`import torch` before the module's first import (after its docstring
    and `from __future__`)."""
    module = ast.parse(text)
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            lines = text.splitlines(keepends=True)
            lines.insert(node.lineno - 1, "import torch\n")
            return "".join(lines)
    raise Refused("the module imports nothing to put `import torch` beside")
