"""Proof before commit on the recipe path: the edited tree, materialised in
a temporary directory (its vllm/ package with the edited and added files),
is audited as `make audit` does -- the static scan of the ops it calls in
traced code, and its own fake registrations loaded against the stand-in
kernels in a separate Python with torch -- and every op of ours that it
calls from traced code must have a conformant fake.

The tool itself needs no torch; the proof does. It runs with
$VLLM_XPU_FAKES_PROOF_PYTHON if set, else this Python if it has torch, else
this repository's .venv/bin/python (`make venv`). Without any, apply on the
recipe path refuses unless told --no-proof.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import isolated, paths
from .errors import Refusal
from .ops import is_ours
from .transaction import Change

GOOD_VERDICTS = ("ok", "not traced", "ok (no tensor returned)")


def torch_python() -> str | None:
    """A Python that has torch, or None."""
    override = os.environ.get("VLLM_XPU_FAKES_PROOF_PYTHON")
    if override:
        return override
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    venv = paths.REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else None


def _materialise(root: Path, changes: list[Change], work: Path) -> Path:
    shutil.copytree(
        root / "vllm",
        work / "vllm",
        symlinks=True,
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    for change in changes:
        rel = change.path.relative_to(root)
        if rel.parts[0] != "vllm" or change.data is None:
            continue
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(change.data)
    return work


def prove(
    root: Path,
    changes: list[Change],
    kernels: str,
    python: str,
    sources: dict[str, str] | None = None,
) -> list[str]:
    """'<op>: <verdict>' for each op of ours the edited tree calls from
    traced code without a conformant fake (empty: proven)."""
    with tempfile.TemporaryDirectory(prefix="xpufakes-proof-") as work:
        tree = _materialise(root, changes, Path(work))
        done = subprocess.run(
            [python, "-m", "xpufakes", "audit", str(tree), "--json"]
            + ["--standins", kernels],
            capture_output=True,
            text=True,
            env=isolated.env(),
        )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Refusal(
            f"the proof could not run ({python}: {tail}); nothing changed"
        ) from None
    return [
        f"{op['op']}: {op['verdict']}"
        + (f" ({op['detail'][:120]})" if op.get("detail") else "")
        for op in report["ops"]
        if is_ours(op["op"]) and op["verdict"] not in GOOD_VERDICTS
    ]
