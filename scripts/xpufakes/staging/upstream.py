"""The upstream cut: the overlay files as a vLLM pull request carries them
into one given tree, derived from the one canonical source in vllm_overlay/.

The packager's series (`make export`, `make apply`) ships the overlay as it
is, for every release of both eras. A pull request carries only what its
tree uses, in vLLM's conventions. The cut is a transformation of the source:

* regions marked ``# xpufakes: <tag> begin`` / ``# xpufakes: <tag> end`` are
  dropped when the tree does not use them (``ipex-only`` in the kernels era);
  the marker lines themselves never go upstream;
* module-level definitions that nothing kept refers to are pruned (AST
  reachability from what the tree's files use), with the dict entries and
  imports only they needed: the IPEX fakes and reference kernels in the
  kernels era;
* vllm-xpu-kernels version gating is folded to constants when the tree pins
  one kernels release (``_kernel_has("<feature>")``);
* ``getattr(torch, "<dtype>", None)`` shims become ``torch.<dtype>`` when
  every torch the tree supports has the dtype;
* vllm/ modules log through ``vllm.logger.init_logger``.
"""

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import kernels, recipes
from xpufakes.trees import pins

MARKER = re.compile(r"^[ \t]*# xpufakes: ([a-z0-9_-]+) (begin|end)[ \t]*\n?$")

# torch release that first has a dtype the fakes look up with getattr.
TORCH_DTYPE_SINCE = {
    "float8_e8m0fnu": (2, 7),
    "float4_e2m1fn_x2": (2, 8),
}

# The gating helper of vllm/_xpu_gemm_fakes.py and its feature table.
KERNEL_GATE = "_kernel_has"
KERNEL_FEATURES = "_KERNEL_FEATURES"


@dataclass(frozen=True)
class Target:
    """What the tree uses: its era, the one vllm-xpu-kernels release it
    pins (None: not pinned to one), the oldest torch it supports."""

    era: str
    kernels: tuple[int, ...] | None = None
    torch: tuple[int, ...] | None = None

    @property
    def unused_tags(self) -> set[str]:
        return {"ipex-only"} if self.era == "kernels" else set()

    @property
    def unused_namespaces(self) -> tuple[str, ...]:
        return ("torch_ipex",) if self.era == "kernels" else ()


def pinned(requirements: str, package: str) -> tuple[int, ...] | None:
    """The release a requirements file pins `package` to, as numbers
    (kernels.pinned_release), or None."""
    release = kernels.pinned_release(requirements, package)
    found = pins.split_version(release) if release else None
    return found[0] if found else None


def target_of(root: Path, era: str) -> Target:
    xpu = root / "requirements" / "xpu.txt"
    text = xpu.read_text() if xpu.is_file() else ""
    return Target(era, pinned(text, "vllm-xpu-kernels"), pinned(text, "torch"))


# ---------------------------------------------------------------------------
# Marked regions
# ---------------------------------------------------------------------------


def strip_regions(text: str, drop: set[str]) -> str:
    """Drop the regions tagged with one of `drop`, and every marker line."""
    out: list[str] = []
    dropping: list[str] = []
    for line in text.splitlines(keepends=True):
        match = MARKER.match(line)
        if match:
            tag, edge = match.groups()
            if edge == "begin" and tag in drop:
                dropping.append(tag)
            elif edge == "end" and dropping and dropping[-1] == tag:
                dropping.pop()
            continue
        if not dropping:
            out.append(line)
    if dropping:
        raise ValueError(f"unclosed `# xpufakes: {dropping[-1]} begin`")
    return "".join(out)


# ---------------------------------------------------------------------------
# Source edits by AST position
# ---------------------------------------------------------------------------


def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _span(text: str, node: ast.AST) -> tuple[int, int]:
    starts = _offsets(text)
    return (
        starts[node.lineno - 1] + _col(text, starts, node.lineno, node.col_offset),
        starts[node.end_lineno - 1]
        + _col(text, starts, node.end_lineno, node.end_col_offset),
    )


def _col(text: str, starts: list[int], lineno: int, byte_col: int) -> int:
    """ast columns are UTF-8 byte offsets; convert to characters."""
    line = text[starts[lineno - 1] : starts[lineno]]
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _replace(text: str, node: ast.AST, new: str) -> str:
    start, end = _span(text, node)
    return text[:start] + new + text[end:]


def first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def delete_lines(lines: list[str], first: int, last: int) -> None:
    """Delete lines first..last (1-based) and the comment lines directly
    above them."""
    start = first - 1
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        if _is_banner(lines, start - 1):
            break
        start -= 1
    del lines[start:last]


