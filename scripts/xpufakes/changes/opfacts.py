"""The copies of the op facts (data/fakes.toml, data/op_schemas.toml,
data/opaque_calls.toml and data/schema_contracts.toml: ops.ROUTED_CALLS),
of the newest kernels pin (patches/pins.toml) and
of the catalog's figures (data/models.toml) in files that must stay
self-contained, written from the data files:
`make ops`, and `make refresh` once it has written pins.toml.

* Python files (the in-tree test's reference kernels, which go into vLLM
  trees; make e2e's plugin, installed into engine venvs; the vLLM plugin's
  WRAPPER_FAKES, which ships without the tool's data): the value of a
  named module-level assignment, found by its AST position, is replaced by
  the literal the registry gives (no marker in the file);
* the docs: the marked places `<!-- ops:KEY -->text<!-- /ops -->` and
  `<!-- models:KEY -->text<!-- /models -->`, as trees/pinfacts.py writes
  `<!-- pins:... -->`.

tests/test_op_facts.py checks that every place holds what `expected` says,
so a copy edited by hand, or a registry edited without `make ops`, fails."""

import ast
import math
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

from xpufakes.common import ops, paths, pluginsource
from xpufakes.common.errors import Refusal
from xpufakes.trees import pinfacts, pins

REFERENCE = "vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py"
E2E_STANDINS = "e2e/plugin/xpufakes_e2e_plugin/standins.py"
PLUGIN = pluginsource.module_source()
# the module the opaque-calls recipe adds (changes/recipes.py OPAQUE_MODULE),
# whose CONTRACTS are ops.ROUTED_CALLS'
OPAQUE_MODULE = "vllm_overlay/vllm/_xpu_opaque_calls.py"
INPLACE_TEST = "vllm_overlay/in-place/tests/kernels/quantization/test_xpu_gemm_fakes.py"
DOCUMENTS = ("docs/contributors.md",)
MARKED = pinfacts.marked("ops")
# the documents with the catalog's figures (`<!-- models:KEY -->`)
MODEL_DOCUMENTS = ("docs/traced-path.md",)
# changed lines of the in-place cut in all, tests included, that
# tests/test_stage.py holds it to (issue 19)
INPLACE_AIM = 350
LINE = 88  # the overlay's ruff line length (vLLM's)
# The release whose in-place cut the docs' figures are of (tests/test_stage.py
# stages it)
DOC_RELEASE = "0.33.0"


# ---------------------------------------------------------------------------
# The facts
# ---------------------------------------------------------------------------


def schemas() -> dict[str, str]:
    """qualified op -> its schema as torch prints it (op_schemas.toml)."""
    data = tomllib.loads((paths.DATA / "op_schemas.toml").read_text())
    return {
        f"{ns}::{name}": f"{ns}::{schema}"
        for ns, table in data.items()
        for name, schema in table.items()
    }


def _unqualified(op: str) -> str:
    return op.partition("::")[2]


