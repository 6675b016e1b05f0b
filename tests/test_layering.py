"""The tool's import graph: no circle, and each module imports only modules
of the layers below its own (README, Layout). Every import counts, a
function's own (`from . import base` inside a function) too: that is how
the circle tree -> base -> engine -> tree hid before issue 18."""

import ast
from pathlib import Path

import pytest

from support import tool

PACKAGE = tool.SCRIPTS / "xpufakes"

# Bottom to top. A module imports only modules of an earlier line; a new
# module must be placed here.
LAYERS = [
    # data and plain helpers, nothing of the tool's own
    "__init__ errors paths ops unidiff progress streams intree",
    # the pinned releases, the series on disk, changing files atomically
    "pins series transaction selection isolated history",
    "record lock fetch recipes children",
    # a directory that holds vllm/ (what it says it is, its files)
    "tree",
    # what a series does to a tree, the kernels it runs on, the static scan
    "engine kernels scan",
    # the base release of a tree, the recipes on its live files, the audit
    "base live loading audit",
    # verify-xpu, the cuts of the fix (export, upstream, stage's)
    "verify export authoring upstream treechecks",
    # the proof; the PR texts and the in-place test's cases
    "proof prtext testcases",
    # plan -> prove -> commit -> report; the in-place cut
    "pipeline inplace",
    "plans",
    # the verbs
    "apply revert status treetest stage bench",
    # the command line
    "cli",
    "__main__",
]


def imports(path: Path) -> set[str]:
    """The modules of the package that a module imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "xpufakes."
        ):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.split(".")[1]
                for a in node.names
                if a.name.startswith("xpufakes.")
            )
    return found


def graph() -> dict[str, set[str]]:
    return {p.stem: imports(p) - {p.stem} for p in sorted(PACKAGE.glob("*.py"))}


def problems(edges: dict[str, set[str]], layers: list[str]) -> list[str]:
    """Every module not in a layer, every import that does not go down a
    layer, and every circle."""
    layer = {m: i for i, line in enumerate(layers) for m in line.split()}
    found = [f"{m}: in no layer" for m in edges if m not in layer]
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if target not in edges:
                found.append(f"{module} imports {target}, which does not exist")
            elif module in layer and target in layer and layer[target] >= layer[module]:
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
    pending = ["tree"]
    while pending:
        for target in edges[pending.pop()]:
            if target not in below_tree:
                below_tree.add(target)
                pending.append(target)
    assert not below_tree & {"base", "engine", "live", "recipes", "kernels"}


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        # the circle of issue 18: tree's detect_base imported base
        (
            {"tree": {"base"}, "base": {"engine"}, "engine": {"tree"}},
            "base -> engine -> tree -> base",
        ),
        ({"tree": {"engine"}, "engine": set()}, "tree imports engine, not below it"),
        ({"tree": set(), "newmodule": {"tree"}}, "newmodule: in no layer"),
    ],
    ids=["circle", "upward", "unplaced"],
)
def test_the_check_finds_what_it_is_for(edges, expected):
    """Negative controls: a circle, an upward import and a module in no
    layer are each reported."""
    assert expected in problems(edges, ["tree", "engine", "base"])


def test_a_function_level_import_counts(tmp_path):
    module = tmp_path / "tree.py"
    module.write_text("def detect_base(found):\n    from . import base\n")
    assert imports(module) == {"base"}
