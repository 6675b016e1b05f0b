"""What a series does to a tree: its state, and the changes that apply or
revert it. Everything is computed in memory; nothing here writes files."""

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from . import recipes, unidiff
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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FileState:
    path: str
    status: str  # PRISTINE, PATCHED, PARTIAL, MODIFIED or MISSING
    stage: int  # how many of the series' diffs of this file are applied
    stages: int  # how many diffs of the series touch this file
    pristine_text: str | None = None  # the pristine content, when known
    carries_ours: bool = False  # a modified file holding some of our changes


@dataclass
class OverlayState:
    path: str
    patch: str
    status: str  # ABSENT, OURS or FOREIGN


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
        if all(self.applied.values()):
            return PATCHED
        if not any(self.applied.values()):
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
            if not target.exists():
                status = ABSENT
            elif target.read_bytes() == plan.overlay_bytes(path):
                status = OURS
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
    if not target.is_file():
        return FileState(path, MISSING, 0, len(diffs))
    text = target.read_bytes().decode("utf-8", errors="surrogateescape")
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
            present.append(o.status == OURS)
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
        if f.status in (PATCHED, PARTIAL)
    ]
    changes += [
        Change(plan.tree.root / o.path, None) for o in state.overlay if o.status == OURS
    ]
    return changes


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
    each file is its pristine text plus the diffs of the kept patches, the
    kept patches' overlay files are present, the others' removed. Files that
    would not change are left alone."""
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
        elif not wanted and o.status == OURS:
            changes.append(Change(plan.tree.root / o.path, None))
    return changes
