"""The recipe path: the recipes of recipes.py run on a tree's files as they
are, for a tree that is not a pinned release's (a dev build, a downstream-
patched tree, an unreleased checkout). Never fuzz: each recipe finds its
anchors in the file's syntax tree, or the tree is refused.

The result is an ordinary change set (transaction.Change), plus a state
file, vllm/.xpufakes-state.json, that records what apply did:

    {"format": 1, "base": "<pinned release>", "version": "<the tree's>",
     "patches": [<patch names>], "recipes_sha256": "<of recipes.py>",
     "files": {"<path>": {"before_sha256": ..., "after_sha256": ...,
                          "before": "<the pre-apply bytes, base64>"}},
     "added": {"<path>": "<sha256>"},
     "record": {"<an installed wheel's RECORD>": {"<path>": "<its row>" | null}}}

`status` reads it ("applied by recipe on a modified file"), `revert`
restores the exact pre-apply bytes from it, refusing a file changed since.
"""

import base64
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xpufakes.changes import kernels, recipes, selection, series
from xpufakes.changes.engine import sha256
from xpufakes.common import paths
from xpufakes.common.errors import Refusal
from xpufakes.common.transaction import Change
from xpufakes.trees import pins, record, tree
from xpufakes.trees.tree import Tree

STATE_FILE = "vllm/.xpufakes-state.json"
STATE_FORMAT = 1

APPLIED, APPLIED_MODIFIED, CHANGED, NOT_APPLIED = (
    "applied by recipe",
    "applied by recipe on a modified file",
    "changed since apply",
    "not applied",
)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


@dataclass
class FileRecord:
    """A file apply changed: its sha256 before and after, its bytes before."""

    before_sha256: str
    after_sha256: str
    before: str  # base64


@dataclass
class RecipeState:
    """The state file: what an apply by recipe did."""

    base: str  # the pinned release the tree is based on
    version: str  # what the tree says it is
    patches: list[str]
    mixed: bool = False
    recipes_sha256: str = ""
    files: dict[str, FileRecord] = field(default_factory=dict)
    added: dict[str, str] = field(default_factory=dict)  # path -> sha256
    # an installed wheel's RECORD rows as they were: RECORD -> path -> row
    record: dict[str, dict[str, str | None]] = field(default_factory=dict)

    @property
    def pin(self) -> pins.Pin:
        return pins.load().get(self.base)

    def to_json(self) -> bytes:
        data = {"format": STATE_FORMAT, **asdict(self)}
        return (json.dumps(data, indent=1) + "\n").encode()

    @classmethod
    def from_dict(cls, data: dict) -> "RecipeState":
        files = {p: FileRecord(**entry) for p, entry in data["files"].items()}
        return cls(
            base=data["base"],
            version=data["version"],
            patches=list(data["patches"]),
            mixed=data.get("mixed", False),
            recipes_sha256=data.get("recipes_sha256", ""),
            files=files,
            added=dict(data["added"]),
            record=data.get("record") or {},
        )


class RecipesRefused(Refusal):
    """The recipes cannot run on this tree. `structural`: only because an
    anchor is not where they look, or a file already holds our changes
    (or, where ours goes, another file): a tree that may need no fix at
    all, which apply then proves as it is."""

    def __init__(self, message: str, structural: bool):
        super().__init__(message)
        self.structural = structural


# the faults of run_recipes and by_recipe that make a refusal structural
_STRUCTURAL = (
    "(anchor of ",
    "already carries our changes",
    "IPEXWeightOnlyQuantizedLinear.from_weight(...)` in any file",
    "exists and is not the file we install",
)


@dataclass
class RecipeResult:
    """What the recipes do to a live tree."""

    changes: list[Change]  # the state file first, then the edited, the added
    edited: dict[str, tuple[bytes, bytes]]  # path -> (before, after)
    added: dict[str, bytes]
    patches: list[str]
    mixed: bool  # IPEX era, and some code calls the _xpu_C GEMMs
    sources: dict[str, str]  # the tree's Python before the recipes, by path


def _targets(edit: recipes.Edit, sources: dict[str, str]) -> list[tuple[str, bool]]:
    """(path, required) of each file the edit applies to."""
    if edit.anywhere_if is not None:
        return [
            (p, False)
            for p, text in sources.items()
            if p not in recipes.OUR_MODULES
            and (edit.where is None or edit.where(p))
            and edit.anywhere_if(text)
        ]
    if not edit.anywhere:
        return edit.files
    return [
        (p, False)
        for p, text in sources.items()
        if p not in recipes.OUR_MODULES and all(s in text for s in edit.anywhere)
    ]


