"""One path for every change a verb makes to a tree: plan -> prove ->
commit -> report.

A *plan* is a list of changes (transaction.Change) and what to say about
them; the series path (the series' diffs of a pinned release, apply.py /
revert.py), an upgrade of a tree patched by an earlier version of this tool
(this version's diffs, the same way), PATCHES= (a chosen set of patches) and
the recipe path (the recipes on the live files, live.py) differ only in how
they make it. The plan of the recipe path, and of any tree that is not a
verified pinned release, is *proven* before anything is written (proof.py).
The *commit* is one transaction (transaction.py), with an installed wheel's
RECORD kept true (record.py); the recipe path's state file is one of its
changes. The *report* says what was done, or would be.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import live, proof, record, transaction
from .errors import STRANDED, Refusal
from .transaction import Change


@dataclass(frozen=True)
class Report:
    """Where a verb's lines go, as they happen: `line` for what it does
    (stdout), `note` for what else is true (stderr)."""

    line: Callable[[str], None] = print
    note: Callable[[str], None] = lambda text: print(text, file=sys.stderr)


PRINTED = Report()  # the command line's


@dataclass(frozen=True)
class Committed:
    """What a commit did (a signal held until after it says so)."""

    done: str  # "applied", "reverted", "apply 0001-..."
    leaves: str  # "the tree was fully patched"


@dataclass
class ToProve:
    """What the proof needs besides the changes: the stand-in kernels and the
    tree's Python as it was before them."""

    kernels: str
    sources: dict[str, str]


@dataclass
class Plan:
    """What a verb will do to a tree, and what it will say."""

    root: Path
    changes: list[Change] = field(default_factory=list)
    unchanged: str = ""  # nothing to do: what to say instead
    done: str = ""  # for Committed
    leaves: str = ""
    lines: list[str] = field(default_factory=list)  # after the commit
    summary: str = ""
    would: list[str] = field(default_factory=list)  # in a dry run
    would_summary: str = ""
    to_prove: ToProve | None = None
    record_rows: dict | None = None  # RECORD rows to put back (revert by recipe)


def run(
    plan: Plan, report: Report, dry_run: bool = False, no_proof: bool = False
) -> Committed | None:
    """Prove, commit and report a plan; what was committed, if anything."""
    if plan.unchanged:
        report.line(plan.unchanged)
        return None
    if plan.to_prove is not None:
        _prove(plan, report, no_proof)
    if dry_run:
        for line in [*plan.would, plan.would_summary]:
            report.line(line)
        return None
    _commit(plan, report)
    for line in [*plan.lines, plan.summary]:
        report.line(line)
    return Committed(plan.done, plan.leaves)


def _prove(plan: Plan, report: Report, no_proof: bool) -> None:
    kernels = plan.to_prove.kernels
    if no_proof:
        report.line(
            "WARNING: --no-proof: the edited tree is NOT proven (no fake checked)"
        )
        return
    python = proof.torch_python()
    if python is None:
        raise Refusal(
            "the recipe path proves its result with torch, and there is none "
            f"here ({sys.executable}, $VLLM_XPU_FAKES_PROOF_PYTHON, .venv); "
            "install torch, run `make venv`, or pass --no-proof (NO_PROOF=1); "
            "nothing changed"
        )
    failures = proof.prove(
        plan.root, plan.changes, kernels, python, plan.to_prove.sources
    )
    if failures:
        raise Refusal(
            "the edited tree fails the proof: "
            + "; ".join(failures)
            + "; nothing changed"
        )
    report.line(
        "proof: every op of ours the edited tree calls from traced code has "
        f"a conformant fake (stand-ins: {kernels})"
    )


def _commit(plan: Plan, report: Report) -> None:
    root = plan.root
    changes = record.with_record(root, plan.changes, plan.record_rows)
    transaction.writable_or_refuse(changes, root)
    try:
        leftovers = transaction.commit(changes, root)
    except transaction.Stranded as e:
        raise Refusal(
            f"{e}; every other file is as before; {_finish(plan)}", status=STRANDED
        ) from None
    except OSError as e:
        raise Refusal(
            f"{transaction.reason(e)}; nothing changed (every file is as it was)"
        ) from None
    for path in leftovers:
        report.note(
            f"note: could not remove the backup {path}; the next apply or "
            "revert removes it"
        )


def _finish(plan: Plan) -> str:
    """The command that finishes a change that could not be undone."""
    root = plan.root
    command = f"run `make revert VLLM={root}`"
    if all(c.path != root / live.STATE_FILE for c in plan.changes):
        return f"{command} to restore the pristine release"
    if (root / live.STATE_FILE).is_file():
        return f"{command} to restore every file as it was before apply"
    return (
        "put each original back from where it is kept (named above): "
        "nothing in the tree records the apply, so `make revert` cannot"
    )


def sweep(root: Path, directories: set[Path], report: Report) -> None:
    """Remove what a killed run left in the directories a verb writes in."""
    for path in transaction.sweep(directories):
        report.line(
            f"  {transaction.rel(path, root)}: removed (left by an interrupted run)"
        )
