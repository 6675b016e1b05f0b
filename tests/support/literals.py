"""Where a release written by hand would go stale the day the next one is
pinned (tests/test_release_literals.py): the newest pin's own literal, its
kernels release, the next release, and any "newest" / "only pinned" claim
next to a release, in the repository's text files.

What is not written by hand is left out before anything is searched:

* generated files: patches/ (`make refresh`: pins.toml, the series), the
  locks (e2e/requirements/, `make e2e-lock`), the overlay's histories
  (`make overlay-history`);
* the data files (scripts/xpufakes/data/, e2e/pins.toml): a release there
  is a fact, not a copy, so they are searched for claims only;
* the generated places: the docs' marked places `<!-- KIND:KEY -->...
  <!-- /KIND -->` (trees/pinfacts.py, changes/opfacts.py) and the
  module-level assignments `make ops` writes (opfacts.python_values);
* the input of `make refresh`: authoring.py's `LAST`, the newest release it
  pins (docs/layout.md, "Adding a release", step 1);
* in the docs, a citation of a release's own source ("vLLM X.Y.Z" and a
  `path:line` in backticks): a fact of that release's file, true after the
  next pin.

Text is searched as tokens (words, release numbers, the ends of sentences,
paragraphs and Python statements), not lines, so a re-wrapped comment or
paragraph (a claim word on one line, the release on the next, a `#`
between) is found all the same. A claim is about the release nearest to
it: if that is computed (a marked place, a generated value, `newest()`),
so is the claim."""

import ast
import bisect
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import opfacts
from xpufakes.common import paths

# Written by a generator: never searched.
GENERATED = (
    "patches/",
    "e2e/requirements/",
    "scripts/xpufakes/data/patch_history.json",
    "scripts/xpufakes/data/overlay_history.toml",
)
# The data: a release there is a fact, not a copy (searched for claims only).
DATA = ("scripts/xpufakes/data/", "e2e/pins.toml")
SUFFIXES = (".py", ".md", ".toml", ".txt", ".cfg", ".json")
NAMES = ("Makefile", "run", "xpufakes")  # Makefile, .ci/run, bin/xpufakes
# file -> module-level names it assigns that are inputs, not copies
INPUTS = {"scripts/xpufakes/changes/authoring.py": ("LAST",)}

MARKED = re.compile(r"<!-- (\w+):\w+ -->.*?<!-- /\1 -->", re.S)
CITATION = re.compile(r"\bvLLM\s+v?\d+(?:\.\d+)+\s+`[\w./-]+:\d+`")
NAME = re.compile(r"`[A-Za-z_]+`")  # a name in backticks (`latest`): no claim
COMPUTED = "\x1f"  # stands where a generated value or marked place was
END = "\x1e"  # where a Python statement starts, and where its last line ends
TOKEN = re.compile(
    r"(?P<version>(?<![\w.])v?\d+(?:\.\d+){2,}(?!\d))"
    r"|(?P<tuple>\(\s*\d+\s*,\s*\d+\s*,\s*\d+\s*,?\s*\))"
    rf"|(?P<computed>{COMPUTED}|\b(?:newest|latest)(?=\())"
    r"|(?P<word>[A-Za-z]+)"
    rf"|(?P<stop>{END}|\n[ \t]*\n|[.!?][\"')\]`*]*(?=\s))"
)
# words that claim a release is the newest or the only one
CLAIM_WORDS = {"newest", "latest"}
CLAIM_PAIRS = {("only", "pinned"), ("only", "pin"), ("last", "pin")}
CLAIM_PAIRS |= {("last", "pinned"), ("most", "recent")}
NEAR = 6  # words between a claim and the release it names


@dataclass(frozen=True)
class Token:
    kind: str  # version, tuple, computed, word, stop
    text: str
    line: int


def files(repo: Path = paths.REPO) -> list[str]:
    """The repository's text files a person writes (relative paths):
    tracked or new, not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(
        name
        for name in set(listed.split("\0"))
        if name
        and (name.endswith(SUFFIXES) or name.rsplit("/", 1)[-1] in NAMES)
        and not name.startswith(GENERATED)
        and (repo / name).is_file()
    )


def _blank(text: str, spans: list[tuple[int, int]], mark: str = COMPUTED) -> str:
    """`text` with each span replaced by `mark` and spaces (newlines kept:
    the line numbers stay)."""
    pieces, last = [], 0
    for begin, end in sorted(spans):
        if begin < last:  # inside a span already blanked
            continue
        kept = re.sub(r"[^\n]", " ", text[begin:end])
        pieces += [text[last:begin], mark, kept[len(mark) :]]
        last = end
    return "".join([*pieces, text[last:]])


def _python(text: str, generated: set[str], inputs: set[str]) -> str:
    """The values `make ops` writes and the statements that assign an
    input blanked, and END where a statement starts and where its last
    line ends: a comment belongs to the statement after it, or to the one
    on its line; the lines of one comment or docstring are one sentence."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def span(node: ast.AST) -> tuple[int, int]:
        return (
            starts[node.lineno - 1] + node.col_offset,
            starts[node.end_lineno - 1] + node.end_col_offset,
        )

    spans = []
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if names & inputs:
            spans.append(span(node))
        elif names & generated and len(names) == 1:
            spans.append(span(node.value))
    text = _blank(text, spans)
    # a statement starts a sentence; its last line (a comment after it
    # included) ends one
    edges = sorted(
        {
            edge
            for node in ast.walk(tree)
            if isinstance(node, ast.stmt)
            for edge in (span(node)[0], starts[node.end_lineno] - 1)
        }
    )
    pieces, last = [], 0
    for edge in edges:
        pieces += [text[last:edge], END]
        last = edge
    return "".join([*pieces, text[last:]])


