"""A kernel package's sources read as text (no compiler, no torch): the op
schemas its C++ registers (`m.def("...")` inside `TORCH_LIBRARY` /
`TORCH_LIBRARY_FRAGMENT`), the function each op runs (`m.impl`), and what
that function's own code says it writes or returns, each with file:line;
and the package's Python wrappers (`def f(...): return _ops.op(...)`).

What counts as evidence that an op writes a parameter, in the function
that implements it (or a function of the package it passes the parameter
on to, or the function a lambda of `m.impl` calls):

* it returns the parameter (`return output;`): the result is that tensor;
* it calls an in-place method on it (`output.copy_(...)`) or an `_out` op;
* a pointer to its data (`data_ptr()`, typed `data_ptr<T>()`,
  `mutable_data_ptr`, `EXTRACT_PTR(p, output)`, a pointer array holding
  it) that the code does not show read-only. The pointer is followed
  through casts, local pointers and arrays, into the functions of the
  package it is handed to (templated and indexed calls, `f<2>(...)`,
  included) and the kernel structs whose fields it sets (all their member
  functions). It is read-only where it becomes a `const` pointer (a cast,
  a declaration, a parameter or field of that type), is only loaded
  (ESIMD's `block_load`, `gather`, ...: READS), compared, checked or
  copied out as a value; it is written where it is stored through
  (`p[i] = v`, `*p = v`, `block_store`, `scatter`, ...: WRITES), and
  wherever the reader does not know the use (handed to a function outside
  the package, kept in a field of a kind it does not read): sound by
  construction, so an unknown use over-declares a write (a copy under
  torch.compile) and never hides one (a lost write).

`const_data_ptr()` is a read. A tensor handed as it is to a function
outside the package (`at::` ops, `get_device_queue(t)`) is a read, except
an `_out` op; tensor lists are not followed."""

import ast
import re
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------
# C++ text
# ---------------------------------------------------------------------------


def strip_comments(text: str) -> str:
    """The text with its comments and line continuations blanked (same
    length, same lines); string and character literals kept."""
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
    # a macro's line continuations read as blanks (same length)
    return "".join(out).replace("\\\n", " \n")


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
        array = re.search(r"\s*\[[^\]]*\]$", part)
        if array:  # `uint8_t* ptrs[N]`: a pointer (to its first element)
            part = part[: array.start()] + "*"
            part = re.sub(r"(\w+)\*$", r"*\1", part)
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
    r"((?:at|torch)::Tensor|void|sycl::event|int|int64_t|bool|float|double"
    r"|std::tuple\s*<[^;{}()]*>|std::vector\s*<[^;{}()]*>)"
    r"\s+(\w+)\s*\("
)


_KERNEL = "struct "  # the key of a kernel struct among the functions
_STRUCT = re.compile(r"(?:^|[\s;}>])struct\s+(\w+)\s*(?::[^{;]*)?\{")


def _top_level(text: str) -> str:
    """The text with each brace block (a member function's body) replaced
    by `;`."""
    out, depth = [], 0
    for c in text:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                out.append(";")
        elif depth == 0:
            out.append(c)
    return "".join(out)


def _kernels(path: str, code: str) -> dict[str, Function]:
    """The kernel structs of a file (a struct with an operator()): each as
    a Function whose parameters are its fields, in order, and whose body is
    its operator()'s."""
    found: dict[str, Function] = {}
    for match in _STRUCT.finditer(code):
        open_at = match.end() - 1
        end = _close(code, open_at, "{}")
        inside = code[open_at + 1 : end]
        call = re.search(r"\boperator\s*\(\s*\)\s*\(", inside)
        if call is None:
            continue
        fields = []
        for statement in _top_level(inside[: call.start()]).split(";"):
            statement = re.sub(
                r"^.*(?:public|private|protected)\s*:", "", statement, flags=re.S
            )
            statement = statement.strip()
            if (
                not statement
                or "(" in statement
                or statement.startswith(
                    ("using", "static", "template", "typedef", "friend")
                )
            ):
                continue
            declared = params(statement)
            kind = declared[0][0] if declared else ""
            if not kind:
                continue
            # `int N, K;`: the first's type for all
            fields += [(k or kind, n) for k, n in declared]
        # every member function's body (operator() calls the others), the
        # declarations between them blanked: same length, same lines
        depth, members = 0, []
        for c in inside:
            if c == "}":
                depth -= 1
            members.append(c if depth > 0 or c == "\n" else " ")
            if c == "{":
                depth += 1
        found[_KERNEL + match.group(1)] = Function(
            match.group(1),
            path,
            _line(code, match.start(1)),
            "void",
            fields,
            "".join(members),
            open_at + 1,
            code,
        )
    return found


