"""What a tree itself cannot run on XPU: data (data/limits.toml), exact, and
one classifier (no torch: it runs in the tool, on the model proof's result).

Each limit is listed with its tree (the release the tree says it is), model,
configuration and reason: the error exactly as the cell says it, vLLM's own
words ("<Error>: <message>"). A cell that failed or was not built is the
tree's limit only if

* a listed limit of its tree, model and configuration has exactly its
  reason, and
* no line the error passed through is one our series or recipes wrote, or
  one changed since, in a file they edit or add (changes/live.py
  edited_by_us; changes/ourlines.py: a line of such a file is the tree's
  own only if the file had it before apply, in place; where that text is
  not known, the whole file is ours): a fault in a line we write is never
  excused, whatever its text. A limit of the tree's own code met in a file
  we also edit (llm-scaler 0a85564's XPUFp8LinearMethod in ipex_quant.py)
  is excused like any other, and
* no frame it passed through is of our code outside the tree
  (trace.ours_outside: the stand-ins under proof/xpu/, the overlay, the
  vLLM plugin, the proof's own code where the tree called it).

The numbers' compiled runs that raised (numbers.py: Inductor's lowering,
torch's aliasing checks, which the trace never meets) are judged the same
way, cell by cell, against the limits of their configuration; an eager run
that fails or compares nothing never is.

A limit of an intel/llm-scaler image's tree that its base release does not
have is keyed to the image too (`image`: the image commit, as
data/esimd_schemas.toml knows it): it covers that image's rebuilt tree
(image_of: the image trees/images.py recognises it as) and never the plain
release.

Every other cell that fails, fails. A listed limit that no longer happens is
reported as such (the cell's `limit_gone`). A limit of the proof itself
(one process: tensor parallelism 1) is the proof's (report.PROOF_LIMIT),
decided in the proof's Python, never the tree's, and listed nowhere.
"""

import tomllib
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import esimdfacts, live, ourlines
from xpufakes.common import paths
from xpufakes.common.errors import Refusal
from xpufakes.proof.model.report import (
    ERRORS,
    NOT_FOR_THIS_TREE,
    NUMBERS_RAISED,
    PROOF_LIMIT,
    TREE_LIMIT,
    numbers_outcome,
)
from xpufakes.proof.static.schematruth import ESIMD_PACKAGE, ROUTING_MODULE
from xpufakes.trees import images, pins
from xpufakes.trees import tree as trees

LIMITS = paths.DATA / "limits.toml"
ANY = "*"  # a limit of every model, or of every configuration


@dataclass(frozen=True)
class Limit:
    tree: str  # the release the tree says it is (vllm/_version.py, PKG-INFO)
    model: str  # a model of data/models.toml, or ANY
    configuration: str  # "default", "sp", or ANY
    reason: str  # exactly as the cell says it: "<Error>: <vLLM's message>"
    why: str  # what it means, for the reader
    # the tree's release and every later one (a limit a release brought and
    # no later one took back: a new pin needs no new entry)
    and_later: bool = False
    # an intel/llm-scaler image commit: the limit of that image's tree only
    # (built on `tree`), never of the plain release
    image: str = ""
    # the test of make test that meets it, where no recorded catalog run
    # does ("tests/<file>.py::<test>": it asserts the cell is this limit)
    met_by: str = ""

    def _of_tree(self, tree: str) -> bool:
        if self.tree == tree:
            return True
        if not self.and_later:
            return False
        found = pins.split_version(tree)
        return found is not None and found[0] >= pins.version_tuple(self.tree)

    def covers(
        self, tree: str, model: str, configuration: str, image: str = ""
    ) -> bool:
        return (
            self._of_tree(tree)
            and self.image in ("", image)
            and self.model in (ANY, model)
            and self.configuration in (ANY, configuration)
        )


def load(path: Path = LIMITS) -> list[Limit]:
    return [
        Limit(
            entry["tree"],
            entry["model"],
            entry["configuration"],
            entry["reason"],
            " ".join(entry["why"].split()),
            entry.get("and_later", False),
            entry.get("image", ""),
            entry.get("met_by", ""),
        )
        for entry in tomllib.loads(path.read_text()).get("limit", [])
    ]


def tree_name(root: Path) -> str:
    """The release a tree says it is (the key of its limits); "" if it
    cannot tell."""
    try:
        return trees.detect_version(trees.locate(str(root)))[0]
    except Refusal:
        return ""


def image_of(texts: dict[str, str], release: str, root: Path | None = None) -> str:
    """The intel/llm-scaler image commit whose tree this is (its Python
    sources, path -> text), where the tree's Python names the image's ESIMD
    package (a plain release never does; the fix's own module, which names
    it in its contracts, is not the tree's): the image the tree at `root`
    is (trees/images.py, a modified one too), else, of the image commits
    data/esimd_schemas.toml knows, the newest whose image builds `release`;
    "" for any other tree."""
    own = (t for p, t in texts.items() if p != ROUTING_MODULE)
    if not release or not any(ESIMD_PACKAGE in text for text in own):
        return ""
    recognised = images.recognise(root).image if root is not None else None
    if recognised is not None:
        return recognised
    commits = esimdfacts.load()
    same = [c for c in commits if commits[c].get("vllm") == release]
    return max(same, key=lambda c: commits[c].get("date", ""), default="")


