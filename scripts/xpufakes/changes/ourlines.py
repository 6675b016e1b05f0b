"""Which lines of a tree's files are not the tree's own: what our series or
recipes wrote there, and anything changed since.

A file we edit keeps most of the tree's lines. The model proof excuses a
listed limit of the tree (proof/model/limits.py) only where its error
passed through lines the tree itself had before apply: a frame on any
other line of a file we edit or add is never excused.

The tree's own text of a file is what apply started from:

* a tree applied by recipe: the pre-apply bytes its state file records
  (live.py); a file it added has no text of the tree's;
* a pinned release's tree: the pristine file, its series' diffs reversed
  (engine.py); a file that is neither pristine nor patched has none;
* a tree not applied, holding none of our changes: the file as it is.

Where the tree's own text is not known, every line of the file counts as
ours (the file rule: never excused).
"""

import base64
import difflib
from pathlib import Path

from xpufakes.changes import base, engine, live, recipes
from xpufakes.common.errors import NotAffected, Refusal
from xpufakes.trees.tree import SITE_PACKAGES, Tree, locate


def not_the_trees(live_text: str, own: str) -> set[int]:
    """The 1-based numbers of the lines of live_text that are not lines of
    own kept in place (a line added, or changed)."""
    now, before = live_text.splitlines(), own.splitlines()
    kept = set()
    matcher = difflib.SequenceMatcher(None, before, now, autojunk=False)
    for block in matcher.get_matching_blocks():
        kept.update(range(block.b + 1, block.b + block.size + 1))
    return set(range(1, len(now) + 1)) - kept


def _own_texts(found: Tree, paths: set[str]) -> dict[str, str | None]:
    """path -> the tree's own text of each file of `paths`, None where not
    known."""
    state = live.read_state(found)
    if state is not None:
        own: dict[str, str | None] = dict.fromkeys(paths)
        for path, entry in state.files.items():
            if path in own:
                before = base64.b64decode(entry.before)
                own[path] = before.decode("utf-8", errors="surrogateescape")
        for path in paths - set(state.files) - set(state.added):
            own[path] = _as_is(found, path)
        return own
    try:
        detected = base.detect_base(found)
    except (NotAffected, Refusal):
        return dict.fromkeys(paths)
    if detected.series_fits:
        plan = engine.Plan.of(found, detected.pin)
        pristine = {f.path: f.pristine_text for f in engine.inspect(plan).files}
        added = {
            path for patch in plan.series.patches for path in plan.overlay_paths(patch)
        }
        return {
            path: None if path in added else pristine.get(path, _as_is(found, path))
            for path in paths
        }
    return {path: _as_is(found, path) for path in paths}


def _as_is(found: Tree, path: str) -> str | None:
    """A file of a tree not applied: its text, unless it holds our changes."""
    target = found.root / path
    if not target.is_file():
        return None
    text = target.read_text(errors="surrogateescape")
    return None if recipes.carries_ours(text) else text


def ours(root: Path, paths: set[str]) -> dict[str, set[int] | None]:
    """For each file of `paths` (tree-relative: the files our series or
    recipes edit or add) the tree has: the numbers of its lines that are not
    the tree's own, or None where the tree's own text is not known (the
    whole file is ours)."""
    try:
        found = locate(str(root))
    except Refusal:
        found = Tree(root, SITE_PACKAGES)
    present = {path for path in paths if (root / path).is_file()}
    said: dict[str, set[int] | None] = {}
    for path, own in _own_texts(found, present).items():
        if own is None:
            said[path] = None
            continue
        text = (root / path).read_text(errors="surrogateescape")
        said[path] = not_the_trees(text, own)
    return said


def frame_is_ours(frame: str, lines: dict[str, set[int] | None]) -> bool:
    """Whether a frame ("path:line") is on a line of a file of ours that is
    not the tree's own (any line, where that is not known)."""
    path, _, number = frame.rpartition(":")
    if path not in lines:
        return False
    written = lines[path]
    return written is None or not number.isdigit() or int(number) in written
