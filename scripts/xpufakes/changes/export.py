"""`make export`: a self-contained series for packagers (quilt, `patch -p1`,
`git am`): every patch in `git format-patch` form, with the overlay files it
brings as new-file diffs, and a `series` file. Nothing of this project is
needed to apply it.

Each file's diff has the line numbers of the release exported for (a series
serves several releases, with the line numbers of its first) and carries
`index <pre>..<post>`, the git blob ids of the file before and after (the
pristine file of that release), so `patch -F0` applies it with no offset and
`git am -3` can fall back to a three-way merge on a tree whose context moved.
The patches keep the series' file names. Author and sign-off: AUTHOR
("Name <email>"), else git's user.name / user.email, else the project's
identity from the patch header.
"""

import datetime
import email.utils
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import series, unidiff
from xpufakes.common import paths, transaction
from xpufakes.common.errors import Refusal
from xpufakes.trees import fetch, pins

ZERO_COMMIT = "0" * 40


@dataclass(frozen=True)
class Message:
    """A patch as a commit: author, date, subject, body, diff."""

    author: str
    date: str  # RFC 2822
    subject: str
    body: str
    diff: str


def blob_id(data: bytes) -> str:
    """What `git hash-object` prints for data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def new_file_diff(path: str, data: bytes) -> str:
    text = data.decode("utf-8")
    body = unidiff.unified("", text, path)
    body = body.replace(f"--- a/{path}\n", "--- /dev/null\n", 1)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
        f"index {'0' * 40}..{blob_id(data)}\n" + body
    )


def identity(fallback: str) -> str:
    """AUTHOR, else git's user.name <user.email>, else `fallback`."""
    given = os.environ.get("AUTHOR", "").strip()
    if given:
        if not re.fullmatch(r"[^<>]+ <[^<>\s]+@[^<>\s]+>", given):
            raise Refusal(f'AUTHOR must be "Name <email>", not {given!r}')
        return given
    found = []
    for key in ("user.name", "user.email"):
        done = subprocess.run(
            ["git", "-C", str(paths.REPO), "config", key],
            capture_output=True,
            text=True,
        )
        found.append(done.stdout.strip() if done.returncode == 0 else "")
    return f"{found[0]} <{found[1]}>" if all(found) else fallback


def _git_style(diff: str, blobs: dict[str, tuple[str, str]]) -> str:
    """Precede each file's ---/+++ header with `diff --git` and, for the
    files in `blobs` (path -> (pre, post) blob ids), an `index` line."""
    out = []
    lines = unidiff.lines_of(diff)
    for i, line in enumerate(lines):
        if (
            line.startswith("--- a/")
            and i + 1 < len(lines)
            and lines[i + 1].startswith("+++ b/")
        ):
            path = line[6:].rstrip("\n")
            out.append(f"diff --git a/{path} b/{path}\n")
            if path in blobs:
                pre, post = blobs[path]
                out.append(f"index {pre}..{post} 100644\n")
        out.append(line)
    return "".join(out)


def _for_release(
    patch: series.Patch, texts: dict[str, str]
) -> tuple[str, dict[str, tuple[str, str]]]:
    """The patch's diff with the line numbers of the release whose files are
    `texts` (each file before the patch; updated to after it), and the
    (pre, post) blob ids of the files it changes. A series serves several
    releases whose diffs differ only in line numbers (authoring.py): the
    hunks are the series', found in the release's file and renumbered."""
    parts = []
    blobs = {}
    for d in patch.file_diffs:
        if d.path not in texts:
            raise Refusal(f"{patch.name}: {d.path} is not in this release")
        before = texts[d.path]
        after = unidiff.apply(before, d)
        text = unidiff.unified(before, after, d.path)
        (renumbered,) = unidiff.parse(text)
        if [h.lines for h in renumbered.hunks] != [h.lines for h in d.hunks]:
            raise Refusal(
                f"{patch.name}: {d.path}: its hunks do not carry over to this "
                "release's file unchanged; run `make refresh`"
            )
        parts.append(text)
        blobs[d.path] = (
            blob_id(before.encode("utf-8", "surrogateescape")),
            blob_id(after.encode("utf-8", "surrogateescape")),
        )
        texts[d.path] = after
    return "".join(parts), blobs