def written_by_hand(name: str, text: str, generated: dict | None = None) -> str:
    """The text of a file with what is not written by hand blanked out
    (COMPUTED in its place), and END around each Python statement.
    `generated`: opfacts.python_values(), if already made."""
    spans = [m.span() for m in MARKED.finditer(text)]
    if name.endswith(".md"):
        spans += [m.span() for m in CITATION.finditer(text)]
    text = _blank(text, spans)
    text = _blank(text, [m.span() for m in NAME.finditer(text)], mark=" ")
    if name.endswith(".py"):
        generated = opfacts.python_values() if generated is None else generated
        text = _python(text, set(generated.get(name, {})), set(INPUTS.get(name, ())))
    return text


def tokens(text: str) -> list[Token]:
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    found = []
    for match in TOKEN.finditer(text):
        kind = match.lastgroup
        value = match.group(kind).lower()
        if kind == "version":
            value = value.removeprefix("v")
        line = bisect.bisect_left(newlines, match.start()) + 1
        found.append(Token(kind, value, line))
    return found


def _as_tuple(text: str) -> str:
    return ".".join(p.strip() for p in text.strip("()").split(",") if p.strip())


def literals(text: str | list[Token], release: str, tuples: bool = False) -> list[int]:
    """Line numbers where `release` is written (as itself, not inside a
    longer release; with `tuples`, also as a tuple of its numbers)."""
    stream = tokens(text) if isinstance(text, str) else text
    return [
        t.line
        for t in stream
        if (t.kind == "version" and t.text == release)
        or (tuples and t.kind == "tuple" and _as_tuple(t.text) == release)
    ]


def _nearest(stream: list[Token], i: int, step: int) -> tuple[int, Token] | None:
    """The first release or computed value from stream[i] on in `step`'s
    direction, at most NEAR words away and in the same sentence: (its
    distance in words, it)."""
    j, words = i + step, 0
    while 0 <= j < len(stream) and words <= NEAR:
        other = stream[j]
        if other.kind == "stop":
            return None
        if other.kind in ("version", "computed"):
            return words, other
        words += 1
        j += step
    return None


def claims(text: str | list[Token]) -> list[tuple[int, str, str]]:
    """(line, claim, release) for each claim (newest, latest, only pinned,
    last pinned, most recent) whose nearest release in its sentence, at
    most NEAR words before or after it, is written by hand (a computed one
    -- a marked place, a generated value, newest() -- as near or nearer
    makes it computed)."""
    found = []
    stream = tokens(text) if isinstance(text, str) else text
    for i, t in enumerate(stream):
        if t.kind != "word":
            continue
        following = stream[i + 1] if i + 1 < len(stream) else None
        if t.text in CLAIM_WORDS:
            claim = t.text
        elif following and (t.text, following.text) in CLAIM_PAIRS:
            claim = f"{t.text} {following.text}"
        else:
            continue
        near = [n for n in (_nearest(stream, i, -1), _nearest(stream, i, 1)) if n]
        if not near:
            continue
        distance = min(d for d, _ in near)
        closest = [other for d, other in near if d == distance]
        if all(other.kind == "version" for other in closest):
            found.append((t.line, claim, closest[0].text))
    return found


def scan(
    releases: tuple[str, ...], repo: Path = paths.REPO, read=None
) -> tuple[list[str], list[str]]:
    """Every literal of `releases` written by hand outside the data, and
    every claim written by hand: "path:line: what"."""
    read = read or (lambda name: (repo / name).read_text(errors="replace"))
    found_literals, found_claims = [], []
    generated = opfacts.python_values()
    for name in files(repo):
        stream = tokens(written_by_hand(name, read(name), generated))
        if not name.startswith(DATA):
            for release in releases:
                for line in literals(stream, release, tuples=name.endswith(".py")):
                    found_literals.append(f"{name}:{line}: {release}")
        for line, claim, release in claims(stream):
            found_claims.append(f"{name}:{line}: {claim!r} next to {release}")
    return found_literals, found_claims
