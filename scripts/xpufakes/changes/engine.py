"""What a series does to a tree: its state, and the changes that leave a
chosen set of its patches applied (all of them: apply, an upgrade of a tree
patched by an earlier version; none: revert; some: PATCHES=). Everything is
computed in memory; nothing here writes files."""

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from xpufakes.changes import history, recipes, unidiff
from xpufakes.changes.series import Patch, Series, overlay_source
from xpufakes.changes.series import load as load_series
from xpufakes.common.errors import Refusal
from xpufakes.common.transaction import Change
from xpufakes.trees.pins import Pin
from xpufakes.trees.tree import Tree

PRISTINE, PATCHED, PARTIAL, MODIFIED, MISSING = (
    "pristine",
    "patched",
    "partially patched",
    "modified",
    "missing",
)
# a target that is a symlink to nothing: named as such, never "missing"
DANGLING = "a dangling symlink"
ABSENT, OURS, FOREIGN = "absent", "present", "present, not ours"
OLDER = "present, ours (an older version)"
# a target file patched by an earlier version of this tool's series
PATCHED_OLDER = "patched by an earlier version"
OUTDATED = "patched by an earlier version of this tool"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FileState:
    path: str
    status: str  # PRISTINE, PATCHED, PATCHED_OLDER, PARTIAL, MODIFIED, MISSING
    # or DANGLING
    stage: int  # how many of the series' diffs of this file are applied
    stages: int  # how many diffs of the series touch this file
    pristine_text: str | None = None  # the pristine content, when known
    carries_ours: bool = False  # a modified file holding some of our changes
    link: str = ""  # DANGLING: where the symlink points

    @property
    def said(self) -> str:
        """The state in words (a dangling symlink with its target)."""
        if self.status == DANGLING:
            return f"{DANGLING} (to {self.link})"
        return self.status


@dataclass
class OverlayState:
    path: str
    patch: str
    status: str  # ABSENT, OURS, OLDER or FOREIGN


@dataclass
class TreeState:
    files: list[FileState]
    overlay: list[OverlayState]
    applied: dict[str, bool | None] = field(default_factory=dict)  # None: unclear

    @property
    def summary(self) -> str:
        if any(f.status in (MODIFIED, MISSING, DANGLING) for f in self.files) or any(
            o.status == FOREIGN for o in self.overlay
        ):
            return MODIFIED
        older = any(o.status == OLDER for o in self.overlay) or any(
            f.status == PATCHED_OLDER for f in self.files
        )
        # None (partly applied) is neither applied nor not applied
        if all(applied is True for applied in self.applied.values()):
            return OUTDATED if older else PATCHED
        if all(applied is False for applied in self.applied.values()):
            return PRISTINE
        if older and None not in self.applied.values():
            # an earlier version's series, whose patches are applied, lacked
            # the others (a patch added since): apply upgrades to the whole
            return OUTDATED
        return PARTIAL


@dataclass
class Plan:
    """A tree, the release it is, and the series it takes."""

    tree: Tree
    pin: Pin
    series: Series

    @classmethod
    def of(cls, found: Tree, pin: Pin) -> "Plan":
        """The tree as the release `pin`, with its series."""
        return cls(found, pin, load_series(pin.series))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.series.patches]

    def overlay_paths(self, patch: Patch) -> list[str]:
        """The overlay files this tree receives (Tree.receives)."""
        return [p for p in patch.overlay if self.tree.receives(p)]

    def overlay_bytes(self, path: str) -> bytes:
        source = overlay_source(path)
        if not source.is_file():
            raise Refusal(f"overlay file {path} is missing from {source.parent}")
        return source.read_bytes()

    def diffs_of(self, path: str) -> list[tuple[Patch, unidiff.FileDiff]]:
        return [
            (patch, d)
            for patch in self.series.patches
            for d in patch.file_diffs
            if d.path == path
        ]