def functions(path: str, text: str) -> dict[str, Function]:
    """The functions a C++ file defines (not declares) that return a
    tensor, a tuple or vector, an event, a number or nothing, and its
    kernel structs ("struct <name>"): name -> Function (the first)."""
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
    found.update(_kernels(path, code))
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
    flow = _Flow(known)
    for _, name in fn.params:
        written = flow.param(fn, name)
        if written is not None:
            writes.append(written)
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


# ---------------------------------------------------------------------------
# Pointer flow: a pointer to a parameter's data is written unless the code
# shows it read-only
# ---------------------------------------------------------------------------

_CAST = re.compile(
    r"\b(?:reinterpret|static|const)_cast\s*<([^<>]*(?:<[^<>]*>)?[^<>]*)>\s*$"
)
_C_CAST = re.compile(r"\(\s*((?:const\s+)?[\w:]+(?:\s+const)?\s*\*+)\s*\)\s*$")
_TEMPLATE_ARGS = r"<[^;(){}=<>]*(?:<[^;(){}=<>]*>[^;(){}=<>]*)*>"
_CALLEE = re.compile(
    rf"(?:(?<=[\s(,;{{}}=!&|?:.>])|^)([A-Za-z_][\w:]*)\s*(?:{_TEMPLATE_ARGS})?\s*$"
)
# ESIMD / SYCL calls that only read the memory a pointer argument points to,
# and those that write it (intel/llvm sycl/include/sycl/ext/intel/esimd/)
READS = frozenset(
    {
        "block_load",
        "lsc_block_load",
        "gather",
        "lsc_gather",
        "lsc_load_2d",
        "load_2d",
        "prefetch",
        "lsc_prefetch",
        "lsc_prefetch_2d",
        "prefetch_2d",
        "copy_from",
    }
)
WRITES = frozenset(
    {
        "block_store",
        "lsc_block_store",
        "scatter",
        "lsc_scatter",
        "lsc_store_2d",
        "store_2d",
        "atomic_update",
        "lsc_atomic_update",
        "copy_to",
    }
)
_CHECKS = re.compile(
    r"^(?:[A-Z_]*CHECK\w*|TORCH_INTERNAL_ASSERT\w*|assert|static_assert|if|while|for|switch|sizeof)$"
)
_POINTER_DECL = re.compile(
    r"^(?:static\s+|constexpr\s+)*(?P<type>(?:const\s+)?(?:auto|[\w:]+(?:\s*<[^;=]*>)?)"
    r"(?:\s+const)?\s*(?:\*\s*(?:const\s*)?)*)\s*(?P<name>\w+)\s*(?:\[[^\]]*\])?\s*=\s*$"
)
_ASSIGN = re.compile(r"^(?P<name>\w+)\s*=\s*$")
_STORE = re.compile(r"^[\w.\->\[\]\s()*]*(?:\.|->|\])\s*=\s*$")
_MACRO = re.compile(r"#\s*define\s+(\w+)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)([^\n]*)")
_DATA_PTR = re.compile(
    r"\s*(?:\.|->)\s*(data_ptr|mutable_data_ptr|const_data_ptr)\s*(?:<[^;()]*>)?\s*\(\s*\)"
)


def _is_tensor(kind: str) -> bool:
    return "Tensor" in kind and "vector" not in kind and "List" not in kind


def _is_pointer(kind: str) -> bool:
    return "*" in kind


def _const_pointer(kind: str) -> bool:
    """A pointer type that points to const (`const T*`, `T const*`)."""
    head = kind.split("*", 1)[0]
    return bool(re.search(r"\bconst\b", head))


