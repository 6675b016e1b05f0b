"""`make export VLLM=<tree> OUT=dir`: the change apply would make to that
tree, as a series a packager applies there -- `patch -p1 -F0`, `quilt`,
`git am` -- for a tree that is not a pristine release (a downstream-patched
one, on which the pinned series does not apply).

The recipes run on the tree's files as they are (live.py), the result is
proven as apply proves it, and each patch becomes a `git format-patch` file
(export.py): the hunks of that recipe against the tree's files as the
patches before it left them, the overlay files the tree receives as
new-file diffs, the DEP-3 header of the recipe. Nothing is written to the
tree, and no state file goes into the series: it is a plain change. A tree
whose files are a pinned release's gets that release's series (as `make
export PIN=<release>`)."""

import datetime
import tempfile
from pathlib import Path

from xpufakes.changes import (
    authoring,
    base,
    engine,
    export,
    live,
    lock,
    recipes,
    series,
    unidiff,
)
from xpufakes.common import transaction
from xpufakes.common.errors import Refusal
from xpufakes.trees.tree import Tree
from xpufakes.verbs import apply, pipeline
from xpufakes.verbs.pipeline import PRINTED, Report


def export_tree(found: Tree, out: Path, report: Report = PRINTED) -> list[Path]:
    """The patches written to `out` (a new or empty directory)."""
    export.refuse_unless_empty(out)
    with lock.tree_lock(found.root, exclusive=False):
        if live.read_state(found) is not None:
            raise Refusal(
                f"{found.root} is applied by recipe ({live.STATE_FILE}); export "
                "from the tree as it was: run `make revert` first; nothing written"
            )
        detected = base.detect_base(found)
        try:
            if detected.by_recipe:
                return _by_recipe(found, detected, out, report)
            return _by_series(found, detected, out, report)
        except OSError as e:
            raise Refusal(f"cannot write to {out}: {transaction.reason(e)}") from None


def _by_series(found: Tree, detected: base.Base, out: Path, report: Report):
    plan = engine.Plan.of(found, detected.pin)
    report.line(f"{detected.reason}, {found.shape} at {found.root}")
    state = engine.inspect(plan)
    if state.summary != engine.PRISTINE:
        raise Refusal(
            f"{found.root} is {state.summary}, not the pristine vLLM "
            f"{detected.pin.version}: export from the pristine tree; nothing written"
        )
    return export.export_series(detected.pin.series, out, detected.pin)


def _by_recipe(found: Tree, detected: base.Base, out: Path, report: Report):
    plan = apply.by_recipe(found, detected, None, True, report)
    pipeline.prove(plan, report)
    era = recipes.RECIPES[detected.pin.era]
    result = live.by_recipe(found, detected.pin, detected.version)
    by_patch, before, _ = live.run_recipes(
        found.root, list(era), result.mixed, keep=True
    )
    texts = {p: data.decode("utf-8", "surrogateescape") for p, data in before.items()}
    chosen = [r for r in era if r.name in result.patches]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="xpufakes-export-") as work:
        for number, recipe in enumerate(chosen, 1):
            text = _patch_text(found, detected, recipe, texts, by_patch)
            source = Path(work) / recipe.name
            source.write_text(text)
            patch = series.Patch(recipe.name, source)
            msg = export.message(patch, texts)  # texts: updated to after it
            target = out / recipe.name
            target.write_text(export.format_patch(msg, number, len(chosen)))
            written.append(target)
    (out / "series").write_text("".join(f"{p.name}\n" for p in written))
    return written


def _patch_text(
    found: Tree,
    detected: base.Base,
    recipe: recipes.Recipe,
    texts: dict[str, str],
    by_patch: dict[str, dict[str, str]],
) -> str:
    """The recipe as a patch of this tree: its header, the overlay files
    the tree receives, its hunks against `texts` (the files before it)."""
    where = (
        f"{detected.version} as in {found.root} (made on its own files by "
        f"`make export VLLM=`; base {detected.pin.version})"
    )
    header = recipe.header.format(
        releases=where, date=datetime.date.today().isoformat()
    )
    overlay = "".join(
        f"X-Overlay: {path}\n" for path in recipe.overlay if found.receives(path)
    )
    depends = "".join(f"X-Depends: {d}\n" for d in recipe.depends)
    signoff = f"Signed-off-by: {authoring.SIGNED_OFF_BY}\n"
    diff = "".join(
        unidiff.unified(texts[path], after, path)
        for path, after in by_patch.get(recipe.name, {}).items()
        if after != texts[path]
    )
    return header + overlay + depends + signoff + "---\n" + diff
