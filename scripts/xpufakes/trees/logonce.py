"""vLLM's `logger.<level>_once(...)` calls in a module's Python, read as
text (data/untraceable.toml [logger_once]): which names are a vLLM logger,
which calls are `*_once`, and which lines run only when Dynamo is not
compiling (or only on another platform). The one place these rules are
written: the audit's search (proof/static/reach.py) finds such calls on the
traced path, the recipe (changes/traceablelogs.py) guards them.

Dynamo refuses any method of a logging.Logger it is not told to ignore
("logging.Logger method not supported for non-export cases", torch 2.13):
vLLM's `*_once` are bound on the logger instance, so each call stops a
compile with fullgraph=True (intel/llm-scaler #699).
"""

import ast
import re
import tomllib
from collections.abc import Callable

from xpufakes.common import paths
from xpufakes.trees import names

_UNTRACEABLE = tomllib.loads((paths.DATA / "untraceable.toml").read_text())
DATA = _UNTRACEABLE["logger_once"]
METHODS = frozenset(DATA["methods"])
FACTORIES = frozenset(DATA["factories"])
LOGGERS = frozenset(DATA["loggers"])
GUARDS = tuple(DATA["guards"])
OTHER_PLATFORM_TESTS = frozenset(DATA["other_platform_tests"])

# (dotted name, scope) -> what it may be, fully qualified
Qualify = Callable[[str, str], list[str]]

# The methods the compiled forward enters a class by, and the set-up it
# never runs (a `*_once` there is logged while loading, eagerly)
ENTRIES = frozenset({"forward", "forward_native", "forward_xpu", "apply"})
ENTRIES |= {"apply_weights"}
SETUP = re.compile(
    r"^(__init__|process_weights_after_loading|_?process_weights.*|create_weights"
    r"|load_weights|.*weight_loader.*|__post_init__)$"
)
APPLY_NOT_TRACED = re.compile(_UNTRACEABLE["apply_not_traced"]["class_pattern"])
_DEFINES_ENTRY = re.compile(
    r"^\s+(?:async\s+)?def\s+(?:" + "|".join(sorted(ENTRIES)) + r")\s*\(", re.M
)


def mentions(text: str) -> bool:
    """Whether a module's text may call a `*_once` (a cheap pre-filter)."""
    return "_once(" in text and any(f"{m}(" in text for m in METHODS)


def may_trace(text: str) -> bool:
    """Whether a module's text may call a `*_once` where the compiled
    forward runs it: it also defines a method the forward enters by (the
    search is of the file: traced_closure)."""
    return mentions(text) and bool(_DEFINES_ENTRY.search(text))


def traced_closure(functions: dict[str, ast.AST]) -> dict[str, tuple[str, int] | None]:
    """The functions of one file the traced forward runs: each class's
    entries (ENTRIES; not a class APPLY_NOT_TRACED names) and what they
    call in the file by name (`self.<name>(...)`, `<name>(...)`),
    transitively, never set-up. `functions`: qualname -> def, methods of
    nested classes included. qualname -> None for an entry, else (the
    caller it was first reached from, the line of that call): the chain up
    to the entry. The one reach of the file: the audit's search
    (proof/static/reach.py) and the recipe's edit (changes/traceablelogs.py)
    read it, so the audit finds what the recipe guards."""
    found: dict[str, tuple[str, int] | None] = {
        q: None
        for q in sorted(functions)
        if "." in q
        and q.rsplit(".", 1)[1] in ENTRIES
        and not APPLY_NOT_TRACED.search(q.rsplit(".", 2)[-2])
    }
    todo = list(found)
    while todo:
        qual = todo.pop(0)
        owner = qual.rpartition(".")[0]
        for node in ast.walk(functions[qual]):
            if not isinstance(node, ast.Call):
                continue
            name = names.dotted(node.func)
            head, _, last = name.rpartition(".")
            if head in ("self", "cls") and owner:
                # a method of the class or of a class of the file
                targets = sorted(q for q in functions if q.rsplit(".", 1)[-1] == last)
            elif not head:
                targets = [last] if last in functions else []
            else:
                targets = []
            for target in targets:
                if target not in found and not SETUP.match(target.rsplit(".")[-1]):
                    found[target] = (qual, node.lineno)
                    todo.append(target)
    return found


