"""The in-place cut: the fix as a vLLM reviewer takes it, the fakes of
vllm/_xpu_ops.py corrected where they stand (`make stage`'s default; `FULL=1`
gives upstream.py's cut of the whole overlay).

Derived from the same source as the packager's series, the canonical fakes
of vllm_overlay/vllm/_xpu_gemm_fakes.py, after upstream.py's transformations
for the tree (its vllm-xpu-kernels pin folded in, torch shims dropped):

* each `if hasattr(torch.ops._xpu_C, "<gemm>"):` block of vllm/_xpu_ops.py
  keeps its place and its fake's signature; the fake's body becomes the
  canonical fake's, its parameters renamed to the tree's. A GEMM the tree
  calls without a fake gets a block of its own after the others;
* the helpers those bodies use (the oneDNN GEMMs' output rule and their input
  checks) go once before the first block, with the imports they need;
* vLLM's own ops that return a GEMM's output unchanged (vllm::xpu_fp8_bmm)
  get that GEMM's canonical fake body, as a commit of their own;
* the new test is vllm_overlay/in-place/tests/kernels/quantization/
  test_xpu_gemm_fakes.py, with the cases of the ops the tree uses (its
  ``# xpufakes: op-<gemm>`` / ``xpu-fp8-bmm`` regions), run on an XPU by a
  step of the tree's Intel CI.

Only the ops the tree uses: those it has a fake block for and those its code
calls (a GEMM called only inside a wrapper op is the wrapper's business).
Text is formatted with the tree's own ruff (`formatter`).
"""

import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import recipes
from xpufakes.common import ops, paths
from xpufakes.staging import prtext, upstream
from xpufakes.trees import tree

XPU_OPS = "vllm/_xpu_ops.py"
TEST_SOURCE = Path("in-place") / recipes.TREE_TEST  # under vllm_overlay/
WRAPPER_TAG = "xpu-fp8-bmm"


class CutError(Exception):
    """The tree's vllm/_xpu_ops.py is not shaped as the cut expects."""


@dataclass
class Commit:
    subject: str
    body: str
    files: dict[str, str]  # path -> new text


Formatter = Callable[[str], str]


# ---------------------------------------------------------------------------
# What the tree uses
# ---------------------------------------------------------------------------


def _wrapper(fake: str) -> ops.Wrapper:
    """The wrapper op whose fake function is `fake`."""
    return next(w for w in ops.WRAPPERS.values() if w.fake == fake)


def _wrapper_impls() -> set[str]:
    return {w.impl for w in ops.WRAPPERS.values()}


def called_gemms(sources: dict[str, str]) -> set[str]:
    """The _xpu_C GEMMs the tree's code calls, outside the wrapper ops'
    implementations (whose fake is the wrapper's)."""
    found: set[str] = set()
    skip = _wrapper_impls()

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = inside or (
                isinstance(child, ast.FunctionDef) and child.name in skip
            )
            if isinstance(child, ast.Call) and not inner:
                gemm = ops.xpu_c_gemm_of(ast.unparse(child.func))
                if gemm:
                    found.add(gemm)
            visit(child, inner)

    for text in sources.values():
        if ops.calls_xpu_c_gemms(text):
            try:
                visit(ast.parse(text), False)
            except SyntaxError:
                continue
    return found


def _blocks(body: list[ast.stmt]) -> dict[str, ast.If]:
    return {recipes.xpu_c_gemm_guard(n): n for n in body if recipes.xpu_c_gemm_guard(n)}


def gemms_of(ops_text: str, sources: dict[str, str]) -> list[str]:
    """The GEMMs to fix: those with a fake block (in file order), then those
    the code calls without one (in ops.XPU_C_GEMMS order)."""
    blocks = list(_blocks(ast.parse(ops_text).body))
    called = called_gemms(sources)
    return blocks + [g for g in ops.XPU_C_GEMMS if g in called - set(blocks)]


