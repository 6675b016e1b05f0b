"""The Python of a vLLM tree, parsed module by module when first needed:
what a dotted name is (a module, a class, a function; through imports,
re-exports and module-level aliases, in every branch that binds it), the
class hierarchy across modules, and what a class stores on `self` and what
a factory function makes. Source text only, no import (reach.py's search
runs on it)."""

import ast
import bisect
import re
from collections import deque
from dataclasses import dataclass

from xpufakes.trees import names


@dataclass(frozen=True)
class Func:
    module: str
    qualname: str

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def owner(self) -> str | None:
        """The qualname of the class it is a method of."""
        head, _, _ = self.qualname.rpartition(".")
        return head or None


# Nodes below which there is no other node that the search looks for (a
# call, an assignment, an attribute, a statement): not descended into.
LEAVES = (
    ast.Name,
    ast.Constant,
    ast.expr_context,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
    ast.alias,
)
# The fields that hold statements (in a function, a class, a compound
# statement, an except clause, a match case).
_BLOCKS = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


def walk(node: ast.AST):
    """ast.walk's nodes in ast.walk's order, but the leaves (LEAVES) and
    what is below them: a search walks hundreds of functions."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        yield node
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                todo.extend(
                    v
                    for v in value
                    if isinstance(v, ast.AST) and not isinstance(v, LEAVES)
                )
            elif isinstance(value, ast.AST) and not isinstance(value, LEAVES):
                todo.append(value)


def statements(node: ast.AST):
    """The node and the statements below it (except clauses and match cases
    too), in ast.walk's order: what ast.walk yields, without the expressions
    (no statement is below an expression)."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        yield node
        for name in node._fields:
            if name in _BLOCKS:
                value = getattr(node, name, None)
                if isinstance(value, list):
                    todo.extend(value)


def own_statements(function: ast.AST):
    """The statements of a function's body, in its compound statements too,
    and the functions and classes defined there, not what is inside those."""
    todo = deque(function.body)
    while todo:
        node = todo.popleft()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in node._fields:
            if name in _BLOCKS:
                value = getattr(node, name, None)
                if isinstance(value, list):
                    todo.extend(value)


