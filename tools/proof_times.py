"""Where the time of `make apply` on the recipe path goes (BENCHMARKS.md):

    .venv/bin/python tools/proof_times.py <tree> [<tree> ...]

For each tree (one that takes the recipe path; it is copied, never changed):
the stages of apply, each timed on its own -- the interpreter and the
tool's import, the base release and the recipes, the proof's key, laying
out the edited tree, the static scan, and in the proof's Python the import
of torch, of Dynamo and opcheck, the tree's own import against the stand-in
kernels and the opcheck grid -- then `make apply` itself on fresh copies:
the first time (no proof remembered) and again after `make revert` (the
proof remembered). A maintainer's measurement, not a test.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from xpufakes.changes import base, live  # noqa: E402
from xpufakes.common import isolated  # noqa: E402
from xpufakes.proof import proofpython  # noqa: E402
from xpufakes.proof import prove as proof  # noqa: E402
from xpufakes.proof.static import scan  # noqa: E402
from xpufakes.trees import tree  # noqa: E402
from xpufakes.verbs import apply  # noqa: E402
from xpufakes.verbs.pipeline import Report  # noqa: E402

CHILD = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torch._dynamo
from torch.testing._internal.optests import generate_tests  # noqa: F401
t2 = time.perf_counter()
from xpufakes.proof import verify
from xpufakes.proof.xpu import extensions, reference, registering, xpu_kernels
libraries = reference.define_standins(sys.argv[2])
xpu_kernels.stub_xpu_kernel_package()
extensions.stub_vllm_extensions(Path(sys.argv[1]))
registering.import_registering_module(Path(sys.argv[1]))
t3 = time.perf_counter()
called = {op.split(".")[0] for op in json.loads(sys.argv[3])}
for case in reference.reference().opcheck_cases(full=False):
    if case.available() and f"{case.namespace}::{case.name}" in called:
        try:
            torch.library.opcheck(
                case.op(), case.args("cpu"), test_utils=verify.TEST_UTILS
            )
        except Exception:
            pass
t4 = time.perf_counter()
print(f"{t1 - t0:.2f} {t2 - t1:.2f} {t3 - t2:.2f} {t4 - t3:.2f}", flush=True)
import os
os._exit(0)  # as the proof's Python ends: no teardown of torch
"""


def _timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def _wall(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return time.perf_counter() - start


def stages(root: Path, work: Path) -> list[tuple[str, float]]:
    copy = work / "stages"
    shutil.copytree(root, copy, symlinks=True)
    python, _ = proofpython.choose(print)
    startup = min(
        _wall([sys.executable, "-c", "import xpufakes.cli"], isolated.env())
        for _ in range(3)
    )
    found = tree.locate(str(copy))
    detected, t_base = _timed(base.detect_base, found)
    if not detected.by_recipe:
        raise SystemExit(f"{root}: not a recipe-path tree ({detected.reason})")
    result, t_recipes = _timed(live.by_recipe, found, detected.pin, detected.version)
    plan = apply.by_recipe(found, detected, None, True, Report(lambda _: None))
    edited, t_read = _timed(proof.EditedTree, found.root, result.changes)
    _, t_key = _timed(
        lambda: proof.ProofCache(edited, plan.to_prove.kernels, python).key
    )
    laid = work / "laid-out"
    _, t_layout = _timed(edited.lay_out, laid)
    (sites, _), t_scan = _timed(scan.scan, edited.sources(result.sources))
    start = time.perf_counter()
    out = subprocess.run(
        [python, "-c", CHILD, str(laid), plan.to_prove.kernels, json.dumps([*sites])],
        capture_output=True,
        text=True,
        env=isolated.env(),
        cwd=laid,
    )
    t_child = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"the proof's Python failed: {out.stderr.strip()[-500:]}")
    t_torch, t_dynamo, t_tree, t_grid = map(float, out.stdout.split()[-4:])
    return [
        ("interpreter + the tool's import", startup),
        ("base release (base.detect_base)", t_base),
        ("recipes on the live files", t_recipes),
        ("edited tree read + proof key", t_read + t_key),
        ("edited tree laid out (symlinks)", t_layout),
        ("static scan of call sites", t_scan),
        ("proof's Python, whole", t_child),
        ("  of it: import torch", t_torch),
        ("  of it: Dynamo + opcheck", t_dynamo),
        ("  of it: the tree's import (stand-ins)", t_tree),
        ("  of it: opcheck grid of the ops called", t_grid),
    ]


def end_to_end(root: Path, work: Path) -> list[tuple[str, float]]:
    env = dict(os.environ, VLLM_XPU_FAKES_PROOF_CACHE=str(work / "proofs"))
    make = ["make", "-s", "-C", str(REPO)]
    copy = work / "make"
    shutil.copytree(root, copy, symlinks=True)
    first = _wall([*make, "apply", f"VLLM={copy}"], env)
    _wall([*make, "revert", f"VLLM={copy}"], env)
    again = _wall([*make, "apply", f"VLLM={copy}"], env)
    _wall([*make, "revert", f"VLLM={copy}"], env)
    return [
        ("make apply, first (no proof remembered)", first),
        ("make apply, again (after make revert)", again),
    ]


def main(trees: list[str]) -> None:
    for given in trees:
        root = Path(given).resolve()
        with tempfile.TemporaryDirectory(prefix="xpufakes-times-") as work:
            rows = stages(root, Path(work)) + end_to_end(root, Path(work))
        print(f"{root}:")
        for name, seconds in rows:
            print(f"  {name:42} {seconds:6.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
