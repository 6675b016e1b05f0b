"""What a vLLM tree's own Python says about custom ops, read by AST (no
import, no torch): the ops it defines itself (`direct_register_custom_op`,
`torch.library.custom_op`) with their `mutates_args` (none given is []),
the fakes it registers (`register_fake`, `impl_abstract`, a function that
passes its arguments on to one of those, `fake_impl=`), and every call of
an op, directly (`torch.ops.<ns>.<op>(...)`) or through the names that
reach one: a kernel package's Python wrappers (data), re-exports
(`from x import f`, `f = _pkg.f` in a module such as `esimd_utils`), a
local name (`fn = torch.ops.a.b if c else torch.ops.a.d`), an attribute
a class sets (`self._op = f`). Each call with what it passes for each of
the op's parameters, whether it uses the result, and which of the
arguments it reads after the call."""

import ast
import re
from dataclasses import dataclass, field

from xpufakes.common import opschema
from xpufakes.trees import names as pynames
from xpufakes.trees.pysource import Module, SourceTree, parse, statements

# What the fix's vllm/_xpu_opaque_calls.py gives a tree to keep in place of
# a callee (changes/recipes.py AS_CUSTOM_OP): its calls are vllm::<op>'s.
AS_CUSTOM_OP = "as_custom_op"

# Namespaces of torch's own ops: not kernels' (their schemas are torch's).
_TORCH_NAMESPACES = frozenset(
    {"aten", "prims", "higher_order", "quantized", "_c10d_functional"}
)


@dataclass(frozen=True)
class Wrapper:
    """A kernel package's Python function that calls one op."""

    op: str
    params: tuple[str, ...]
    args: tuple[str, ...]  # what it passes to the op, in order ("x=y" by keyword)
    returns_op: bool
    at: str = ""


@dataclass
class Known:
    """What the search looks for: the ops with a schema, by "ns::name";
    the packages' wrappers, by qualified name ("pkg.f"); the packages."""

    schemas: dict[str, opschema.Schema]
    wrappers: dict[str, Wrapper] = field(default_factory=dict)
    packages: tuple[str, ...] = ()

    def names(self) -> set[str]:
        """The last parts of every name that may reach an op."""
        found = {op.split("::")[1] for op in self.schemas}
        return found | {w.rsplit(".", 1)[-1] for w in self.wrappers}


@dataclass
class Registration:
    """An op the tree defines itself."""

    op: str  # "vllm::xpu_topk_topp_sampler"
    file: str
    line: int
    how: str  # "direct_register_custom_op", "torch.library.custom_op"
    function: str  # the implementation's qualname in `module`
    module: str
    params: list[str]
    mutates: list[str] | None  # None: not a literal list
    mutates_given: bool
    fake: str = ""  # the fake's qualname in `module`, if given there


@dataclass
class Fake:
    """A fake the tree registers for an op, and what it returns."""

    op: str
    file: str
    line: int
    params: list[str]
    # (kind, line): "none", "param:<name>", "view:<name>", "fresh",
    # "tuple(...)", "other" (returns_of)
    returns: list[tuple[str, int]]


@dataclass
class Call:
    op: str
    file: str
    line: int
    module: str
    function: str  # qualname, "<module>" at module level
    via: str  # the name called, as written
    args: dict[str, str]  # op parameter -> the argument's source text
    result_used: bool
    read_after: dict[str, int] = field(default_factory=dict)  # parameter -> line
    target: str = ""  # what the name resolves to: "pkg.f", "torch.ops.ns.op"


# ---------------------------------------------------------------------------
# Resolving a called name
# ---------------------------------------------------------------------------


