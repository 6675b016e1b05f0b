"""A kernel package's sources read as text (no compiler, no torch): the op
schemas its C++ registers (`m.def("...")` inside `TORCH_LIBRARY` /
`TORCH_LIBRARY_FRAGMENT`), the function each op runs (`m.impl`), and what
that function's own code says it writes or returns, each with file:line;
and the package's Python wrappers (`def f(...): return _ops.op(...)`).

What counts as evidence that an op writes a parameter, in the function
that implements it (or a function of the package it passes the parameter
on to, or the function a lambda of `m.impl` calls):

* it returns the parameter (`return output;`): the result is that tensor;
* it hands a kernel a writable pointer to the parameter's data
  (`reinterpret_cast<fp16*>(output.data_ptr())`, or of a pointer taken
  from it by `EXTRACT_PTR(p, output)`), in a function that casts what it
  only reads to a `const` pointer (one that casts every pointer writable
  says nothing by it);
* it calls an in-place method on it (`output.copy_(...)`) or an `_out` op.

A writable pointer says the kernel may write; only the kernel's code says
that it does. Declaring a write the kernel does not do costs a copy under
torch.compile; not declaring one it does loses it."""

import ast
import re
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------
# C++ text
# ---------------------------------------------------------------------------


def strip_comments(text: str) -> str:
    """The text with its comments blanked (same length, same lines);
    string and character literals kept."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


def _close(text: str, start: int, pair: str = "()") -> int:
    """The index of the bracket closing the one at `start` (strings skipped);
    len(text) if none."""
    opening, closing = pair
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return n


def _split_top(text: str) -> list[str]:
    """Top-level comma-separated parts of an argument list."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def _literal(text: str) -> str | None:
    """The value of adjacent string literals ("a " "b"), or None if the
    text is not only those (maybe inside one macro call)."""
    inner = text.strip()
    macro = re.fullmatch(r"\w+\s*\((.*)\)", inner, re.S)
    if macro:
        inner = macro.group(1).strip()
    found = _STRING.findall(inner)
    if not found or _STRING.sub("", inner).strip():
        return None
    return "".join(bytes(s, "utf-8").decode("unicode_escape") for s in found)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


@dataclass
class Definition:
    """An op a library block defines."""

    namespace: str
    name: str
    schema: str  # whitespace normalised
    file: str
    line: int


@dataclass
class Impl:
    """What an op runs: a function by name, or a lambda (its text)."""

    op: str  # "ns::name"
    function: str = ""
    lambda_params: list[tuple[str, str]] = field(default_factory=list)
    lambda_body: str = ""
    lambda_returns: str = ""
    file: str = ""
    line: int = 0
    body_offset: int = 0  # of the lambda's body in its file's text


_LIBRARY = re.compile(r"\bTORCH_LIBRARY(_FRAGMENT|_IMPL)?(?:_EXPAND)?\s*\(")


def library_blocks(text: str):
    """(kind, namespace, variable, body start, body end) of each
    TORCH_LIBRARY / _FRAGMENT / _IMPL block; kind "def" or "impl"."""
    for found in _LIBRARY.finditer(text):
        kind = "impl" if found.group(1) == "_IMPL" else "def"
        close = _close(text, found.end() - 1)
        rest = text[close + 1 :]
        if not rest.lstrip().startswith("{"):
            continue
        start = close + 1 + rest.index("{")
        end = _close(text, start, "{}")
        parts = _split_top(text[found.end() : close])
        ns, variable = parts[0], parts[-1]
        yield kind, ns, variable, start, end


def _calls(code: str, method: str, namespace: str = ""):
    """(namespace, where its "(" is, its arguments) of each
    `<variable>.<method>(...)` call ("def" or "impl") in the library blocks
    of a C++ file's code (an _IMPL block's impl calls only: it defines
    nothing). `namespace`: as definitions() takes it."""
    for kind, ns, var, start, end in library_blocks(code):
        if namespace and ns != "TORCH_EXTENSION_NAME":
            continue
        if method == "def" and kind != "def":
            continue
        pattern = rf"\b{re.escape(var)}\s*\.\s*{method}\s*\("
        for call in re.finditer(pattern, code[start:end]):
            open_at = start + call.end() - 1
            close = _close(code, open_at)
            yield namespace or ns, open_at, _split_top(code[open_at + 1 : close])