def wrappers_of(ops_text: str) -> list[str]:
    """The wrapper ops' fakes the tree has (ops.WRAPPERS)."""
    names = {n.name for n in ast.parse(ops_text).body if isinstance(n, ast.FunctionDef)}
    return [w.fake for w in ops.WRAPPERS.values() if w.fake in names]


# ---------------------------------------------------------------------------
# The canonical fakes
# ---------------------------------------------------------------------------


FAKE_DECORATOR = "_fake_of"


def _canonical_fakes(canonical: str) -> dict[str, str]:
    """gemm -> the name of its fake in the canonical module (the function
    that `@_fake_of(XPU_GEMM_FAKES, "_xpu_C::<gemm>(...")` decorates)."""
    table = {}
    for node in ast.parse(canonical).body:
        for decorator in _fake_decorators(node):
            table_name, schema = decorator.args[0], decorator.args[1]
            if ast.unparse(table_name) == "XPU_GEMM_FAKES":
                qualname = ast.literal_eval(schema).partition("(")[0]
                table[qualname.split("::")[1]] = node.name
    if not table:
        raise CutError("the canonical module has no fake of an _xpu_C GEMM")
    return table


def _fake_decorators(node: ast.stmt) -> list[ast.Call]:
    if not isinstance(node, ast.FunctionDef):
        return []
    return [
        d
        for d in node.decorator_list
        if isinstance(d, ast.Call) and ast.unparse(d.func) == FAKE_DECORATOR
    ]


def without_registration(canonical: str) -> str:
    """The canonical module without its fakes' `@_fake_of(...)` decorators:
    vLLM's module registers the fakes its own way."""
    lines = canonical.splitlines(keepends=True)
    spans = [
        (d.lineno - 1, d.end_lineno)
        for node in ast.parse(canonical).body
        for d in _fake_decorators(node)
    ]
    for first, last in sorted(spans, reverse=True):
        del lines[first:last]  # "@" + the call, from its first line
    return "".join(lines)


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}


def _header_end(function: ast.FunctionDef) -> int:
    """The last line of `def ...:` (1-based)."""
    if function.returns is not None:
        return function.returns.end_lineno
    return function.body[0].lineno - 1


def renamed_body(
    text: str, function: ast.FunctionDef, names: list[str], indent: str
) -> str:
    """The source of the function's body (below its `def ...:` line, comments
    included), its parameters renamed to `names` (by position), indented by
    `indent`."""
    params = [a.arg for a in function.args.args]
    if len(params) != len(names):
        raise CutError(
            f"takes {len(names)} parameters, the canonical {function.name} "
            f"{len(params)}"
        )
    mapping = dict(zip(params, names, strict=True))
    others = {
        n.id
        for stmt in function.body
        for n in ast.walk(stmt)
        if isinstance(n, ast.Name) and n.id not in mapping
    }
    if clash := others & set(names):
        raise CutError(f"a parameter is named like {sorted(clash)[0]!r} of the fake")
    lines = text.splitlines(keepends=True)
    first, last = _header_end(function), function.end_lineno
    spots: dict[int, list[ast.Name]] = {}
    for stmt in function.body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and n.id in mapping:
                spots.setdefault(n.lineno, []).append(n)
    out = []
    for number in range(first + 1, last + 1):
        line = lines[number - 1]
        for n in sorted(spots.get(number, []), key=lambda n: -n.col_offset):
            line = line[: n.col_offset] + mapping[n.id] + line[n.end_col_offset :]
        out.append(line)
    body = _reindent("".join(out), function.body[0].col_offset, indent)
    _same_code(text, function, body, mapping)
    return body


def _reindent(text: str, old: int, indent: str) -> str:
    return "".join(
        indent + line[old:] if line.strip() else line
        for line in text.splitlines(keepends=True)
    )


