"""How each patch is made: an edit of the pristine file of a release, and the
patch's header (data/dep3_headers.toml). `make refresh` runs the edits on
every pinned release and writes patches/ (grouping releases whose diffs are
the same into one series), so the diff context always comes from the
official sdists; the recipe path (recipe_path.py) and `make stage` run the
same edits on a tree's live files.
"""

import ast
import hashlib
import textwrap
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xpufakes.changes import indexerop, traceablelogs
from xpufakes.common import ops, paths
from xpufakes.common.ops import XPU_C_GEMMS
from xpufakes.trees import names, pins, pysource

FAKES_MODULE = "vllm/_xpu_gemm_fakes.py"
XPU_OPS = "vllm/_xpu_ops.py"
TREE_TEST = "tests/kernels/quantization/test_xpu_gemm_fakes.py"
TREE_TEST_REFERENCE = "tests/kernels/quantization/xpu_gemm_reference.py"
WOQ_MODULE = "vllm/_ipex_woq_linear.py"
WOQ_TREE_TEST = "tests/kernels/quantization/test_ipex_woq_linear.py"
OPAQUE_MODULE = "vllm/_xpu_opaque_calls.py"
OPAQUE_TREE_TEST = "tests/kernels/test_xpu_opaque_calls.py"
INDEXER_TREE_TEST = "tests/kernels/test_sparse_attn_indexer_op.py"
# the modules we add to vllm/ (never a recipe's target)
OUR_MODULES = frozenset({FAKES_MODULE, WOQ_MODULE, OPAQUE_MODULE})


class RecipeError(Exception):
    """The pristine file is not shaped as the recipe expects."""


class RecipeRefusal(RecipeError):
    """A site the recipe must change and cannot: refused, wherever it is."""


@dataclass(frozen=True)
class Edit:
    target: str  # the release's file it edits
    edit: Callable[[str], str]
    # files of the releases that have them, edited the same way
    optional: tuple[str, ...] = ()
    # On a tree that is not a pinned release's: the edit applies to every file
    # of vllm/ where its sites are (source text containing all of `anywhere`,
    # or for which `anywhere_if` says so), not only to its files.
    anywhere: tuple[str, ...] = ()
    anywhere_if: Callable[[str], bool] | None = None
    # False: a release may have none of its files (an op some releases lack)
    required: bool = True
    # the edit on a live tree (apply's recipe path, export VLLM=), where it
    # is not the series' (it keeps what the tree had: do no harm)
    live: Callable[[str], str] | None = None
    # with anywhere_if: the files (by path) it may apply to at all
    where: Callable[[str], bool] | None = None

    def on(self, text: str, live: bool) -> str:
        """The edit of a file's text (`live`: on apply's recipe path)."""
        return (self.live or self.edit)(text) if live else self.edit(text)

    @property
    def files(self) -> list[tuple[str, bool]]:
        """(path, required) of each release file it edits."""
        return [
            (self.target, self.required),
            *((path, False) for path in self.optional),
        ]


@dataclass(frozen=True)
class Recipe:
    name: str  # the patch file name
    edits: tuple[Edit, ...]
    overlay: tuple[str, ...]
    header: str  # DEP-3 fields; {releases} is replaced by the releases it fits
    depends: tuple[str, ...] = ()  # patches it needs (X-Depends:), by number
    # edits run after `edits` on a mixed tree (IPEX era, but some of its code
    # calls the _xpu_C GEMMs): register those fakes too
    mixed_edits: tuple[Edit, ...] = ()

    @property
    def optional(self) -> bool:
        """A patch only of the trees it changes (every file of it optional:
        the indexer's, for the releases that have the op)."""
        return not any(e.required for e in self.edits)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _statements(text: str) -> list[ast.stmt]:
    return ast.parse(text).body


def _is_type_checking_if(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )


def xpu_c_gemm_guard(node: ast.stmt) -> str | None:
    """The op name of `if hasattr(torch.ops._xpu_C, "<gemm>"):`, else None."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Call):
        return None
    call = node.test
    if not (isinstance(call.func, ast.Name) and call.func.id == "hasattr"):
        return None
    if len(call.args) != 2 or ast.unparse(call.args[0]) != "torch.ops._xpu_C":
        return None
    name = call.args[1]
    if isinstance(name, ast.Constant) and name.value in XPU_C_GEMMS:
        return name.value
    return None


def _names_used(nodes: list[ast.stmt]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _register_fake_shim(body: list[ast.stmt]) -> ast.stmt | None:
    """vLLM's `if TYPE_CHECKING: def register_fake ... else: from torch.library
    import register_fake` statement, wherever it is."""
    for node in body:
        if _is_type_checking_if(node) and any(
            isinstance(n, ast.FunctionDef) and n.name == "register_fake"
            for n in ast.walk(node)
        ):
            return node
    return None


# The fakes of the _xpu_C GEMMs that vLLM's releases register in
# vllm/_xpu_ops.py (data/tree_fakes.toml, written by `make refresh` from the
# pinned sdists): op -> the digests of their `if hasattr(...)` blocks. A
# recipe removes a tree's block only if it is one of these; any other (an
# image that changed the fake for a kernel build of its own) stays, and ours
# registers over it only where the live schema is one ours is exact for.
TREE_FAKES = paths.DATA / "tree_fakes.toml"


def fake_block_digest(node: ast.stmt) -> str:
    """A digest of a fake's block that formatting and comments do not change."""
    return hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]


def _known_tree_fakes() -> dict[str, frozenset[str]]:
    data = tomllib.loads(TREE_FAKES.read_text()) if TREE_FAKES.is_file() else {}
    return {op: frozenset(e["digests"]) for op, e in data.get("ops", {}).items()}


def own_tree_fakes(body: list[ast.stmt]) -> list[ast.stmt]:
    """The `if hasattr(torch.ops._xpu_C, "<gemm>"):` blocks of a tree that no
    release of vLLM has (an image's, for its own build of the kernels): every
    recipe keeps them (do no harm)."""
    known = _known_tree_fakes()
    return [
        n
        for n in body
        if (gemm := xpu_c_gemm_guard(n))
        and fake_block_digest(n) not in known.get(f"{ops.XPU_C}::{gemm}", ())
    ]


def own_tree_fake_ops(text: str) -> list[str]:
    """The ops whose fake in vllm/_xpu_ops.py's text is the tree's own."""
    try:
        body = _statements(text)
    except SyntaxError:
        return []
    return [f"{ops.XPU_C}::{xpu_c_gemm_guard(n)}" for n in own_tree_fakes(body)]


def xpu_gemm_fake_sites(
    body: list[ast.stmt], keep: Sequence[ast.stmt] = ()
) -> list[ast.stmt]:
    """The module-level statements to remove from vllm/_xpu_ops.py: every
    `if hasattr(torch.ops._xpu_C, "<gemm>"):` block (wherever it is, in any
    order, whatever lies between them) but those to `keep`, and the
    register_fake shim if nothing else uses it."""
    guarded = [n for n in body if xpu_c_gemm_guard(n)]
    if not guarded:
        raise RecipeError('no `if hasattr(torch.ops._xpu_C, "<gemm>"):` block')
    blocks = [n for n in guarded if n not in keep]
    shim = _register_fake_shim(body)
    rest = [n for n in body if n is not shim and n not in blocks]
    if shim is not None and "register_fake" not in _names_used(rest):
        blocks.append(shim)
    return sorted(blocks, key=lambda n: n.lineno)


def _runs(body: list[ast.stmt], chosen: list[ast.stmt]) -> list[tuple[int, int]]:
    """(first line index, end line) of each run of adjacent chosen statements."""
    runs: list[tuple[int, int]] = []
    previous = None
    for index, node in enumerate(body):
        if node not in chosen:
            continue
        if runs and previous == index - 1:
            runs[-1] = (runs[-1][0], node.end_lineno)
        else:
            runs.append((node.lineno - 1, node.end_lineno))
        previous = index
    return runs


def _drop_blank_after(lines: list[str], at: int) -> None:
    """Remove the blank lines at `at` if a blank line precedes them."""
    if at > 0 and lines[at - 1].strip() == "":
        while at < len(lines) and lines[at].strip() == "":
            del lines[at]


def _typing_import(body: list[ast.stmt], name: str) -> ast.ImportFrom | None:
    """The one-line module-level `from typing import ... name ...`."""
    for node in body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "typing"
            and name in [a.name for a in node.names]
            and node.lineno == node.end_lineno
        ):
            return node
    return None


def _drop_typing_name(lines: list[str], body: list[ast.stmt], name: str) -> None:
    """Remove `name` from its module-level `from typing import ...`; the whole
    line if it was the only name."""
    node = _typing_import(body, name)
    if node is not None:
        names = [a.name for a in node.names]
        at = node.lineno - 1
        if names == [name]:
            if lines[at - 1] == "\n" and lines[at + 1] == "\n":
                del lines[at : at + 2]  # it was a group of its own
            else:
                del lines[at]
        else:
            kept = ", ".join(
                a.name + (f" as {a.asname}" if a.asname else "")
                for a in node.names
                if a.name != name
            )
            lines[at] = f"from typing import {kept}\n"


XPU_REGISTRATION = (
    "# torch.compile needs a fake (meta) implementation of each custom op it\n",
    "# traces. The fakes of the _xpu_C GEMMs are in vllm/_xpu_gemm_fakes.py:\n",
    "# each reproduces its kernel's output shape, strides and dtype, and is\n",
    "# registered only if the op has the schema it was written for.\n",
    "register_xpu_gemm_fakes()\n",
)


def edit_xpu_ops(text: str, keep_all: bool = False) -> str:
    """vllm/_xpu_ops.py (0.16.0+): drop the upstream GEMM fakes and the
    register_fake shim only they use; register the canonical fakes instead,
    where the first of them was. A tree's own fake (no release's) stays,
    and so does every fake with `keep_all` (a live tree, whose kernels may
    have schemas we do not know): the canonical fakes are registered after
    them and replace each only where they are exact for the live schema."""
    body = _statements(text)
    lines = _lines(text)
    kept = (
        [n for n in body if xpu_c_gemm_guard(n)] if keep_all else own_tree_fakes(body)
    )
    removed = xpu_gemm_fake_sites(body, kept)
    runs = _runs(body, removed)
    # ours register after every fake of the tree's that stays (and replace
    # it where they are exact for the live schema)
    after_kept = max((n.end_lineno for n in kept), default=0)
    if kept and (not runs or runs[0][0] < after_kept):
        runs.insert(0, (after_kept, after_kept))
    import_line = "from vllm._xpu_gemm_fakes import register_xpu_gemm_fakes\n"
    import_at = _vllm_import_position(body, "vllm._xpu_gemm_fakes")
    remaining = [n for n in body if n not in removed]
    # edits from the bottom up, so that line numbers stay valid
    edits = [(first, last, i) for i, (first, last) in enumerate(runs)]
    edits.append((import_at, import_at, "import"))
    typing = _typing_import(body, "TYPE_CHECKING")
    if typing is not None and "TYPE_CHECKING" not in _names_used(remaining):
        edits.append((typing.lineno - 1, typing.lineno - 1, "typing"))
    for first, last, what in sorted(edits, key=lambda e: e[0], reverse=True):
        if what == "import":
            lines.insert(first, import_line)
        elif what == "typing":
            _drop_typing_name(lines, body, "TYPE_CHECKING")
        elif what == 0 and first == last:  # after a block the tree keeps
            lines[first:last] = ["\n", "\n", *XPU_REGISTRATION]
        elif what == 0:
            lines[first:last] = XPU_REGISTRATION
        else:
            del lines[first:last]
            _drop_blank_after(lines, first)
    return "".join(lines)


def _ipex_import_site(module: ast.Module) -> ast.stmt | None:
    """The statement after which IPEX's ops exist: the innermost `try:` whose
    body imports intel_extension_for_pytorch, else that import itself; at
    module level (also inside module-level `if` / `try` blocks), never inside
    a function."""

    def imports_ipex(node: ast.stmt) -> bool:
        return isinstance(node, ast.Import) and any(
            a.name == "intel_extension_for_pytorch" for a in node.names
        )

    def search(statements: list[ast.stmt]) -> ast.stmt | None:
        for node in statements:
            if imports_ipex(node):
                return node
            if isinstance(node, ast.Try):
                inner = search(node.body)
                if inner is not None:
                    return node if inner in node.body else inner
            if isinstance(node, ast.If):
                inner = search(node.body) or search(node.orelse)
                if inner is not None:
                    return inner
        return None

    return search(module.body)


IPEX_REGISTRATION = (
    "\n",
    "# torch.compile needs a fake (meta) implementation of each custom op it\n",
    "# traces, and IPEX has none for the GEMMs of the quantized linear methods.\n",
    "# vllm/_xpu_gemm_fakes.py registers exact ones for the ops that exist (the\n",
    "# XPU builds of IPEX) and have the schema they were written for.\n",
    "register_ipex_gemm_fakes()\n",
)


def returns_gemm_unchanged(impl: ast.FunctionDef, gemm: str) -> bool:
    """Whether impl's only statement (after its docstring) is
    `return torch.ops._xpu_C.<gemm>(<its own parameters, in order>)`."""
    body = impl.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    ):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return False
    call = body[0].value
    params = [a.arg for a in impl.args.args]
    return (
        isinstance(call, ast.Call)
        and ast.unparse(call.func) == f"torch.ops._xpu_C.{gemm}"
        and not call.keywords
        and [ast.unparse(a) for a in call.args] == params
    )


def edit_xpu_gemm_wrapper_fakes(text: str) -> str:
    """vllm/_xpu_ops.py (0.27.0+): the fake of each vLLM op that returns a
    _xpu_C GEMM's output unchanged (vllm::xpu_fp8_bmm) becomes that GEMM's
    canonical fake. Releases without such a wrapper are left as they are."""
    body = _statements(text)
    functions = {n.name: n for n in body if isinstance(n, ast.FunctionDef)}
    lines = _lines(text)
    used = []
    for wrapper in ops.WRAPPERS.values():
        fake_name, impl_name = wrapper.fake, wrapper.impl
        gemm, canonical = wrapper.gemm, wrapper.canonical
        fake = functions.get(fake_name)
        if fake is None:
            continue
        impl = functions.get(impl_name)
        if impl is None or not returns_gemm_unchanged(impl, gemm):
            raise RecipeError(
                f"{impl_name} no longer returns torch.ops._xpu_C.{gemm}(...) "
                f"unchanged; {fake_name} needs a new look"
            )
        params = [a.arg for a in fake.args.args]
        if params != [a.arg for a in impl.args.args]:
            raise RecipeError(f"{fake_name} and {impl_name} differ in parameters")
        indent = " " * fake.body[0].col_offset
        lines[fake.returns.end_lineno : fake.end_lineno] = [
            f"{indent}# The op returns torch.ops._xpu_C.{gemm}'s output as it is,"
            " so its\n",
            f"{indent}# fake is that kernel's (whose output follows the input's"
            " strides).\n",
            f"{indent}return {canonical}({', '.join(params)})\n",
        ]
        used.append(canonical)
    if not used:
        return text
    result = "".join(lines)
    old = "from vllm._xpu_gemm_fakes import register_xpu_gemm_fakes\n"
    if old not in result:
        raise RecipeError("no `from vllm._xpu_gemm_fakes import` line")
    names = ", ".join(sorted([*used, "register_xpu_gemm_fakes"]))
    return result.replace(old, f"from vllm._xpu_gemm_fakes import {names}\n", 1)


def edit_xpu_ops_and_wrappers(text: str) -> str:
    """vllm/_xpu_ops.py: the canonical GEMM fakes, and the same fakes for
    vLLM's ops that wrap the GEMMs."""
    return edit_xpu_gemm_wrapper_fakes(edit_xpu_ops(text))


def edit_live_xpu_ops_and_wrappers(text: str) -> str:
    """edit_xpu_ops_and_wrappers on a live tree: every fake the tree has
    stays (ours replace them at start-up where exact for the live schema)."""
    return edit_xpu_gemm_wrapper_fakes(edit_xpu_ops(text, keep_all=True))


def edit_ipex_ops(text: str) -> str:
    """vllm/_ipex_ops.py (0.10.2-0.14.1): register the canonical fakes of the
    torch_ipex GEMMs right after IPEX is imported (the ops exist only then)."""
    module = ast.parse(text)
    body = module.body
    lines = _lines(text)
    site = _ipex_import_site(module)
    if site is None:
        raise RecipeError("no `import intel_extension_for_pytorch` at module level")
    indent = " " * site.col_offset
    lines[site.end_lineno : site.end_lineno] = [
        line if line == "\n" else indent + line for line in IPEX_REGISTRATION
    ]
    _insert_vllm_import(
        lines, body, "from vllm._xpu_gemm_fakes import register_ipex_gemm_fakes\n"
    )
    return "".join(lines)


def add_xpu_gemm_registration(text: str) -> str:
    """vllm/_ipex_ops.py of a mixed tree (IPEX era, but some code calls the
    _xpu_C GEMMs): after edit_ipex_ops, also register the _xpu_C fakes."""
    module = ast.parse(text)
    call = next(
        (
            n
            for n in ast.walk(module)
            if isinstance(n, ast.Expr)
            and ast.unparse(n.value) == "register_ipex_gemm_fakes()"
        ),
        None,
    )
    if call is None:
        raise RecipeError("no `register_ipex_gemm_fakes()` call")
    lines = _lines(text)
    lines.insert(call.end_lineno, " " * call.col_offset + "register_xpu_gemm_fakes()\n")
    line = "from vllm._xpu_gemm_fakes import register_ipex_gemm_fakes\n"
    at = lines.index(line)
    lines[at] = (
        "from vllm._xpu_gemm_fakes import (\n"
        "    register_ipex_gemm_fakes,\n"
        "    register_xpu_gemm_fakes,\n"
        ")\n"
    )
    return "".join(lines)


def _vllm_import_position(body: list[ast.stmt], module: str) -> int:
    """The line index where isort puts `from <module> import ...` among the
    module-level vllm imports (they are sorted by module name)."""
    vllm_imports = [
        n
        for n in body
        if isinstance(n, ast.ImportFrom)
        and n.level == 0
        and (n.module == "vllm" or (n.module or "").startswith("vllm."))
    ]
    if not vllm_imports:
        raise RecipeError("no module-level `from vllm... import`")
    later = [n for n in vllm_imports if n.module > module]
    return later[0].lineno - 1 if later else vllm_imports[-1].end_lineno


def _insert_vllm_import(lines: list[str], body: list[ast.stmt], line: str) -> None:
    """Insert `from <module> import ...` among the module-level vllm imports,
    where isort puts it."""
    lines.insert(_vllm_import_position(body, line.split()[1]), line)


# IPEX's weight-only-quantized linear module classes (their `from_weight`
# makes the module that vLLM stores on the layer and calls in apply()).
WOQ_CLASSES = ("IPEXWeightOnlyQuantizedLinear", "WeightOnlyQuantizedLinear")


def _woq_creation(value: ast.expr) -> ast.Call | None:
    """The `<...>.<WOQ class>.from_weight(...)` call in an expression."""
    for node in ast.walk(value):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "from_weight"
            and ast.unparse(node.func.value).split(".")[-1] in WOQ_CLASSES
        ):
            return node
    return None


def _out_features(function: ast.AST, owner: str, call: ast.Call) -> str:
    """The expression for the module's output size: `<owner>.ipex_output_size`
    when the function sets it, else from_weight's out_features argument."""
    wanted = f"{owner}.ipex_output_size"
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(
            ast.unparse(t) == wanted for t in node.targets
        ):
            return wanted
    value = next((k.value for k in call.keywords if k.arg == "out_features"), None)
    if value is None and len(call.args) >= 5:
        value = call.args[4]
    if value is None:
        raise RecipeError("from_weight(...) is given no out_features")
    return ast.unparse(value)


def woq_sites(module: ast.Module) -> list[tuple[ast.Assign, str, str]]:
    """Every place an IPEX WOQ linear module is made and stored on an object
    (`X.<attr> = <...>.IPEXWeightOnlyQuantizedLinear.from_weight(...)`), in
    any function: (the assignment, the stored-to expression, the output-size
    expression)."""
    sites = []
    functions = [
        n
        for n in ast.walk(module)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for function in functions:
        for node in ast.walk(function):
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute)
            ):
                continue
            call = _woq_creation(node.value)
            if call is None:
                continue
            owner = ast.unparse(node.targets[0].value)
            sites.append(
                (
                    node,
                    ast.unparse(node.targets[0]),
                    _out_features(function, owner, call),
                )
            )
    unique = {id(node): (node, t, o) for node, t, o in sites}  # nested functions
    return sorted(unique.values(), key=lambda s: s[0].lineno)


def woq_wrap_lines(indent: str, module: str, out_features: str) -> list[str]:
    """What goes right after a WOQ module is made: wrap it in one op."""
    return [
        f"{indent}# torch.compile cannot trace IPEX's WOQ forward: run it as one op\n",
        f"{indent}{module} = opaque_ipex_woq_linear(\n",
        f"{indent}    {module}, {out_features}\n",
        f"{indent})\n",
    ]


def edit_woq(text: str) -> str:
    """ipex_quant.py, kernels/mixed_precision/xpu.py, or any file that makes
    an IPEX weight-only-quantized linear module (IPEX era): wrap each module,
    right after it is made, so that torch.compile sees one op instead of
    IPEX's forward."""
    module = ast.parse(text)
    lines = _lines(text)
    sites = woq_sites(module)
    if not sites:
        raise RecipeError(
            "no `X.<attr> = ...IPEXWeightOnlyQuantizedLinear.from_weight(...)`"
        )
    for node, target, out_features in reversed(sites):
        lines[node.end_lineno : node.end_lineno] = woq_wrap_lines(
            " " * node.col_offset, target, out_features
        )
    _insert_vllm_import(
        lines, module.body, "from vllm._ipex_woq_linear import opaque_ipex_woq_linear\n"
    )
    return "".join(lines)


# The calls a recipe routes through a vLLM op: callee -> contract
# (ops.ROUTED_CALLS: data/opaque_calls.toml, the calls Dynamo cannot trace,
# and data/schema_contracts.toml, the kernel calls whose schemas lie;
# vllm/_xpu_opaque_calls.py registers one op per callee).
OPAQUE_CALLS: dict[str, dict] = ops.ROUTED_CALLS
_CALLEE_NAMES = tuple({c.rsplit(".", 1)[1] for c in OPAQUE_CALLS})
OPAQUE_IMPORT = "import vllm._xpu_opaque_calls  # noqa: F401\n"
# where a module keeps a callee to call later (`f = _esimd.f`, `self._op = f`)
AS_CUSTOM_OP = "vllm._xpu_opaque_calls.as_custom_op"
# what a call whose result is used calls instead of its callee
ROUTED = "vllm._xpu_opaque_calls.routed"


def _package_mark(callee: str) -> str:
    """What a module that reaches the callee spells: its package (a name it
    imports), the namespace of a torch op, the extension's `_C`."""
    parts = callee.split(".")
    if parts[:2] == ["torch", "ops"]:
        return parts[2]
    return parts[1] if parts[0] == "vllm" else parts[0]


_PACKAGE_MARKS = tuple({_package_mark(c) for c in OPAQUE_CALLS})


def may_call_opaque(text: str) -> bool:
    """Whether a module's text may use a callee of OPAQUE_CALLS (a cheap
    necessary condition: its package and its name are in the text)."""
    return any(m in text for m in _PACKAGE_MARKS) and any(
        name in text for name in _CALLEE_NAMES
    )


def _scoped_nodes(tree: ast.Module):
    """(node, the qualname of the function it is in, "" at module level)
    of every node of a module, each once (a nested function's by its own)."""
    todo: list[tuple[ast.AST, str, str]] = [(tree, "", "")]
    while todo:
        node, scope, prefix = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                todo.append((child, name, f"{name}."))
                continue
            if isinstance(child, ast.ClassDef):
                todo.append((child, scope, f"{prefix}{child.name}."))
                continue
            yield child, scope
            todo.append((child, scope, prefix))


def opaque_references(
    text: str, only: frozenset[str] | None = None
) -> list[tuple[ast.expr, str, ast.AST, ast.Call | None]]:
    """(expression, callee, its parent node, the call of it or None) of every
    use of an OPAQUE_CALLS callee in a module: a call of it, or the callee
    itself kept to call later (`f = _esimd.f`, `self._op = f`), qualified
    through the module's imports (those of the function it is in first)."""
    tree = ast.parse(text)
    module = pysource.Module("vllm._edited", "vllm/_edited.py", tree, False)
    nodes = list(_scoped_nodes(tree))
    parents = {
        id(child): node
        for node in ast.walk(tree)
        for child in ast.iter_child_nodes(node)
    }
    found: dict[int, tuple[ast.expr, str, ast.AST, ast.Call | None]] = {}
    for node, scope in nodes:
        looked_up = _getattr_of(node)
        if looked_up and looked_up.rsplit(".", 1)[-1] in _CALLEE_NAMES:
            # `getattr(_esimd, "f", None)`: the callee kept, or None
            for qualified in module.qualify_all(looked_up, scope):
                if qualified in OPAQUE_CALLS and (only is None or qualified in only):
                    found[id(node)] = (node, qualified, parents[id(node)], None)
                    break
            continue
        if not isinstance(node, ast.Name | ast.Attribute) or not isinstance(
            node.ctx, ast.Load
        ):
            continue
        parent = parents[id(node)]
        if isinstance(parent, ast.Attribute):
            continue  # a part of a longer name
        name = names.dotted(node)
        if not name or name.rsplit(".", 1)[-1] not in _CALLEE_NAMES:
            continue
        for qualified in module.qualify_all(name, scope):
            if qualified in OPAQUE_CALLS and (only is None or qualified in only):
                if isinstance(parent, ast.Call) and parent.func is node:
                    found[id(node)] = (node, qualified, parents[id(parent)], parent)
                else:
                    found[id(node)] = (node, qualified, parent, None)
                break
    return sorted(found.values(), key=lambda r: (r[0].lineno, r[0].col_offset))


def _one_line(segment: str) -> str:
    """A bracketed expression laid out over lines, on one line (no trailing
    comma: `getattr(\\n    x, "f", None\\n)` -> `getattr(x, "f", None)`)."""
    joined = " ".join(part.strip() for part in segment.splitlines())
    joined = joined.replace("( ", "(").replace(" )", ")")
    return joined.replace(",)", ")")


def _getattr_of(node: ast.AST) -> str:
    """`<x>.<name>` of a `getattr(<x>, "<name>"[, default])` call, else ''."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) in (2, 3)
        and not node.keywords
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return ""
    base = names.dotted(node.args[0])
    return f"{base}.{node.args[1].value}" if base else ""


def opaque_call_sites(
    text: str, only: frozenset[str] | None = None
) -> list[tuple[ast.Call, str, ast.AST]]:
    """(call, callee, its parent node) of every call of an OPAQUE_CALLS callee
    in a module, the callee qualified through the module's imports (those of
    the function the call is in first)."""
    return [
        (call, callee, parent)
        for _, callee, parent, call in opaque_references(text, only)
        if call is not None
    ]


def _refuse_site(call: ast.Call, callee: str, parent: ast.AST) -> str | None:
    """Why a call cannot become its op's call, or None."""
    contract = OPAQUE_CALLS[callee]
    params = [p.split()[1].split("=")[0] for p in contract["params"]]
    required = [p.split()[1] for p in contract["params"] if "=" not in p]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return "it passes *args or **kwargs"
    if len(call.args) > len(params):
        return f"it passes {len(call.args)} arguments, the contract has {len(params)}"
    given = params[: len(call.args)] + [k.arg for k in call.keywords]
    unknown = [k.arg for k in call.keywords if k.arg not in params]
    if unknown:
        return f"keyword {unknown[0]!r} is not in the contract"
    missing = [p for p in required if p not in given]
    if missing:
        return f"it does not pass {missing[0]!r}"
    if _result_used(callee, parent) and not contract["callee_returns"]:
        return "its result is used, and the kernel returns nothing it may use"
    return None


def _result_used(callee: str, parent: ast.AST) -> bool:
    """Whether the caller uses what the call returns, where the callee's
    vLLM op returns nothing: the call becomes `routed("<op>")(...)`,
    which gives the caller what the callee returns."""
    return not OPAQUE_CALLS[callee]["returns"] and not isinstance(parent, ast.Expr)


def _columns(line: str, node: ast.AST) -> tuple[int, int]:
    """A single-line node's character columns in its line."""
    start = len(line.encode()[: node.col_offset].decode())
    return start, len(line.encode()[: node.end_col_offset].decode())


def _kept(lines: list[str], expr: ast.expr, callee: str, parent: ast.AST) -> None:
    """A callee kept to call later becomes `as_custom_op("<op>", <it>)` (what
    it was, when it is None); an assignment of it alone, laid out as ruff
    formats a call that does not fit the line."""
    op = OPAQUE_CALLS[callee]["op"]
    row, last = expr.lineno - 1, expr.end_lineno - 1
    first_line, last_line = lines[row], lines[last]
    start = _columns(first_line, expr)[0]
    end = len(last_line.encode()[: expr.end_col_offset].decode())
    alone = (
        isinstance(parent, ast.Assign | ast.AnnAssign)
        and parent.value is expr
        and parent.lineno == expr.lineno
        and not last_line[end:].strip()
    )
    if row != last and not (alone and _getattr_of(expr)):
        raise RecipeRefusal(f"line {expr.lineno}: {callee} spans lines")
    # the callee as one line (a getattr laid out over lines, joined)
    text = "".join(lines[row : last + 1])
    it = _one_line(text[start : len(text) - len(last_line) + end])
    arguments = f'"{op}", {it}'
    head, tail = first_line[:start], last_line[end:]
    one = f"{head}{AS_CUSTOM_OP}({arguments}){tail}"
    indent = first_line[: len(first_line) - len(first_line.lstrip())]
    if len(one.rstrip("\n")) <= 88 or not alone:
        laid = one
    elif len(indent) + 4 + len(arguments) <= 88:
        laid = f"{head}{AS_CUSTOM_OP}(\n{indent}    {arguments}\n{indent})\n"
    else:  # one argument a line, ruff's trailing comma
        each = f'{indent}    "{op}",\n{indent}    {it},\n'
        laid = f"{head}{AS_CUSTOM_OP}(\n{each}{indent})\n"
    lines[row : last + 1] = [laid]


def _wrapped(lines: list[str], row: int, call: ast.Call, parent: ast.AST) -> None:
    """A call statement alone on its line that the rewrite made too long,
    laid out as ruff formats it: its arguments on the next line, or one a
    line where they do not fit."""
    line = lines[row]
    if not (
        isinstance(parent, ast.Expr)
        and call.lineno == call.end_lineno
        and parent.col_offset == call.col_offset
        and line.rstrip().endswith(")")
        and line.count("#") == 0
    ):
        return
    indent = line[: len(line) - len(line.lstrip())]
    opened = line.index("(", len(indent))
    head, arguments = line[: opened + 1], line[opened + 1 :].rstrip()[:-1]
    if len(indent) + 4 + len(arguments) <= 88:
        lines[row] = f"{head}\n{indent}    {arguments}\n{indent})\n"
        return
    parts = [ast.unparse(a) for a in call.args]
    parts += [f"{k.arg}={ast.unparse(k.value)}" for k in call.keywords]
    each = "".join(f"{indent}    {p},\n" for p in parts)
    lines[row] = f"{head}\n{each}{indent})\n"


def edit_opaque_calls(text: str, only: frozenset[str] | None = None) -> str:
    """Any file of vllm/: every call of a callee of OPAQUE_CALLS (one Dynamo
    cannot trace, or a kernel op whose schema lies) becomes a call of its
    vLLM op, `torch.ops.vllm.<op>(...)` with the same arguments; where the
    module keeps the callee to call later (`f = _esimd.f`, `self._op = f`),
    it keeps `as_custom_op("<op>", f)` instead, whose calls are the op's.
    The module imports vllm/_xpu_opaque_calls.py, which registers the ops.
    A file without such a use is left as it is; a call that cannot be
    rewritten is refused, naming it."""
    try:
        references = opaque_references(text, only)
    except SyntaxError:
        return text  # the tree's own error: the proof names its file and line
    if not references:
        return text
    sites = opaque_call_sites(text, only)
    body = _statements(text)
    if sites and not any(
        isinstance(n, ast.Import)
        and any(a.name == "torch" and not a.asname for a in n.names)
        for n in body
    ):
        raise RecipeRefusal("no module-level `import torch`")
    lines = _lines(text)
    for call, callee, parent in sites:
        why = _refuse_site(call, callee, parent)
        if why:
            raise RecipeRefusal(
                f"line {call.lineno}: {callee}(...) cannot become its op's call: {why}"
            )
    for expr, callee, parent, called in reversed(references):
        if called is None:
            _kept(lines, expr, callee, parent)
            continue
        if expr.lineno != expr.end_lineno:
            raise RecipeRefusal(f"line {expr.lineno}: {callee} spans lines")
        row = expr.lineno - 1
        start, end = _columns(lines[row], expr)
        op = OPAQUE_CALLS[callee]["op"]
        target = f"torch.ops.vllm.{op}"
        if _result_used(callee, parent):
            target = f'{ROUTED}("{op}")'
        lines[row] = f"{lines[row][:start]}{target}{lines[row][end:]}"
        if len(lines[row].rstrip("\n")) > 88:
            _wrapped(lines, row, called, parent)
    heads = {names.dotted(call.func).split(".")[0] for call, _, _ in sites}
    lines = _lines("".join(lines))  # a kept callee's call may span lines now
    _keep_unused_imports(lines, heads)
    kept = any(
        called is None or _result_used(callee, parent)
        for _, callee, parent, called in references
    )
    _insert_first_party_import(
        lines, body, OPAQUE_IMPORT if not kept else OPAQUE_IMPORT.split("  #")[0] + "\n"
    )
    return "".join(lines)


def _keep_unused_imports(lines: list[str], names: set[str]) -> None:
    """An import whose name the rewritten calls were the only users of (in
    the function it is in, or the module) stays (it says what the module
    needs: `import intel_extension_for_pytorch as ipex` in a try that
    re-raises, `from pkg import f` in a try that falls back on ImportError),
    marked for the linter as used (and, in a function, as no redefinition
    where the module imports the same name, unused too now: b6's
    `import vllm._C.ops` at the top of _ipex_ops.py and again in its
    rotary_embedding); one that would pass the line length then is laid out
    as ruff's isort lays it out."""
    tree = ast.parse("".join(lines))
    at_module = {
        a.asname or a.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for a in node.names
    }
    scopes: dict[int, ast.AST] = {}  # node -> the innermost function it is in
    for node in ast.walk(tree):  # outer functions first
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if inner is not node:
                    scopes[id(inner)] = node
    used_in: dict[int, set[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        scope = scopes.get(id(node), tree)
        if id(scope) not in used_in:
            used_in[id(scope)] = {
                n.id for n in ast.walk(scope) if isinstance(n, ast.Name)
            }
        bound = {a.asname or a.name.split(".")[0] for a in node.names}
        if not (bound & names) or bound & used_in[id(scope)]:
            continue
        row = node.lineno - 1
        if node.lineno != node.end_lineno or "noqa" in lines[row]:
            continue
        codes = "F401, F811" if scope is not tree and bound & at_module else "F401"
        marked = lines[row].rstrip("\n") + f"  # noqa: {codes}\n"
        one = isinstance(node, ast.ImportFrom) and len(node.names) == 1
        if len(marked) - 1 > 88 and one:
            indent = lines[row][: len(lines[row]) - len(lines[row].lstrip())]
            alias = node.names[0]
            name = alias.name + (f" as {alias.asname}" if alias.asname else "")
            marked = (
                f"{indent}from {'.' * node.level}{node.module or ''} import (\n"
                f"{indent}    {name},  # noqa: {codes}\n{indent})\n"
            )
        lines[row] = marked


def _first_party(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == "vllm"
    return isinstance(node, ast.Import) and any(
        a.name.split(".")[0] == "vllm" for a in node.names
    )


def _is_import_or_doc(node: ast.stmt) -> bool:
    return isinstance(node, ast.Import | ast.ImportFrom) or (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    )


def _insert_first_party_import(
    lines: list[str], body: list[ast.stmt], line: str
) -> None:
    """`import vllm.<module>` where isort puts it: in the module's first
    block of imports that has vLLM's own, before its `from vllm... import`s,
    in name order among its `import vllm...`s. A module without one at
    module level gets it as a block of its own after its leading imports."""
    first = next((i for i, n in enumerate(body) if _first_party(n)), None)
    if first is None:
        leading = [
            n
            for n in body[
                : next(
                    (i for i, n in enumerate(body) if not _is_import_or_doc(n)),
                    len(body),
                )
            ]
            if isinstance(n, ast.Import | ast.ImportFrom)
        ]
        if not leading:
            raise RecipeRefusal("no module-level import to put vLLM's after")
        lines.insert(leading[-1].end_lineno, "\n" + line)
        return
    name = line.split()[1]
    at = body[first].lineno - 1
    for node in body[first:]:
        if not isinstance(node, ast.Import | ast.ImportFrom):
            break
        if isinstance(node, ast.Import) and _first_party(node):
            if node.names[0].name < name:
                at = node.end_lineno
            else:
                break
    lines.insert(at, line)


# Text that only our changes put into a vLLM file.
MARKERS = ("vllm._xpu_gemm_fakes", "vllm._ipex_woq_linear", "vllm._xpu_opaque_calls")


def carries_ours(text: str) -> bool:
    """Whether a file holds any of our changes."""
    return any(marker in text for marker in MARKERS)


# The width of a header's lines, the leading space included.
HEADER_WIDTH = 76


def op_list(names: Sequence[str]) -> str:
    """ "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def with_ops(header: str, names: Sequence[str]) -> str:
    """`header` with its `{ops}` replaced by the names (op_list) and the
    paragraph holding it (its lines indented by one space, between "."
    lines) filled again to HEADER_WIDTH; the rest kept as it is."""
    lines = header.split("\n")
    at = next((i for i, line in enumerate(lines) if "{ops}" in line), None)
    if at is None:
        return header

    def plain(line: str) -> bool:
        return line.startswith(" ") and not line.startswith("  ") and line != " ."

    start, end = at, at + 1
    while start > 0 and plain(lines[start - 1]):
        start -= 1
    while end < len(lines) and plain(lines[end]):
        end += 1
    words = " ".join(lines[start:end]).split()
    text = " ".join(words).replace("{ops}", op_list(names))
    filled = textwrap.wrap(
        text,
        HEADER_WIDTH,
        initial_indent=" ",
        subsequent_indent=" ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return "\n".join([*lines[:start], *filled, *lines[end:]])


def edit_sparse_attn_indexer(text: str) -> str:
    """vllm::sparse_attn_indexer registered to return nothing, its calls
    returning the buffer it writes (indexerop.py)."""
    try:
        return indexerop.edit(text)
    except indexerop.Refused as e:
        raise RecipeRefusal(str(e)) from None
    except indexerop.Unshaped as e:
        raise RecipeError(str(e)) from None


# every release file that registers or calls vllm::sparse_attn_indexer
INDEXER_FILES = (
    "vllm/model_executor/models/deepseek_v2.py",  # 0.11.0-0.14.1
    "vllm/model_executor/layers/sparse_attn_indexer.py",  # 0.15.0 on
    # Kimi K3's NVIDIA path (releases after 0.33.0)
    "vllm/models/kimi_k3/nvidia/dsa.py",
    "vllm/models/kimi_k3/nvidia/specialized_decode/cutedsl/dsa/indexer_stage.py",
)
INDEXER_EDIT = Edit(
    INDEXER_FILES[0],
    edit_sparse_attn_indexer,
    optional=INDEXER_FILES[1:],
    anywhere_if=indexerop.mentions,
    required=False,
)

_HEADERS = tomllib.loads((paths.DATA / "dep3_headers.toml").read_text())
IPEX_HEADER, WOQ_HEADER, KERNELS_HEADER, OPAQUE_HEADER, INDEXER_HEADER = (
    _HEADERS["ipex"],
    _HEADERS["woq"],
    with_ops(_HEADERS["kernels"], XPU_C_GEMMS),
    _HEADERS["opaque"],
    _HEADERS["indexer"],
)
COMMON_FIELDS = _HEADERS["common"]

OVERLAY = (FAKES_MODULE, TREE_TEST_REFERENCE, TREE_TEST)

# what a file that makes an IPEX WOQ module contains (a cheap pre-filter)
WOQ_SOURCE_TEXT = ("from_weight", "WeightOnlyQuantizedLinear")

INDEXER_PATCH = "sparse-attn-indexer-register-the-op-to-return-nothing.patch"

# The patches of each era, in series order. A series holds a patch only where
# its diff is not empty (the indexer's: the releases that have the op).
RECIPES: dict[str, tuple[Recipe, ...]] = {
    pins.IPEX: (
        Recipe(
            name="0001-xpu-register-fakes-for-ipex-gemms.patch",
            edits=(Edit("vllm/_ipex_ops.py", edit_ipex_ops),),
            overlay=OVERLAY,
            header=IPEX_HEADER + COMMON_FIELDS,
            mixed_edits=(Edit("vllm/_ipex_ops.py", add_xpu_gemm_registration),),
        ),
        Recipe(
            name="0002-xpu-run-ipex-woq-linear-as-one-opaque-op.patch",
            edits=(
                Edit(
                    "vllm/model_executor/layers/quantization/ipex_quant.py",
                    edit_woq,
                    optional=(
                        "vllm/model_executor/layers/quantization/kernels/"
                        "mixed_precision/xpu.py",
                    ),
                    anywhere=WOQ_SOURCE_TEXT,
                ),
            ),
            overlay=(WOQ_MODULE, WOQ_TREE_TEST),
            header=WOQ_HEADER + COMMON_FIELDS,
            depends=(
                "0001 (vllm/_ipex_woq_linear.py imports its fake from 0001's "
                "vllm/_xpu_gemm_fakes.py)",
            ),
        ),
        Recipe(
            name="0003-xpu-run-untraceable-kernel-calls-as-custom-ops.patch",
            edits=(
                Edit(
                    "vllm/_ipex_ops.py",
                    edit_opaque_calls,
                    optional=("vllm/lora/ops/ipex_ops/lora_ops.py",),
                    anywhere_if=may_call_opaque,
                ),
            ),
            overlay=(OPAQUE_MODULE, OPAQUE_TREE_TEST),
            header=OPAQUE_HEADER + COMMON_FIELDS,
            depends=(
                "0001 (its hunks in vllm/_ipex_ops.py are made on the file as "
                "0001 leaves it)",
            ),
        ),
        Recipe(
            name=f"0004-{INDEXER_PATCH}",
            edits=(INDEXER_EDIT,),
            overlay=(INDEXER_TREE_TEST,),
            header=INDEXER_HEADER + COMMON_FIELDS,
        ),
    ),
    pins.KERNELS: (
        Recipe(
            name="0001-xpu-use-exact-fakes-for-xpu-c-gemms.patch",
            edits=(
                Edit(
                    "vllm/_xpu_ops.py",
                    edit_xpu_ops_and_wrappers,
                    live=edit_live_xpu_ops_and_wrappers,
                ),
            ),
            overlay=OVERLAY,
            header=KERNELS_HEADER + COMMON_FIELDS,
        ),
        Recipe(
            name=f"0002-{INDEXER_PATCH}",
            edits=(INDEXER_EDIT,),
            overlay=(INDEXER_TREE_TEST,),
            header=INDEXER_HEADER + COMMON_FIELDS,
        ),
    ),
}


# The callees of the kernel ops whose schemas lie (data/schema_contracts.toml)
LYING_KERNEL_CALLS = frozenset(ops.SCHEMA_CONTRACTS)
_LYING_NAMES = tuple({c.rsplit(".", 1)[1] for c in LYING_KERNEL_CALLS})
_LYING_MARKS = tuple({_package_mark(c) for c in LYING_KERNEL_CALLS})


def may_call_lying_kernel(text: str) -> bool:
    """Whether a module's text may use a callee of LYING_KERNEL_CALLS."""
    return any(m in text for m in _LYING_MARKS) and any(
        name in text for name in _LYING_NAMES
    )


def edit_lying_kernel_calls(text: str) -> str:
    """edit_opaque_calls for the callees of the kernel ops whose schemas lie
    only (a kernels-era tree's other calls are its era's recipes' to fix)."""
    return edit_opaque_calls(text, LYING_KERNEL_CALLS)


# Recipes of the recipe path only (a tree that is not a pinned release's),
# run after its era's: a kernels-era tree's calls of OPAQUE_CALLS (an image's
# ESIMD ops whose schemas lie, data/schema_contracts.toml). No pinned release
# of that era has such a call, so the series has no patch of it; the IPEX
# era's 0003 makes the same edit.
DOWNSTREAM: dict[str, tuple[Recipe, ...]] = {
    pins.KERNELS: (
        Recipe(
            name="0003-xpu-run-kernel-calls-as-custom-ops.patch",
            edits=(
                Edit(
                    OPAQUE_MODULE,
                    edit_lying_kernel_calls,
                    anywhere_if=may_call_lying_kernel,
                ),
            ),
            overlay=(OPAQUE_MODULE, OPAQUE_TREE_TEST),
            header=OPAQUE_HEADER + COMMON_FIELDS,
        ),
    ),
}


# vLLM's logger.*_once on the traced path (traceablelogs.py), on the recipe
# path of either era: no pinned release has one the edit changes.
def edit_traceable_logs(text: str) -> str:
    try:
        return traceablelogs.edit(text)
    except traceablelogs.Refused as e:
        raise RecipeRefusal(str(e)) from None


LOGS_PATCH = "xpu-guard-logger-once-calls-on-the-traced-path.patch"
LOGS_EDIT = Edit(
    OPAQUE_MODULE,  # nominal: anywhere_if and where choose the files
    edit_traceable_logs,
    anywhere_if=traceablelogs.mentions,
    where=traceablelogs.traced_module,
    required=False,
)
for _era, _number in ((pins.IPEX, "0005"), (pins.KERNELS, "0004")):
    DOWNSTREAM[_era] = (
        *DOWNSTREAM.get(_era, ()),
        Recipe(
            name=f"{_number}-{LOGS_PATCH}",
            edits=(LOGS_EDIT,),
            overlay=(),
            header=_HEADERS["logonce"] + COMMON_FIELDS,
        ),
    )


def downstream_work(era: str, sources: dict[str, str]) -> list[str]:
    """The modules of a tree (its Python, by path) that the recipe path's
    DOWNSTREAM recipes of `era` would edit: a call of an image's kernel whose
    schema lies (or one the recipe refuses, which the recipe path says).
    A tree whose target files are a pinned release's but that has any takes
    the recipe path all the same (changes/base.py): its series alone would
    leave the lie."""
    found = []
    for recipe in DOWNSTREAM.get(era, ()):
        for edit in recipe.edits:
            if edit.anywhere_if is None:
                continue
            for path, text in sources.items():
                if path in OUR_MODULES or not edit.anywhere_if(text):
                    continue
                if edit.where is not None and not edit.where(path):
                    continue
                try:
                    changed = edit.edit(text) != text
                except (RecipeError, SyntaxError):
                    changed = True
                if changed and path not in found:
                    found.append(path)
    return sorted(found)
