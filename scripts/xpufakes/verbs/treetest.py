"""`make test-tree`: the tests the series adds to vLLM's tests/ tree, run
inside a patched checkout or sdist with the Python that has that vLLM
(intree.py: the pytest command)."""

import os
import subprocess
import sys

from xpufakes.changes import base, engine, recipes
from xpufakes.common.errors import Refusal
from xpufakes.staging import intree
from xpufakes.trees.tree import Tree
from xpufakes.verbs.pipeline import PRINTED, Report


def test_tree(
    found: Tree,
    pytest_args: list[str] = (),
    python: str = sys.executable,
    report: Report = PRINTED,
) -> int:
    """Run the tree's copies of our in-tree tests; pytest's exit status."""
    detected = base.detect_base(found)
    plan = engine.Plan.of(found, detected.pin)
    state = engine.inspect(plan)
    report.line(f"{detected.reason}, {found.shape} at {found.root}: {state.summary}")
    if not found.has_tests:
        raise Refusal(
            "an installed package has no tests/ tree; point VLLM at the vLLM "
            "checkout or sdist it was built from"
        )
    tests = [p for p in plan.series.overlay if p.startswith("tests/") and "/test_" in p]
    missing = [p for p in tests if not (found.root / p).is_file()]
    if not tests or missing:
        first = (missing or [recipes.TREE_TEST])[0]
        raise Refusal(f"{first} is not in the tree; run make apply first")
    sys.stdout.flush()  # the line above before pytest's own
    done = subprocess.run(
        intree.command(python, [*tests, *pytest_args]),
        cwd=found.root,
        env=intree.environment(found.root, dict(os.environ)),
    )
    return done.returncode