class Resolver:
    """What a called expression may be: qualified names outside the tree
    ("torch.ops.ns.op", "pkg.f") or functions of the tree ("vllm.m.f")."""

    def __init__(self, tree: SourceTree, known: Known):
        self.tree = tree
        self.known = known
        self._locals: dict[tuple[str, str], dict[str, list[ast.expr]]] = {}

    def locals_of(self, module: Module, scope: str) -> dict[str, list[ast.expr]]:
        key = (module.name, scope)
        if key not in self._locals:
            found: dict[str, list[ast.expr]] = {}
            function = module.functions.get(scope)
            for node in statements(function) if function is not None else ():
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            found.setdefault(target.id, []).append(node.value)
            self._locals[key] = found
        return self._locals[key]

    def resolve(
        self, module: Module, scope: str, expr: ast.expr, depth: int = 0
    ) -> set[str]:
        if depth > 6:
            return set()
        if isinstance(expr, ast.IfExp):
            return self.resolve(module, scope, expr.body, depth + 1) | self.resolve(
                module, scope, expr.orelse, depth + 1
            )
        if (
            isinstance(expr, ast.Call)
            and pynames.dotted(expr.func).endswith(AS_CUSTOM_OP)
            and expr.args
            and isinstance(expr.args[0], ast.Constant)
            and isinstance(expr.args[0].value, str)
        ):  # the fix's `as_custom_op("<op>", f)`: calls of vllm::<op>
            return {f"torch.ops.vllm.{expr.args[0].value}"}
        if (
            isinstance(expr, ast.Call)
            and pynames.dotted(expr.func) == "getattr"
            and len(expr.args) >= 2
            and isinstance(expr.args[1], ast.Constant)
            and isinstance(expr.args[1].value, str)
        ):
            base = pynames.dotted(expr.args[0])
            if base:
                name = ast.parse(f"{base}.{expr.args[1].value}", mode="eval").body
                return self.resolve(module, scope, name, depth + 1)
            return set()
        dotted = pynames.dotted(expr)
        if not dotted:
            return set()
        head, _, rest = dotted.partition(".")
        owner = scope.rpartition(".")[0]
        if head == "self" and owner in module.classes and rest and "." not in rest:
            found = set()
            for parsed, where, value in self.tree.attr_values(module.name, owner, rest):
                found |= self.resolve(parsed, where, value, depth + 1)
            return found
        local = self.locals_of(module, scope) if scope else {}
        if head in local and head not in module.local_imports(scope):
            found = set()
            for value in local[head]:
                for target in self.resolve(module, scope, value, depth + 1):
                    found.add(f"{target}.{rest}" if rest else target)
            return found
        found = set()
        for qualified in module.qualify_all(dotted, scope):
            found |= self.expand(qualified, depth + 1)
        return found

    def expand(self, qualified: str, depth: int) -> set[str]:
        """A qualified name followed through the tree's re-exports and
        module-level aliases, to where it leaves the tree or is defined."""
        if depth > 6 or qualified.startswith("torch."):
            return {qualified}
        if qualified.split(".")[0] in self.known.packages:
            return {qualified}
        parts = qualified.split(".")
        for i in range(len(parts), 0, -1):
            name = ".".join(parts[:i])
            if name not in self.tree.paths:
                continue
            rest = parts[i:]
            module = self.tree.module(name)
            if not rest or module is None:
                return {qualified}
            head = rest[0]
            if head in module.functions or head in module.classes:
                return {qualified}
            found = set()
            for target in module.alternatives.get(head, ()):
                found |= self.expand(".".join([target, *rest[1:]]), depth + 1)
            for value in module.alias_values.get(head, ()):
                for target in self.resolve(module, "", value, depth + 1):
                    found.add(".".join([target, *rest[1:]]))
            return found or {qualified}
        return {qualified}

    def op_of(self, qualified: str) -> tuple[str, Wrapper | None] | None:
        """("ns::op", the wrapper called, if any) for a resolved name."""
        parts = qualified.split(".")
        if parts[:2] == ["torch", "ops"] and len(parts) in (4, 5):
            if parts[2] in _TORCH_NAMESPACES:
                return None
            op = f"{parts[2]}::{parts[3]}"
            return op, None
        wrapper = self.known.wrappers.get(qualified)
        if wrapper is None and len(parts) == 3:
            # the package's function through its `ops` module
            wrapper = self.known.wrappers.get(f"{parts[0]}.{parts[2]}")
        if wrapper is not None:
            return wrapper.op, wrapper
        return None


# ---------------------------------------------------------------------------
# Registrations and fakes
# ---------------------------------------------------------------------------