def _enclosing(body: str, start: int) -> int:
    """The index of the innermost bracket ( { [ open at `start` (-1: none)."""
    depth = 0
    i = start - 1
    while i >= 0:
        c = body[i]
        if c in ")}]":
            depth += 1
        elif c in "({[":
            if depth == 0:
                return i
            depth -= 1
        i -= 1
    return -1


def _statement_start(body: str, start: int, outer: int) -> int:
    """Where the statement (or element) holding `start` begins, within the
    bracket opened at `outer`."""
    depth, i = 0, start - 1
    while i > outer:
        c = body[i]
        if c == "}" and depth == 0:  # the block before ends a statement
            return i + 1
        if c in ")}]":
            depth += 1
        elif c in "({[":
            depth -= 1
        elif depth < 0 or (depth == 0 and c in ";,"):
            return i + 1
        i -= 1
    return outer + 1


class _Flow:
    """Whether a function writes through a parameter: a tensor whose data it
    hands on as a writable pointer, or a pointer it hands on writable, with
    the first evidence (file:line). A use the reader does not know counts as
    a write; a read is shown by a `const` pointer (a cast, a declaration, a
    parameter of a function of the package it is handed to), a check, a
    comparison, a value copied out."""

    def __init__(self, known: dict[str, Function], depth: int = 5):
        self.known = known
        self.structs = {
            n[len(_KERNEL) :]: f for n, f in known.items() if n.startswith(_KERNEL)
        }
        self.depth = depth
        self.memo: dict[tuple[str, str], Evidence | None] = {}

    def param(
        self, fn: Function, name: str, depth: int | None = None
    ) -> Evidence | None:
        depth = self.depth if depth is None else depth
        key = (f"{fn.file}:{fn.line}:{fn.name}", name)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = None  # in progress: a cycle says nothing
        kind = dict((n, k) for k, n in fn.params).get(name, "")
        found = None
        if _is_tensor(kind):
            found = self._name(fn, name, 0, tensor=True, depth=depth)
        elif _is_pointer(kind) and not _const_pointer(kind):
            found = self._name(fn, name, 0, tensor=False, depth=depth)
        self.memo[key] = found
        return found

    def _at(self, fn: Function, position: int) -> int:
        return _line(fn.text, fn.body_offset + position)

    def _name(self, fn, name, after, tensor, depth) -> Evidence | None:
        body = fn.body
        for found in re.finditer(
            rf"(?<![\w.>:]){re.escape(name)}\b(?!\s*::)", body[after:]
        ):
            s, e = after + found.start(), after + found.end()
            got = self._use(fn, name, s, e, tensor, depth)
            if got is not None:
                return got
        return None

    def _use(self, fn, name, s, e, tensor, depth) -> Evidence | None:
        body = fn.body
        if tensor:
            ptr = _DATA_PTR.match(body, e)
            if ptr is None:
                return self._tensor_use(fn, name, s, e, depth)
            if ptr.group(1) == "const_data_ptr":
                return None
            return self._pointer(fn, name, s, ptr.end(), depth, 0)
        return self._pointer(fn, name, s, e, depth, 0)

    def _tensor_use(self, fn, name, s, e, depth) -> Evidence | None:
        """A tensor given on as it is: to a macro that takes its pointer
        (EXTRACT_PTR(p, t)), or to a function of the package."""
        body = fn.body
        outer = _enclosing(body, s)
        if outer < 0 or body[outer] != "(":
            return None
        callee = _CALLEE.search(body[:outer])
        if not callee:
            return None
        args = _split_top(body[outer + 1 : _close(body, outer)])
        index = next((i for i, a in enumerate(args) if a == name), None)
        if index is None:
            return None
        macro = self._macro(fn, callee.group(1))
        if macro is not None and index == 1 and len(args) == 2:
            if "data_ptr" not in macro or re.search(r"<\s*const\b", macro):
                return None
            alias = args[0]
            close = _close(body, outer)
            inner = self._name(fn, alias, close + 1, False, depth)
            return self._via(fn, name, inner, s, f"through {alias}")
        target = self.known.get(callee.group(1).split("::")[-1])
        if target is None or target is fn or depth <= 0 or index >= len(target.params):
            return None
        inner = self.param(target, target.params[index][1], depth - 1)
        return self._via(fn, name, inner, s, f"in {target.name}")

    def _macro(self, fn, name: str) -> str | None:
        """The body of a macro `NAME(var, tensor)` of the function's file;
        one named like EXTRACT_PTR defined elsewhere takes a writable
        pointer."""
        for found in _MACRO.finditer(fn.text):
            if found.group(1) == name:
                return found.group(4)
        if re.fullmatch(r"[A-Z_]*PTR\w*", name):
            return "auto var = tensor.data_ptr()"
        return None

    def _via(
        self, fn, name, inner: Evidence | None, s: int, how: str
    ) -> Evidence | None:
        if inner is None:
            return None
        first = inner.how.split(" (")[0]
        return Evidence(
            name, f"{first} ({how}, {inner.where})", fn.file, self._at(fn, s)
        )

    def _write(self, fn, param, s, how) -> Evidence:
        return Evidence(param, how, fn.file, self._at(fn, s))

    def _pointer(self, fn, name, s, e, depth, hops) -> Evidence | None:
        """A pointer expression body[s:e] (to `name`'s data): written?"""
        body = fn.body
        if hops > 12:
            return self._write(fn, name, s, "writable pointer")
        while e < len(body) and body[e] == "[":  # an element: a pointer of an array
            close = _close(body, e, "[]")
            e = close + 1
        rest = body[e:].lstrip()
        before = body[:s].rstrip()
        if re.match(r"(?:==|!=|<=|>=|<(?!<)|>(?!>))", rest) or re.search(
            r"(?:==|!=|<=|>=)$", before
        ):
            return None  # compared
        if re.match(r"=(?!=)", rest):
            return self._write(fn, name, s, "written through")
        if re.match(r"(?:\+\+|--|[-+*/|&^]=)", rest):
            return self._write(fn, name, s, "written through")
        if before.endswith("*") and re.search(r"(?:^|[(=,;{}!&|?:])\s*\*$", before):
            # dereferenced: `*p = v` writes, `v = *p` reads
            if re.match(r"=(?!=)", rest):
                return self._write(fn, name, s, "written through")
            return None
        cast = _C_CAST.search(before)
        if cast:
            if _const_pointer(cast.group(1)):
                return None
            return self._pointer(fn, name, cast.start(), e, depth, hops + 1)
        outer = _enclosing(body, s)
        if outer >= 0 and body[outer] == "(":
            return self._argument(fn, name, s, e, outer, depth, hops)
        start = _statement_start(body, s, outer)
        prefix = body[start:s].strip()
        in_list = outer >= 0 and body[outer] == "{" and not prefix
        if in_list and (start == outer + 1 or body[start - 1] == ","):
            return self._element(fn, name, s, outer, depth)
        if prefix.startswith("return"):
            return self._write(fn, name, s, "writable pointer returned")
        decl = _POINTER_DECL.match(prefix)
        if decl:
            kind = decl.group("type")
            if _const_pointer(kind):
                return None
            if "*" not in kind and "auto" not in kind:
                return None  # a value copied out
            return self._alias(fn, name, decl.group("name"), e, depth, s)
        assign = _ASSIGN.match(prefix)
        if assign:
            return self._alias(fn, name, assign.group("name"), e, depth, s)
        if _STORE.match(prefix):
            member = re.match(r"^(\w+)\s*(?:\.|->)\s*(\w+)", prefix)
            kernel = self._kernel_of(fn, member.group(1)) if member else None
            if kernel is not None:
                fields = [n for _, n in kernel.params]
                if member.group(2) in fields:
                    return self._field(
                        fn, name, kernel, fields.index(member.group(2)), s, depth
                    )
            return self._write(fn, name, s, "writable pointer stored")
        return self._write(fn, name, s, "writable pointer")

    def _argument(self, fn, name, s, e, outer, depth, hops) -> Evidence | None:
        """The pointer body[s:e] inside the brackets opened at `outer`: a
        cast's operand, a call's argument, a bracketed expression."""
        body = fn.body
        close = _close(body, outer)
        head = body[:outer]
        cast = _CAST.search(head)
        if cast:
            if _const_pointer(cast.group(1)):
                return None
            if not _is_pointer(cast.group(1)):
                return None  # a value (an address as an integer)
            return self._pointer(fn, name, cast.start(), close + 1, depth, hops + 1)
        callee = _CALLEE.search(head)
        word = callee.group(1).split("::")[-1] if callee else ""
        if not word:  # a bracketed expression: `(p + off)`
            return self._pointer(fn, name, outer, close + 1, depth, hops + 1)
        if _CHECKS.match(word) or word in READS:
            return None
        if word in WRITES:
            return self._write(fn, name, s, f"stored by {word}")
        args = _split_top(body[outer + 1 : close])
        index, position = None, outer + 1
        for i, arg in enumerate(args):
            at = body.index(arg, position)
            if at <= s < at + len(arg):
                index = i
                break
            position = at + len(arg)
        if index is None:
            return self._write(fn, name, s, "writable pointer")
        kernel = self.structs.get(word)
        if kernel is not None:  # a kernel's fields set by its constructor
            return self._field(fn, name, kernel, index, s, depth)
        target = self.known.get(word)
        if target is None or target is fn or depth <= 0:
            return self._write(fn, name, s, f"writable pointer handed to {word}")
        if index >= len(target.params):
            return self._write(fn, name, s, f"writable pointer handed to {word}")
        mine = body[s:e].strip()
        plain = args[index].replace(" ", "") == mine.replace(" ", "")
        if not plain and not re.fullmatch(
            rf"{re.escape(mine)}\s*[+-].*", args[index], re.S
        ):
            return self._write(fn, name, s, f"handed to {word} in an expression")
        inner = self.param(target, target.params[index][1], depth - 1)
        return self._via(fn, name, inner, s, f"in {target.name}")

    def _element(self, fn, name, s, outer, depth) -> Evidence | None:
        """The pointer at `s`, an element of the brace list opened at
        `outer`: a pointer array's initialiser, or a kernel's fields."""
        body = fn.body
        head_at = _statement_start(body, outer, _enclosing(body, outer))
        decl = _POINTER_DECL.match(body[head_at:outer].strip())
        if decl:
            if _const_pointer(decl.group("type")):
                return None
            after = _close(body, outer, "{}")
            return self._alias(fn, name, decl.group("name"), after, depth, s)
        kernel = re.search(r"(\w+)\s*(?:<[^;{}()]*>)?\s*$", body[:outer])
        kernel = self.structs.get(kernel.group(1)) if kernel else None
        if kernel is None:
            return self._write(
                fn, name, s, "writable pointer stored in a kernel's fields"
            )
        index = len(_split_top(body[outer + 1 : s] + "x")) - 1
        return self._field(fn, name, kernel, index, s, depth)

    def _field(self, fn, name, kernel, index, s, depth) -> Evidence | None:
        """A pointer given to a kernel's field: what the kernel does with it."""
        if index >= len(kernel.params) or depth <= 0:
            return self._write(
                fn, name, s, "writable pointer stored in a kernel's fields"
            )
        inner = self.param(kernel, kernel.params[index][1], depth - 1)
        return self._via(fn, name, inner, s, f"in {kernel.name}")

    def _kernel_of(self, fn, variable: str):
        """The kernel struct a local variable of the function is."""
        found = re.search(
            rf"(?:^|[;{{}}\s])(\w+)\s*(?:<[^;{{}}()]*>)?\s+{re.escape(variable)}\s*;",
            fn.body,
        )
        return self.structs.get(found.group(1)) if found else None

    def _alias(self, fn, name, alias, after, depth, s) -> Evidence | None:
        inner = self._name(fn, alias, after, False, depth)
        if inner is None:
            return None
        return Evidence(
            name,
            inner.how if " (" in inner.how else f"{inner.how} (as {alias})",
            inner.file,
            inner.line,
        )


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
