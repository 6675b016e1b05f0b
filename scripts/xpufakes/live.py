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
from dataclasses import dataclass, field
from pathlib import Path

from . import pins, recipes, record, series
from .base import IPEX, Base
from .engine import sha256
from .errors import Refusal
from .transaction import Change
from .tree import Tree

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


def select(names: list[str], selection: list[str] | None, what: str) -> list[str]:
    """The names a PATCHES= selection picks ("0001", "0001-xpu-...patch")."""
    if not selection:
        return list(names)
    chosen = []
    for token in selection:
        found = [n for n in names if n == token or n.split("-", 1)[0] == token]
        if not found:
            raise Refusal(
                f"PATCHES: no patch {token!r} in {what}; it has " + ", ".join(names)
            )
        chosen += [n for n in found if n not in chosen]
    return [n for n in names if n in chosen]


def check_depends(depends: dict[str, list[str]], wanted: set[str]) -> None:
    """Refuse a set of patches that lacks a patch one of them needs. A
    dependency is `<number> (<why>)`, as in the X-Depends: header field."""
    for name in sorted(wanted):
        for dependency in depends.get(name, []):
            number, _, why = dependency.partition(" ")
            if not any(n.split("-", 1)[0] == number for n in wanted):
                needed = next(
                    (n for n in depends if n.split("-", 1)[0] == number), number
                )
                mine = name.split("-", 1)[0]
                raise Refusal(
                    f"{name} needs {needed} {why}".rstrip()
                    + f"; add it (PATCHES='{number} {mine}') or apply it first; "
                    "nothing changed"
                )


@dataclass
class RecipeResult:
    """What the recipes do to a live tree."""

    changes: list[Change]
    edited: dict[str, tuple[bytes, bytes]]  # path -> (before, after)
    added: dict[str, bytes]
    patches: list[str]
    mixed: bool  # IPEX era, and some code calls the _xpu_C GEMMs
    state: dict = field(default_factory=dict)


def _vllm_sources(root: Path) -> dict[str, str]:
    found = {}
    for path in sorted((root / "vllm").rglob("*.py")):
        try:
            found[str(path.relative_to(root))] = path.read_text(errors="replace")
        except OSError:
            continue
    return found


def is_mixed(found: Tree, base: Base, sources: dict[str, str] | None = None) -> bool:
    """An IPEX-era tree some of whose code calls the _xpu_C GEMMs."""
    if base.era != IPEX:
        return False
    sources = sources if sources is not None else _vllm_sources(found.root)
    return any(
        recipes.calls_xpu_c_gemms(text)
        for p, text in sources.items()
        if p not in OUR_MODULES
    )


# the modules we add to vllm/ (never a recipe's target)
OUR_MODULES = frozenset({recipes.FAKES_MODULE, recipes.WOQ_MODULE})


def _targets(edit: recipes.Edit, sources: dict[str, str]) -> list[str]:
    if not edit.anywhere:
        return [edit.target]
    return [
        p
        for p, text in sources.items()
        if p not in OUR_MODULES and all(s in text for s in edit.anywhere)
    ]