def edited_by_us(sources: dict[str, str]) -> set[str]:
    """Every file of a tree (its Python, by path: `sources`) that our series
    or recipes edit or add: the files each recipe of each era names (its
    own and the optional ones), the files of the series' patches, the
    modules and tests we add, every file that carries our changes (the
    recipe path's edits on a patched tree), and on this tree the files a
    recipe's `anywhere` rule would edit (a module that makes an IPEX WOQ
    module; one with a call the opaque-calls recipe rewrites). The model
    proof never excuses an error that passed through one of them
    (proof/model/limits.py)."""
    ours = set(recipes.OUR_MODULES)
    for era in (*recipes.RECIPES.values(), *recipes.DOWNSTREAM.values()):
        for recipe in era:
            ours.update(recipe.overlay)
            for edit in (*recipe.edits, *recipe.mixed_edits):
                ours.update(path for path, _ in edit.files)
                if edit.anywhere:
                    ours.update(path for path, _ in _targets(edit, sources))
                elif edit.anywhere_if is not None:
                    ours.update(
                        path
                        for path, _ in _targets(edit, sources)
                        if _rewrites_opaque_calls(sources[path])
                        or _changes(edit, sources[path])
                    )
    for patch in paths.PATCHES.glob("*/*.patch"):
        ours.update(_PATCHED_FILE.findall(patch.read_text(errors="replace")))
    ours.update(path for path, text in sources.items() if recipes.carries_ours(text))
    return ours


# a file a patch of the series changes or adds
_PATCHED_FILE = re.compile(r"^\+\+\+ b/(\S+)", re.M)


def _changes(edit: recipes.Edit, text: str) -> bool:
    """Whether the edit changes a module, or refuses to."""
    try:
        return edit.edit(text) != text
    except recipes.RecipeRefusal:
        return True
    except (recipes.RecipeError, SyntaxError):
        return False


def _rewrites_opaque_calls(text: str, only: frozenset[str] | None = None) -> bool:
    """Whether the opaque-calls recipe (`only` those callees) changes a
    module: it has a use of a callee it rewrites (or refuses to)."""
    try:
        return bool(recipes.opaque_references(text, only))
    except SyntaxError:
        return False


def run_recipes(
    root: Path,
    chosen: list[recipes.Recipe],
    mixed: bool = False,
    sources: dict[str, str] | None = None,
    keep: bool = False,
) -> tuple[dict[str, dict[str, str]], dict[str, bytes], list[str]]:
    """The recipes' edits on the live files (apply's recipe path and stage
    both run them here): per recipe, the text each file it edits has after it
    (and the recipes before it); each file's bytes before; and every fault
    (a missing file, an anchor not found, a file carrying our changes).
    `keep`: the edits of apply's recipe path, which keep what the tree had
    where the series' drop it (Edit.live)."""
    sources = sources if sources is not None else tree.python_sources(root)
    texts: dict[str, str] = {}
    before: dict[str, bytes] = {}
    faults: list[str] = []
    by_patch: dict[str, dict[str, str]] = {}
    crlf: set[str] = set()  # files whose lines end in CRLF
    for recipe in chosen:
        edits = list(recipe.edits) + (list(recipe.mixed_edits) if mixed else [])
        for edit in edits:
            targets = _targets(edit, sources)
            done = []
            for path, required in targets:
                target = root / path
                if path not in texts:
                    if not target.is_file():
                        if target.is_symlink():
                            link = os.readlink(target)
                            faults.append(f"{path} is a dangling symlink (to {link})")
                        elif required:
                            faults.append(f"{path} is missing")
                        continue
                    before[path] = target.read_bytes()
                    texts[path] = _text(before[path])
                    if "\r\n" in texts[path]:  # edited as LF, written back as CRLF
                        crlf.add(path)
                        lone = texts[path].count("\n") - texts[path].count("\r\n")
                        if lone:
                            faults.append(
                                f"{path} has mixed line endings (CRLF, and LF on "
                                f"{lone} line(s)): apply keeps a file's own line "
                                "endings, and cannot tell which they are"
                            )
                            continue
                        texts[path] = texts[path].replace("\r\n", "\n")
                    if recipes.carries_ours(texts[path]):
                        faults.append(f"{path} already carries our changes")
                        continue
                try:
                    new = edit.on(texts[path], keep)
                except recipes.RecipeRefusal as e:
                    faults.append(f"{path}: {e} ({recipe.name})")
                    continue
                except recipes.RecipeError as e:
                    if not edit.anywhere:
                        faults.append(f"{path}: {e} (anchor of {recipe.name})")
                    continue
                if new != texts[path] or not edit.anywhere_if:
                    texts[path] = new
                    done.append(path)
                    by_patch.setdefault(recipe.name, {})[path] = new
            if edit.anywhere and not done:
                faults.append(
                    "vllm/: no `X.<attr> = ...IPEXWeightOnlyQuantizedLinear."
                    f"from_weight(...)` in any file (anchor of {recipe.name})"
                )
    for files in by_patch.values():
        for path in crlf & set(files):
            files[path] = files[path].replace("\n", "\r\n")
    return by_patch, before, faults