def python_values() -> dict[str, dict[str, object]]:
    """file -> {module-level name: the value the registry (and, for the
    newest kernels release, the pins) gives it}."""
    known = schemas()
    missing = [op["name"] for op in ops.FAKES if op["name"] not in known]
    missing += [op for op in ops.WRAPPERS if op not in known]
    if missing:
        raise Refusal(f"op_schemas.toml has no schema for {', '.join(missing)}")
    by_era: dict[str, list[dict]] = {pins.KERNELS: [], pins.IPEX: []}
    for op in ops.FAKES:
        by_era[op["era"]].append(op)
    later = sorted(
        (pins.version_tuple(op["since"]), _unqualified(op["name"]))
        for op in by_era[pins.KERNELS]
        if pins.version_tuple(op["since"]) > (0, 1, 0)
    )
    return {
        REFERENCE: {
            "XPU_C_SCHEMAS": {
                _unqualified(op["name"]): _unqualified(known[op["name"]])
                for op in by_era[pins.KERNELS]
            },
            "XPU_C_OP_SINCE": {name: version for version, name in later},
            "TORCH_IPEX_SCHEMAS": {
                _unqualified(op["name"]): _unqualified(known[op["name"]])
                for op in by_era[pins.IPEX]
            },
            "NEWEST_XPU_KERNELS": pins.load().newest_kernels(),
        },
        E2E_STANDINS: {
            "CHECKED_OPS": {
                pins.KERNELS: tuple(op["name"] for op in by_era[pins.KERNELS]),
                pins.IPEX: (
                    *(op["name"] for op in by_era[pins.IPEX]),
                    ops.IPEX_WOQ_OP,
                ),
            },
        },
        PLUGIN: {
            "WRAPPER_FAKES": {
                op: (known[op], wrapper.canonical)
                for op, wrapper in ops.WRAPPERS.items()
            },
            "CALLEE_RETURNS": {
                callee: entry["callee_returns"]
                for callee, entry in ops.ROUTED_CALLS.items()
            },
        },
        OPAQUE_MODULE: {
            "CONTRACTS": {
                callee: (
                    entry["op"],
                    tuple(entry["params"]),
                    tuple(entry["mutates"]),
                    entry["returns"],
                )
                for callee, entry in ops.ROUTED_CALLS.items()
            },
            "CALLEE_RETURNS": {
                callee: entry["callee_returns"]
                for callee, entry in ops.ROUTED_CALLS.items()
            },
        },
    }


def _inplace_cases(text: str) -> dict[str, int]:
    """op -> its number of cases in the in-place test: the product of the
    sizes of the dimensions its `@_cases(op, *dims)` names (a module-level
    tuple by name, or a tuple literal)."""
    tree = ast.parse(text)
    sizes = {
        node.targets[0].id: len(node.value.elts)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Tuple)
    }
    cases = {}
    for node in tree.body:
        for d in getattr(node, "decorator_list", []):
            if isinstance(d, ast.Call) and ast.unparse(d.func) == "_cases":
                op, *dims = d.args
                cases[ast.literal_eval(op)] = math.prod(
                    sizes[x.id] if isinstance(x, ast.Name) else len(x.elts)
                    for x in dims
                )
    return cases


def _region_lines(text: str, ops_kept: set[str]) -> int:
    """Lines of the in-place test as the cut writes it for a tree using
    `ops_kept`: the regions of the other ops' cases dropped, and the
    markers. (Regions of code several ops share are kept.)"""
    region = re.compile(r"^\s*# xpufakes: (\S+) (begin|end)$")
    keep = {f"op-{op.partition('::')[2]}" for op in ops_kept}
    keep |= {
        tag
        for tag, used in ops.SHARED_TEST_TAGS.items()
        if {f"{ops.XPU_C}::{g}" for g in used} & ops_kept
    }
    keep |= (
        {tag for tag in re.findall(r"# xpufakes: (\S+) begin", text)}
        - {f"op-{g}" for g in ops.XPU_C_GEMMS}
        - set(ops.SHARED_TEST_TAGS)
    )  # the wrapper's region
    lines, dropping = 0, []
    for line in text.splitlines():
        match = region.match(line)
        if match:
            tag, edge = match.groups()
            if edge == "begin" and tag not in keep:
                dropping.append(tag)
            elif edge == "end" and dropping and dropping[-1] == tag:
                dropping.pop()
            continue
        lines += not dropping
    return lines


def doc_facts(repo: Path) -> dict[str, str]:
    """KEY -> the text of each marked place of DOCUMENTS: the in-place
    cut's test on DOC_RELEASE, the ops the test has cases for that the
    release's vllm-xpu-kernels has (and vLLM's own wrapper ops)."""
    text = (repo / INPLACE_TEST).read_text()
    kernels = pins.load().get(DOC_RELEASE).kernels.split()[-1]
    has = {
        op["name"]
        for op in ops.FAKES
        if op["era"] == pins.KERNELS
        and pins.version_tuple(op["since"]) <= pins.version_tuple(kernels)
    } | set(ops.WRAPPERS)
    cases = {op: n for op, n in _inplace_cases(text).items() if op in has}
    return {
        "release": DOC_RELEASE,
        "inplace_aim": str(INPLACE_AIM),
        "inplace_test_lines": str(_region_lines(text, set(cases))),
        "inplace_cases": str(sum(cases.values())),
        "inplace_ops": str(len(cases)),
    }