def module_imports(module: ast.Module, name: str) -> dict[str, str]:
    """The names a module's top-level imports bind (also inside a top-level
    if / try), qualified."""
    found: dict[str, str] = {}
    todo = list(module.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            for local, target in names.bindings(node, name):
                found.setdefault(local, target)
        elif isinstance(node, ast.If | ast.Try):
            todo += node.body + node.orelse
            for handler in getattr(node, "handlers", []):
                todo += handler.body
    return found


def loggers(aliases: dict[str, ast.expr], imports: dict[str, str], qualify) -> set:
    """The module-level names bound to a vLLM logger: `logger =
    init_logger(__name__)` (`qualify`: a dotted name -> its qualified
    forms), or vllm.logger's own logger imported."""
    found = set()
    for name, value in aliases.items():
        if isinstance(value, ast.Call) and any(
            q in FACTORIES for q in qualify(names.dotted(value.func))
        ):
            found.add(name)
    for name, target in imports.items():
        if target in LOGGERS:
            found.add(name)
    return found


def logs_once(name: str, bound: set[str], local: dict[str, str]) -> bool:
    """Whether a call's dotted name is `<a vLLM logger>.<level>_once`
    (`local`: the function's own imports)."""
    head, _, method = name.rpartition(".")
    if method not in METHODS or not head or "." in head:
        return False
    if head in local:
        return local[head] in LOGGERS
    return head in bound


def is_guard(test: ast.expr, qualify: Callable[[str], list[str]]) -> bool:
    """`<guard>()`: whether Dynamo is compiling (data: guards)."""
    if not isinstance(test, ast.Call) or test.args:
        return False
    name = names.dotted(test.func)
    if not name:
        return False
    return any(
        q == guard or q.endswith(f".{guard}")
        for q in [name, *qualify(name)]
        for guard in GUARDS
    )


def _terms(test: ast.expr) -> list[ast.expr]:
    """The terms of an `and`, or the test itself."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return test.values
    return [test]


def not_guard(test: ast.expr, qualify) -> bool:
    """`not <guard>()`, alone or as a term of an `and`."""
    return any(
        isinstance(t, ast.UnaryOp)
        and isinstance(t.op, ast.Not)
        and is_guard(t.operand, qualify)
        for t in _terms(test)
    )


def other_platform(test: ast.expr) -> bool:
    """`<x>.is_cuda` (or `current_platform.is_cuda()`, ...), alone or as a
    term of an `and`: another platform's branch (data: other_platform_tests)."""
    for term in _terms(test):
        if isinstance(term, ast.Call) and not term.args:
            term = term.func
        if isinstance(term, ast.Attribute) and term.attr in OTHER_PLATFORM_TESTS:
            return True
    return False


def _ends(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise)


def _leaves_other_platforms(stmt: ast.If) -> bool:
    """An if / elif chain whose every branch returns, down to one that tests
    `not <x>.is_cuda()`: what follows it runs on that platform only
    (vLLM's `elif not current_platform.is_cuda(): return ...`)."""
    node = stmt
    while isinstance(node, ast.If) and _ends(node.body):
        test = node.test
        if (
            isinstance(test, ast.UnaryOp)
            and isinstance(test.op, ast.Not)
            and other_platform(test.operand)
        ):
            return True
        if len(node.orelse) != 1:
            return False
        node = node.orelse[0]
    return False


def guarded_lines(function: ast.AST, qualify) -> set[int]:
    """The lines of a function that run only when Dynamo is not compiling
    (the body of `if not <guard>():`, the `else` of `if <guard>():`, what
    follows `if <guard>(): return ...` in the same block), or only on
    another platform (the body of `if <x>.is_cuda:`, what follows an
    `if ...: return` chain ending in `elif not <x>.is_cuda(): return`)."""
    lines: set[int] = set()

    def span(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            lines.update(range(node.lineno, node.end_lineno + 1))

    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if not isinstance(stmt, ast.If):
                    continue
                if not_guard(stmt.test, qualify) or other_platform(stmt.test):
                    span(stmt.body)
                elif is_guard(stmt.test, qualify):
                    span(stmt.orelse)
                    if _ends(stmt.body):
                        span(block[i + 1 :])
                if _leaves_other_platforms(stmt):
                    span(block[i + 1 :])
    return lines


def _env_var(node: ast.AST) -> str | None:
    """`envs.<X>` (vllm.envs), `os.environ[...]` / `os.getenv(...)`: the
    variable it reads."""
    for inner in ast.walk(node):
        if (
            isinstance(inner, ast.Attribute)
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "envs"
        ):
            return inner.attr
        if isinstance(inner, ast.Call) and names.dotted(inner.func) in (
            "os.getenv",
            "os.environ.get",
        ):
            first = inner.args[0] if inner.args else None
            if isinstance(first, ast.Constant):
                return str(first.value)
    return None


def env_condition(function: ast.AST, line: int) -> str | None:
    """The environment variable an `if` around the line tests (directly,
    or through a local name bound from it: `layout = envs.X` then `if
    layout is not None:`), or None."""
    bound = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            variable = _env_var(node.value)
            for target in targets:
                if variable and isinstance(target, ast.Name):
                    bound[target.id] = variable
    for node in ast.walk(function):
        if not isinstance(node, ast.If) or not node.body:
            continue
        if not node.body[0].lineno <= line <= node.body[-1].end_lineno:
            continue
        variable = _env_var(node.test)
        for inner in ast.walk(node.test):
            if variable is None and isinstance(inner, ast.Name):
                variable = bound.get(inner.id)
        if variable:
            return variable
    return None
