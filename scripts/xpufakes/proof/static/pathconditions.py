"""When the traced path takes a call: the conditions on the way, read from
the source (no import). For each call of reach.py's chain (the entry
first, the call last): the tests of the `if`s it is inside (negated in an
`else`) and of the `if`s before it that return or raise. Together, as
alternatives (a disjunction of conjunctions), each condition tagged by what
it depends on: `token count` (vLLM traces once, at max_num_batched_tokens,
and drops the guards), `weight shape` (a property of the checkpoint: it
holds at any token count), `env var`, `kernel present`, `other`; a platform
test (`current_platform.is_cuda()`) is evaluated for XPU, and a path only
another platform takes is said to be one."""

import ast
import re

from xpufakes.trees.names import module_name
from xpufakes.trees.pysource import SourceTree, statements


def conditions(source: SourceTree, steps: list) -> str:
    """When the path through `steps` (reach's chain, the call last) is
    taken: the conditions of the `if`s around each call and the early
    returns before it, as alternatives, each tagged by what it depends on."""
    found: list[ast.expr] = []
    named: dict[str, str] = {}
    for step in steps:
        module = source.module(module_name(step.file))
        function = module.function_node(step.function) if module else None
        if function is None:
            continue
        found += guards(function, step.line)
        named.update(_bindings(function))
    if not found:
        return "always (no condition on the way)"
    alternatives = _dnf(ast.BoolOp(ast.And(), found))
    if alternatives is None:
        return "when " + " and ".join(ast.unparse(c) for c in found)
    alternatives = _simplified(alternatives)
    on_xpu = [a for a in alternatives if all(_on_xpu(x) is not False for x in a)]
    if alternatives and not on_xpu:
        shown = _some([" and ".join(ast.unparse(x) for x in a) for a in alternatives])
        return f"{NOT_ON_XPU}: only when {shown}"
    free, counted, env = [], [], []
    for conjunction in on_xpu:
        tagged = [(ast.unparse(atom), _tag(atom, named)) for atom in conjunction]
        env += [text for text, tag in tagged if tag == "env var" and text not in env]
        if any(tag == "token count" for _, tag in tagged):
            said = " and ".join(t for t, tag in tagged if tag == "token count")
            if said not in counted:
                counted.append(said)
        else:
            shown = [f"{t} [{tag}]" for t, tag in tagged if tag != "env var"]
            free.append(" and ".join(shown) or "(only env vars)")
    parts = []
    if free:
        parts.append("at any token count when " + _some(free))
    if counted:
        parts.append(
            "at a traced token count (max_num_batched_tokens) where " + _some(counted)
        )
    if not parts:
        parts.append("never: the conditions on the way contradict each other")
    if env:
        parts.append("env: " + "; ".join(env))
    return "; ".join(parts)


NOT_ON_XPU = "not on XPU"
_PLATFORM = re.compile(r"(not )?[\w.]*platform\.is_(\w+)\(\)")
_PLATFORMS = {"xpu", "cuda", "rocm", "cuda_alike", "cpu", "tpu", "hpu", "neuron"}


def _on_xpu(atom: ast.expr) -> bool | None:
    """The value of a platform test (`current_platform.is_cuda()`) on XPU;
    None for any other condition."""
    found = _PLATFORM.fullmatch(ast.unparse(atom))
    if found is None or found.group(2) not in _PLATFORMS:
        return None
    return (found.group(2) == "xpu") != bool(found.group(1))


def _some(alternatives: list[str], shown: int = 3) -> str:
    said = " | ".join(alternatives[:shown])
    more = len(alternatives) - shown
    return said + (f" (| {more} more)" if more > 0 else "")


def _simplified(alternatives: list[list[ast.expr]]) -> list[list[ast.expr]]:
    """Each alternative without repeated atoms, and without those that
    contradict themselves (an atom and its negation); each once."""
    kept, seen = [], set()
    for conjunction in alternatives:
        atoms, texts = [], set()
        for atom in conjunction:
            text = ast.unparse(atom)
            if text not in texts:
                texts.add(text)
                atoms.append(atom)
        if any(ast.unparse(_not(a)) in texts for a in atoms):
            continue
        key = frozenset(texts)
        if key not in seen:
            seen.add(key)
            kept.append(atoms)
    return kept