def nested_calls(function: ast.AST, qual: str) -> dict[int, str]:
    """id(call) -> the qualname of the function defined inside `function`
    (at any depth) that holds the call, for the calls in such functions
    ("C.__init__.route"): a call there runs when that function is called,
    not when `function` runs."""
    found: dict[int, str] = {}
    todo = [
        (node, f"{qual}.{node.name}")
        for node in own_statements(function)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    while todo:
        node, name = todo.pop()
        for inner in walk(node):
            if isinstance(inner, ast.Call):
                found[id(inner)] = name  # the innermost's, set last below
        todo.extend(
            (child, f"{name}.{child.name}")
            for child in own_statements(node)
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        )
    return found


def parse(texts: dict[str, str], path: str, parsed: dict | None = None):
    """The syntax tree of texts[path] (None: it does not parse), from
    `parsed` (path -> tree) when an earlier parse put it there: the scan and
    the search parse each file once between them. Nothing changes a tree."""
    if parsed is not None and path in parsed:
        return parsed[path]
    try:
        tree = ast.parse(texts[path])
    except SyntaxError:
        tree = None
    if parsed is not None:
        parsed[path] = tree
    return tree


def local_imports(
    module: str, function: ast.AST, is_package: bool = False
) -> dict[str, str]:
    """Imports inside a function's body (or of one import statement)."""
    found: dict[str, str] = {}
    for node in statements(function):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.update(names.bindings(node, module, is_package))
    return found


class Module:
    """One module of the tree, parsed: its imports, functions, classes, and
    what its classes store on `self`."""

    def __init__(
        self,
        name: str,
        path: str,
        tree: ast.Module,
        text_has_registration: bool,
        text: str | None = None,
    ):
        self.name, self.path = name, path
        # the lines that hold the word `import` (None: not known, any may):
        # a function without one imports nothing, and is not walked for it
        self._import_lines = None if text is None else _lines_with(text, "import")
        self.is_package = path.endswith("__init__.py")
        self.imports: dict[str, str] = {}
        self.alternatives: dict[str, list[str]] = {}  # every branch's import
        for node in tree.body:
            self._import(node, self.imports)
        self.alias_values: dict[str, list[ast.expr]] = {}
        self.functions: dict[str, ast.AST] = {}  # qualname -> def
        self.classes: dict[str, ast.ClassDef] = {}
        self.bases: dict[str, list[str]] = {}  # class -> base expressions
        self.custom_op_name: dict[str, str] = {}  # class -> CustomOp name
        self._attrs: dict[str, list[tuple[ast.expr, str]]] | None = None
        self.aliases: dict[str, ast.expr] = {}  # module-level name = expr
        self.opaque: set[str] = set()  # functions registered as vLLM op impls
        self.scopes: dict[str, dict[str, str]] = {}  # qualname -> imports
        self._methods: list[tuple[ast.AST, str, str]] = []  # (def, class, qual)
        self._aliases(tree.body)
        self._walk(tree.body, [])
        for node in walk(tree) if text_has_registration else ():
            if isinstance(node, ast.Call):
                func = names.dotted(node.func)
                if func.endswith("register_custom_op"):
                    for kw in node.keywords:
                        if kw.arg == "op_func" and isinstance(kw.value, ast.Name):
                            self.opaque.add(kw.value.id)
                    if len(node.args) >= 2 and isinstance(node.args[1], ast.Name):
                        self.opaque.add(node.args[1].id)

    def _aliases(self, body: list) -> None:
        """Module-level `name = <expr>`, also inside module-level if / try."""
        for node in body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.aliases.setdefault(target.id, node.value)
                    self.alias_values.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.If):
                self._aliases(node.body)
                self._aliases(node.orelse)
            elif isinstance(node, ast.Try):
                self._aliases(node.body)
                for handler in node.handlers:
                    self._aliases(handler.body)
                self._aliases(node.orelse)

    def _import(self, node: ast.AST, into: dict[str, str]) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found = local_imports(self.name, node, self.is_package)
            for name, target in found.items():
                into.setdefault(name, target)
                self.alternatives.setdefault(name, [])
                if target not in self.alternatives[name]:
                    self.alternatives[name].append(target)
        elif isinstance(node, ast.If | ast.Try):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt | ast.excepthandler):
                    for inner in getattr(child, "body", [child]):
                        self._import(inner, into)
                    for inner in getattr(child, "orelse", []):
                        self._import(inner, into)

    def _walk(self, body: list, stack: list[str]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                qual = ".".join([*stack, node.name])
                self.classes[qual] = node
                self.bases[qual] = [names.dotted(b) for b in node.bases]
                for decorator in node.decorator_list:
                    if (
                        isinstance(decorator, ast.Call)
                        and names.dotted(decorator.func).endswith(".register")
                        and decorator.args
                        and isinstance(decorator.args[0], ast.Constant)
                        and isinstance(decorator.args[0].value, str)
                    ):
                        self.custom_op_name[qual] = decorator.args[0].value
                self._walk(node.body, [*stack, node.name])
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                qual = ".".join([*stack, node.name])
                self.functions[qual] = node
                decorators = [
                    names.dotted(d.func if isinstance(d, ast.Call) else d)
                    for d in node.decorator_list
                ]
                if any("custom_op" in d for d in decorators):
                    self.opaque.add(node.name)
                if stack and ".".join(stack) in self.classes:
                    self._methods.append((node, ".".join(stack), qual))
            elif isinstance(node, ast.If | ast.Try):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        self._walk([child], stack)
                    elif isinstance(child, ast.excepthandler):
                        self._walk(child.body, stack)

    @property
    def attrs(self) -> dict[str, list[tuple[ast.expr, str]]]:
        """ "Class.attr" -> (value, method) of each `self.attr = value`."""
        if self._attrs is None:
            self._attrs = {}
            for function, owner, qual in self._methods:
                self._self_attrs(function, owner, qual)
        return self._attrs

    def _self_attrs(self, function: ast.AST, owner: str, qual: str) -> None:
        for node in statements(function):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                for element in elements:
                    if (
                        isinstance(element, ast.Attribute)
                        and isinstance(element.value, ast.Name)
                        and element.value.id == "self"
                    ):
                        key = f"{owner}.{element.attr}"
                        self._attrs.setdefault(key, []).append((node.value, qual))

    def qualify_all(self, dotted: str, scope: str = "") -> list[str]:
        """A dotted expression qualified through each binding of its head:
        the function's own import, else every module-level one (or a name
        of this module)."""
        head = dotted.partition(".")[0]
        local = self.local_imports(scope) if scope else {}
        if head in local:
            targets = [local[head]]
        elif head in self.alternatives:
            targets = self.alternatives[head]
        elif head in self.functions or head in self.classes or head in self.aliases:
            targets = [f"{self.name}.{head}"]
        else:
            return []
        return [names.qualify(dotted, {head: target}) for target in targets]

    def local_imports(self, qualname: str) -> dict[str, str]:
        """The imports inside a function (and the functions it is in)."""
        key = f"local:{qualname}"
        if key not in self.scopes:
            scope: dict[str, str] = {}
            parts = qualname.split(".")
            for i in range(1, len(parts) + 1):
                function = self.functions.get(".".join(parts[:i]))
                if function is not None:
                    scope.update(self._function_imports(function))
            self.scopes[key] = scope
        return self.scopes[key]

    def _function_imports(self, function: ast.AST) -> dict[str, str]:
        """local_imports of a function, not walked if none of its lines
        holds the word `import` (every import statement does)."""
        lines = self._import_lines
        if lines is not None:
            first = bisect.bisect_left(lines, function.lineno)
            if first == len(lines) or lines[first] > function.end_lineno:
                return {}
        return local_imports(self.name, function, self.is_package)

    def function_node(self, qualname: str) -> ast.AST | None:
        """The def of a function, one defined inside another too
        ("C.__init__.route")."""
        if qualname in self.functions:
            return self.functions[qualname]
        head, _, name = qualname.rpartition(".")
        outer = self.function_node(head) if head else None
        if outer is None:
            return None
        return next(
            (
                node
                for node in own_statements(outer)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == name
            ),
            None,
        )

    def nested_function(self, scope: str, name: str) -> str | None:
        """The qualname of a function `name` defined in the body of function
        `scope` (not in a function inside it), or None."""
        qualname = f"{scope}.{name}"
        if scope not in self.functions or qualname in self.functions:
            return None
        return qualname if self.function_node(qualname) is not None else None

    def imports_in(self, qualname: str) -> dict[str, str]:
        """The imports a function sees: its own over the module's."""
        if qualname not in self.scopes:
            scope = dict(self.imports)
            parts = qualname.split(".")
            for i in range(1, len(parts) + 1):
                function = self.functions.get(".".join(parts[:i]))
                if function is not None:
                    scope.update(self._function_imports(function))
            self.scopes[qualname] = scope
        return self.scopes[qualname]


class SourceTree:
    """The tree's modules, parsed when first needed."""

    def __init__(self, texts: dict[str, str], parsed: dict | None = None):
        self.texts = texts
        self.parsed = parsed  # shared with the scan (parse)
        self.paths = {}
        for path in texts:
            self.paths.setdefault(names.module_name(path), path)
        self._parsed: dict[str, Module | None] = {}
        self._mro: dict = {}
        self._instances: dict = {}
        self._made: dict = {}

    def module(self, name: str) -> Module | None:
        if name not in self._parsed:
            path = self.paths.get(name)
            parsed = None
            if path is not None:
                tree = parse(self.texts, path, self.parsed)
                if tree is not None:
                    text = self.texts[path]
                    registers = "register_custom_op" in text
                    parsed = Module(name, path, tree, registers, text)
            self._parsed[name] = parsed
        return self._parsed[name]

    # -- names -> definitions ------------------------------------------------

    def lookup(self, dotted: str):
        """What a fully qualified name is: ("module", name), ("class", module,
        qualname), ("function", module, qualname), or None (the first, where a
        module binds a name in several branches)."""
        return next(self._lookups(dotted, 0), None)

    def lookup_all(self, dotted: str) -> list:
        """Everything a fully qualified name may be (every branch's)."""
        return list(dict.fromkeys(self._lookups(dotted, 0)))

    def _lookups(self, dotted: str, depth: int):
        if depth > 4 or not dotted:
            return
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            name = ".".join(parts[:i])
            if name not in self.paths:
                continue
            rest = parts[i:]
            if not rest:
                yield ("module", name)
            else:
                yield from self._members(name, rest, depth)
            return

    def _members(self, module_name: str, rest: list[str], depth: int):
        module = self.module(module_name)
        if module is None:
            return
        head = rest[0]
        if head in module.classes:
            found = self._in_class(module, head, rest[1:])
            if found:
                yield found
        if head in module.functions and len(rest) == 1:
            yield ("function", module.name, head)
        for target in module.alternatives.get(head, ()):
            yield from self._lookups(".".join([target, *rest[1:]]), depth + 1)
        if len(rest) == 1:
            for value in module.alias_values.get(head, ()):
                name = names.dotted(value)
                if name:
                    for qualified in module.qualify_all(name):
                        yield from self._lookups(qualified, depth + 1)

    def _in_class(self, module: Module, cls: str, rest: list[str]):
        if not rest:
            return ("class", module.name, cls)
        if len(rest) == 1:
            found = self.method(module.name, cls, rest[0])
            if found is not None:
                return ("function", found.module, found.qualname)
        return None

    def base_classes(self, module: str, cls: str) -> list[tuple[str, str]]:
        """(module, class) of each base of a class that the tree defines."""
        parsed = self.module(module)
        if parsed is None:
            return []
        found = []
        for base in parsed.bases.get(cls, []):
            if not base:
                continue
            target = self.resolve_name(parsed, cls, base)
            if target and target[0] == "class":
                found.append((target[1], target[2]))
        return found

    def mro(self, module: str, cls: str) -> list[tuple[str, str]]:
        """The class and its bases the tree defines, in Python's method
        resolution order (C3 linearization, as `type.mro()`)."""
        return self._linearize((module, cls), ())

    def _linearize(self, key: tuple[str, str], within: tuple) -> list:
        if key in self._mro:
            return self._mro[key]
        # A base that names a class being linearized is a cycle Python
        # cannot build (the source read names the wrong binding): drop it.
        within = (*within, key)
        bases = [b for b in self.base_classes(*key) if b not in within]
        order = [key, *c3_merge([*(self._linearize(b, within) for b in bases), bases])]
        self._mro[key] = order
        return order

    def method(self, module: str, cls: str, name: str) -> Func | None:
        """The method `name` that instances of the class call (MRO)."""
        for owner_module, owner in self.mro(module, cls):
            parsed = self.module(owner_module)
            if parsed and f"{owner}.{name}" in parsed.functions:
                return Func(owner_module, f"{owner}.{name}")
        return None

    def custom_op_name(self, module: str, cls: str) -> str | None:
        """The CustomOp name a class is registered under (or inherits)."""
        for owner_module, owner in self.mro(module, cls):
            parsed = self.module(owner_module)
            if parsed and owner in parsed.custom_op_name:
                return parsed.custom_op_name[owner]
        return None

    def is_custom_op(self, module: str, cls: str) -> bool:
        return any(owner == "CustomOp" for _, owner in self.mro(module, cls)[1:])

    def resolve_name(self, module: Module, scope: str, dotted: str):
        """What a dotted expression names in a function (or class) of a
        module, without `self` (the first of its bindings)."""
        return next(iter(self.resolve_all(module, scope, dotted)), None)

    def resolve_all(self, module: Module, scope: str, dotted: str) -> list:
        """Everything a dotted expression may name in a function of a module
        (a name bound in several branches: each)."""
        head = dotted.split(".")[0]
        local = module.local_imports(scope)
        if head in local:
            return self.lookup_all(names.qualify(dotted, local))
        return self.lookup_all(f"{module.name}.{dotted}")

    # -- instances -------------------------------------------------------------

    def made_by(self, module: str, function: str) -> frozenset:
        """The classes a factory function constructs (what it may return)."""
        key = (module, function)
        if key not in self._made:
            self._made[key] = frozenset()  # while it is computed: recursion
            parsed = self.module(module)
            if parsed is not None and function in parsed.functions:
                self._made[key] = frozenset(
                    self._constructed(parsed, function, parsed.functions[function])
                )
        return self._made[key]

    def _constructed(self, module: Module, scope: str, expr: ast.AST, depth=0):
        found = set()
        for node in walk(expr):
            if not isinstance(node, ast.Call):
                continue
            name = names.dotted(node.func)
            if not name or name.split(".")[0] == "self":
                continue
            name = default_of(module.functions.get(scope), name) or name
            target = self.resolve_name(module, scope, name)
            if target and target[0] == "class":
                found.add((target[1], target[2]))
            elif target and target[0] == "function" and depth < 2:
                found |= set(self.made_by(target[1], target[2]))
        return found

    def attr_values(self, module: str, cls: str, attr: str):
        """(module, scope, expression) of each value the class (or a base)
        stores as self.<attr>."""
        found = []
        for owner_module, owner in self.mro(module, cls):
            parsed = self.module(owner_module)
            if parsed:
                for value, scope in parsed.attrs.get(f"{owner}.{attr}", []):
                    found.append((parsed, scope, value))
        return found

    def instances(self, module: str, cls: str, attr: str) -> set[tuple[str, str]]:
        """The classes self.<attr> may be an instance of (or hold instances
        of: a ModuleList, make_layers' layers)."""
        key = (module, cls, attr)
        if key not in self._instances:
            found = set()
            for parsed, scope, value in self.attr_values(module, cls, attr):
                found |= self._constructed(parsed, scope, value)
            self._instances[key] = found
        return self._instances[key]

    def function_refs(self, module: str, cls: str, attr: str) -> set:
        """The functions self.<attr> may hold (`self.op = ipex_ops.silu_and_mul`;
        a function defined in the method that stores it, `def route(...)`
        then `self._route = route`: "Class.__init__.route", as the call
        sites in it are named)."""
        found = set()
        for parsed, scope, value in self.attr_values(module, cls, attr):
            name = names.dotted(value)
            nested = parsed.nested_function(scope, name) if name else None
            if nested is not None:
                found.add(Func(parsed.name, nested))
            elif name and name.split(".")[0] != "self":
                target = self.resolve_name(parsed, scope, name)
                if target and target[0] == "function":
                    found.add(Func(target[1], target[2]))
        return found


def default_of(function: ast.AST | None, name: str) -> str:
    """The dotted default of a parameter of that name (`layer_type:
    type[nn.Module] = LlamaDecoderLayer`), else ''."""
    if function is None or "." in name:
        return ""
    args = function.args
    positional = args.posonlyargs + args.args
    defaulted = positional[len(positional) - len(args.defaults) :]
    pairs = list(zip(defaulted, args.defaults, strict=True))
    pairs += [
        (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d
    ]
    for arg, default in pairs:
        if arg.arg == name:
            return names.dotted(default)
    return ""


def _lines_with(text: str, word: str) -> list[int]:
    """The numbers (from 1) of the lines that hold `word`, in order."""
    found = []
    line, last = 1, 0
    for match in re.finditer(re.escape(word), text):
        line += text.count("\n", last, match.start())
        last = match.start()
        if not found or found[-1] != line:
            found.append(line)
    return found


def c3_merge(sequences: list[list]) -> list:
    """C3's merge: repeatedly take the first head that is in no sequence's
    tail. Where no head qualifies, Python refuses the class ("Cannot create
    a consistent method resolution order"); the source read may have named
    the wrong binding of a base, so the first head is taken (as the
    depth-first order would) rather than stopping the search."""
    pending = [list(seq) for seq in sequences if seq]
    order: list = []
    while pending:
        tails = [item for seq in pending for item in seq[1:]]
        head = next((seq[0] for seq in pending if seq[0] not in tails), pending[0][0])
        order.append(head)
        pending = [[item for item in seq if item != head] for seq in pending]
        pending = [seq for seq in pending if seq]
    return order