def _is_banner(lines: list[str], i: int) -> bool:
    return lines[i].startswith("# ---")


def tidy(text: str) -> str:
    """Drop section banners left without content and runs of blank lines a
    deletion left (at most two)."""
    lines = text.splitlines(keepends=True)
    changed = True
    while changed:
        changed = False
        for i, line in enumerate(lines):
            if not line.startswith("# ---"):
                continue
            j = i + 1
            while (
                j < len(lines) and lines[j].startswith("# ") and "---" not in lines[j]
            ):
                j += 1
            if j == i + 1 or j == len(lines) or not lines[j].startswith("# ---"):
                continue
            j += 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j == len(lines) or lines[j].startswith("# ---"):
                del lines[i:j]
                changed = True
                break
    out: list[str] = []
    for line in lines:
        blank_run = len(out) >= 2 and not out[-1].strip() and not out[-2].strip()
        if not line.strip() and blank_run:
            continue
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return "".join(out).rstrip("\n")


# ---------------------------------------------------------------------------
# Reachability pruning
# ---------------------------------------------------------------------------


def defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return set()


def _used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _drop_dict_entries(text: str, namespaces: tuple[str, ...]) -> str:
    """Remove the entries of module-level dict literals keyed by an op of an
    unused namespace ("ns::op" or ("ns", ...))."""
    if not namespaces:
        return text

    def unused(key: ast.expr | None) -> bool:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value.split("::")[0] in namespaces and "::" in key.value
        if isinstance(key, ast.Tuple) and key.elts:
            first = key.elts[0]
            return isinstance(first, ast.Constant) and first.value in namespaces
        return False

    lines = text.splitlines(keepends=True)
    spans = []
    for node in ast.parse(text).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict):
            for key, item in zip(value.keys, value.values, strict=True):
                if unused(key):
                    spans.append((key.lineno, item.end_lineno))
    for first, last in sorted(spans, reverse=True):
        delete_lines(lines, first, last)
    return "".join(lines)


def prune(text: str, roots: set[str]) -> str:
    """Remove module-level definitions (and imports) that neither `roots`
    nor the module's other statements reach."""
    while True:
        body = ast.parse(text).body
        definitions = [n for n in body if defined(n)]
        keep = set(roots)
        for node in body:
            if not defined(node) and not is_docstring(node):
                keep |= _used(node)
        todo = list(keep)
        while todo:
            name = todo.pop()
            for node in definitions:
                if name in defined(node) and not isinstance(
                    node, (ast.Import, ast.ImportFrom)
                ):
                    for used in _used(node) - keep:
                        keep.add(used)
                        todo.append(used)
            # a function entered in a kept table by its decorator is kept
            for node in definitions:
                if (
                    isinstance(node, ast.FunctionDef)
                    and node.name not in keep
                    and any(_used(d) & keep for d in _tables_of(node))
                ):
                    keep.add(node.name)
                    todo.append(node.name)
        dead = [n for n in definitions if not (defined(n) & keep)]
        if not dead:
            return tidy(text) + "\n"  # _tidy strips the final newline too
        lines = text.splitlines(keepends=True)
        for node in sorted(dead, key=lambda n: n.lineno, reverse=True):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and len(node.names) > 1:
                kept = [a for a in node.names if (a.asname or a.name) in keep]
                if kept:
                    node.names = kept
                    lines[node.lineno - 1 : node.end_lineno] = [
                        ast.unparse(node) + "\n"
                    ]
                    continue
            delete_lines(lines, first_line(node), node.end_lineno)
        text = "".join(lines)


def _tables_of(function: ast.FunctionDef) -> list[ast.expr]:
    """The tables a decorator enters the function in: the first argument of
    each decorator call (``@_fake_of(XPU_GEMM_FAKES, schema)``)."""
    return [
        d.args[0] for d in function.decorator_list if isinstance(d, ast.Call) and d.args
    ]


def is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


# ---------------------------------------------------------------------------
# Folding the kernels' version gates and torch compatibility shims
# ---------------------------------------------------------------------------


def _features(text: str) -> dict[str, tuple[int, ...]]:
    for node in ast.parse(text).body:
        targets = defined(node) if isinstance(node, (ast.Assign, ast.AnnAssign)) else ()
        if KERNEL_FEATURES in targets and node.value is not None:
            table = ast.literal_eval(node.value)
            return {name: since for name, (since, _) in table.items()}
    return {}