def definitions(path: str, text: str, namespace: str = "") -> list[Definition]:
    """The schemas a C++ file's library blocks define (pybind11's m.def of a
    function, without a schema, is not one). `namespace`: the library's
    name where the file names it by the build's macro
    (`TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops)`)."""
    code = strip_comments(text)
    found = []
    for ns, open_at, args in _calls(code, "def", namespace):
        schema = _literal(args[0]) if args else None
        if not schema or "->" not in schema or "(" not in schema:
            continue
        schema = " ".join(schema.split())
        name = schema.split("(", 1)[0].strip()
        found.append(Definition(ns, name, schema, path, _line(code, open_at)))
    return found


def impls(path: str, text: str, namespace: str = "") -> dict[str, Impl]:
    """ "ns::name" -> what `m.impl` binds to the op, in a C++ file
    (`namespace`: as definitions() takes it)."""
    code = strip_comments(text)
    found: dict[str, Impl] = {}
    for ns, open_at, args in _calls(code, "impl", namespace):
        name = _literal(args[0]) if args else None
        if not name or len(args) < 2:
            continue
        target = args[-1]
        impl = Impl(f"{ns}::{name.split('.')[0]}", file=path)
        impl.line = _line(code, open_at)
        if target.startswith("["):
            lam = code.index(target, open_at)
            params_at = code.index("(", lam)
            params_end = _close(code, params_at)
            impl.lambda_params = params(code[params_at + 1 : params_end])
            body_at = code.index("{", params_end)
            head = code[params_end + 1 : body_at]
            impl.lambda_returns = head.split("->", 1)[1].strip() if "->" in head else ""
            impl.lambda_body = code[body_at : _close(code, body_at, "{}") + 1]
            impl.body_offset = body_at
        else:
            word = re.search(r"(\w+)\s*\)?\s*$", target.replace("&", ""))
            impl.function = word.group(1) if word else ""
        found[impl.op] = impl
    return found


def params(text: str) -> list[tuple[str, str]]:
    """(type, name) of each parameter of a C++ parameter list."""
    found = []
    for part in _split_top(text):
        part = part.split("=", 1)[0].strip()
        name = re.search(r"(\w+)\s*$", part)
        if name:
            found.append((part[: name.start()].strip(), name.group(1)))
    return found


@dataclass
class Function:
    name: str
    file: str
    line: int
    returns: str  # the C++ return type
    params: list[tuple[str, str]]
    body: str  # from its `{` to its `}`, comments blanked
    body_offset: int
    text: str  # the whole file's text, comments blanked (for line numbers)


_FUNCTION = re.compile(
    r"(?:^|[\s;}])(?:static\s+|inline\s+)*"
    r"((?:at|torch)::Tensor|void|std::tuple\s*<[^;{}()]*>|std::vector\s*<[^;{}()]*>)"
    r"\s+(\w+)\s*\("
)


def functions(path: str, text: str) -> dict[str, Function]:
    """The functions a C++ file defines (not declares) that return a
    tensor, a tuple or vector, or nothing: name -> Function (the first)."""
    code = strip_comments(text)
    found: dict[str, Function] = {}
    for match in _FUNCTION.finditer(code):
        open_at = match.end() - 1
        close = _close(code, open_at)
        after = code[close + 1 : close + 200].lstrip()
        after = re.sub(r"^(const|noexcept|override)\s*", "", after)
        if not after.startswith("{"):
            continue
        body_at = code.index("{", close)
        body_end = _close(code, body_at, "{}")
        name = match.group(2)
        if name in found or name in ("if", "for", "while", "switch", "return"):
            continue
        found[name] = Function(
            name,
            path,
            _line(code, match.start(2)),
            " ".join(match.group(1).split()),
            params(code[open_at + 1 : close]),
            code[body_at : body_end + 1],
            body_at,
            code,
        )
    return found


@dataclass(frozen=True)
class Evidence:
    param: str
    how: str  # "returned", "writable pointer", "in-place method", ...
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


