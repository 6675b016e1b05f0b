"""The edit that makes vLLM's `vllm::sparse_attn_indexer` op tell the truth:
registered so that its schema returns nothing (`-> ()`), its callers
returning the buffer it writes.

vLLM registers the op (direct_register_custom_op) with
mutates_args=["topk_indices_buffer", ...] and a function that returns
topk_indices_buffer as a plain `-> Tensor`: an output aliasing an input that
the schema does not declare (docs/schema-truth.md, kind (b)). Functionalized
(a compiled graph with Inductor's graph partition, with splitting_ops
emptied, or in a mode that compiles the model whole) the result is a copy,
and torch warns that such a return "is deprecated and will become an error".

The edit, on any file of a tree:
* where the op is registered: two functions, `<impl>_op` and
  `<fake>_op`, with the impl's parameters (their source text) and
  `-> None`, each calling the function it stands for; the registration
  takes them. The impl itself is unchanged: its Python callers (the models
  that call it directly) still get the buffer.
* at each call of `torch.ops.vllm.sparse_attn_indexer(...)`: the call must
  be a `return` statement's value, with exactly one argument naming the
  buffer (`topk_indices_buffer` or `<x>.topk_indices_buffer`); it becomes
  the call, then `return <that argument>`. Any other call is refused.

Pure text and AST: no torch, no vLLM import.
"""

import ast

OP = "sparse_attn_indexer"
BUFFER = "topk_indices_buffer"
REGISTER = "direct_register_custom_op"
CALLEE = f"torch.ops.vllm.{OP}"


class Unshaped(Exception):
    """The file is not shaped as the edit expects."""


class Refused(Unshaped):
    """A site the edit must change and cannot."""


def mentions(text: str) -> bool:
    """Whether a module's text may register or call the op (a cheap
    pre-filter before parsing)."""
    return OP in text and (REGISTER in text or CALLEE in text)


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _registration(module: ast.Module) -> tuple[ast.stmt, ast.Call] | None:
    for stmt in module.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not (
            isinstance(call, ast.Call)
            and _dotted(call.func).rsplit(".", 1)[-1] == REGISTER
        ):
            continue
        named = {k.arg: k.value for k in call.keywords}
        name = named.get("op_name")
        if isinstance(name, ast.Constant) and name.value == OP:
            return stmt, call
    return None


def implementation(text: str) -> str | None:
    """The name of the function a module registers as the op's
    implementation (op_func=), None where the module registers no op."""
    if not mentions(text):
        return None
    found = _registration(ast.parse(text))
    if found is None:
        return None
    named = {k.arg: k.value for k in found[1].keywords}
    func = named.get("op_func")
    if not isinstance(func, ast.Name):
        return None
    return func.id


def _calls(module: ast.Module) -> list[tuple[ast.Call, ast.AST | None]]:
    """Each call of the op, with its parent node."""
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(module):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return [
        (node, parents.get(id(node)))
        for node in ast.walk(module)
        if isinstance(node, ast.Call)
        and _dotted(node.func) in (CALLEE, f"{CALLEE}.default")
    ]


def _buffer(call: ast.Call) -> ast.expr:
    """The one argument that names the buffer."""
    named = [
        a
        for a in [*call.args, *(k.value for k in call.keywords)]
        if (isinstance(a, ast.Name) and a.id == BUFFER)
        or (isinstance(a, ast.Attribute) and a.attr == BUFFER and _dotted(a))
    ]
    if len(named) != 1:
        raise Refused(
            f"line {call.lineno}: the call of {CALLEE} passes {len(named)} "
            f"argument(s) naming {BUFFER}, not one"
        )
    return named[0]


def _function(module: ast.Module, name: str) -> ast.FunctionDef:
    for stmt in module.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    raise Unshaped(f"{name}, registered as vllm::{OP}, is not defined here")


def _parameters(lines: list[str], function: ast.FunctionDef) -> list[str]:
    """Each parameter of the function as its source writes it (annotation
    and default), in order; refused for *args, **kwargs, `/` or `*`."""
    a = function.args
    if a.vararg or a.kwarg or a.posonlyargs or a.kwonlyargs:
        raise Refused(f"{function.name} has parameters other than plain ones")
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    found = []
    for arg, default in zip(a.args, defaults, strict=True):
        text = arg.arg
        if arg.annotation is not None:
            text += ": " + ast.get_source_segment("".join(lines), arg.annotation)
        if default is not None:
            value = ast.get_source_segment("".join(lines), default)
            text += (" = " if arg.annotation is not None else "=") + value
        found.append(text)
    return found


