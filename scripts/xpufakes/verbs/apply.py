"""`make apply` and `make check`: the plan for a tree -- its release's series
(all of it, an upgrade of a tree patched by an earlier version of this tool,
or the PATCHES= chosen), or the recipes on its live files -- run through
the pipeline (check: a dry run, the proof included)."""

from xpufakes.changes import (
    base,
    engine,
    kernels,
    live,
    lock,
    recipes,
    selection,
    series,
)
from xpufakes.common.errors import NotAffected, Refusal
from xpufakes.trees import tree
from xpufakes.trees.tree import Tree
from xpufakes.verbs import pipeline, plans
from xpufakes.verbs.pipeline import PRINTED, Committed, Plan, Report, ToProve


def apply(
    found: Tree,
    patches: list[str] | None = None,
    dry_run: bool = False,
    no_proof: bool = False,
    report: Report = PRINTED,
) -> Committed | None:
    """Apply (or, dry_run, check) the fix on a located tree; what was
    committed, if anything."""
    with lock.tree_lock(found.root, exclusive=not dry_run):
        state = live.read_state(found)
        if state is not None:
            return pipeline.run(on_recipe_state(found, state, patches, report), report)
        detected = base.detect_base(found)
        if detected.by_recipe:
            try:
                plan = by_recipe(found, detected, patches, dry_run, report)
            except live.RecipesRefused as refused:
                if not refused.structural or no_proof or patches:
                    raise
                already_right(found, detected, refused, report)
        else:
            plan = by_series(found, detected, patches, dry_run, report)
        return pipeline.run(plan, report, dry_run, no_proof)


def by_series(
    found: Tree,
    detected: base.Base,
    patches: list[str] | None,
    dry_run: bool,
    report: Report,
) -> Plan:
    plan = engine.Plan.of(found, detected.pin)
    report.line(plans.header(found, detected, plan))
    if not dry_run:
        pipeline.sweep(found.root, engine.directories(plan), report)
    state = engine.inspect(plan)
    engine.refuse_if_modified(plan, state)
    if patches:
        return _selected(plan, state, patches)
    if state.summary == engine.PATCHED:
        return Plan(found.root, unchanged="already applied; nothing changed")
    if state.summary == engine.OUTDATED:
        return _upgrade(plan, state)
    if state.summary != engine.PRISTINE:
        raise Refusal(engine.partial_message(state))
    return _whole(plan, state)


def _describe(plan: engine.Plan, patch: series.Patch) -> str:
    parts = list(patch.targets)
    added = plan.overlay_paths(patch)
    if added:
        parts.append("new: " + ", ".join(added))
    return "; ".join(parts)


def _whole(plan: engine.Plan, state: engine.TreeState) -> Plan:
    """A pristine tree, the whole series."""
    changes = engine.changes_to(plan, state, set(plan.names))
    patches = plan.series.patches
    added = sum(1 for c in changes if c.mode is not None)
    return Plan(
        plan.tree.root,
        changes,
        done="applied",
        leaves="the tree was fully patched",
        lines=[f"  {p.name}: applied ({_describe(plan, p)})" for p in patches],
        summary=f"applied {len(patches)} patch(es): "
        f"{len(changes) - added} file(s) changed, {added} added",
        would=[
            f"  {p.name}: would apply cleanly ({_describe(plan, p)})" for p in patches
        ],
        would_summary=f"would apply {len(patches)} patch(es); nothing changed",
    )


def _upgrade(plan: engine.Plan, state: engine.TreeState) -> Plan:
    """A tree patched by an earlier version of this tool: its files become
    this version's (the whole series, from the pristine texts)."""
    changes = engine.changes_to(plan, state, set(plan.names))
    paths = [c.path.relative_to(plan.tree.root) for c in changes]
    return Plan(
        plan.tree.root,
        changes,
        done="upgraded",
        leaves="the tree was fully patched",
        lines=[f"  {p}: upgraded" for p in paths],
        summary=f"upgraded {len(changes)} file(s) written by an earlier version",
        would=[f"  {p}: would be upgraded" for p in paths],
        would_summary="patched by an earlier version; would upgrade; nothing changed",
    )


