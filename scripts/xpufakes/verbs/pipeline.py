"""One path for every change a verb makes to a tree: plan -> prove ->
commit -> report.

A *plan* is a list of changes (transaction.Change) and what to say about
them; the series path (the series' diffs of a pinned release, apply.py /
revert.py), an upgrade of a tree patched by an earlier version of this tool
(this version's diffs, the same way), PATCHES= (a chosen set of patches) and
the recipe path (the recipes on the live files, live.py) differ only in how
they make it. The plan of the recipe path, and of any tree that is not a
verified pinned release, is *proven* before anything is written (proof/prove.py).
The *commit* is one transaction (transaction.py), with an installed wheel's
RECORD kept true (record.py); the recipe path's state file is one of its
changes. The *report* says what was done, or would be.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from xpufakes.changes import live
from xpufakes.common import transaction
from xpufakes.common.errors import STRANDED, Refusal
from xpufakes.common.transaction import Change
from xpufakes.proof import proofpython
from xpufakes.proof import prove as proof
from xpufakes.trees import record


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
    plan.changes = with_bytecode(plan.changes)
    # a tree apply cannot write is refused before the proof, and by check
    # too (it does not "apply cleanly")
    changes = record.with_record(plan.root, plan.changes, plan.record_rows)
    transaction.writable_or_refuse(changes, plan.root)
    if plan.to_prove is not None:
        prove(plan, report, no_proof)
    if dry_run:
        for line in [*plan.would, plan.would_summary]:
            report.line(line)
        return None
    _commit(plan, report)
    for line in [*plan.lines, plan.summary]:
        report.line(line)
    return Committed(plan.done, plan.leaves)


def with_bytecode(changes: list[Change]) -> list[Change]:
    """The changes, and the removal of the bytecode of every module they
    remove: `__pycache__/<name>.*.pyc` (of any Python, optimized, pytest's)
    and a `<name>.pyc` beside it, left by an import after apply (`pip
    uninstall` removes only its own Python's, and only of files RECORD
    still lists)."""
    removed = {c.path for c in changes if c.data is None}
    extra = []
    for path in sorted(removed):
        if path.suffix != ".py":
            continue
        cache = path.parent / "__pycache__"
        found = sorted(cache.glob(f"{path.stem}.*.pyc")) if cache.is_dir() else []
        found += [p for p in [path.with_suffix(".pyc")] if p.is_file()]
        extra += [Change(p, None) for p in found if p not in removed]
    return changes + extra


def prove(
    plan: Plan, report: Report, no_proof: bool = False, what: str = "the edited tree"
) -> None:
    """The proof of a plan of the recipe path (refuses if it fails); `what`
    names the tree proven."""
    kernels = plan.to_prove.kernels
    if no_proof:
        report.line(
            "WARNING: --no-proof: the edited tree is NOT proven (no fake checked)"
        )
        return
    python, why = proofpython.choose(report.note)
    report.line(f"the proof's Python: {python} ({why})")
    failures = proof.prove(
        plan.root, plan.changes, kernels, python, plan.to_prove.sources
    )
    if failures:
        raise Refusal(
            f"{what} fails the proof: " + "; ".join(failures) + "; nothing changed"
        )
    report.line(
        f"proof: every op of ours {what} calls from traced code has "
        f"a conformant fake (stand-ins: {kernels}), and its traced path, in "
        "every configuration the audit knows, reaches no call Dynamo cannot trace"
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