def _strings(
    expr: ast.expr | None, module_strings: dict[str, str], scope_strings
) -> str | None:
    """The value of a string expression: a literal, an f-string of names
    bound to literals (f"{NS}::op"), a name bound to one."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name):
        return scope_strings.get(expr.id, module_strings.get(expr.id))
    if isinstance(expr, ast.JoinedStr):
        out = []
        for part in expr.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                value = _strings(part.value, module_strings, scope_strings)
                if value is None:
                    return None
                out.append(value)
        return "".join(out)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left = _strings(expr.left, module_strings, scope_strings)
        right = _strings(expr.right, module_strings, scope_strings)
        return None if left is None or right is None else left + right
    return None


def _string_names(body) -> dict[str, str]:
    found = {}
    for node in body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found[node.targets[0].id] = node.value.value
    return found


def _params(function: ast.AST | None) -> list[str]:
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return []
    a = function.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def returns_of(function: ast.AST) -> list[tuple[str, int]]:
    """What each return of a fake gives: "none", "param:<name>" (an
    argument as it came), "view:<name>" (a view of one: `x.view(...)`,
    `x[i]`, `x.t()`), "fresh" (a tensor it makes: torch.empty*, new_empty,
    *_like, ...), "tuple(<kind>, ...)", "other"."""
    params = set(_params(function))
    # a parameter the function binds again is not the argument any more
    params -= {
        n.id
        for n in ast.walk(function)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    if isinstance(function, ast.Lambda):
        values = [(function.body, function.body.lineno)]
    else:
        values = [
            (n.value, n.lineno)
            for n in statements(function)
            if isinstance(n, ast.Return)
        ]
        if not values:
            values = [(None, function.lineno)]
    return [(_kind(v, params), line) for v, line in values]


_FRESH = re.compile(
    r"(^|\.)(empty\w*|new_\w+|zeros\w*|ones\w*|full\w*|\w+_like|clone|rand\w*)$"
)


# methods whose result shares its tensor's storage (a view), as torch's fake
# tensors give it: a fake that returns one returns an alias of its argument
_VIEWS = frozenset(
    {
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "t",
        "transpose",
        "permute",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "narrow",
        "expand",
        "expand_as",
        "as_strided",
        "detach",
        "select",
        "diagonal",
        "unfold",
        "movedim",
        "swapaxes",
    }
)


def _viewed(value: ast.expr, params: set[str]) -> str | None:
    """The parameter a view expression is of (`x.view(...)`, `x[0]`,
    `x.t()`, chained), else None."""
    while True:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            if value.func.attr not in _VIEWS:
                return None
            value = value.func.value
        elif isinstance(value, ast.Subscript) or (
            isinstance(value, ast.Attribute) and value.attr in ("T", "mT")
        ):
            value = value.value
        else:
            break
    if isinstance(value, ast.Name) and value.id in params:
        return value.id
    return None


def _kind(value: ast.expr | None, params: set[str]) -> str:
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return "none"
    if isinstance(value, ast.Name) and value.id in params:
        return f"param:{value.id}"
    viewed = _viewed(value, params)
    if viewed is not None:
        return f"view:{viewed}"
    if isinstance(value, ast.Tuple):
        kinds = [_kind(e, params) for e in value.elts]
        if all(k == "fresh" for k in kinds):
            return "fresh"
        return "tuple(" + ", ".join(kinds) + ")"
    if isinstance(value, ast.Call) and _FRESH.search(pynames.dotted(value.func)):
        return "fresh"
    return "other"


def registrations(
    tree: SourceTree, paths: list[str]
) -> tuple[list[Registration], list[Fake]]:
    """The ops the modules at `paths` define, and the fakes they register."""
    regs: list[Registration] = []
    fakes: list[Fake] = []
    for path in paths:
        module = tree.module(pynames.module_name(path))
        if module is None:
            continue
        syntax = parse(tree.texts, path, tree.parsed)
        if syntax is None:
            continue
        module_strings = _string_names(syntax.body)
        text = tree.texts[path]
        fakes_here = "register_fake" in text or "impl_abstract" in text
        forwarders = _fake_forwarders(module) if fakes_here else {}
        for node, scope, _ in _calls_in(syntax, top=True):
            last = pynames.dotted(node.func).rsplit(".", 1)[-1]
            if last.endswith("register_custom_op"):
                _registration(module, node, path, scope, regs)
            elif last in ("register_fake", "impl_abstract") or last in forwarders:
                _fake_call(module, node, path, scope, module_strings, forwarders, fakes)
        for function in module.functions.values():
            if function.decorator_list:
                _decorated(module, function, path, module_strings, regs, fakes)
    return regs, fakes


def _fake_forwarders(module: Module) -> dict[str, tuple[int, int]]:
    """Functions of the module that pass two of their parameters on to
    register_fake as (name, fake): name -> (position of the name, of the
    fake) (esimd_fake_ops.py's `_try_register(qualname, fn)`)."""
    found = {}
    for qual, function in module.functions.items():
        params = _params(function)
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Call)
                and pynames.dotted(node.func).endswith(
                    ("register_fake", "impl_abstract")
                )
                and len(node.args) >= 2
                and all(
                    isinstance(a, ast.Name) and a.id in params for a in node.args[:2]
                )
            ):
                found[qual.rsplit(".", 1)[-1]] = (
                    params.index(node.args[0].id),
                    params.index(node.args[1].id),
                )
    return found


