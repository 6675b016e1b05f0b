"""`make export`: a self-contained series for packagers (quilt, `patch -p1`,
`git am`): every patch in `git format-patch` form, with the overlay files it
brings as new-file diffs, and a `series` file. Nothing of this project is
needed to apply it.
"""

import datetime
import email.utils
import re
from dataclasses import dataclass
from pathlib import Path

from . import pins, series, unidiff
from .errors import Refusal

ZERO_COMMIT = "0" * 40


@dataclass(frozen=True)
class Message:
    """A patch as a commit: author, date, subject, body, diff."""

    author: str
    date: str  # RFC 2822
    subject: str
    body: str
    diff: str


def _description(patch: series.Patch) -> tuple[str, str]:
    """(subject, body) from the DEP-3 Description: its first line, then the
    continuation lines ("." is an empty line)."""
    text = patch.field("Description") or patch.field("Subject")
    first, _, rest = text.partition("\n")
    lines = ["" if line.strip() == "." else line for line in rest.split("\n")]
    return first.strip(), "\n".join(lines).strip("\n")


def new_file_diff(path: str, data: bytes) -> str:
    text = data.decode("utf-8")
    body = unidiff.unified("", text, path)
    body = body.replace(f"--- a/{path}\n", "--- /dev/null\n", 1)
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n" + body


def _git_style(diff: str) -> str:
    """Precede each file's ---/+++ header with a `diff --git` line."""
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
        out.append(line)
    return "".join(out)


def message(patch: series.Patch, overlay_root: Path | None = None) -> Message:
    subject, body = _description(patch)
    trailers = [
        f"{name}: {patch.field(name)}"
        for name in ("Origin", "Bug", "Forwarded", "Last-Update")
        if patch.field(name)
    ]
    signoffs = [f"Signed-off-by: {v}" for v in patch.fields.get("Signed-off-by", [])]
    full_body = "\n\n".join(
        part for part in (body, "\n".join(trailers), "\n".join(signoffs)) if part
    )
    diff = _git_style(patch.diff)
    for path in patch.overlay:
        data = series.overlay_source(path, overlay_root).read_bytes()
        diff += new_file_diff(path, data)
    author = patch.fields.get("Signed-off-by", ["unknown <unknown@invalid>"])[0]
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


def _file_name(number: int, subject: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", subject).strip("-")[:52].rstrip("-")
    return f"{number:04d}-{slug}.patch"


def export_series(name: str, out: Path) -> list[Path]:
    loaded = series.load(name)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    total = len(loaded.patches)
    for number, patch in enumerate(loaded.patches, 1):
        msg = message(patch)
        target = out / _file_name(number, msg.subject)
        target.write_text(format_patch(msg, number, total))
        written.append(target)
    (out / "series").write_text("".join(f"{p.name}\n" for p in written))
    return written


def export(out: Path, version: str | None) -> dict[str, list[Path]]:
    """One release's series into `out`, or (no version) every series into
    out/<series>/ with out/releases listing which release takes which."""
    if out.exists() and any(out.iterdir()):
        raise Refusal(f"{out} exists and is not empty; give an empty or new OUT")
    all_pins = pins.load()
    if version:
        pin = all_pins.get(version)
        return {pin.series: export_series(pin.series, out)}
    written = {}
    for name in sorted({p.series for p in all_pins.releases.values()}):
        written[name] = export_series(name, out / name)
    out.joinpath("releases").write_text(
        "".join(f"{v} {p.series}\n" for v, p in all_pins.releases.items())
    )
    return written