def by_recipe(
    found: Tree, base_pin: pins.Pin, version: str, patches: list[str] | None = None
) -> RecipeResult:
    """Run the recipes of the base release's era on the live files; refuse
    (naming every file and anchor at fault) if a file already carries our
    changes or an anchor is not found. `version`: what the tree says it is,
    for the state file."""
    era = recipes.RECIPES[base_pin.era]
    names = selection.select(
        [r.name for r in era], patches, f"the {base_pin.era} recipes"
    )
    chosen = [r for r in era if r.name in names]
    selection.check_depends({r.name: list(r.depends) for r in era}, set(names))
    sources = tree.python_sources(found.root)
    if patches is None:  # the recipe path's own, where a file needs them
        for recipe in recipes.DOWNSTREAM.get(base_pin.era, ()):
            if any(
                _rewrites_opaque_calls(sources[p], recipes.LYING_KERNEL_CALLS)
                if edit is not recipes.LOGS_EDIT
                else _changes(edit, sources[p])
                for edit in recipe.edits
                for p, _ in _targets(edit, sources)
            ):
                chosen.append(recipe)
                names = [*names, recipe.name]
    mixed = kernels.is_mixed(base_pin.kernels, sources)
    by_patch, before, faults = run_recipes(
        found.root, chosen, mixed, sources, keep=True
    )
    # an optional recipe that changes nothing on this tree (the indexer's, on
    # a tree without the op) is not one of its patches
    chosen = [r for r in chosen if r.name in by_patch or not r.optional]
    names = [r.name for r in chosen]
    named = " ".join(faults)
    faults += [  # the tree's Python cannot import them: the proof would fail
        f"{path} is a dangling symlink (to {link})"
        for path, link in tree.dangling_symlinks(found.root).items()
        if path.endswith(".py") and path not in named
    ]
    texts = {p: t for files in by_patch.values() for p, t in files.items()}
    added: dict[str, bytes] = {}
    for recipe in chosen:
        for path in recipe.overlay:
            if not found.receives(path):
                continue
            data = series.overlay_source(path).read_bytes()
            target = found.root / path
            if target.exists() and target.read_bytes() != data:
                faults.append(f"{path} exists and is not the file we install")
            elif not target.exists():
                added[path] = data
    if faults:
        raise RecipesRefused(
            "; ".join(faults) + "; nothing changed",
            structural=all(any(k in f for k in _STRUCTURAL) for f in faults),
        )
    edited = {
        p: (before[p], _bytes(t)) for p, t in texts.items() if _bytes(t) != before[p]
    }
    state = RecipeState(
        base=base_pin.version,
        version=version,
        patches=names,
        mixed=mixed,
        recipes_sha256=sha256(Path(recipes.__file__).read_bytes()),
        files={
            p: FileRecord(sha256(old), sha256(new), base64.b64encode(old).decode())
            for p, (old, new) in edited.items()
        },
        added={p: sha256(data) for p, data in added.items()},
        record=record.rows_before(found.root, [STATE_FILE, *edited, *added]),
    )
    # the state file first: it is in place before any file changes (and, in a
    # rollback, goes last), so `revert` can finish an apply that failed midway
    changes = [Change(found.root / STATE_FILE, state.to_json(), mode=0o644)]
    changes += [Change(found.root / p, new) for p, (_, new) in edited.items()]
    changes += [Change(found.root / p, d, mode=0o644) for p, d in added.items()]
    return RecipeResult(changes, edited, added, names, mixed, sources)


# ---------------------------------------------------------------------------
# A tree applied by recipe: its state, revert
# ---------------------------------------------------------------------------


def read_state(found: Tree) -> RecipeState | None:
    path = found.root / STATE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Refusal(f"{STATE_FILE} is unreadable ({e}); nothing changed") from None
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise Refusal(f"{STATE_FILE} has an unknown format; nothing changed")
    try:
        return RecipeState.from_dict(data)
    except (KeyError, TypeError) as e:
        raise Refusal(f"{STATE_FILE} is unreadable ({e!r}); nothing changed") from None