def _same_code(
    text: str, function: ast.FunctionDef, body: str, mapping: dict[str, str]
) -> None:
    """The renamed body parses to the canonical body with the names mapped
    (a check on the renaming by source positions)."""
    expected = ast.parse(ast.get_source_segment(text, function))
    for n in ast.walk(expected):
        if isinstance(n, ast.Name) and n.id in mapping:
            n.id = mapping[n.id]
    got = ast.parse("def f():\n" + _reindent(body, _indent_of(body), "    "))
    want = [ast.dump(s) for s in expected.body[0].body]
    if [ast.dump(s) for s in got.body[0].body] != want:
        raise CutError(f"renaming the parameters of {function.name} failed")


def _indent_of(text: str) -> int:
    line = next(ln for ln in text.splitlines() if ln.strip())
    return len(line) - len(line.lstrip())


def _is_check(node: ast.stmt) -> bool:
    """A statement that only checks input: `_check...(...)`, `torch._check(...)`."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    name = ast.unparse(node.value.func)
    return name.startswith("_check") or name == "torch._check"


def _slim_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that compute the result: without input checks, `if`
    blocks left empty by that, and assignments nothing kept reads."""
    kept = []
    for node in body:
        if _is_check(node):
            continue
        empty_if = isinstance(node, ast.If) and not node.orelse
        if empty_if and not _slim_statements(node.body):
            continue
        kept.append(node)
    while True:
        used = {
            n.id
            for node in kept
            for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        dead = [
            n
            for n in kept
            if isinstance(n, ast.Assign)
            and all(isinstance(t, ast.Name) and t.id not in used for t in n.targets)
        ]
        if not dead:
            return kept
        kept = [n for n in kept if n not in dead]


def slim(text: str, names: set[str]) -> str:
    """The module with the functions `names` reduced to what computes their
    result (the output rule): their own input checks are left to the
    kernels (the packager's module keeps them). A final `x = <expr>;
    return x` becomes `return <expr>`."""
    lines = text.splitlines(keepends=True)
    functions = [f for f in _functions(text).values() if f.name in names]
    for function in sorted(functions, key=lambda f: f.lineno, reverse=True):
        kept = _slim_statements(function.body)
        chunks = [
            lines[_above(lines, node.lineno) - 1 : node.end_lineno] for node in kept
        ]
        if (
            len(kept) > 1
            and isinstance(kept[-1], ast.Return)
            and isinstance(kept[-2], ast.Assign)
            and kept[-1].value is not None
            and ast.unparse(kept[-1].value) == ast.unparse(kept[-2].targets[0])
        ):
            comments = chunks[-2][: kept[-2].lineno - _above(lines, kept[-2].lineno)]
            value = ast.get_source_segment(text, kept[-2].value)
            indent = " " * kept[-1].col_offset
            chunks[-2:] = [[*comments, f"{indent}return {value}\n"]]
        lines[_header_end(function) : function.end_lineno] = [
            line for chunk in chunks for line in chunk
        ]
    return "".join(lines)


def helpers(canonical: str, roots: set[str]) -> tuple[str, list[ast.stmt]]:
    """(the module-level definitions the functions `roots` use, without
    them, as source; the import statements they need)."""
    text = upstream.prune(canonical, roots)
    module = ast.parse(text)
    lines = text.splitlines(keepends=True)
    imports = [n for n in module.body if isinstance(n, ast.Import | ast.ImportFrom)]
    drop = [
        n
        for n in module.body
        if n in imports
        or upstream.is_docstring(n)
        or (isinstance(n, ast.FunctionDef) and n.name in roots)
    ]
    for node in sorted(drop, key=lambda n: n.lineno, reverse=True):
        upstream.delete_lines(lines, upstream.first_line(node), node.end_lineno)
    kept = [ln for ln in lines if not ln.startswith("# ---")]
    # a banner's title lines, now between blank lines
    out = []
    for i, line in enumerate(kept):
        alone = (i == 0 or not kept[i - 1].strip()) and (
            i + 1 == len(kept) or not kept[i + 1].strip()
        )
        if not (line.startswith("# ") and alone):
            out.append(line)
    return upstream.tidy("".join(out)).strip("\n") + "\n", imports


# ---------------------------------------------------------------------------
# vllm/_xpu_ops.py
# ---------------------------------------------------------------------------


def _module_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        names |= upstream.defined(node)
        if isinstance(node, ast.If | ast.Try):
            names |= _module_names(node.body + getattr(node, "orelse", []))
    return names


def _register_fake_name(body: list[ast.stmt]) -> bool:
    return "register_fake" in _module_names(body)


def _binds(node: ast.stmt) -> set[tuple[str | None, str, str]]:
    """(module, name, bound as) of an import statement."""
    if isinstance(node, ast.Import):
        return {(None, a.name, a.asname or a.name) for a in node.names}
    return {(node.module, a.name, a.asname or a.name) for a in node.names}


def _is_stdlib(node: ast.stmt) -> bool:
    module = node.names[0].name if isinstance(node, ast.Import) else node.module
    return (module or "").split(".")[0] in sys.stdlib_module_names


def add_imports(text: str, imports: list[ast.stmt]) -> str:
    """The imports the tree's module lacks, where isort puts them: in the
    stdlib or third-party group, `import x` lines before `from x import`,
    sorted by module."""
    body = ast.parse(text).body
    have = set().union(
        *(_binds(n) for n in body if isinstance(n, ast.Import | ast.ImportFrom))
    )
    lines = text.splitlines(keepends=True)
    for node in imports:
        missing = _binds(node) - have
        if not missing:
            continue
        if isinstance(node, ast.ImportFrom):
            names = sorted(a for _, a, _ in missing)
            new = f"from {node.module} import {', '.join(names)}\n"
        else:
            new = "".join(
                f"import {m}" + (f" as {b}" if b != m else "") + "\n"
                for _, m, b in sorted(missing)
            )
        body = ast.parse("".join(lines)).body
        top = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
        group = [n for n in top if _is_stdlib(n) == _is_stdlib(node)]
        if not group:
            kind = "stdlib" if _is_stdlib(node) else "third-party"
            raise CutError(f"no {kind} imports to add {new.strip()!r} to")
        key = _sort_key(node)
        at = next((n for n in group if _sort_key(n) > key), None)
        index = at.lineno - 1 if at is not None else group[-1].end_lineno
        lines[index:index] = [new]
        have |= missing
    return "".join(lines)


def _sort_key(node: ast.stmt) -> tuple[int, str]:
    if isinstance(node, ast.Import):
        return (0, node.names[0].name)
    return (1, node.module or "")


def _above(lines: list[str], line: int) -> int:
    """The first line (1-based) of the comments directly above `line`."""
    while line > 1 and lines[line - 2].lstrip().startswith("#"):
        line -= 1
    return line


def _snippet(lines: list[str], first: int, last: int) -> str:
    return "".join(lines[first - 1 : last])


def fix_xpu_ops(
    text: str,
    canonical: str,
    gemms: list[str],
    wrappers: list[str],
    formatter: Formatter,
) -> str:
    """vllm/_xpu_ops.py with the fakes of `gemms` and the wrapper ops' fakes
    `wrappers` corrected in place."""
    fake_of = _canonical_fakes(canonical)
    canonical = without_registration(canonical)
    body = ast.parse(text).body
    if not _register_fake_name(body):
        raise CutError("no `register_fake` in vllm/_xpu_ops.py")
    blocks = _blocks(body)
    tree_functions = {n.name: n for n in body if isinstance(n, ast.FunctionDef)}
    roots = {fake_of[g] for g in gemms}
    roots |= {_wrapper(w).canonical for w in wrappers}
    canonical = slim(canonical, roots)
    functions = _functions(canonical)
    shared, imports = helpers(canonical, roots)
    if clash := _module_names(ast.parse(shared).body) & _module_names(body):
        raise CutError(f"vllm/_xpu_ops.py already defines {sorted(clash)[0]}")
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # replace lines first..last (1-based)
    for gemm, block in blocks.items():
        if gemm not in gemms:
            continue
        fake = next((n for n in block.body if isinstance(n, ast.FunctionDef)), None)
        if fake is None:
            raise CutError(f"the {gemm} block has no fake function")
        new = _snippet(lines, block.lineno, _header_end(fake))
        new += _body_for(canonical, functions[fake_of[gemm]], fake)
        new += _snippet(lines, fake.end_lineno + 1, block.end_lineno)
        edits.append((block.lineno, block.end_lineno, formatter(new)))
    last = max(blocks.values(), key=lambda b: b.end_lineno).end_lineno
    for gemm in reversed([g for g in gemms if g not in blocks]):
        new = _new_block(canonical, functions[fake_of[gemm]], gemm)
        edits.append((last + 1, last, "\n\n" + formatter(new)))
    for name in wrappers:
        wrapper = _wrapper(name)
        impl_name, gemm, canonical_name = wrapper.impl, wrapper.gemm, wrapper.canonical
        fake, impl = tree_functions[name], tree_functions.get(impl_name)
        if impl is None or not recipes.returns_gemm_unchanged(impl, gemm):
            raise CutError(
                f"{impl_name} no longer returns torch.ops._xpu_C.{gemm}(...) "
                f"unchanged; {name} needs a new look"
            )
        first = _above(lines, upstream.first_line(fake))
        new = _snippet(lines, first, _header_end(fake))
        new += _body_for(canonical, functions[canonical_name], fake)
        edits.append((first, fake.end_lineno, formatter(new)))
    at = _above(lines, min(b.lineno for b in blocks.values()))
    blank = len(lines[: at - 1]) - len(
        "".join(lines[: at - 1]).rstrip("\n").splitlines()
    )
    edits.append((at, at - 1, "\n" * max(0, 2 - blank) + formatter(shared) + "\n\n"))
    # bottom up; at one line, the replacement before the insertion above it
    for first, last, new in sorted(edits, reverse=True):
        lines[first - 1 : last] = [new]
    return add_imports("".join(lines), imports)


def _body_for(canonical: str, function: ast.FunctionDef, fake: ast.FunctionDef) -> str:
    names = [a.arg for a in fake.args.args]
    try:
        return renamed_body(canonical, function, names, " " * fake.body[0].col_offset)
    except CutError as e:
        raise CutError(f"{fake.name} {e}") from None


def _new_block(canonical: str, function: ast.FunctionDef, gemm: str) -> str:
    """`if hasattr(...)` block registering the canonical fake for a GEMM the
    tree calls without one (the canonical signature, vLLM's name)."""
    source = ast.get_source_segment(canonical, function)
    source = source.replace(f"def {function.name}(", f"def _{gemm}_fake(", 1)
    inner = "".join(
        "    " + line if line.strip() else line
        for line in source.splitlines(keepends=True)
    )
    return (
        f'if hasattr(torch.ops._xpu_C, "{gemm}"):\n\n'
        f'    @register_fake("_xpu_C::{gemm}")\n{inner}\n'
    )


# ---------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------


def test_text(gemms: list[str], wrappers: bool) -> str:
    source = (paths.OVERLAY / TEST_SOURCE).read_text()
    tags = set(re.findall(r"# xpufakes: ([a-z0-9_-]+) begin", source))
    keep = {f"op-{g}" for g in gemms}
    keep |= {t for t, used in ops.SHARED_TEST_TAGS.items() if set(used) & set(gemms)}
    if wrappers:
        keep.add(WRAPPER_TAG)
    return upstream.strip_regions(source, tags - keep)


# ---------------------------------------------------------------------------
# The tree's Intel CI: the test runs in the Intel quantization step
# ---------------------------------------------------------------------------

INTEL_QUANTIZATION_JOBS = ".buildkite/intel_jobs/quantization_intel.yaml"


def add_to_quantization_step(text: str, test: str, sources: list[str]) -> str:
    """The Intel quantization job file with `test` run by its `quantization`
    step (appended to its last pytest command) whenever one of `sources`
    changes (its source_file_dependencies)."""
    steps = [m.start() for m in re.finditer(r"^- label:", text, re.M)] + [len(text)]
    for start, end in zip(steps, steps[1:], strict=False):
        step = text[start:end]
        if re.search(r"^\s+key:\s*quantization\s*$", step, re.M):
            break
    else:
        raise ValueError("no step with `key: quantization`")
    deps = re.search(r"^(\s*)source_file_dependencies:\n((?:\1\s*- .*\n)+)", step, re.M)
    last = re.search(r"^([ \t]+)(?:&& )?(.*pytest .*)'[ \t]*$", step, re.M)
    if not (deps and last):
        raise ValueError("its step has no source_file_dependencies or pytest command")
    item = re.match(r"(\s*- )", deps.group(2)).group(1)
    listed = deps.group(2) + "".join(
        f"{item}{p}\n" for p in sources if f"- {p}\n" not in deps.group(2)
    )
    new = step.replace(deps.group(2), listed, 1)
    line = last.group(0)
    run = f"{last.group(1)}&& pytest -v -s {test}'"
    new = new.replace(line, line.rstrip().removesuffix("'") + "\n" + run, 1)
    return text[:start] + new + text[end:]


def ci_files(root: Path) -> dict[str, str]:
    """The tree's Intel CI with a step running the new test: in the Intel
    quantization step if there is one, else a step of its own in the Intel
    kernels jobs (upstream.add_intel_ci_step), else nothing."""
    sources = [XPU_OPS, recipes.TREE_TEST]
    quantization = root / INTEL_QUANTIZATION_JOBS
    if quantization.is_file():
        try:
            text = add_to_quantization_step(
                quantization.read_text(), recipes.TREE_TEST, sources
            )
            return {INTEL_QUANTIZATION_JOBS: text}
        except ValueError:
            pass
    kernels = root / upstream.INTEL_KERNEL_JOBS
    if kernels.is_file():
        try:
            text = upstream.add_intel_ci_step(
                kernels.read_text(), recipes.TREE_TEST, sources
            )
            return {upstream.INTEL_KERNEL_JOBS: text}
        except ValueError:
            pass
    # none shaped as expected: no CI change (the tree's test-tethering hook,
    # if it has one, says so)
    return {}


# ---------------------------------------------------------------------------
# The commits
# ---------------------------------------------------------------------------

SUBJECT = "[XPU] Fix the fake kernels of the _xpu_C quantized GEMMs"
HOW = """\
This corrects them where they stand. One helper follows the kernels'
allocator, check_and_create_output_tensor in csrc/xpu/onednn/
onednn_matmul.cpp: shape A.shape[:-1] + (N,), strides A.stride(i) / K * N,
float16 when out_dtype is None; and it makes that function's checks (2-D or
3-D input, batched weights, int4 weight in NT format) with the kernels'
messages, so that such input fails at trace time. Each fake calls it with
its op's output dtype (the int4 ones on the permuted copy of the input
they multiply when g_idx is given); the ops' other input checks (dtypes,
scales, bias) stay with the kernels. Fakes of: {ops}."""
TEST = """\
{test} runs opcheck (test_faketensor,
test_aot_dispatch_dynamic) on each op on an XPU, over 2-D, 3-D, transposed
and row-sliced inputs, NN and NT weights, bias and out_dtype=None{ci}."""
WRAPPER_SUBJECT = "[XPU] Give vllm::xpu_fp8_bmm the fake of _xpu_C::fp8_bmm"
WRAPPER_BODY = """\
vllm::xpu_fp8_bmm returns torch.ops._xpu_C.fp8_bmm's output as it is, but
its fake returns a new contiguous tensor. DeepSeek-V4 calls it on a
transposed [M, G, K] view, for which the kernel's output is laid out like
the input (strides A.stride(i) / K * N), not contiguous.

Its fake is now fp8_bmm's: the shared oneDNN output rule and the kernel's
checks. The test covers the op on 3-D and transposed inputs with NN and NT
weights."""


def _defects(gemms: list[str], missing: list[str]) -> str:
    """The packager's patch's list of the upstream fakes' defects (one
    source), for this tree: which GEMMs have no fake in it."""
    _, body = prtext.description(recipes.KERNELS_HEADER)
    intro, bullets, inductor = body.split("\n\n")[:3]
    kept = [b for b in re.split(r"\n(?= *- )", bullets) if "has no fake" not in b]
    if missing:
        verb = "has" if len(missing) == 1 else "have"
        kept.append(f"  - {', '.join(missing)} {verb} no fake.")
    return "\n\n".join([intro, "\n".join(kept), inductor])


@dataclass
class Cut:
    """The in-place cut of one tree: its commits, the GEMMs whose fakes it
    fixes (or adds: `missing`), the wrapper ops it fixes."""

    commits: list[Commit]
    gemms: list[str]
    missing: list[str]
    wrappers: list[str]

    @property
    def ops(self) -> list[str]:
        """The ops the validation checks, as verify-xpu names them."""
        wrapped = [
            op
            for op, gemm in ops.WRAPPER_OPS.items()
            if any(_wrapper(w).gemm == gemm.split("::")[1] for w in self.wrappers)
        ]
        return [f"_xpu_C::{g}" for g in self.gemms] + wrapped


def canonical_for(target: upstream.Target) -> str:
    text = (paths.OVERLAY / recipes.FAKES_MODULE).read_text()
    return upstream.for_target(upstream.strip_regions(text, target.unused_tags), target)


def cut(root: Path, formatter: Formatter, sources: dict[str, str] | None = None) -> Cut:
    """The in-place cut of the kernels-era checkout at root."""
    ops_text = (root / XPU_OPS).read_text()
    canonical = canonical_for(upstream.target_of(root, "kernels"))
    sources = sources if sources is not None else tree.python_sources(root)
    gemms = gemms_of(ops_text, sources)
    missing = [g for g in gemms if g not in _blocks(ast.parse(ops_text).body)]
    wrappers = wrappers_of(ops_text)
    tests = tree.locate(str(root)).receives(recipes.TREE_TEST)
    files = {XPU_OPS: fix_xpu_ops(ops_text, canonical, gemms, [], formatter)}
    ci = {}
    if tests:
        files[recipes.TREE_TEST] = test_text(gemms, False)
        ci = ci_files(root)
    files.update(ci)
    where = {
        INTEL_QUANTIZATION_JOBS: "; the Intel quantization CI step runs it",
        upstream.INTEL_KERNEL_JOBS: "; a new Intel kernels CI step runs it",
    }
    test = TEST.format(test=recipes.TREE_TEST, ci=next((where[p] for p in ci), ""))
    body = "\n\n".join(
        [
            _defects(gemms, missing),
            HOW.format(ops=", ".join(gemms)),
            *([test] if tests else []),
        ]
        + _links()
    )
    commits = [Commit(SUBJECT, _rewrap(body), files)]
    if wrappers:
        second = {XPU_OPS: fix_xpu_ops(ops_text, canonical, gemms, wrappers, formatter)}
        if tests:
            second[recipes.TREE_TEST] = test_text(gemms, True)
        commits.append(Commit(WRAPPER_SUBJECT, WRAPPER_BODY, second))
    return Cut(commits, gemms, missing, wrappers)


def _links() -> list[str]:
    """The paragraph naming the PRs that added the fakes fixed here."""
    _, body = prtext.description(recipes.KERNELS_HEADER)
    return [p for p in body.split("\n\n") if "https://" in p]


def _rewrap(text: str) -> str:
    """Rewrap the paragraphs made of plain lines (not lists) at 72."""
    out = []
    for paragraph in text.split("\n\n"):
        if re.search(r"^\s*- ", paragraph, re.M):
            out.append(paragraph)
        else:
            out.append(prtext.wrap(" ".join(paragraph.split())))
    return "\n\n".join(out)