def _registration(
    module: Module, node: ast.Call, path: str, scope: str, regs: list
) -> None:
    func = pynames.dotted(node.func)
    if func.endswith("direct_register_custom_op"):
        keywords = {k.arg: k.value for k in node.keywords}
        name = keywords.get("op_name", node.args[0] if node.args else None)
        impl = keywords.get("op_func", node.args[1] if len(node.args) > 1 else None)
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return
        impl_name = _unwrapped(impl)
        mutates, given = _mutates(keywords.get("mutates_args", _positional(node, 2)))
        fake = _unwrapped(keywords.get("fake_impl", _positional(node, 3)))
        function = _function(module, scope, impl_name)
        regs.append(
            Registration(
                f"vllm::{name.value}",
                path,
                node.lineno,
                "direct_register_custom_op",
                function,
                module.name,
                _params(module.functions.get(function)),
                mutates,
                given,
                _function(module, scope, fake) if fake else "",
            )
        )


def _positional(node: ast.Call, i: int):
    return node.args[i] if len(node.args) > i else None


def _unwrapped(expr: ast.expr | None) -> str:
    """The function a registration names: `f`, or `wrap(f)`."""
    while isinstance(expr, ast.Call) and expr.args:
        expr = expr.args[0]
    return pynames.dotted(expr) if expr is not None else ""


def _function(module: Module, scope: str, name: str) -> str:
    """The qualname of a function named in `scope` (a nested one first)."""
    for candidate in (f"{scope}.{name}" if scope else "", name):
        if candidate and candidate in module.functions:
            return candidate
    return name


def _mutates(expr: ast.expr | None) -> tuple[list[str] | None, bool]:
    if expr is None:
        return [], False
    if isinstance(expr, ast.List | ast.Tuple | ast.Set):
        values = [e.value for e in expr.elts if isinstance(e, ast.Constant)]
        return [v for v in values if isinstance(v, str)], True
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return ([] if expr.value == "unknown" else [expr.value]), True
    return None, True