def run_recipes(
    root: Path,
    chosen: list[recipes.Recipe],
    mixed: bool = False,
    sources: dict[str, str] | None = None,
) -> tuple[dict[str, dict[str, str]], dict[str, bytes], list[str]]:
    """The recipes' edits on the live files (apply's recipe path and stage
    both run them here): per recipe, the text each file it edits has after it
    (and the recipes before it); each file's bytes before; and every fault
    (a missing file, an anchor not found, a file carrying our changes)."""
    sources = sources if sources is not None else _vllm_sources(root)
    texts: dict[str, str] = {}
    before: dict[str, bytes] = {}
    faults: list[str] = []
    by_patch: dict[str, dict[str, str]] = {}
    for recipe in chosen:
        edits = list(recipe.edits) + (list(recipe.mixed_edits) if mixed else [])
        done_by_recipe = set()
        for edit in edits:
            for path in _targets(edit, sources):
                if edit.anywhere and path in done_by_recipe:
                    continue
                target = root / path
                if path not in texts:
                    if not target.is_file():
                        if edit.required:
                            faults.append(f"{path} is missing")
                        continue
                    before[path] = target.read_bytes()
                    texts[path] = _text(before[path])
                    if recipes.carries_ours(texts[path]):
                        faults.append(f"{path} already carries our changes")
                        continue
                try:
                    texts[path] = edit.edit(texts[path])
                    done_by_recipe.add(path)
                    by_patch.setdefault(recipe.name, {})[path] = texts[path]
                except recipes.RecipeError as e:
                    if not edit.anywhere:
                        faults.append(f"{path}: {e} (anchor of {recipe.name})")
        anywhere = [e for e in recipe.edits if e.anywhere]
        if anywhere and not done_by_recipe & {
            p for e in anywhere for p in _targets(e, sources)
        }:
            faults.append(
                "vllm/: no `X.<attr> = ...IPEXWeightOnlyQuantizedLinear."
                f"from_weight(...)` in any file (anchor of {recipe.name})"
            )
    return by_patch, before, faults


def by_recipe(
    found: Tree, base: Base, selection: list[str] | None = None
) -> RecipeResult:
    """Run the era's recipes on the live files; refuse (naming every file and
    anchor at fault) if a file already carries our changes or an anchor is not
    found."""
    era = recipes.RECIPES[base.era]
    names = select([r.name for r in era], selection, f"the {base.era} recipes")
    chosen = [r for r in era if r.name in names]
    check_depends({r.name: list(r.depends) for r in era}, set(names))
    sources = _vllm_sources(found.root)
    mixed = is_mixed(found, base, sources)
    by_patch, before, faults = run_recipes(found.root, chosen, mixed, sources)
    texts = {p: t for files in by_patch.values() for p, t in files.items()}
    added: dict[str, bytes] = {}
    for recipe in chosen:
        for path in recipe.overlay:
            if path.startswith("tests/") and not found.has_tests:
                continue
            data = series.overlay_source(path).read_bytes()
            target = found.root / path
            if target.exists() and target.read_bytes() != data:
                faults.append(f"{path} exists and is not the file we install")
            elif not target.exists():
                added[path] = data
    if faults:
        raise Refusal("; ".join(faults) + "; nothing changed")
    edited = {
        p: (before[p], _bytes(t)) for p, t in texts.items() if _bytes(t) != before[p]
    }
    state = {
        "format": STATE_FORMAT,
        "base": base.pin.version,
        "version": base.version,
        "patches": names,
        "mixed": mixed,
        "recipes_sha256": sha256(Path(recipes.__file__).read_bytes()),
        "files": {
            p: {
                "before_sha256": sha256(old),
                "after_sha256": sha256(new),
                "before": base64.b64encode(old).decode(),
            }
            for p, (old, new) in edited.items()
        },
        "added": {p: sha256(data) for p, data in added.items()},
        # an installed wheel's RECORD rows as they were, for revert
        "record": record.rows_before(found.root, [STATE_FILE, *edited, *added]),
    }
    # the state file first: it is in place before any file changes (and, in a
    # rollback, goes last), so `revert` can finish an apply that failed midway
    changes = [
        Change(
            found.root / STATE_FILE,
            (json.dumps(state, indent=1) + "\n").encode(),
            mode=0o644,
        )
    ]
    changes += [Change(found.root / p, new) for p, (_, new) in edited.items()]
    changes += [Change(found.root / p, d, mode=0o644) for p, d in added.items()]
    return RecipeResult(changes, edited, added, names, mixed, state)


# ---------------------------------------------------------------------------
# A tree applied by recipe: its state, revert
# ---------------------------------------------------------------------------


def read_state(found: Tree) -> dict | None:
    path = found.root / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Refusal(f"{STATE_FILE} is unreadable ({e}); nothing changed") from None
    if state.get("format") != STATE_FORMAT:
        raise Refusal(f"{STATE_FILE} has an unknown format; nothing changed")
    return state