def _selected(plan: engine.Plan, state: engine.TreeState, patches: list[str]) -> Plan:
    names = plans.chosen(plan, state, patches)
    applied = {n for n, a in state.applied.items() if a}
    if set(names) <= applied:
        return Plan(
            plan.tree.root,
            unchanged=f"already applied: {', '.join(names)}; nothing changed",
        )
    adding = [n for n in names if n not in applied]
    return plans.reach(plan, state, applied | set(adding), adding, "apply")


def by_recipe(
    found: Tree,
    detected: base.Base,
    patches: list[str] | None,
    dry_run: bool,
    report: Report,
) -> Plan:
    """The recipes on the live files, to be proven."""
    report.line(f"{detected.reason}; {found.shape} at {found.root}")
    result = live.by_recipe(found, detected.pin, detected.version, patches)
    if result.mixed:
        report.line(
            "mixed tree: IPEX era, and its code calls the _xpu_C GEMMs: "
            "registering the fakes of both"
        )
    kept = recipes.own_tree_fake_ops(result.sources.get(recipes.XPU_OPS, ""))
    for op in kept:
        report.note(kept_fake_warning(op))
    if not dry_run:
        plans.sweep_for_recipes(found, detected.pin, result.changes, report)
    edited = [f"  {path}: changed by recipe" for path in result.edited]
    added = [f"  {path}: added" for path in result.added]
    also = f"; the tree's own fake kept for {', '.join(kept)}" if kept else ""
    return Plan(
        found.root,
        result.changes,
        done="applied by recipe",
        leaves="the tree was fully patched",
        lines=edited + added,
        summary=f"applied {len(result.patches)} patch(es) by recipe: "
        f"{len(result.edited)} file(s) changed, {len(result.added)} added; "
        f"what was done is in {live.STATE_FILE}{also}",
        would=[f"  {path}: would change by recipe" for path in result.edited]
        + [f"  {path}: would be added" for path in result.added],
        would_summary=f"would apply {', '.join(result.patches)} by recipe{also}; "
        "nothing changed",
        # the stand-ins of the base release the tree is judged as
        to_prove=ToProve(
            kernels.with_image(
                found.root, kernels.standins(detected.pin.kernels, result.mixed)
            ),
            result.sources,
        ),
    )


def already_right(
    found: Tree, detected: base.Base, refused: Refusal, report: Report
) -> None:
    """The recipes do not fit the tree: it may need no fix at all (its own
    fakes already right, e.g. vLLM took this fix). The tree as it is is
    proven: if it passes, it is not affected (NotAffected: success, nothing
    changed); if not, the recipes' refusal stands."""
    sources = tree.python_sources(found.root)
    standins = kernels.standins(
        detected.pin.kernels, kernels.is_mixed(detected.pin.kernels, sources)
    )
    plan = Plan(found.root, to_prove=ToProve(standins, sources))
    why = str(refused).removesuffix("; nothing changed")
    report.line(f"the recipes do not fit ({why}): proving the tree as it is")
    try:
        pipeline.prove(plan, report, what="the tree as it is")
    except Refusal:
        raise refused from None
    raise NotAffected(
        f"vLLM {detected.version} is not affected (every op of ours it calls from "
        "traced code already has a conformant fake, proven): nothing to do"
    )


def on_recipe_state(
    found: Tree, state: live.RecipeState, patches: list[str] | None, report: Report
) -> Plan:
    """A tree applied by recipe: already applied, or refused."""
    report.line(plans.recipe_header(found, state))
    live.refuse_unless_applied(found, state)
    wanted = selection.select(live.recipe_names(state), patches, "the recipes")
    missing = [n for n in wanted if n not in state.patches]
    if missing and not patches:  # a recipe that changes nothing here is not missing
        missing = live.changing(found, missing, state.pin.era)
    if missing:
        raise Refusal(
            f"{', '.join(state.patches)} applied by recipe; to add "
            f"{', '.join(missing)}, run `make revert` and apply them together; "
            "nothing changed"
        )
    return Plan(found.root, unchanged="already applied; nothing changed")


def kept_fake_warning(op: str) -> str:
    """What apply says of a tree's own fake it keeps (do no harm)."""
    return (
        f"warning: {recipes.XPU_OPS}: the tree's own fake of {op} is not one of "
        "vLLM's releases' (its image may build the kernels with another schema): "
        "kept; ours replaces it at start-up only where the live schema is one "
        "ours is exact for (make audit names it)"
    )