_CAST_WRITE = re.compile(
    r"reinterpret_cast\s*<\s*(?!const\b)[\w:]+\s*\*\s*>\s*\(\s*(\w+)\s*(\.\s*data_ptr\s*\(|\))"
)
_STATIC_WRITE = re.compile(
    r"static_cast\s*<\s*(?!const\b)[\w:]+\s*\*\s*>\s*\(\s*(\w+)\s*\.\s*data_ptr\s*\("
)
_CONST_CAST = re.compile(r"(?:reinterpret|static)_cast\s*<\s*const\b")
_EXTRACT = re.compile(r"\b[A-Z_]*PTR\w*\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
_PTR_ALIAS = re.compile(
    r"(\w+)\s*=\s*(?:reinterpret_cast\s*<[^>]*>\s*\(\s*)?(\w+)\s*\.\s*data_ptr\s*(?:<[^>]*>)?\s*\("
)
_INPLACE = re.compile(r"\b(\w+)\s*(?:\.|->)\s*([a-z]\w*[a-z0-9]_)\s*\(")
_OUT_OP = re.compile(r"\bat::\w+_out\s*\(\s*(\w+)")
_RETURN = re.compile(r"\breturn\b([^;]*);")
_NOT_INPLACE = {"data_ptr_", "size_", "sizes_"}


def _returned(expression: str) -> list[str]:
    """The names a return expression gives back: `x`, `std::move(x)`,
    `{a, b}`, `std::make_tuple(a, b)`, `std::tuple<...>(a, b)`."""
    e = expression.strip()
    moved = re.fullmatch(r"std::move\s*\(\s*(\w+)\s*\)", e)
    if moved:
        return [moved.group(1)]
    if re.fullmatch(r"\w+", e):
        return [e]
    group = re.fullmatch(
        r"(?:std::make_tuple|std::tuple\s*<[^>]*>)?\s*[({](.*)[)}]", e, re.S
    )
    if group:
        names = []
        for part in _split_top(group.group(1)):
            names += _returned(part) or ["?"]
        return names
    return []


def evidence(
    fn: Function,
    known: dict[str, Function],
    depth: int = 2,
) -> tuple[list[Evidence], list[Evidence]]:
    """(what the function returns of its parameters, what it writes of
    them): each an Evidence, file:line. `known`: the package's functions,
    through which a parameter passed on is followed `depth` levels."""
    names = {name for _, name in fn.params}
    body, text, offset = fn.body, fn.text, fn.body_offset
    returns: list[Evidence] = []
    writes: list[Evidence] = []

    def at(position: int) -> int:
        return _line(text, offset + position)

    # a parameter the function assigns anew is not the argument any more
    rebound = {n for n in names if re.search(rf"(?<![\w.>]){n}\s*=(?!=)", body)}
    for found in _RETURN.finditer(body):
        expression = found.group(1)
        line = at(found.start())
        for name in _returned(expression):
            if name in names and name not in rebound:
                returns.append(Evidence(name, "returned", fn.file, line))
        call = re.match(r"\s*(\w+)\s*\(", expression)
        if call and call.group(1) in known and depth and call.group(1) != fn.name:
            inner = known[call.group(1)]
            args = _split_top(
                expression[expression.index("(") + 1 : expression.rindex(")")]
            )
            inner_returns, _ = evidence(inner, known, depth - 1)
            for e in inner_returns:
                passed = _passed(inner, args, e.param)
                if passed in names:
                    how = f"returned (by {inner.name}, {e.where})"
                    returns.append(Evidence(passed, how, fn.file, line))
    pointers = {}  # local pointer -> parameter
    for found in _EXTRACT.finditer(body):
        if found.group(2) in names:
            pointers[found.group(1)] = found.group(2)
    for found in _PTR_ALIAS.finditer(body):
        if found.group(2) in names:
            pointers.setdefault(found.group(1), found.group(2))
    # a writable pointer says something only where the function casts what
    # it reads to a const one
    distinguishes = bool(_CONST_CAST.search(body))
    for pattern in (_CAST_WRITE, _STATIC_WRITE) if distinguishes else ():
        for found in pattern.finditer(body):
            name = found.group(1)
            param = name if name in names else pointers.get(name)
            if param:
                writes.append(
                    Evidence(param, "writable pointer", fn.file, at(found.start()))
                )
    for found in _INPLACE.finditer(body):
        if found.group(1) in names and found.group(2) not in _NOT_INPLACE:
            how = f"in-place {found.group(2)}"
            writes.append(Evidence(found.group(1), how, fn.file, at(found.start())))
    for found in _OUT_OP.finditer(body):
        if found.group(1) in names:
            writes.append(
                Evidence(found.group(1), "an _out op", fn.file, at(found.start()))
            )
    if depth:
        for found in re.finditer(r"\b(\w+)\s*\(", body):
            callee = found.group(1)
            if callee not in known or callee == fn.name:
                continue
            inner = known[callee]
            open_at = found.end() - 1
            args = _split_top(body[open_at + 1 : _close(body, open_at)])
            _, inner_writes = evidence(inner, known, depth - 1)
            for e in inner_writes:
                passed = _passed(inner, args, e.param)
                if passed in names:
                    how = f"{e.how} (in {inner.name}, {e.where})"
                    writes.append(Evidence(passed, how, fn.file, at(found.start())))
    return _unique(returns), _unique(writes)


def _passed(fn: Function, args: list[str], param: str) -> str:
    """The name given for `param` of fn in a call with `args` ("" if not a
    plain name)."""
    position = next((i for i, (_, n) in enumerate(fn.params) if n == param), None)
    if position is None or position >= len(args):
        return ""
    got = _returned(args[position])
    return got[0] if len(got) == 1 else ""


def _unique(found: list[Evidence]) -> list[Evidence]:
    """One per parameter and kind of evidence (the first)."""
    seen, kept = set(), []
    for e in found:
        key = (e.param, e.how.split(" (")[0])
        if key not in seen:
            seen.add(key)
            kept.append(e)
    return kept


def lambda_evidence(
    impl: Impl, known: dict[str, Function], text: str
) -> tuple[list[Evidence], list[Evidence]]:
    """A lambda of `m.impl`, as a function of its own."""
    code = strip_comments(text)
    fn = Function(
        f"<lambda of {impl.op}>",
        impl.file,
        impl.line,
        impl.lambda_returns or "auto",
        impl.lambda_params,
        impl.lambda_body,
        impl.body_offset,
        code,
    )
    return evidence(fn, known)


# ---------------------------------------------------------------------------
# The package's Python wrappers
# ---------------------------------------------------------------------------


@dataclass
class Wrapper:
    """A Python function of the package that calls its ops."""

    name: str
    file: str
    line: int
    params: list[str]
    calls: list[tuple[str, list[str]]]  # (op "ns::name", argument expressions)
    returns_op: bool  # it returns the (one) op's result as it is


def wrappers(path: str, text: str) -> list[Wrapper]:
    """The module-level functions of a Python module of the package that
    call an op through a name bound to `torch.ops.<ns>`."""
    tree = ast.parse(text)
    namespaces = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], ast.unparse(node.value)
            if isinstance(target, ast.Name) and value.startswith("torch.ops."):
                namespaces[target.id] = value.split(".")[2]
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        calls = []
        for call in ast.walk(node):
            if not isinstance(call, ast.Call) or not isinstance(
                call.func, ast.Attribute
            ):
                continue
            base = call.func.value
            if isinstance(base, ast.Name) and base.id in namespaces:
                args = [ast.unparse(a) for a in call.args]
                args += [f"{k.arg}={ast.unparse(k.value)}" for k in call.keywords]
                calls.append((f"{namespaces[base.id]}::{call.func.attr}", args))
        if not calls:
            continue
        returns = [r for r in ast.walk(node) if isinstance(r, ast.Return)]
        returns_op = (
            len(calls) == 1
            and len(returns) == 1
            and isinstance(returns[0].value, ast.Call)
            and isinstance(returns[0].value.func, ast.Attribute)
            and isinstance(returns[0].value.func.value, ast.Name)
            and returns[0].value.func.value.id in namespaces
        )
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        found.append(
            Wrapper(
                node.name,
                path,
                node.lineno,
                [a.arg for a in arguments],
                calls,
                returns_op,
            )
        )
    return found