def inspect(plan: Plan) -> TreeState:
    files = [_file_state(plan, path) for path in plan.series.targets]
    overlay = []
    for patch in plan.series.patches:
        for path in plan.overlay_paths(patch):
            target = plan.tree.root / path
            _refuse_odd_overlay_path(target, path)
            if not target.exists():
                status = ABSENT
            else:
                data = _read(target, path)
                if data == plan.overlay_bytes(path):
                    status = OURS
                elif sha256(data) in history.known(path):
                    status = OLDER
                else:
                    status = FOREIGN
            overlay.append(OverlayState(path, patch.name, status))
    state = TreeState(files, overlay)
    for patch in plan.series.patches:
        state.applied[patch.name] = _patch_applied(plan, patch, state)
    return state


def _file_state(plan: Plan, path: str) -> FileState:
    diffs = [d for _, d in plan.diffs_of(path)]
    target = plan.tree.root / path
    if target.is_dir():
        raise Refusal(f"{path} is a directory, not vLLM's file; nothing changed")
    if not target.is_file():
        if target.is_symlink():
            return FileState(path, DANGLING, 0, len(diffs), link=os.readlink(target))
        return FileState(path, MISSING, 0, len(diffs))
    text = _read(target, path).decode("utf-8", errors="surrogateescape")
    pristine = plan.pin.files.get(path)
    if pristine is None:
        raise Refusal(
            f"pins.toml has no pristine sha256 of {path} for {plan.pin.version}"
        )
    # The file is at stage j if reversing its last j diffs gives the pristine file.
    for stage in range(len(diffs), -1, -1):
        try:
            candidate = text
            for d in reversed(diffs[:stage]):
                candidate = unidiff.apply(candidate, d, reverse=True)
        except unidiff.DiffError:
            continue
        if sha256(candidate.encode("utf-8", errors="surrogateescape")) == pristine:
            status = (
                PRISTINE if stage == 0 else PATCHED if stage == len(diffs) else PARTIAL
            )
            return FileState(path, status, stage, len(diffs), candidate)
    for earlier in history.earlier_diffs(path):
        try:
            candidate = text
            for d in reversed(earlier):
                candidate = unidiff.apply(candidate, d, reverse=True)
        except unidiff.DiffError:
            continue
        if sha256(candidate.encode("utf-8", errors="surrogateescape")) == pristine:
            return FileState(path, PATCHED_OLDER, len(diffs), len(diffs), candidate)
    return FileState(
        path, MODIFIED, -1, len(diffs), carries_ours=recipes.carries_ours(text)
    )


def _patch_applied(plan: Plan, patch: Patch, state: TreeState) -> bool | None:
    """True if all of the patch is in the tree, False if none of it, None if
    some of it or if the tree is modified."""
    present = []
    by_path = {f.path: f for f in state.files}
    for d in patch.file_diffs:
        f = by_path[d.path]
        if f.status == MODIFIED and not f.carries_ours:
            present.append(False)  # modified, but none of ours in it
            continue
        if f.status in (MODIFIED, MISSING, DANGLING):
            return None
        position = [x for _, x in plan.diffs_of(d.path)].index(d)
        present.append(f.stage > position)
    for o in state.overlay:
        if o.patch == patch.name:
            if o.status == FOREIGN:
                return None
            present.append(o.status in (OURS, OLDER))
    if all(present):
        return True
    if not any(present):
        return False
    return None


def _read(target: Path, path: str) -> bytes:
    try:
        return target.read_bytes()
    except OSError as e:
        raise Refusal(
            f"{path}: cannot read it ({e.strerror}); nothing changed"
        ) from None


def _refuse_odd_overlay_path(target: Path, path: str) -> None:
    """What sits where an overlay file goes must be nothing or a regular
    file: a directory or a symlink (dangling or not) is someone else's."""
    if target.is_symlink():
        what = "a symlink" if target.exists() else "a dangling symlink"
        raise Refusal(
            f"{path} is {what}; this series installs a regular file there; "
            "nothing changed"
        )
    if target.is_dir():
        raise Refusal(
            f"{path} is a directory; this series installs a file there; nothing changed"
        )