def guards(function: ast.AST, line: int) -> list[ast.expr]:
    """The conditions under which a function reaches `line`: the tests of
    the `if`s it is inside (negated in an `else`) and of the `if`s before
    it that return or raise."""
    found: list[ast.expr] = []
    body = list(getattr(function, "body", []))
    while body:
        inside = None
        for statement in body:
            if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
                inside = statement
                break
            if (
                isinstance(statement, ast.If)
                and statement.end_lineno < line
                and _exits(statement.body)
                and not statement.orelse
            ):
                found.append(_not(statement.test))
        if inside is None:
            break
        if isinstance(inside, ast.If):
            if (
                inside.body
                and inside.body[0].lineno <= line <= inside.body[-1].end_lineno
            ):
                found.append(inside.test)
                body = inside.body
            elif inside.orelse and inside.orelse[0].lineno <= line:
                found.append(_not(inside.test))
                body = inside.orelse
            else:
                break
        elif isinstance(
            inside, ast.For | ast.While | ast.With | ast.AsyncWith | ast.AsyncFor
        ):
            body = inside.body + getattr(inside, "orelse", [])
        elif isinstance(inside, ast.Try):
            body = (
                inside.body
                + [s for h in inside.handlers for s in h.body]
                + inside.orelse
                + inside.finalbody
            )
        else:
            break
    return found


def _exits(body: list) -> bool:
    return bool(body) and isinstance(
        body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break
    )


_FLIP = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


def _not(expr: ast.expr) -> ast.expr:
    """The negation, made readable: De Morgan, flipped comparisons."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return expr.operand
    if isinstance(expr, ast.BoolOp):
        other = ast.Or() if isinstance(expr.op, ast.And) else ast.And()
        return ast.BoolOp(other, [_not(v) for v in expr.values])
    if (
        isinstance(expr, ast.Compare)
        and len(expr.ops) == 1
        and type(expr.ops[0]) in _FLIP
    ):
        return ast.Compare(expr.left, [_FLIP[type(expr.ops[0])]()], expr.comparators)
    return ast.UnaryOp(ast.Not(), expr)


def _dnf(expr: ast.expr, limit: int = 24) -> list[list[ast.expr]] | None:
    """The alternatives (each a conjunction of atoms) of a condition; None
    past `limit` of them."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = expr.operand
        if isinstance(inner, ast.BoolOp | ast.Compare) or (
            isinstance(inner, ast.UnaryOp) and isinstance(inner.op, ast.Not)
        ):
            negated = _not(inner)
            if not (
                isinstance(negated, ast.UnaryOp) and isinstance(negated.op, ast.Not)
            ):
                return _dnf(negated, limit)
        return [[expr]]
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
        found = []
        for value in expr.values:
            inner = _dnf(value, limit)
            if inner is None:
                return None
            found += inner
        return found if len(found) <= limit else None
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And):
        found = [[]]
        for value in expr.values:
            inner = _dnf(value, limit)
            if inner is None:
                return None
            found = [a + b for a in found for b in inner]
            if len(found) > limit:
                return None
        return found
    return [[expr]]


def _bindings(function: ast.AST) -> dict[str, str]:
    """name -> the source of what a function binds it to (tuples too)."""
    found = {}
    for node in statements(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], ast.unparse(node.value)
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            for name in names:
                if isinstance(name, ast.Name):
                    found.setdefault(name.id, value)
    return found


_ENV = re.compile(r"disable_esimd|_DISABLE_|environ|getenv|\benvs\.|VLLM_\w+")
_TOKENS = re.compile(
    r"shape\[0\]|size\(0\)|\.numel\(\)|num_tokens|num_decode|num_prefill|query_len"
    r"|\bbsz\b|batch|DECODE_BSZ|max_num_batched|positions\.ndim|\.ndim"
)
_WEIGHT = re.compile(
    r"%|weight|_esimd\b|scale|out_features|in_features|block_size|hidden_size|head_dim"
)
_PRESENT = re.compile(
    r"ESIMD_AVAILABLE|\bis None\b|\bis not None\b|hasattr|is_xpu|_AVAILABLE"
)