def _fold(node: ast.expr, text: str, gate: Callable[[str], bool | None]):
    """(constant or None, source) of a condition with the gates folded."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == KERNEL_GATE
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
    ):
        value = gate(node.args[0].value)
        if value is not None:
            return value, repr(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value, source = _fold(node.operand, text, gate)
        if value is not None:
            return (not value), repr(not value)
    if isinstance(node, ast.BoolOp):
        neutral = isinstance(node.op, ast.And)
        parts = []
        for operand in node.values:
            value, source = _fold(operand, text, gate)
            if value is None:
                parts.append(source)
            elif value != neutral:
                return value, repr(value)
        if not parts:
            return neutral, repr(neutral)
        joiner = " and " if neutral else " or "
        return None, joiner.join(parts)
    return None, ast.get_source_segment(text, node)


def fold_kernel_gates(text: str, kernels: tuple[int, ...] | None) -> str:
    if kernels is None:
        return text
    since = _features(text)

    def gate(feature: str) -> bool | None:
        return kernels >= since[feature] if feature in since else None

    while True:
        module = ast.parse(text)
        alone = {
            id(block[0])
            for parent in ast.walk(module)
            for block in (getattr(parent, "body", None),)
            if isinstance(block, list) and len(block) == 1
        }
        for node in ast.walk(module):
            if not isinstance(node, ast.If) or node.orelse:
                continue
            if KERNEL_GATE not in ast.get_source_segment(text, node.test):
                continue
            value, source = _fold(node.test, text, gate)
            lines = text.splitlines(keepends=True)
            if value is False and id(node) in alone:  # the block must not be empty
                lines[node.lineno - 1 : node.end_lineno] = [
                    " " * node.col_offset + "pass\n"
                ]
                text = "".join(lines)
            elif value is False:
                delete_lines(lines, node.lineno, node.end_lineno)
                text = "".join(lines)
            elif value is True:
                body = lines[node.body[0].lineno - 1 : node.end_lineno]
                indent = node.body[0].col_offset - node.col_offset
                lines[node.lineno - 1 : node.end_lineno] = [
                    line[indent:] if line.strip() else line for line in body
                ]
                text = "".join(lines)
            elif source != ast.get_source_segment(text, node.test):
                text = _replace(text, node.test, source)
            else:
                continue
            break
        else:
            return text


def drop_torch_shims(text: str, torch: tuple[int, ...] | None) -> str:
    """getattr(torch, "<dtype>", None) -> torch.<dtype> where every torch
    the tree supports has it."""
    if torch is None:
        return text
    while True:
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) == 3
                and ast.unparse(node.args[0]) == "torch"
                and isinstance(node.args[1], ast.Constant)
                and torch >= TORCH_DTYPE_SINCE.get(node.args[1].value, (99,))
            ):
                text = _replace(text, node, f"torch.{node.args[1].value}")
                break
        else:
            return _drop_stale_comments(text)


def _drop_stale_comments(text: str) -> str:
    return text.replace("# Absent from older torch releases.\n", "")


# ---------------------------------------------------------------------------
# vLLM conventions
# ---------------------------------------------------------------------------


def drop_docstring_items(text: str, namespaces: tuple[str, ...]) -> str:
    """Drop the bullet items of the module docstring that are about an
    unused namespace, and the note on what the module imports (the cut
    imports vllm.logger)."""
    node = ast.parse(text).body[0]
    if not is_docstring(node):
        return text
    lines = text.splitlines(keepends=True)
    first, last = node.lineno - 1, node.end_lineno
    doc, out, item = lines[first:last], [], []

    def flush() -> None:
        if not any(f"``{ns}``" in "".join(item) for ns in namespaces):
            out.extend(item)
        item.clear()

    for line in doc:
        if line.startswith("* ") or (item and line.startswith("  ")):
            if line.startswith("* "):
                flush()
            item.append(line)
            continue
        flush()
        if not line.startswith("This module imports only"):
            out.append(line)
    flush()
    while len(out) > 1 and not out[-2].strip():  # a blank line before the end
        del out[-2]
    lines[first:last] = out
    return "".join(lines)


def use_vllm_logger(text: str) -> str:
    """A vllm/ module logs through vllm.logger.init_logger."""
    old = "logger = logging.getLogger(__name__)"
    if old not in text or "from vllm.logger import init_logger" in text:
        return text
    text = text.replace(old, "logger = init_logger(__name__)")
    body = ast.parse(text).body
    imports = [
        n
        for n in body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and not (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vllm"))
    ]
    lines = text.splitlines(keepends=True)
    at = imports[-1].end_lineno
    lines[at:at] = ["\n", "from vllm.logger import init_logger\n"]
    text = "".join(lines)
    if "logging." not in text.replace("import logging\n", ""):
        text = text.replace("import logging\n", "", 1)
    return text


# ---------------------------------------------------------------------------
# The cut of each file
# ---------------------------------------------------------------------------


def _attributes_of(text: str, alias: str) -> set[str]:
    return {
        n.attr
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == alias
    }


def _imported_from(text: str, module: str) -> set[str]:
    return {
        a.name
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.ImportFrom) and n.module == module
        for a in n.names
    }


def for_target(text: str, target: Target) -> str:
    """A kernels-era overlay file as the tree uses it: without the entries of
    the namespaces it does not use, its kernels pin folded in, without the
    shims for torch releases it does not support (marked regions are
    already stripped)."""
    text = _drop_dict_entries(text, target.unused_namespaces)
    text = fold_kernel_gates(text, target.kernels)
    return drop_torch_shims(text, target.torch)


def cut(files: dict[str, str], target: Target) -> dict[str, str]:
    """The upstream cut of the overlay files `files` (path -> canonical
    text), given the tree's edited files among `files` too (they are only
    read, to see what they use)."""
    out = {p: strip_regions(t, target.unused_tags) for p, t in files.items()}
    if target.era != "kernels":
        for path in out:
            if path.startswith("vllm/") and path in _overlay_paths():
                out[path] = use_vllm_logger(drop_docstring_items(out[path], ()))
        return out
    others = "\n".join(t for p, t in out.items())
    roots = {
        recipes.FAKES_MODULE: (
            _attributes_of(others, "fakes")
            | _imported_from(others, "vllm._xpu_gemm_fakes")
        ),
        recipes.TREE_TEST_REFERENCE: _attributes_of(others, "reference"),
    }
    for path, names in roots.items():
        if path not in out:
            continue
        text = drop_docstring_items(out[path], target.unused_namespaces)
        out[path] = prune(for_target(text, target), names)
    if recipes.FAKES_MODULE in out:
        text = drop_docstring_items(out[recipes.FAKES_MODULE], ())
        out[recipes.FAKES_MODULE] = use_vllm_logger(text)
    return out


def _overlay_paths() -> set[str]:
    return {p for rs in recipes.RECIPES.values() for r in rs for p in r.overlay}


# ---------------------------------------------------------------------------
# The tree's Intel CI: a step that runs the new test on an XPU
# ---------------------------------------------------------------------------

INTEL_KERNEL_JOBS = ".buildkite/intel_jobs/kernels_intel.yaml"
CI_STEP_KEY = "xpu-gemm-fake-kernel-tests"


def add_intel_ci_step(text: str, test: str, sources: list[str]) -> str:
    """Append to an Intel kernels job file a step that runs `test` on an
    XPU when one of `sources` changes, copied from the file's first step
    (its agents, environment and test runner)."""
    steps = [m.start() for m in re.finditer(r"^- label:", text, re.M)]
    if not steps:
        raise ValueError("no `- label:` step to copy")
    end = steps[1] if len(steps) > 1 else len(text)
    step = text[steps[0] : end].rstrip("\n") + "\n"
    runner = re.search(r"^(\s+)(bash \S*run-intel-test\.sh)\s*$", step, re.M)
    deps = re.search(r"^(\s*)source_file_dependencies:\n((?:\1\s+- .*\n)+)", step, re.M)
    commands = re.search(r"^(\s*)commands:\n", step, re.M)
    if not (runner and deps and commands and re.search(r"^\s*key:", step, re.M)):
        raise ValueError(
            "the first step has no key, source_file_dependencies or runner"
        )
    indent = deps.group(1)
    item = re.match(r"(\s+- )", deps.group(2)).group(1)
    step = re.sub(
        r'^(-?\s*label: )"(.*)"',
        lambda m: (
            f'{m.group(1)}"{_label_prefix(m.group(2))}XPU GEMM Fake Kernel Tests"'
        ),
        step,
        count=1,
        flags=re.M,
    )
    step = re.sub(r"^(\s*key:).*$", rf"\1 {CI_STEP_KEY}", step, count=1, flags=re.M)
    listed = "".join(f"{item}{path}\n" for path in sources)
    step = step.replace(
        deps.group(0), f"{indent}source_file_dependencies:\n{listed}", 1
    )
    body = step[: step.index(commands.group(0))]
    pad = runner.group(1)
    run = test.removeprefix("tests/")
    body += (
        f"{commands.group(1)}commands:\n"
        f"{commands.group(1)}  - >-\n"
        f"{pad}{runner.group(2)}\n"
        f"{pad}'cd tests &&\n"
        f"{pad}pytest -v -s {run}'\n"
    )
    return text.rstrip("\n") + "\n\n" + body


def _label_prefix(label: str) -> str:
    """`:intel: (BMG) ` of `:intel: (BMG) UVA Kernel Tests`."""
    match = re.match(r"(.*\)\s*)", label)
    return match.group(1) if match else ""