def message(patch: series.Patch, texts: dict[str, str]) -> Message:
    """The patch as a commit; `texts`: the release's files before it (for
    its line numbers and index lines), updated to after it."""
    subject, body = patch.description
    trailers = [
        f"{name}: {patch.field(name)}"
        for name in ("Origin", "Bug", "Forwarded", "Last-Update")
        if patch.field(name)
    ]
    project = patch.fields.get("Signed-off-by", ["unknown <unknown@invalid>"])[0]
    author = identity(project)
    signoffs = [f"Signed-off-by: {author}"]
    full_body = "\n\n".join(
        part for part in (body, "\n".join(trailers), "\n".join(signoffs)) if part
    )
    diff, blobs = _for_release(patch, texts)
    diff = _git_style(diff, blobs)
    for path in patch.overlay:
        data = series.overlay_source(path).read_bytes()
        diff += new_file_diff(path, data)
    day = patch.field("Last-Update") or "1970-01-01"
    when = datetime.datetime.fromisoformat(day).replace(tzinfo=datetime.UTC)
    return Message(author, email.utils.format_datetime(when), subject, full_body, diff)


def format_patch(msg: Message, number: int, total: int) -> str:
    """The text `git format-patch --zero-commit --no-signature` would write."""
    subject = (
        f"[PATCH {number}/{total}] {msg.subject}"
        if total > 1
        else (f"[PATCH] {msg.subject}")
    )
    return (
        f"From {ZERO_COMMIT} Mon Sep 17 00:00:00 2001\n"
        f"From: {msg.author}\n"
        f"Date: {msg.date}\n"
        f"Subject: {subject}\n"
        "\n"
        f"{msg.body}\n"
        "---\n"
        f"{msg.diff}"
    )


def _pristine_texts(loaded: series.Series, pin: pins.Pin) -> dict[str, str]:
    root = fetch.fetch(pin)
    return {
        path: (root / path).read_bytes().decode("utf-8", "surrogateescape")
        for path in loaded.targets
        if (root / path).is_file()
    }


def export_series(name: str, out: Path, pin: pins.Pin) -> list[Path]:
    """The series as patches for the pristine files of `pin`'s release (one
    of the series' releases: the index lines name its blobs)."""
    loaded = series.load(name)
    out.mkdir(parents=True, exist_ok=True)
    texts = _pristine_texts(loaded, pin)
    written = []
    total = len(loaded.patches)
    for number, patch in enumerate(loaded.patches, 1):
        msg = message(patch, texts)
        target = out / patch.name  # the series' name, as status prints it
        target.write_text(format_patch(msg, number, total))
        written.append(target)
    (out / "series").write_text("".join(f"{p.name}\n" for p in written))
    return written


def export(out: Path, version: str | None) -> dict[str, list[Path]]:
    """One release's series into `out`, or (no version) every series into
    out/<series>/ with out/releases listing which release takes which."""
    try:
        return _export(out, version)
    except OSError as e:
        raise Refusal(f"cannot write to {out}: {transaction.reason(e)}") from None


def refuse_unless_empty(out: Path) -> None:
    """OUT must be a new or empty directory."""
    if out.exists() and not out.is_dir():
        raise Refusal(
            f"{out} is not a directory; give an empty or new directory as OUT"
        )
    if out.exists() and any(out.iterdir()):
        raise Refusal(f"{out} exists and is not empty; give an empty or new OUT")


def _export(out: Path, version: str | None) -> dict[str, list[Path]]:
    refuse_unless_empty(out)
    all_pins = pins.load()
    if version:
        pin = all_pins.get(version)
        return {pin.series: export_series(pin.series, out, pin)}
    written = {}
    first: dict[str, pins.Pin] = {}
    for pin in all_pins.releases.values():
        first.setdefault(pin.series, pin)
    for name in sorted(first):
        written[name] = export_series(name, out / name, first[name])
    out.joinpath("releases").write_text(
        "".join(f"{v} {p.series}\n" for v, p in all_pins.releases.items())
    )
    return written