def _fake_call(module, node, path, scope, module_strings, forwarders, fakes) -> None:
    func = pynames.dotted(node.func)
    last = func.rsplit(".", 1)[-1]
    if last in ("register_fake", "impl_abstract") and len(node.args) >= 2:
        name_at, fake_at = 0, 1
    elif last in forwarders:
        name_at, fake_at = forwarders[last]
        if len(node.args) <= max(name_at, fake_at):
            return
    else:
        return
    scope_strings = {}
    if scope in module.functions:
        scope_strings = _string_names(module.functions[scope].body)
    op = _strings(node.args[name_at], module_strings, scope_strings)
    if not op or "::" not in op:
        return
    fake = node.args[fake_at]
    if isinstance(fake, ast.Name):
        # a function of the module, or one defined in the registering
        # function (esimd_fake_ops.py's `def _qkv_split_norm_rope` inside
        # register_esimd_fakes)
        nested = module.nested_function(scope, fake.id) if scope else None
        named = nested or _function(module, scope, fake.id)
        fake = module.function_node(named) or fake
    if isinstance(fake, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
        fakes.append(
            Fake(op.split("(")[0], path, node.lineno, _params(fake), returns_of(fake))
        )


def _decorated(module, node, path, module_strings, regs, fakes) -> None:
    for decorator in node.decorator_list:
        if not isinstance(decorator, ast.Call) or not decorator.args:
            continue
        func = pynames.dotted(decorator.func)
        name = _strings(decorator.args[0], module_strings, {})
        if not name:
            # the overlay's @_fake_of(TABLE, "ns::op(...) -> ...")
            if len(decorator.args) > 1 and "fake" in func:
                name = _strings(decorator.args[1], module_strings, {})
            if not name:
                continue
        if "::" not in name:
            continue
        op = name.split("(")[0]
        if func.endswith("custom_op"):
            keywords = {k.arg: k.value for k in decorator.keywords}
            mutates, given = _mutates(keywords.get("mutates_args"))
            regs.append(
                Registration(
                    op,
                    path,
                    node.lineno,
                    "torch.library.custom_op",
                    node.name,
                    module.name,
                    _params(node),
                    mutates,
                    given,
                )
            )
        elif "fake" in func or func.endswith("impl_abstract"):
            fakes.append(Fake(op, path, node.lineno, _params(node), returns_of(node)))


# ---------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------


def candidates(tree: SourceTree, known: Known) -> list[str]:
    """The paths whose text may call an op the search knows (a necessary
    condition): those naming `torch.ops.<ns>.` of a known namespace (vLLM's
    own: with one of the ops looked for), or a package; then those naming a
    module among them that re-exports at module level a package's name or
    an op (`f = _esimd.f`, `from pkg import f`, `op = torch.ops.ns.op`)."""
    texts = tree.texts
    by_namespace: dict[str, set[str]] = {}
    for op in known.schemas:
        ns, name = op.split("::")
        by_namespace.setdefault(ns, set()).add(name)
    first = []
    for path, text in texts.items():
        if any(p in text for p in known.packages) or any(
            f"ops.{ns}." in text
            and (ns != "vllm" or any(f"ops.vllm.{n}" in text for n in names))
            for ns, names in by_namespace.items()
        ):
            first.append(path)
    reaching = (*known.packages, *(f"torch.ops.{ns}" for ns in by_namespace))
    exporters = set()
    for path in first:
        module = tree.module(pynames.module_name(path))
        if module is None:
            continue
        bound = list(module.imports.values())
        for values in module.alias_values.values():
            for value in values:
                dotted = pynames.dotted(value.args[0] if _is_getattr(value) else value)
                bound += module.qualify_all(dotted) if dotted else []
        if any(b.startswith(reaching) for b in bound):
            exporters.add(module.name.rsplit(".", 1)[-1])
    chosen = set(first)
    more = [
        p
        for p, t in texts.items()
        if p not in chosen
        and any(n in t and re.search(rf"\b{re.escape(n)}\b", t) for n in exporters)
    ]
    return first + more


def _is_getattr(value: ast.expr) -> bool:
    return (
        isinstance(value, ast.Call)
        and pynames.dotted(value.func) == "getattr"
        and bool(value.args)
    )


def calls(
    tree: SourceTree,
    paths: list[str],
    known: Known,
    only: set[tuple[str, str]] | None = None,
) -> list[Call]:
    """Every call of a known op (or of a name that reaches one) in the
    modules at `paths` (`only`: in these (module, qualname) functions)."""
    resolver = Resolver(tree, known)
    interesting = known.names()
    namespaces = {op.split("::")[0] for op in known.schemas}
    spelled = tuple(f"ops.{ns}." for ns in namespaces)
    found: list[Call] = []
    for path in paths:
        text = tree.texts[path]
        if not any(w in text for w in spelled) and not any(
            n in text for n in interesting
        ):
            continue
        module = tree.module(pynames.module_name(path))
        if module is None:
            continue
        syntax = tree.parsed.get(path) if tree.parsed is not None else None
        if syntax is None:
            continue
        attr_words = None
        for node, qual, function in _calls_in(syntax):
            if not qual or (only is not None and (module.name, qual) not in only):
                continue
            dotted = pynames.dotted(node.func)
            last = dotted.rsplit(".", 1)[-1]
            head = dotted.split(".")[0]
            if last not in interesting and not any(w in dotted for w in spelled):
                if head == "self" and dotted.count(".") == 1:
                    if attr_words is None:
                        attr_words = _attr_words(module, interesting)
                    if last not in attr_words:
                        continue
                elif not dotted or head not in resolver.locals_of(module, qual):
                    continue
            # one call of each op the callee may be (`f = a if c else b`)
            ops_here: set[str] = set()
            for target in sorted(resolver.resolve(module, qual, node.func)):
                got = resolver.op_of(target)
                if got is None:
                    continue
                op, wrapper = got
                if op not in known.schemas and op.split("::")[0] not in namespaces:
                    continue
                if op in ops_here:
                    continue
                ops_here.add(op)
                call = _call(
                    op, wrapper, node, function, path, module, qual, dotted, known
                )
                call.target = target
                found.append(call)
    return found


def _calls_in(syntax: ast.Module, top: bool = False):
    """(call, the qualname of the function it is in, that function's node)
    of each call in a function (a function nested in another one is named
    by both); `top`: those at module or class level too ("", None)."""
    todo = [(syntax, "", None)]
    while todo:
        node, qual, function = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = child if not isinstance(child, ast.ClassDef) else None
                todo.append(
                    (child, f"{qual}.{child.name}" if qual else child.name, inner)
                )
                continue
            if isinstance(child, ast.Call) and (top or function is not None):
                yield child, qual, function
            todo.append((child, qual, function))


def _attr_words(module: Module, interesting: set[str]) -> set[str]:
    """The attributes a class of the module sets to a value naming one of
    the interesting names (`self._op = esimd_gemv`)."""
    found = set()
    for key, values in module.attrs.items():
        for value, _ in values:
            for node in ast.walk(value):
                word = (
                    node.attr
                    if isinstance(node, ast.Attribute)
                    else getattr(node, "id", "")
                )
                if word in interesting:
                    found.add(key.rsplit(".", 1)[-1])
    return found


def _call(op, wrapper, node, function, path, module, qual, dotted, known) -> Call:
    schema = known.schemas.get(op)
    names = schema.names() if schema else []
    given: dict[str, ast.expr] = {}
    if wrapper is not None:
        passed = dict(zip(wrapper.params, node.args, strict=False))
        passed.update({k.arg: k.value for k in node.keywords if k.arg})
        for i, arg in enumerate(wrapper.args):
            key, _, value = arg.partition("=") if "=" in arg else ("", "", arg)
            target = key or (names[i] if i < len(names) else f"_{i}")
            if value in passed:
                given[target] = passed[value]
    else:
        for i, arg in enumerate(node.args):
            if isinstance(arg, ast.Starred):
                break
            given[names[i] if i < len(names) else f"_{i}"] = arg
        for keyword in node.keywords:
            if keyword.arg:
                given[keyword.arg] = keyword.value
    call = Call(
        op,
        path,
        node.lineno,
        module.name,
        qual,
        dotted or ast.unparse(node.func),
        {k: ast.unparse(v) for k, v in given.items()},
        _result_used(function, node),
    )
    end = getattr(node, "end_lineno", node.lineno)
    for param, expr in given.items():
        text = pynames.dotted(expr)
        if text:
            line = _read_after(function, text, end)
            if line:
                call.read_after[param] = line
    return call


def _result_used(function: ast.AST, call: ast.Call) -> bool:
    """Whether the call's result is used: not a statement of its own, not
    bound to a name nothing reads."""
    for node in ast.walk(function):
        if isinstance(node, ast.Expr) and node.value is call:
            return False
        if isinstance(node, ast.Assign) and node.value is call:
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if names and len(names) == len(node.targets):
                return any(
                    n != "_" and _read_after(function, n, call.lineno) for n in names
                )
    return True


def _loads(function: ast.AST) -> list[tuple[str, int]]:
    """(dotted, line) of every name and attribute chain a function reads
    (kept on the function's node: the search asks it once per argument)."""
    found = getattr(function, "_xpufakes_loads", None)
    if found is None:
        found = [
            (pynames.dotted(n), n.lineno)
            for n in ast.walk(function)
            if isinstance(n, ast.Name | ast.Attribute) and isinstance(n.ctx, ast.Load)
        ]
        function._xpufakes_loads = found
    return found


def _read_after(function: ast.AST, dotted: str, line: int) -> int:
    """The first line after `line` where the function reads the name (or
    attribute chain) `dotted`; 0 if none. A loop around the call counts
    its own lines too (the next iteration reads them)."""
    loops = getattr(function, "_xpufakes_loops", None)
    if loops is None:
        loops = [n for n in ast.walk(function) if isinstance(n, ast.For | ast.While)]
        function._xpufakes_loops = loops
    loops = [n for n in loops if n.lineno <= line <= n.end_lineno]
    best = 0
    for name, at in _loads(function):
        if name != dotted:
            continue
        after = at > line or any(loop.lineno <= at < line for loop in loops)
        if after and (not best or at < best):
            best = at
    return best
