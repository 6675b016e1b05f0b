"""Unified diffs: parse them, and apply them in memory like `patch -F0`.

A hunk applies where its old lines (context and removals) match the file
exactly. Offsets are allowed (the hunk is searched for nearest its stated
line first), fuzz is not: no context line may differ. Reversal swaps old and
new lines.
"""

import re
from dataclasses import dataclass, field

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class DiffError(Exception):
    """A diff that cannot be parsed or does not apply."""


@dataclass
class Hunk:
    old_start: int
    new_start: int
    lines: list[str] = field(default_factory=list)  # " x", "-x", "+x" (with \n)

    def old(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    def new(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]


@dataclass
class FileDiff:
    old_path: str
    new_path: str
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        """The file's path below the tree root (-p1)."""
        name = self.new_path if self.new_path != "/dev/null" else self.old_path
        return name.split("/", 1)[1]

    @property
    def creates(self) -> bool:
        return self.old_path == "/dev/null"


def lines_of(text: str) -> list[str]:
    """Lines with their endings, split at "\n" only (as patch does; unlike
    str.splitlines, which also splits at form feeds and other separators)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def parse(text: str) -> list[FileDiff]:
    """The file diffs of a patch; text before the first ``--- `` is ignored."""
    lines = lines_of(text)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines):
            nxt = lines[i + 1]
            if not nxt.startswith("+++ "):
                i += 1
                continue
            files.append(FileDiff(_path(line), _path(nxt)))
            i += 2
            continue
        match = _HUNK_HEADER.match(line)
        if match:
            if not files:
                raise DiffError(f"hunk before any file header at line {i + 1}")
            hunk, i = _parse_hunk(lines, i, match)
            files[-1].hunks.append(hunk)
            continue
        i += 1
    return files


def _path(header: str) -> str:
    return header[4:].rstrip("\n").split("\t")[0].strip()


def _parse_hunk(lines: list[str], i: int, match: re.Match) -> tuple[Hunk, int]:
    old_len = int(match.group(2)) if match.group(2) is not None else 1
    new_len = int(match.group(4)) if match.group(4) is not None else 1
    hunk = Hunk(int(match.group(1)), int(match.group(3)))
    i += 1
    old_seen = new_seen = 0
    while old_seen < old_len or new_seen < new_len:
        if i >= len(lines):
            raise DiffError("diff ends inside a hunk")
        line = lines[i]
        tag = line[:1]
        if line.startswith("\\"):
            _drop_newline(hunk)
            i += 1
            continue
        if tag == "\n" or line == "":
            line, tag = " \n", " "  # an empty context line some tools write
        if tag not in " -+":
            raise DiffError(f"bad line in hunk at line {i + 1}: {line!r}")
        hunk.lines.append(line)
        old_seen += tag in " -"
        new_seen += tag in " +"
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        _drop_newline(hunk)
        i += 1
    return hunk, i


def _drop_newline(hunk: Hunk) -> None:
    """``\\ No newline at end of file`` applies to the line before it."""
    if hunk.lines and hunk.lines[-1].endswith("\n"):
        hunk.lines[-1] = hunk.lines[-1][:-1]


def apply(text: str, diff: FileDiff, reverse: bool = False) -> str:
    """The text with the diff applied (or reversed); DiffError if it does not
    apply exactly."""
    lines = lines_of(text)
    offset = 0
    last_end = 0
    for number, hunk in enumerate(diff.hunks, 1):
        old, new = (hunk.new(), hunk.old()) if reverse else (hunk.old(), hunk.new())
        start = (hunk.new_start if reverse else hunk.old_start) - 1
        if not old:  # pure insertion: the stated line is after which to insert
            start += 1
        where = _find(lines, old, start + offset, last_end)
        if where is None:
            raise DiffError(f"{diff.path}: hunk #{number} does not apply")
        lines[where : where + len(old)] = new
        offset = where - start + len(new) - len(old)
        last_end = where + len(new)
    return "".join(lines)


def _find(lines: list[str], old: list[str], hint: int, floor: int) -> int | None:
    """The position nearest ``hint`` (not before ``floor``) where ``old``
    matches exactly."""
    size = len(old)
    limit = len(lines) - size
    hint = min(max(hint, floor), max(limit, floor))
    for distance in range(0, max(limit, 0) + 1):
        for where in (hint - distance, hint + distance):
            if floor <= where <= limit and lines[where : where + size] == old:
                return where
        if hint - distance < floor and hint + distance > limit:
            break
    return None


def unified(old: str, new: str, path: str, context: int = 3) -> str:
    """A ``diff -u`` of two texts, with a/ and b/ paths."""
    import difflib

    a = lines_of(old)
    b = lines_of(new)
    out = []
    for line in difflib.unified_diff(
        a, b, f"a/{path}", f"b/{path}", n=context, lineterm="\n"
    ):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)
