"""What a series does to a tree: its state, and the changes that apply or
revert it. Everything is computed in memory; nothing here writes files."""

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import history, recipes, unidiff
from .errors import Refusal
from .pins import Pin
from .series import Patch, Series, overlay_source
from .transaction import Change
from .tree import Tree

PRISTINE, PATCHED, PARTIAL, MODIFIED, MISSING = (
    "pristine",
    "patched",
    "partially patched",
    "modified",
    "missing",
)
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
    status: str  # PRISTINE, PATCHED, PATCHED_OLDER, PARTIAL, MODIFIED or MISSING
    stage: int  # how many of the series' diffs of this file are applied
    stages: int  # how many diffs of the series touch this file
    pristine_text: str | None = None  # the pristine content, when known
    carries_ours: bool = False  # a modified file holding some of our changes


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
        if any(f.status in (MODIFIED, MISSING) for f in self.files) or any(
            o.status == FOREIGN for o in self.overlay
        ):
            return MODIFIED
        # None (partly applied) is neither applied nor not applied
        if all(applied is True for applied in self.applied.values()):
            if any(o.status == OLDER for o in self.overlay) or any(
                f.status == PATCHED_OLDER for f in self.files
            ):
                return OUTDATED
            return PATCHED
        if all(applied is False for applied in self.applied.values()):
            return PRISTINE
        return PARTIAL


@dataclass
class Plan:
    """A tree, the release it is, and the series it takes."""

    tree: Tree
    pin: Pin
    series: Series
    overlay_root: Path | None = None

    def overlay_paths(self, patch: Patch) -> list[str]:
        """The overlay files this tree receives (no tests/ files for an
        installed package, which has no tests tree)."""
        return [
            p
            for p in patch.overlay
            if not p.startswith("tests/") or self.tree.has_tests
        ]

    def overlay_bytes(self, path: str) -> bytes:
        source = overlay_source(path, self.overlay_root)
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
        if f.status in (MODIFIED, MISSING):
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


def changes_to_apply(plan: Plan, state: TreeState) -> list[Change]:
    """The changes that take a pristine tree to a patched one."""
    texts = {f.path: f.pristine_text for f in state.files}
    new_files: list[str] = []
    for patch in plan.series.patches:
        for d in patch.file_diffs:
            try:
                texts[d.path] = unidiff.apply(texts[d.path], d)
            except unidiff.DiffError as e:
                raise Refusal(f"{patch.name}: {e} to vLLM {plan.pin.version}") from None
        new_files += plan.overlay_paths(patch)
    changes = [
        Change(plan.tree.root / path, text.encode("utf-8", errors="surrogateescape"))
        for path, text in texts.items()
    ]
    changes += [
        Change(plan.tree.root / path, plan.overlay_bytes(path), mode=0o644)
        for path in new_files
    ]
    return changes


def changes_to_revert(plan: Plan, state: TreeState) -> list[Change]:
    """The changes that take a tree at any stage of the series back to the
    pristine release: each file to its pristine text, our overlay files
    removed."""
    changes = [
        Change(
            plan.tree.root / f.path,
            f.pristine_text.encode("utf-8", errors="surrogateescape"),
        )
        for f in state.files
        if f.status in (PATCHED, PATCHED_OLDER, PARTIAL)
    ]
    changes += [
        Change(plan.tree.root / o.path, None)
        for o in state.overlay
        if o.status in (OURS, OLDER)
    ]
    return changes


def changes_to_upgrade(plan: Plan, state: TreeState) -> list[Change]:
    """For a tree patched by an earlier version of this tool: its target
    files patched by this version's diffs (from their pristine text), its
    overlay files replaced by this version's."""
    changes = []
    for f in state.files:
        if f.status != PATCHED_OLDER:
            continue
        text = f.pristine_text
        for _, d in plan.diffs_of(f.path):
            try:
                text = unidiff.apply(text, d)
            except unidiff.DiffError as e:
                raise Refusal(f"{e} to vLLM {plan.pin.version}") from None
        changes.append(
            Change(
                plan.tree.root / f.path,
                text.encode("utf-8", errors="surrogateescape"),
            )
        )
    changes += [
        Change(plan.tree.root / o.path, plan.overlay_bytes(o.path))
        for o in state.overlay
        if o.status == OLDER
    ]
    return changes


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


def changes_to_reach(plan: Plan, state: TreeState, keep: set[str]) -> list[Change]:
    """The changes that leave exactly the patches in `keep` applied (PATCHES=):
    each file is its pristine text plus this version's diffs of the kept
    patches, the kept patches' overlay files are this version's, the others'
    removed (an earlier version's too). Files that would not change are left
    alone."""
    texts = {f.path: f.pristine_text for f in state.files if f.pristine_text}
    by_path = {f.path: f for f in state.files}
    for patch in plan.series.patches:
        if patch.name not in keep:
            continue
        for d in patch.file_diffs:
            try:
                texts[d.path] = unidiff.apply(texts[d.path], d)
            except (KeyError, unidiff.DiffError):
                raise Refusal(
                    f"{patch.name} does not apply without the patches before it "
                    f"to {d.path}; nothing changed"
                ) from None
    changes = []
    for path, text in texts.items():
        data = text.encode("utf-8", errors="surrogateescape")
        if (
            by_path[path].status != MISSING
            and data != (plan.tree.root / path).read_bytes()
        ):
            changes.append(Change(plan.tree.root / path, data))
    for o in state.overlay:
        wanted = o.patch in keep
        if wanted and o.status == ABSENT:
            changes.append(
                Change(plan.tree.root / o.path, plan.overlay_bytes(o.path), mode=0o644)
            )
        elif wanted and o.status == OLDER:  # its target gets this version's diffs
            changes.append(Change(plan.tree.root / o.path, plan.overlay_bytes(o.path)))
        elif not wanted and o.status in (OURS, OLDER):
            changes.append(Change(plan.tree.root / o.path, None))
    return changes