def model_facts() -> dict[str, str]:
    """KEY -> the text of each `<!-- models:KEY -->` place: the catalog's
    entries and its distinct architectures (config.json's first)."""
    catalog = tomllib.loads((paths.DATA / "models.toml").read_text())
    architectures = {entry["config"]["architectures"][0] for entry in catalog.values()}
    return {"entries": str(len(catalog)), "architectures": str(len(architectures))}


# ---------------------------------------------------------------------------
# Python literals, formatted as ruff formats them
# ---------------------------------------------------------------------------


def _string(text: str, first: str, indent: str, tail: str) -> list[str]:
    """`text` as a string literal after `first` on its first line, split
    (implicit concatenation) after ", " where a line would pass LINE."""
    pieces = re.split(r"(?<=, )", text)
    lines, current, prefix = [], "", first
    for piece in pieces:
        if current and len(prefix) + len(repr(current + piece)) + len(tail) > LINE:
            lines.append(prefix + _quoted(current))
            current, prefix = "", indent
        current += piece
    lines.append(prefix + _quoted(current) + tail)
    return lines


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scalar(value: object) -> str:
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, tuple):
        inner = ", ".join(_scalar(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def literal(value: object) -> str:
    """A dict literal, one entry a line (ruff's magic trailing comma), a
    long string split, a long tuple one element a line (a long string
    element split); anything else as one scalar."""
    if not isinstance(value, dict):
        return _scalar(value)
    lines = ["{"]
    for key, item in value.items():
        head = f"    {_quoted(key)}: "
        one = head + _scalar(item) + ","
        if len(one) <= LINE:
            lines.append(one)
        elif isinstance(item, str):
            lines.extend(_string(item, head, "    ", ","))
        elif isinstance(item, tuple):
            lines.append(head + "(")
            for v in item:
                element = f"        {_scalar(v)},"
                if len(element) <= LINE or not isinstance(v, str | tuple):
                    lines.append(element)
                elif isinstance(v, tuple):  # one element a line, one level
                    lines.append("        (")
                    lines += [f"            {_scalar(x)}," for x in v]
                    lines.append("        ),")
                else:
                    lines.extend(_string(v, "        ", "        ", ","))
            lines.append("    ),")
        else:
            raise ValueError(f"{key}: no layout for {item!r}")
    lines.append("}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Rewriting
# ---------------------------------------------------------------------------


def _assignment(tree: ast.Module, name: str) -> ast.expr:
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                if node.value is None:
                    break
                return node.value
    raise Refusal(f"no module-level assignment of {name} to write")


def rewrite_python(text: str, values: dict[str, object]) -> str:
    """`text` with each named module-level assignment's value replaced by
    its literal (by AST position; everything else kept byte for byte)."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = []
    tree = ast.parse(text)
    for name, value in values.items():
        node = _assignment(tree, name)
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        spans.append((begin, end, literal(value)))
    for begin, end, new in sorted(spans, reverse=True):
        text = text[:begin] + new + text[end:]
    return text


def expected(repo: Path) -> dict[str, Callable[[str], str]]:
    """file -> what the generator makes of its text."""
    rewriters: dict[str, Callable[[str], str]] = {
        path: (lambda text, v=values: rewrite_python(text, v))
        for path, values in python_values().items()
    }
    known = doc_facts(repo)
    for name in DOCUMENTS:
        rewriters[name] = lambda text: pinfacts.rewrite(text, known, "ops")
    catalog = model_facts()
    for name in MODEL_DOCUMENTS:
        rewriters[name] = lambda text: pinfacts.rewrite(text, catalog, "models")
    return rewriters


def write(repo: Path = paths.REPO) -> list[str]:
    """Rewrite every generated place; the files changed."""
    new = {}
    for name, rewrite in expected(repo).items():  # all made before one is written
        text = (repo / name).read_text()
        if rewrite(text) != text:
            new[name] = rewrite(text)
    for name, text in new.items():
        (repo / name).write_text(text)
    return list(new)
