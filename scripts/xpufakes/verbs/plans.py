"""What apply and revert share in making their plans (pipeline.Plan): the
first line that says which tree this is, a PATCHES= selection and the plan
that reaches it, the sweep of what killed runs left."""

from pathlib import Path

from xpufakes.changes import base, engine, live, selection
from xpufakes.common.errors import Refusal
from xpufakes.common.transaction import Change
from xpufakes.trees.pins import Pin
from xpufakes.trees.tree import Tree
from xpufakes.verbs import pipeline
from xpufakes.verbs.pipeline import Plan, Report


def header(found: Tree, detected: base.Base, plan: engine.Plan) -> str:
    """The first line on the series path: which release, and why."""
    return (
        f"{detected.reason}, {found.shape} at {found.root} -> series {plan.series.name}"
    )


def recipe_header(found: Tree, state: live.RecipeState) -> str:
    """The first line on a tree applied by recipe."""
    return (
        f"applied by recipe on base {state.base} (vLLM {state.version}), "
        f"{found.shape} at {found.root}"
    )


def chosen(plan: engine.Plan, state: engine.TreeState, patches: list[str]) -> list[str]:
    """The patches PATCHES= names; refuses a partly applied one."""
    names = selection.select(plan.names, patches, f"series {plan.series.name}")
    if any(applied is None for applied in state.applied.values()):
        raise Refusal(engine.partial_message(state))
    return names


def reach(
    plan: engine.Plan,
    state: engine.TreeState,
    keep: set[str],
    changing: list[str],
    verb: str,
) -> Plan:
    """Leave exactly the patches in `keep` applied (PATCHES=): `changing`
    are the ones applied (verb "apply") or reverted ("revert") to get there."""
    selection.check_depends({p.name: p.depends for p in plan.series.patches}, keep)
    names = ", ".join(changing)
    done = "reverted" if verb == "revert" else "applied"
    return Plan(
        plan.tree.root,
        engine.changes_to(plan, state, keep),
        done=f"{verb} {names}",
        leaves="the selection",
        lines=[f"  {name}: {done}" for name in changing],
        summary=f"now applied: {', '.join(sorted(keep)) or 'none'}",
        would_summary=f"would {verb} {names}; nothing changed",
    )


def recipe_directories(found: Tree, pin: Pin, paths: list[Path]) -> set[Path]:
    """On the recipe path, where a killed run's temporary files and backups
    would be: the series' directories and those of the files the recipes
    write (`paths`)."""
    return engine.directories(engine.Plan.of(found, pin)) | {
        p.parent for p in paths if p.parent.is_dir()
    }


def sweep_for_recipes(
    found: Tree, pin: Pin, changes: list[Change], report: Report
) -> None:
    """On the recipe path: the strays of killed runs in the series'
    directories and in those of the files the recipes change."""
    directories = recipe_directories(found, pin, [c.path for c in changes])
    pipeline.sweep(found.root, directories, report)
