"""The tool's import graph: no circle, and each module imports only modules
of the layers below its own (docs/layout.md). Every import counts, a
function's own (`from . import base` inside a function) too: that is how
the circle tree -> base -> engine -> tree hid before issue 18."""

import ast
from pathlib import Path

import pytest

from support import tool

PACKAGE = tool.SCRIPTS / "xpufakes"

# The subpackages, bottom to top, each with its modules' layers (bottom to
# top). A module imports only modules of a lower subpackage, or of its own
# subpackage on an earlier line; a new module must be placed here.
# docs/layout.md says what each subpackage is for.
LAYERS = {
    # plain helpers, nothing of the tool's own
    "common": [
        "errors paths progress streams opschema bypath",
        "ops pluginsource",
        "transaction isolated",
        "children",
        "installer",
    ],
    # a vLLM tree: which release (pins, sdists, wheels, RECORD), its Python
    "trees": [
        "index names",
        "logonce",
        "natives pins wheel pysource kernelcxx images",
        "pinfacts",
        "record fetch",
        "tree compiled",
    ],
    # changing a tree: recipes, series, diffs, the recipe path, the lock
    "changes": [
        "unidiff selection lock indexerop traceablelogs",
        "recipes",
        "series history",
        "engine kernels export opfacts esimdfacts",
        "base live authoring imagefacts",
        "ourlines",
    ],
    # the proof and the audit, in rooms: the static audit (source text, no
    # torch), the XPU on a CPU (the stand-ins, a tree's fakes loaded
    # against them), the whole-model proof, then the verbs' parts
    "proof.static": [
        "reach treeops pathconditions",
        "scan schematruth",
    ],
    "proof.xpu": [
        "uncomputed esimd_moe_kernels",
        "cpu_kernels builtin device quantize_convert_standin esimd_kernels defining",
        "gdn_core",
        "moe_kernels fused_moe_standin image_kernels ipex_moe",
        "ipex extensions xpu_kernels loading_ops packages sym_int4 reference xpu_moe",
        "registering esimd",
    ],
    "proof.model": [
        "models transformers_pin report features",
        "limits",
        "catalog",
        "runner environment build",
        "trace",
        "numbers",
        "cli",
    ],
    "proof": [
        "plugin proofpython indexercompile",
        "verify audit schemacontracts",
        "prove testcases",
    ],
    # taking the fix upstream
    "staging": [
        "intree treechecks upstream",
        "prtext",
        "inplace",
        "indexerpr",
        "stage",
    ],
    # the verbs: plan -> prove -> commit -> report, one module per verb
    "verbs": [
        "pipeline",
        "outcome",
        "plans",
        "apply revert status treetest",
        "treeexport",
    ],
    # the command line
    "": ["__init__", "cli", "__main__"],
}


def _order(layers: dict[str, list[str]]) -> dict[str, tuple[int, int]]:
    """module ("pkg.m", "pkg.sub.m", or "m" at the top) -> (its
    subpackage's rank, its line's rank)."""
    return {
        f"{pkg}.{m}" if pkg else m: (rank, line_rank)
        for rank, (pkg, lines) in enumerate(layers.items())
        for line_rank, line in enumerate(lines)
        for m in line.split()
    }


def _name(path: Path, package: Path) -> str:
    """ "pkg.m" (or "pkg.sub.m") for a module of a subpackage, "m" for one
    at the top."""
    return ".".join(path.relative_to(package).with_suffix("").parts)


def _is_package(package: Path, parts: list[str]) -> bool:
    return (package.joinpath(*parts) / "__init__.py").is_file()


def _is_module(package: Path, parts: list[str]) -> bool:
    return bool(parts) and package.joinpath(*parts).with_suffix(".py").is_file()


def imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The modules of the package ("pkg.m", "pkg.sub.m", or "m" at the
    top) that a module imports, anywhere in it (a function's own imports
    too). Importing a subpackage itself (its __init__.py, a docstring)
    counts for nothing."""
    own_package = _name(path, package).split(".")[:-1]
    found = set()

    def module_at(parts: list[str]) -> None:
        # the longest prefix that is a module: `import xpufakes.a.b.c`,
        # `from xpufakes.a.b import X` where X is a name of module a.b
        for end in range(len(parts), 0, -1):
            if _is_module(package, parts[:end]):
                found.add(".".join(parts[:end]))
                return
        found.add(".".join(parts))  # no such module: problems() says so

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package[: len(own_package) - (node.level - 1)]
                parts = [*base, *(node.module.split(".") if node.module else [])]
            elif (node.module or "").split(".")[0] == "xpufakes":
                parts = node.module.split(".")[1:]
            else:
                continue
            if not parts or _is_package(package, parts):
                for alias in node.names:  # from xpufakes[.pkg] import m, n
                    if not _is_package(package, [*parts, alias.name]):
                        found.add(".".join([*parts, alias.name]))
            else:  # from xpufakes.pkg.m import X
                module_at(parts)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "xpufakes":
                    module_at(parts[1:])
    return found


def graph() -> dict[str, set[str]]:
    modules = {
        _name(p, PACKAGE): p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not (p.name == "__init__.py" and p.parent != PACKAGE)
    }
    return {m: imports(p) - {m} for m, p in modules.items()}


def problems(edges: dict[str, set[str]], layers: dict[str, list[str]]) -> list[str]:
    """Every module not in a layer, every import that does not go down (to a
    lower subpackage, or an earlier line of its own), and every circle."""
    order = _order(layers)
    found = [f"{m}: in no layer" for m in edges if m not in order]
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if target not in edges:
                found.append(f"{module} imports {target}, which does not exist")
            elif module in order and target in order:
                (pkg, line), (tpkg, tline) = order[module], order[target]
                if tpkg > pkg or (tpkg == pkg and tline >= line):
                    found.append(f"{module} imports {target}, not below it")
    found += [" -> ".join(c) for c in circles(edges)]
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each module that is on one (depth-first)."""
    found, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.append(path[path.index(module) :] + [module])
            return
        if module in done:
            return
        for target in sorted(edges.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    return found


def test_every_module_imports_only_modules_below_it():
    assert problems(graph(), LAYERS) == []


def test_tree_knows_nothing_of_bases():
    edges = graph()
    below_tree = set()
    pending = ["trees.tree"]
    while pending:
        for target in edges[pending.pop()]:
            if target not in below_tree:
                below_tree.add(target)
                pending.append(target)
    changes = {"base", "engine", "live", "recipes", "kernels"}
    assert not below_tree & {f"changes.{m}" for m in changes}


def test_the_subpackages_are_the_folders():
    """Every subpackage of LAYERS is a folder of the package (a subpackage
    of one too: "proof.static"), and every folder with Python in it is a
    subpackage of LAYERS."""
    folders = {
        ".".join(p.parent.relative_to(PACKAGE).parts)
        for p in PACKAGE.rglob("*/__init__.py")
    }
    assert folders == {pkg for pkg in LAYERS if pkg}


_TWO = {"trees": ["tree"], "changes": ["engine", "base"]}


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        # the circle of issue 18: tree's detect_base imported base
        (
            {
                "trees.tree": {"changes.base"},
                "changes.base": {"changes.engine"},
                "changes.engine": {"trees.tree"},
            },
            "changes.base -> changes.engine -> trees.tree -> changes.base",
        ),
        (
            {"trees.tree": {"changes.engine"}, "changes.engine": set()},
            "trees.tree imports changes.engine, not below it",
        ),
        (
            {"changes.engine": {"changes.base"}, "changes.base": set()},
            "changes.engine imports changes.base, not below it",
        ),
        (
            {"trees.tree": set(), "trees.newmodule": {"trees.tree"}},
            "trees.newmodule: in no layer",
        ),
    ],
    ids=["circle", "upward-package", "upward-line", "unplaced"],
)
def test_the_check_finds_what_it_is_for(edges, expected):
    """Negative controls: a circle, an import of a higher subpackage, of a
    later line of its own, and a module in no layer are each reported."""
    assert expected in problems(edges, _TWO)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def detect_base(found):\n    from . import base\n", {"trees.base"}),
        ("from ..changes import engine, live\n", {"changes.engine", "changes.live"}),
        ("from xpufakes.changes.engine import State\n", {"changes.engine"}),
        ("import xpufakes.changes.engine\n", {"changes.engine"}),
        ("from xpufakes import cli\n", {"cli"}),
        ("from xpufakes.proof.static import scan\n", {"proof.static.scan"}),
        ("from xpufakes.proof.static.scan import TRACED\n", {"proof.static.scan"}),
        ("import xpufakes.proof.static.scan\n", {"proof.static.scan"}),
        ("from ..proof.static import scan\n", {"proof.static.scan"}),
        ("from xpufakes.proof import static\n", set()),
    ],
    ids=[
        "function-level",
        "relative-up",
        "from-module",
        "import",
        "top",
        "nested-from-package",
        "nested-from-module",
        "nested-import",
        "nested-relative",
        "a-subpackage-itself",
    ],
)
def test_every_import_form_counts(tmp_path, source, expected):
    for pkg in ("trees", "changes", "proof", "proof/static"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for module in ("trees/base", "changes/engine", "changes/live", "proof/static/scan"):
        (tmp_path / f"{module}.py").write_text("")
    (tmp_path / "cli.py").write_text("")
    module = tmp_path / "trees" / "tree.py"
    module.write_text(source)
    assert imports(module, tmp_path) == expected