def file_states(found: Tree, state: dict, pristine: dict[str, str]) -> dict[str, str]:
    """path -> APPLIED, APPLIED_MODIFIED, NOT_APPLIED or CHANGED, for every
    file the state records (`pristine`: the base's pristine sha256s)."""
    result = {}
    for path, entry in state["files"].items():
        target = found.root / path
        digest = sha256(target.read_bytes()) if target.is_file() else None
        if digest == entry["after_sha256"]:
            modified = entry["before_sha256"] != pristine.get(path)
            result[path] = APPLIED_MODIFIED if modified else APPLIED
        elif digest == entry["before_sha256"]:
            result[path] = NOT_APPLIED
        else:
            result[path] = CHANGED
    for path, digest in state["added"].items():
        target = found.root / path
        if not target.exists():
            result[path] = NOT_APPLIED
        elif sha256(target.read_bytes()) == digest:
            result[path] = APPLIED
        else:
            result[path] = CHANGED
    return result


def changed_since(found: Tree, state: dict) -> list[str]:
    states = file_states(found, state, {})
    return [p for p, s in states.items() if s == CHANGED]


def summary(states: dict[str, str]) -> str:
    """The state of a tree applied by recipe, from file_states."""
    if any(s == CHANGED for s in states.values()):
        return "changed since apply by recipe"
    missing = [p for p, s in states.items() if s == NOT_APPLIED]
    if missing:
        return (
            f"partly applied by recipe ({', '.join(missing)}: not applied); "
            "`make revert`, then `make apply`"
        )
    return "patched by recipe"


def refuse_unless_applied(found: Tree, state: dict) -> None:
    """apply on a tree applied by recipe: every file must be as apply left
    it. A file changed since is refused; so is one back at its pre-apply
    bytes, or an added file removed (a `git checkout` of the file): the
    fakes are not all in place, and that tree is not "already applied"."""
    states = file_states(found, state, {})
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


def recipe_names(state: dict) -> list[str]:
    """The names of the recipes of the era of a tree applied by recipe."""
    era = pins.load().get(state["base"]).series.split("-")[0]
    return [r.name for r in recipes.RECIPES[era]]


def reverts_all(state: dict, selection: list[str] | None) -> bool:
    """Whether revert by recipe goes ahead with PATCHES=: it restores each
    file's bytes from before every patch, so it takes back all of them or
    none; a selection naming only some of those applied is refused. False:
    none of the patches named is applied."""
    if not selection:
        return True
    named = select(recipe_names(state), selection, "the recipes")
    applied = state["patches"]
    if not set(named) & set(applied):
        return False
    kept = [n for n in applied if n not in named]
    if kept:
        numbers = " ".join(n.split("-", 1)[0] for n in kept)
        raise Refusal(
            f"{', '.join(applied)} applied by recipe, and revert by recipe "
            f"takes them back together; to keep {', '.join(kept)}, run `make "
            f"revert`, then `make apply PATCHES='{numbers}'`; nothing changed"
        )
    return True


def changes_to_revert(found: Tree, state: dict) -> list[Change]:
    """Back to the exact pre-apply bytes; refuses, naming every file, if a
    file changed since apply."""
    changed = changed_since(found, state)
    if changed:
        raise Refusal(
            "changed since apply by recipe: "
            + ", ".join(changed)
            + f" (their pre-apply bytes are in {STATE_FILE}); nothing changed"
        )
    changes = []
    for path, entry in state["files"].items():
        if sha256((found.root / path).read_bytes()) == entry["after_sha256"]:
            changes.append(Change(found.root / path, base64.b64decode(entry["before"])))
    changes += [
        Change(found.root / path, None)
        for path in state["added"]
        if (found.root / path).exists()
    ]
    changes.append(Change(found.root / STATE_FILE, None))
    return changes
