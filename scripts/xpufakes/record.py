"""An installed wheel's RECORD (``vllm-*.dist-info/RECORD``) kept true: the
rows of the files a change writes get their new sha256 and size (new files
are appended, in RECORD's own line ending), the rows of deleted files go.
Applied then reverted, RECORD is byte-identical to pip's: the reverted files'
hashes are the pristine ones again and the appended rows are removed.
So `pip uninstall vllm` removes our files too, and `pip install
--force-reinstall` sees an honest RECORD."""

import base64
import csv
import hashlib
import io
from pathlib import Path

from .transaction import Change


def find(root: Path) -> Path | None:
    """The RECORD of the vllm distribution installed in root, if any."""
    for info in sorted(root.glob("vllm-*.dist-info")):
        record = info / "RECORD"
        if record.is_file():
            return record
    return None


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _row(path: str, data: bytes, ending: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator=ending).writerow([path, _digest(data), len(data)])
    return out.getvalue()


def updated(text: str, rows: dict[str, bytes | None]) -> str:
    """RECORD text with the rows of the files in rows (relative path ->
    new content, or None for a deleted file) made true."""
    lines = text.splitlines(keepends=True)
    ending = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out = []
    seen = set()
    for line in lines:
        fields = next(csv.reader([line.rstrip("\r\n")]), [])
        path = fields[0] if fields else None
        if path in rows:
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
        if path not in seen and data is not None:
            out.append(_row(path, data, ending))
    return "".join(out)


def with_record(root: Path, changes: list[Change]) -> list[Change]:
    """changes, plus the change of RECORD that keeps it true, if the tree is
    an installed wheel and RECORD changes."""
    record = find(root)
    if record is None:
        return changes
    rows = {}
    for change in changes:
        try:
            rel = change.path.relative_to(root).as_posix()
        except ValueError:
            continue
        rows[rel] = change.data
    old = record.read_bytes()
    new = updated(old.decode("utf-8"), rows).encode("utf-8")
    if new == old:
        return changes
    return [*changes, Change(record, new)]