def _stand_in(name: str, calls: str, params: list[str], names: list[str]) -> str:
    """def <name>(<params>) -> None: <calls>(<names>)"""
    head = "".join(f"    {p},\n" for p in params)
    args = "".join(f"        {n},\n" for n in names)
    return f"def {name}(\n{head}) -> None:\n    {calls}(\n{args}    )\n"


def _edited_already(module: ast.Module, call: ast.Call, parent) -> bool:
    """A call this edit wrote: a statement of its own, the next statement a
    return of the argument naming the buffer."""
    if not (isinstance(parent, ast.Expr) and parent.value is call):
        return False
    for node in ast.walk(module):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and parent in body:
                index = body.index(parent)
                after = body[index + 1] if index + 1 < len(body) else None
                return (
                    isinstance(after, ast.Return)
                    and after.value is not None
                    and ast.unparse(after.value) == ast.unparse(_buffer(call))
                )
    return False


def _registering(
    module: ast.Module, lines: list[str]
) -> tuple[list[tuple[int, int, int, str]], tuple[int, str]] | None:
    """Where the module registers the op: the edits of the registration's
    op_func= and fake_impl=, and the two functions to insert before it;
    None where it does not, or registers it to return nothing already."""
    found = _registration(module)
    if found is None:
        return None
    stmt, call = found
    named = {k.arg: k.value for k in call.keywords}
    if not all(isinstance(named.get(k), ast.Name) for k in ("op_func", "fake_impl")):
        raise Unshaped(f"vllm::{OP} is registered without op_func= and fake_impl=")
    impl = _function(module, named["op_func"].id)
    fake = _function(module, named["fake_impl"].id)
    if impl.returns is not None and ast.unparse(impl.returns) == "None":
        return None  # registered to return nothing already (by this edit)
    params = _parameters(lines, impl)
    names = [a.arg for a in impl.args.args]
    if [a.arg for a in fake.args.args] != names:
        raise Refused(f"{fake.name}'s parameters are not {impl.name}'s")
    taken = {s.name for s in module.body if isinstance(s, ast.FunctionDef)}
    new = {impl.name: f"{impl.name}_op", fake.name: f"{impl.name}_op_fake"}
    if taken & set(new.values()):
        raise Refused(f"{' or '.join(sorted(new.values()))} is taken")
    edits = [
        (v.lineno - 1, v.col_offset, v.end_col_offset, new[v.id])
        for v in (named["op_func"], named["fake_impl"])
    ]
    block = (
        f"# vllm::{OP} writes {BUFFER} (mutates_args) and\n"
        "# returns nothing: returning the buffer as a plain Tensor would\n"
        "# alias an input the schema does not declare. Its callers return\n"
        "# the buffer.\n"
        + _stand_in(new[impl.name], impl.name, params, names)
        + "\n\n"
        + _stand_in(new[fake.name], fake.name, params, names)
        + "\n\n"
    )
    return edits, (stmt.lineno - 1, block)


def edit(text: str) -> str:
    """The file with the op registered to return nothing and its calls
    returning the buffer (unchanged if it does neither)."""
    if not mentions(text):
        return text
    module = ast.parse(text)
    lines = text.splitlines(keepends=True)
    # (row, column from, column to, new text), applied bottom up
    edits: list[tuple[int, int, int, str]] = []
    inserts: list[tuple[int, str]] = []  # (before row, lines)

    for call, parent in _calls(module):
        if _edited_already(module, call, parent):
            continue
        if not (isinstance(parent, ast.Return) and parent.value is call):
            raise Refused(
                f"line {call.lineno}: {CALLEE}(...) is not a return statement's "
                "value: its result would be None once the op returns nothing"
            )
        buffer = ast.get_source_segment(text, _buffer(call))
        row = parent.lineno - 1
        indent = lines[row][: parent.col_offset]
        if lines[row][parent.col_offset :].startswith("return "):
            edits.append((row, parent.col_offset, parent.col_offset + 7, ""))
        else:
            raise Unshaped(f"line {parent.lineno}: a return split oddly")
        inserts.append((parent.end_lineno, f"{indent}return {buffer}\n"))

    registered = _registering(module, lines)
    if registered is not None:
        more, block = registered
        edits += more
        inserts.append(block)
    if not edits and not inserts:
        return text

    for row, start, end, new_text in sorted(edits, reverse=True):
        lines[row] = lines[row][:start] + new_text + lines[row][end:]
    for row, block in sorted(inserts, key=lambda i: i[0], reverse=True):
        lines[row:row] = [block]
    result = "".join(lines)
    ast.parse(result)
    return result
