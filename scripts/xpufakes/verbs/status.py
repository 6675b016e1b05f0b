"""`make status`: which release a tree is or is based on, its series, each
patch applied or not, each file's state, the strays of killed runs; or, for
a tree applied by recipe, each file the state file records."""

from xpufakes.changes import base, engine, live, lock
from xpufakes.common import transaction
from xpufakes.common.errors import Refusal
from xpufakes.trees.tree import Tree
from xpufakes.verbs import plans
from xpufakes.verbs.pipeline import PRINTED, Report


def status(found: Tree, report: Report = PRINTED) -> None:
    with lock.tree_lock(found.root, exclusive=False):
        state = live.read_state(found)
        lines = by_recipe(found, state) if state is not None else by_series(found)
    for line in lines:
        report.line(line)


def by_series(found: Tree) -> list[str]:
    detected = base.detect_base(found)
    plan = engine.Plan.of(found, detected.pin)
    state = engine.inspect(plan)
    strays = transaction.strays(engine.directories(plan))
    lines = [
        f"{detected.reason}, {found.shape} at {found.root}",
        f"series {plan.series.name} ({len(plan.series.patches)} patch(es))",
    ]
    lines += [
        f"  {name}: {engine.applied_word(applied)}"
        for name, applied in state.applied.items()
    ]
    for f in state.files:
        extra = (
            f" ({f.stage} of {f.stages} diffs)" if f.status == engine.PARTIAL else ""
        )
        said = f.said
        if said == engine.MODIFIED and not f.carries_ours:
            said = "modified, not applied"
        lines.append(f"  {f.path}: {said}{extra}")
    lines += [f"  {o.path}: {o.status}" for o in state.overlay]
    if detected.by_recipe:
        lines += _recipe_lines(found, detected, {f.path for f in state.files})
    lines += _stray_lines(found, strays)
    summary = state.summary
    if summary == engine.MODIFIED and not any(
        f.carries_ours or f.status in (engine.MISSING, engine.DANGLING)
        for f in state.files
    ):
        summary = "modified, not applied (apply runs the recipes on it)"
    lines.append(f"state: {summary}")
    return lines


def by_recipe(found: Tree, state: live.RecipeState) -> list[str]:
    files = live.file_states(found, state)
    written = [found.root / p for p in (*files, live.STATE_FILE)]
    strays = transaction.strays(plans.recipe_directories(found, state.pin, written))
    return [
        plans.recipe_header(found, state),
        f"patches: {', '.join(state.patches)} ({live.STATE_FILE})",
        *(f"  {path}: {said}" for path, said in files.items()),
        *_stray_lines(found, strays),
        f"state: {live.summary(files)}",
    ]


def _stray_lines(found: Tree, strays: list[transaction.Stray]) -> list[str]:
    """What a killed run left (the next apply or revert removes it), or what
    a running one is writing."""
    lines = []
    for stray in strays:
        rel = transaction.rel(stray.path, found.root)
        if stray.dead:
            lines.append(
                f"  {rel}: left by an interrupted run "
                "(the next apply or revert removes it)"
            )
        else:
            lines.append(f"  {rel}: being written by the running process {stray.pid}")
    return lines


def _recipe_lines(found: Tree, detected: base.Base, listed: set[str]) -> list[str]:
    """What apply's recipe path would change besides the series' files
    (the recipes find the IPEX WOQ anchor in any file of vllm/), or why it
    would refuse."""
    try:
        result = live.by_recipe(found, detected.pin, detected.version)
    except Refusal as e:
        why = str(e).removesuffix("; nothing changed")
        return [f"  the recipes would refuse this tree: {why}"]
    return [
        f"  {path}: would change by recipe (not in the series)"
        for path in result.edited
        if path not in listed
    ]
