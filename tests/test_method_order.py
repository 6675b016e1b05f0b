"""The source search's method order (trees/pysource.py) is Python's: for
each hierarchy below, defined in a small tree of modules, `SourceTree.mro`
and `SourceTree.method` agree with the classes Python itself builds from
the same source (`type.mro()`, attribute lookup). The negative control is
the breadth-first walk the search used before (it fails the first two
hierarchies), run through the same comparison."""

import importlib
import sys

import pytest

from xpufakes.trees import names, pysource

# module -> source; each class `f` returns its own name, so the method Python
# calls names its owner.
HIERARCHIES = {
    # The case: D(B, C) with B(A) and C unrelated. Python: D B A C.
    "b_a_then_c": {
        "pkg/base.py": "class A:\n    def f(self): return 'A'\n",
        "pkg/mid.py": (
            "from pkg.base import A\n"
            "class B(A):\n    pass\n"
            "class C:\n    def f(self): return 'C'\n"
        ),
        "pkg/top.py": "from pkg import mid\nclass D(mid.B, mid.C):\n    pass\n",
    },
    # Two diamonds sharing a root, bases in another module, one re-exported.
    "double_diamond": {
        "pkg/__init__.py": "from pkg.root import O\n",
        "pkg/root.py": "class O:\n    def f(self): return 'O'\n",
        "pkg/left.py": (
            "from pkg import O\n"
            "class A(O):\n    pass\n"
            "class B(O):\n    def f(self): return 'B'\n"
        ),
        "pkg/right.py": (
            "from pkg.root import O\n"
            "class C(O):\n    def f(self): return 'C'\n"
            "class E(O):\n    pass\n"
        ),
        "pkg/top.py": (
            "from pkg.left import A, B\n"
            "from pkg.right import C, E\n"
            "class K1(A, B, C):\n    pass\n"
            "class K2(E, B):\n    pass\n"
            "class D(K1, K2):\n    pass\n"
        ),
    },
    # The classic diamond: both orders agree with breadth-first too.
    "diamond": {
        "pkg/top.py": (
            "class A:\n    def f(self): return 'A'\n"
            "class B(A):\n    pass\n"
            "class C(A):\n    def f(self): return 'C'\n"
            "class D(B, C):\n    pass\n"
        ),
    },
    # A chain longer than the old walk's cap of 30 classes; the method is on
    # the root.
    "long_chain": {
        "pkg/top.py": "class K0:\n    def f(self): return 'K0'\n"
        + "".join(f"class K{i}(K{i - 1}):\n    pass\n" for i in range(1, 41))
        + "class D(K40):\n    pass\n",
    },
}


def _python_classes(texts, root) -> dict[str, dict[str, type]]:
    """Python's own classes from the same source, written under root and
    imported."""
    for path, text in {"pkg/__init__.py": "", **texts}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    modules_named = [names.module_name(p) for p in texts]
    for name in [n for n in sys.modules if n.split(".")[0] == "pkg"]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        modules = {name: importlib.import_module(name) for name in modules_named}
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] == "pkg"]:
            del sys.modules[name]
    return {
        name: {k: v for k, v in vars(m).items() if isinstance(v, type)}
        for name, m in modules.items()
    }


def _breadth_first(source: pysource.SourceTree, module: str, cls: str):
    """The walk the search used before C3 (the known-wrong order)."""
    order, pending = [], [(module, cls)]
    while pending:
        current = pending.pop(0)
        if current in order or len(order) > 30:
            continue
        order.append(current)
        pending.extend(source.base_classes(*current))
    return order


def _mismatches(texts, order_of, root) -> list[str]:
    """Every class of the hierarchy whose order (or whose method f) differs
    from Python's."""
    source = pysource.SourceTree(texts)
    found = []
    for module, classes in _python_classes(texts, root).items():
        for name, cls in classes.items():
            if cls.__module__ != module:
                continue  # an import of a class defined elsewhere
            python = [(k.__module__, k.__qualname__) for k in cls.mro()[:-1]]
            ours = order_of(source, module, name)
            if ours != python:
                found.append(f"{module}.{name}: {ours} != {python}")
            owner = next((k for k in cls.mro() if "f" in vars(k)), None)
            if owner is not None:
                python_f = (owner.__module__, f"{owner.__qualname__}.f")
                ours_f = next(
                    (
                        (m, f"{c}.f")
                        for m, c in ours
                        if f"{c}.f" in source.module(m).functions
                    ),
                    None,
                )
                if ours_f != python_f:
                    found.append(f"{module}.{name}.f: {ours_f} != {python_f}")
    return found


@pytest.mark.parametrize("hierarchy", sorted(HIERARCHIES))
def test_method_order_is_pythons(hierarchy, tmp_path):
    texts = HIERARCHIES[hierarchy]
    assert _mismatches(texts, pysource.SourceTree.mro, tmp_path / "a") == []
    # method(), which the search calls, picks Python's override
    source = pysource.SourceTree(texts)
    top = _python_classes(texts, tmp_path / "b")["pkg.top"]["D"]
    found = source.method("pkg.top", "D", "f")
    assert found is not None and found.qualname.split(".")[0] == top().f()


@pytest.mark.parametrize("hierarchy", ["b_a_then_c", "double_diamond", "long_chain"])
def test_breadth_first_order_fails_the_comparison(hierarchy, tmp_path):
    """The negative control: the old walk (breadth-first, capped at 31
    classes) differs from Python on these, and the comparison says so."""
    assert _mismatches(HIERARCHIES[hierarchy], _breadth_first, tmp_path)


def test_cycle_and_inconsistent_order_do_not_stop_the_search():
    """A base read as the class itself (a name bound twice), and an order
    Python would refuse (the source read picked the wrong binding): the
    search still gives every class once, the class first."""
    texts = {
        "pkg/top.py": (
            "class A:\n    pass\n"
            "class B(A):\n    pass\n"
            "class X(A, B):\n    pass\n"  # Python: TypeError (no consistent MRO)
            "class Loop(Loop):\n    pass\n"
        ),
    }
    source = pysource.SourceTree(texts)
    assert source.mro("pkg.top", "X") == [
        ("pkg.top", "X"),
        ("pkg.top", "A"),
        ("pkg.top", "B"),
    ]
    assert source.mro("pkg.top", "Loop") == [("pkg.top", "Loop")]
