"""`make revert`: the plan that takes a tree back -- to the pristine release
(the series path: each file's pristine text, our files removed; PATCHES=:
the patches not chosen kept), or to the exact pre-apply bytes of a tree
applied by recipe -- run through the pipeline."""

from pathlib import Path

from xpufakes.changes import base, engine, live, lock
from xpufakes.common.transaction import Change
from xpufakes.trees.tree import Tree
from xpufakes.verbs import pipeline, plans
from xpufakes.verbs.pipeline import PRINTED, Committed, Plan, Report


def revert(
    found: Tree, patches: list[str] | None = None, report: Report = PRINTED
) -> Committed | None:
    """Revert the fix on a located tree; what was committed, if anything."""
    with lock.tree_lock(found.root):
        state = live.read_state(found)
        if state is not None:
            plan = by_recipe(found, state, patches, report)
        else:
            plan = by_series(found, patches, report)
        return pipeline.run(plan, report)


def _removed_or_restored(root: Path, changes: list[Change]) -> list[str]:
    return [
        f"  {c.path.relative_to(root)}: "
        + ("removed" if c.data is None else "restored")
        for c in changes
    ]


def by_series(found: Tree, patches: list[str] | None, report: Report) -> Plan:
    detected = base.detect_base(found)
    plan = engine.Plan.of(found, detected.pin)
    report.line(plans.header(found, detected, plan))
    pipeline.sweep(found.root, engine.directories(plan), report)
    state = engine.inspect(plan)
    engine.refuse_if_modified(plan, state, reverting=True)
    applied = {n for n, a in state.applied.items() if a}
    if patches:
        reverting = [n for n in plans.chosen(plan, state, patches) if n in applied]
        if not reverting:
            return Plan(found.root, unchanged="not applied; nothing changed")
        return plans.reach(plan, state, applied - set(reverting), reverting, "revert")
    changes = engine.changes_to(plan, state, set())
    if not changes:
        return Plan(found.root, unchanged="not applied; nothing changed")
    return Plan(
        found.root,
        changes,
        done="reverted",
        leaves="the tree was the pristine release",
        lines=_removed_or_restored(found.root, changes),
        summary=_reverted_to(detected),
    )


def _reverted_to(detected: base.Base) -> str:
    """The last line of a series revert: the tree as it is, which is the
    pinned release only when its version is (a newer release, or a build,
    whose files were the pin's is itself again, not the pin)."""
    if detected.exact:
        return f"reverted: the tree is the pristine vLLM {detected.pin.version} again"
    return (
        f"reverted: the tree is vLLM {detected.version} as it was before apply "
        f"(the series' files are vLLM {detected.pin.version}'s again)"
    )


def by_recipe(
    found: Tree, state: live.RecipeState, patches: list[str] | None, report: Report
) -> Plan:
    report.line(plans.recipe_header(found, state))
    if not live.reverts_all(state, patches):
        return Plan(found.root, unchanged="not applied; nothing changed")
    changes = live.changes_to_revert(found, state)
    plans.sweep_for_recipes(found, state.pin, changes, report)
    return Plan(
        found.root,
        changes,
        done="reverted",
        leaves="the tree was as it was before apply",
        lines=_removed_or_restored(found.root, changes),
        summary="reverted: every file is as it was before apply",
        record_rows=state.record,
    )