def directories(plan: Plan) -> set[Path]:
    """Every directory the series writes in (through symlinked targets):
    where a killed run's temporary files and backups would be."""
    paths = [plan.tree.root / p for p in plan.series.targets]
    paths += [
        plan.tree.root / p
        for patch in plan.series.patches
        for p in plan.overlay_paths(patch)
    ]
    found = set()
    for path in paths:
        if path.is_symlink():
            found.add(Path(os.path.realpath(path)).parent)
        found.add(path.parent)
    return {d for d in found if d.is_dir()}


def refuse_if_modified(plan: Plan, state: TreeState, reverting: bool = False) -> None:
    """Refuse, naming every offending file, a tree the series cannot take
    (or, `reverting`, give back: there a missing file, or a modified one
    holding none of our changes, has nothing of ours to revert)."""
    problems = []
    for f in state.files:
        if f.status == DANGLING:
            problems.append(f"{f.path} is {f.said}")
        if f.status == MISSING and not reverting:
            problems.append(
                f"{f.path} is missing; is this really vLLM {plan.pin.version}?"
            )
        if f.status == MODIFIED and (f.carries_ours or not reverting):
            problems.append(
                f"{f.path} is locally modified (matches neither the pristine "
                f"vLLM {plan.pin.version} file nor the series)"
            )
    for o in state.overlay:
        if o.status == FOREIGN:
            problems.append(f"{o.path} exists and is not the file this series installs")
    if problems:
        raise Refusal("; ".join(problems) + "; nothing changed")


def changes_to(plan: Plan, state: TreeState, keep: set[str]) -> list[Change]:
    """The changes that leave exactly the patches in `keep` applied, this
    version's: each target file is its pristine text plus the kept patches'
    diffs, the kept patches' overlay files are this version's, the others'
    are absent (an earlier version's too). Files already so are left alone.
    Target files first, in the series' order, then the overlay files."""
    texts = {
        f.path: f.pristine_text for f in state.files if f.pristine_text is not None
    }
    skipped = False  # a patch before the one applied is not kept
    for patch in plan.series.patches:
        if patch.name not in keep:
            skipped = True
            continue
        for d in patch.file_diffs:
            try:
                texts[d.path] = unidiff.apply(texts[d.path], d)
            except (KeyError, unidiff.DiffError) as e:
                if skipped:
                    raise Refusal(
                        f"{patch.name} does not apply without the patches before "
                        f"it to {d.path}; nothing changed"
                    ) from None
                raise Refusal(
                    f"{patch.name}: {e} to vLLM {plan.pin.version}; nothing changed"
                ) from None
    changes = []
    for path, text in texts.items():
        data = text.encode("utf-8", errors="surrogateescape")
        if data != _read(plan.tree.root / path, path):
            changes.append(Change(plan.tree.root / path, data))
    for o in state.overlay:
        wanted = o.patch in keep
        if wanted and o.status == ABSENT:
            changes.append(
                Change(plan.tree.root / o.path, plan.overlay_bytes(o.path), mode=0o644)
            )
        elif wanted and o.status == OLDER:
            changes.append(Change(plan.tree.root / o.path, plan.overlay_bytes(o.path)))
        elif not wanted and o.status in (OURS, OLDER):
            changes.append(Change(plan.tree.root / o.path, None))
    return changes


_APPLIED = {True: "applied", False: "not applied", None: "partly applied"}


def applied_word(applied: bool | None) -> str:
    return _APPLIED[applied]


def partial_message(state: TreeState) -> str:
    """The refusal of a partly patched tree, each patch's state named."""
    parts = [f"{name} {_APPLIED[applied]}" for name, applied in state.applied.items()]
    return (
        "tree is partially patched (" + ", ".join(parts) + "); "
        "run `make revert` to restore the pristine release first; nothing changed"
    )