def keys_of(root: Path, texts: dict[str, str] | None = None) -> tuple[str, str]:
    """What a tree's limits are keyed by: the release it says it is and the
    llm-scaler image it is the tree of ("" if none)."""
    texts = trees.python_sources(root) if texts is None else texts
    name = tree_name(root)
    return name, image_of(texts, name, root)


def classify_tree(found: list[dict], root: Path) -> list[dict]:
    """classify() for the tree at root: its name, the llm-scaler image it
    is the tree of (if any), and the lines of it that are not the tree's own
    in the files our series or recipes edit or add."""
    texts = trees.python_sources(root)
    name, image = keys_of(root, texts)
    ours = ourlines.ours(root, live.edited_by_us(texts))
    return classify(found, name, ours, image=image)


def excusing(
    limits: list[Limit],
    tree: str,
    model: str,
    configuration: str,
    image: str,
    failure: dict,
) -> Limit | None:
    """The listed limit that excuses a failure (a configuration's, or a
    numbers cell's: its `error`, and `through_ours` and `ours`, the lines
    and frames of ours it passed through), or None: what classify() decides,
    from what a recorded run keeps of the cell (catalog.rejudged)."""
    if failure.get("through_ours") or failure.get("ours"):
        return None
    return next(
        (
            limit
            for limit in limits
            if limit.covers(tree, model, configuration, image)
            and limit.reason == failure.get("error")
        ),
        None,
    )


def classify(
    found: list[dict],
    tree: str,
    ours: dict[str, set[int] | None],
    limits: list[Limit] | None = None,
    image: str = "",
) -> list[dict]:
    """Each model's cells (the model proof's result, changed in place and
    returned): a failure that a listed limit of the tree names exactly, and
    that passed through no line of ours (`ours`: each file our series or
    recipes edit or add -> the numbers of its lines not the tree's own, None
    for all of them), becomes the tree's limit (`limit`: why); one whose
    listed limit is refused because it passed through a line of ours says so
    (`not_excused`); a cell whose listed limit did not happen says that
    (`limit_gone`: the listed reasons). A cell recorded without its lines
    is judged by its files: any file of ours refuses it."""
    limits = load() if limits is None else limits
    for model in found:
        for cell in model["configurations"]:
            listed = [
                limit
                for limit in limits
                if limit.covers(tree, model["model"], cell["configuration"], image)
            ]
            # a cell not run (for other trees; the proof's limit) neither
            # meets a listed limit nor shows that it no longer happens
            if cell["result"] in (NOT_FOR_THIS_TREE, PROOF_LIMIT) or not listed:
                continue
            matched = [limit for limit in listed if limit.reason == cell.get("error")]
            if cell["result"] in ERRORS:
                cell["through_ours"] = through_ours(cell, ours)
                if matched:
                    _excuse(cell, matched[0], TREE_LIMIT)
            # the numbers' compiled runs that raised (numbers.py): excused
            # as the trace's failures are, each cell on its own
            numbers = cell.get("numbers") or {}
            for n in numbers.get("cells", []):
                met = [limit for limit in listed if limit.reason == n.get("error")]
                if n["result"] == NUMBERS_RAISED:
                    n["through_ours"] = through_ours(n, ours)
                    if met:
                        _excuse(n, met[0], TREE_LIMIT)
                        matched += met
            if numbers.get("cells"):
                numbers["result"] = numbers_outcome(numbers["cells"])
            if not matched:
                cell["limit_gone"] = [limit.reason for limit in listed]
    return found


def through_ours(failure: dict, ours: dict) -> list[str]:
    """The lines of ours in the tree a failure passed through (its frames
    in the files our series or recipes edit or add, on lines not the
    tree's own; a failure recorded without its lines: those files)."""
    if failure.get("lines") is None:
        return sorted(set(failure.get("files", [])) & set(ours))
    return [f for f in failure["lines"] if ourlines.frame_is_ours(f, ours)]


def _excuse(cell: dict, limit: Limit, excused: str) -> None:
    """A failure (a configuration's, or a numbers cell's) whose error
    `limit` names: its result `excused`, with the limit's why, unless it
    passed through a line of ours in the tree (`through_ours`) or a frame
    of ours outside it (trace.ours_outside: the stand-ins, the overlay, the
    plugin, the proof's own code the tree called): then `not_excused` says
    which."""
    mine = cell["through_ours"]
    outside = list(cell.get("ours", []))
    if mine:
        cell["not_excused"] = (
            f"data/limits.toml lists it as the tree's limit, but it "
            f"passed through {', '.join(mine)}, which our series or "
            "recipes wrote (or changed since) in a file they edit or add"
        )
    elif outside:
        cell["not_excused"] = (
            "data/limits.toml lists it as the tree's limit, but it passed "
            f"through {', '.join(outside)}, our code outside the tree (a "
            "stand-in, the overlay, the plugin or the proof's own)"
        )
    else:
        cell["result"] = excused
        cell["limit"] = limit.why