def file_states(found: Tree, state: RecipeState) -> dict[str, str]:
    """path -> APPLIED, APPLIED_MODIFIED, NOT_APPLIED or CHANGED, for every
    file the state records."""
    pristine = state.pin.files
    result = {}
    for path, entry in state.files.items():
        target = found.root / path
        digest = sha256(target.read_bytes()) if target.is_file() else None
        if digest == entry.after_sha256:
            modified = entry.before_sha256 != pristine.get(path)
            result[path] = APPLIED_MODIFIED if modified else APPLIED
        elif digest == entry.before_sha256:
            result[path] = NOT_APPLIED
        else:
            result[path] = CHANGED
    for path, digest in state.added.items():
        target = found.root / path
        if not target.exists():
            result[path] = NOT_APPLIED
        elif sha256(target.read_bytes()) == digest:
            result[path] = APPLIED
        else:
            result[path] = CHANGED
    return result


def summary(states: dict[str, str]) -> str:
    """The state of a tree applied by recipe, from file_states."""
    if any(s == CHANGED for s in states.values()):
        return "changed since apply by recipe"
    missing = [p for p, s in states.items() if s == NOT_APPLIED]
    if missing and len(missing) == len(states):
        return (
            "an apply by recipe was interrupted before it changed any file "
            f"({STATE_FILE} alone records it); `make revert`, then `make apply`"
        )
    if missing:
        return (
            f"partly applied by recipe ({', '.join(missing)}: not applied); "
            "`make revert`, then `make apply`"
        )
    return "patched by recipe"


def refuse_unless_applied(found: Tree, state: RecipeState) -> None:
    """apply on a tree applied by recipe: every file must be as apply left
    it. A file changed since is refused; so is one back at its pre-apply
    bytes, or an added file removed (a `git checkout` of the file): the
    fakes are not all in place, and that tree is not "already applied"."""
    states = file_states(found, state)
    changed = [p for p, s in states.items() if s == CHANGED]
    if changed:
        raise Refusal(
            "changed since apply by recipe: "
            + ", ".join(changed)
            + f"; restore them (pre-apply bytes in {STATE_FILE}) or remove "
            "that file; nothing changed"
        )
    missing = [p for p, s in states.items() if s == NOT_APPLIED]
    if missing:
        raise Refusal(
            f"applied by recipe, but {', '.join(missing)} not: back at "
            "the pre-apply bytes or removed since, so the fakes are not all in "
            f"place; run `make revert VLLM={found.root}`, then apply again; "
            "nothing changed"
        )


def changing(found: Tree, names: list[str], era: str) -> list[str]:
    """Of the recipes named, those that would change the tree as it is: an
    optional recipe only where one of its edits changes a file (or refuses
    to); the others always."""
    sources: dict[str, str] | None = None
    kept = []
    for recipe in recipes.RECIPES[era]:
        if recipe.name not in names:
            continue
        if not recipe.optional:
            kept.append(recipe.name)
            continue
        sources = sources if sources is not None else tree.python_sources(found.root)
        if any(
            _changes(edit, sources[path])
            for edit in recipe.edits
            for path, _ in _targets(edit, sources)
            if path in sources
        ):
            kept.append(recipe.name)
    return kept


def recipe_names(state: RecipeState) -> list[str]:
    """The names of the recipes of the era of a tree applied by recipe."""
    return [r.name for r in recipes.RECIPES[state.pin.era]]


def reverts_all(state: RecipeState, patches: list[str] | None) -> bool:
    """Whether revert by recipe goes ahead with PATCHES=: it restores each
    file's bytes from before every patch, so it takes back all of them or
    none; a selection naming only some of those applied is refused. False:
    none of the patches named is applied."""
    if not patches:
        return True
    named = selection.select(recipe_names(state), patches, "the recipes")
    applied = state.patches
    if not set(named) & set(applied):
        return False
    kept = [n for n in applied if n not in named]
    if kept:
        numbers = " ".join(selection.number(n) for n in kept)
        raise Refusal(
            f"{', '.join(applied)} applied by recipe, and revert by recipe "
            f"takes them back together; to keep {', '.join(kept)}, run `make "
            f"revert`, then `make apply PATCHES='{numbers}'`; nothing changed"
        )
    return True


def changes_to_revert(found: Tree, state: RecipeState) -> list[Change]:
    """Back to the exact pre-apply bytes; refuses, naming every file, if a
    file changed since apply."""
    changed = [p for p, s in file_states(found, state).items() if s == CHANGED]
    if changed:
        raise Refusal(
            "changed since apply by recipe: "
            + ", ".join(changed)
            + f" (their pre-apply bytes are in {STATE_FILE}); nothing changed"
        )
    changes = []
    for path, entry in state.files.items():
        if sha256((found.root / path).read_bytes()) == entry.after_sha256:
            changes.append(Change(found.root / path, base64.b64decode(entry.before)))
    changes += [
        Change(found.root / path, None)
        for path in state.added
        if (found.root / path).exists()
    ]
    changes.append(Change(found.root / STATE_FILE, None))
    return changes