def _tag(atom: ast.expr, named: dict[str, str]) -> str:
    """What a condition depends on: an env var, the token count, the
    weights' shape, whether a kernel exists, or something else."""
    text = ast.unparse(atom)
    words = set(re.findall(r"\w+", text))
    seen = [named[w] for w in words if w in named]
    for value in list(seen):
        seen += [
            named[w]
            for w in re.findall(r"\w+", value)
            if w in named and named[w] not in seen
        ]
    full = " ".join([text, *seen])
    if _ENV.search(text):
        return "env var"
    if _TOKENS.search(full):
        return "token count"
    if _WEIGHT.search(full):
        return "weight shape"
    if _PRESENT.search(text):
        return "kernel present"
    return "other"


# Where vLLM splits the compiled graph by default (CompilationConfig's
# `_attention_ops`, which set_splitting_ops_for_v1 makes the splitting ops
# when none are given): each piece between them is compiled (AOT autograd,
# functionalization, Inductor) and the op itself runs as it is, between the
# pieces. A schema that lies loses nothing there; it does where the op is
# compiled inside a graph: with Inductor's graph partition (the partition
# comes after functionalization), with splitting_ops emptied (given as [],
# or by fuse_attn_quant without graph partition), or in a compilation mode
# (level, before 0.13) that compiles the model whole, split nowhere.
COMPILATION = "vllm/config/compilation.py"
SPLIT = (
    "by default vLLM splits the compiled graph at it ({at}: a splitting op), "
    "so it runs between the compiled pieces and its schema loses nothing; "
    "inside a compiled graph with use_inductor_graph_partition, with "
    "splitting_ops emptied ([], or fuse_attn_quant){whole}"
)
# the enum of compilation modes, and the member that splits (the last)
_MODE_ENUMS = ("CompilationMode", "CompilationLevel")


def whole_graph_modes(texts: dict[str, str]) -> list[str]:
    """The tree's compilation modes (CompilationMode, or CompilationLevel
    before 0.13) that compile the model whole, split nowhere: every member
    but the first (no compilation) and the last (vLLM's piecewise
    compilation, the only one set_splitting_ops_for_v1 splits), by value.
    [] where the enum is not found (read from the source, no import)."""
    try:
        module = ast.parse(texts.get(COMPILATION, ""))
    except SyntaxError:
        return []
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name in _MODE_ENUMS:
            members = []
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and len(item.targets) == 1
                    and isinstance(item.targets[0], ast.Name)
                    and isinstance(item.value, ast.Constant)
                    and type(item.value.value) is int
                ):
                    members.append((item.value.value, item.targets[0].id))
            members.sort()
            return [f"{node.name}.{name}" for _, name in members[1:-1]]
    return []


def split_note(at: str, texts: dict[str, str]) -> str:
    """What the audit says beside a traced call of a splitting op listed at
    `at`: where it runs by default, and when it is compiled after all."""
    modes = whole_graph_modes(texts)
    kind = "level" if modes and modes[0].startswith("CompilationLevel.") else "mode"
    whole = f", or in {kind} {' or '.join(modes)} (split nowhere)" if modes else ""
    return SPLIT.format(at=at, whole=whole)


def splitting_ops(texts: dict[str, str]) -> dict[str, str]:
    """The ops vLLM splits the compiled graph at by default, each with where
    the tree lists it ("vllm/config/compilation.py:<line>"); {} for a tree
    that lists none (read from the source, no import)."""
    text = texts.get(COMPILATION)
    if text is None:
        return {}
    try:
        module = ast.parse(text)
    except SyntaxError:
        return {}
    found = {}
    for node in ast.walk(module):
        target = getattr(node, "target", None)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(target, ast.Name)
            and target.id == "_attention_ops"
            and isinstance(node.value, ast.List)
        ):
            continue
        for element in node.value.elts:
            if isinstance(element, ast.Constant) and isinstance(element.value, str):
                found[element.value] = f"{COMPILATION}:{element.lineno}"
    return found
