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
        "errors paths progress streams opschema",
        "ops",
        "transaction isolated",
        "children",
        "installer",
    ],
    # a vLLM tree: which release (pins, sdists, wheels, RECORD), its Python
    "trees": [
        "index natives",
        "pins wheel pysource kernelcxx",
        "pinfacts",
        "record fetch",
        "tree compiled",
    ],
    # changing a tree: recipes, series, diffs, the recipe path, the lock
    "changes": [
        "unidiff selection lock recipes",
        "series history",
        "engine kernels export opfacts esimdfacts",
        "base live authoring",
    ],
    # the proof and the audit
    "proof": [
        "reach standins proofpython models plugin",
        "treeops pathconditions",
        "schematruth",
        "quantize_convert_standin transformers_pin",
        "scan loading modelproof",
        "modeltrace",
        "audit verify schemacontracts",
        "prove testcases",
    ],
    # taking the fix upstream
    "staging": [
        "intree treechecks upstream",
        "prtext",
        "inplace",
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
    """module ("pkg.m", or "m" at the top) -> (its subpackage's rank, its
    line's rank)."""
    return {
        f"{pkg}.{m}" if pkg else m: (rank, line_rank)
        for rank, (pkg, lines) in enumerate(layers.items())
        for line_rank, line in enumerate(lines)
        for m in line.split()
    }


def _name(path: Path, package: Path) -> str:
    """ "pkg.m" for a module of a subpackage, "m" for one at the top."""
    return ".".join(path.relative_to(package).with_suffix("").parts)


def imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The modules of the package ("pkg.m", or "m" at the top) that a module
    imports, anywhere in it (a function's own imports too)."""
    own_package = _name(path, package).split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package[: len(own_package) - (node.level - 1)]
                parts = [*base, *(node.module.split(".") if node.module else [])]
            elif (node.module or "").split(".")[0] == "xpufakes":
                parts = node.module.split(".")[1:]
            else:
                continue
            if not parts or (package / parts[0] / "__init__.py").is_file():
                if len(parts) <= 1:  # from xpufakes[.pkg] import m, n
                    found.update(".".join([*parts, a.name]) for a in node.names)
                else:  # from xpufakes.pkg.m import X
                    found.add(".".join(parts[:2]))
            else:  # from xpufakes.m import X
                found.add(parts[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "xpufakes" and len(parts) > 1:
                    nested = (package / parts[1] / "__init__.py").is_file()
                    found.add(".".join(parts[1:3] if nested else parts[1:2]))
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
    """Every subpackage of LAYERS is a folder of the package, and every
    folder with Python in it is a subpackage of LAYERS."""
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
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
    ],
    ids=["function-level", "relative-up", "from-module", "import", "top"],
)
def test_every_import_form_counts(tmp_path, source, expected):
    for pkg in ("trees", "changes"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    module = tmp_path / "trees" / "tree.py"
    module.write_text(source)
    assert imports(module, tmp_path) == expected
