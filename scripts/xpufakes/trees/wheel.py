"""A release published only as a wheel (vLLM 0.15.0 and 0.15.1 have no
sdist), unpacked as it installs -- its vllm/ package and its .dist-info --
without its native extensions, read member by member.

The x86_64 wheel is ~509 MB, nearly all of it the compiled extensions
(vllm/_C.abi3.so, the flash-attention builds, ...), which nothing of this
tool opens: the stand-ins answer for them. The rest is ~5 MB. So the wheel
is read through HTTP range requests: the zip's central directory from its
end, then only the other members, in a few contiguous spans.

Verified: the wheel's RECORD holds the sha256 of every member, and the
sha256 of RECORD itself is pinned (patches/pins.toml, record_sha256, taken
once from the whole wheel, whose sha256 the index gives and pins.toml keeps
as wheel_sha256). RECORD read by range must have the pinned sha256; every
member read must have RECORD's sha256 (and the zip's CRC and size); every
file RECORD lists but the native extensions must be there. An index that
does not answer range requests gets the whole wheel downloaded, checked
against wheel_sha256, and read the same way from the local file.
"""

import base64
import csv
import hashlib
import io
import os
import re
import struct
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xpufakes.common import progress
from xpufakes.common.errors import Refusal
from xpufakes.trees import index

# What is left out: the native extensions (and shared libraries bundled in
# a wheel's <name>.libs/), which the tool never loads.
NATIVE = re.compile(r"\.(so|pyd|dylib)(\.\d[\w.]*)?$")
GAP = 1 << 20  # members closer than this are read in one request
TAIL = 1 << 16  # the first read: the end of the zip, with its directory


class NoRanges(Exception):
    """The server answered a range request with the whole file."""


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # of its local header
    end: int  # where the next member (or the central directory) starts
    compressed: int
    size: int
    method: int
    crc: int
    mode: int  # unix permission bits, 0 if none


class Source:
    """A wheel to read bytes of."""

    size: int

    def read(self, start: int, end: int) -> bytes:
        """Bytes start..end-1."""
        raise NotImplementedError

    def tail(self, count: int) -> bytes:
        return self.read(max(0, self.size - count), self.size)


class Local(Source):
    def __init__(self, path: Path):
        self.path = path
        self.size = path.stat().st_size

    def read(self, start: int, end: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


class Remote(Source):
    """A wheel on an HTTP(S) server that answers range requests."""

    def __init__(self, url: str):
        self.url = url
        self.size = -1

    def _get(self, start: int, end: int | None) -> bytes:
        try:
            with index.open_url(self.url, start, end) as r:
                if r.status != 206:
                    raise NoRanges(self.url)
                if self.size < 0:
                    total = (r.headers.get("Content-Range") or "").rsplit("/", 1)
                    if len(total) != 2 or not total[1].isdigit():
                        raise NoRanges(self.url)
                    self.size = int(total[1])
                return r.read()
        except OSError as e:
            raise Refusal(f"cannot read {self.url}: {e}") from None

    def tail(self, count: int) -> bytes:
        return self._get(-count, None)

    def read(self, start: int, end: int) -> bytes:
        data = self._get(start, end - 1)
        if len(data) != end - start:
            raise Refusal(f"{self.url}: short read at {start}")
        return data


def source_of(url: str) -> Source:
    """A file:// wheel is read in place; http(s) by range requests."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Local(Path(urllib.parse.unquote(parsed.path)))
    return Remote(url)


class BadZip(Refusal):
    pass


def directory(source: Source, name: str) -> list[Member]:
    """Every member of the zip, from its central directory."""
    tail = source.tail(TAIL)
    base = source.size - len(tail)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        raise BadZip(f"{name}: not a zip file (no end of central directory)")
    count, cd_size, cd_offset = struct.unpack("<HII", tail[at + 10 : at + 20])
    if 0xFFFF in (count,) or 0xFFFFFFFF in (cd_size, cd_offset):
        locator = tail.rfind(b"PK\x06\x07", 0, at)
        if locator < 0:
            raise BadZip(f"{name}: zip64 without its locator")
        (record_at,) = struct.unpack("<Q", tail[locator + 8 : locator + 16])
        record = source.read(record_at, record_at + 56)
        if record[:4] != b"PK\x06\x06":
            raise BadZip(f"{name}: bad zip64 end of central directory")
        count, cd_size, cd_offset = struct.unpack("<QQQ", record[32:56])
    if cd_offset >= base:
        cd = tail[cd_offset - base : cd_offset - base + cd_size]
    else:
        cd = source.read(cd_offset, cd_offset + cd_size)
    rows = []
    pos = 0
    while pos + 46 <= len(cd) and cd[pos : pos + 4] == b"PK\x01\x02":
        (method, _, _, crc, csize, usize, nlen, elen, clen) = struct.unpack(
            "<HHHIIIHHH", cd[pos + 10 : pos + 34]
        )
        (attributes, offset) = struct.unpack("<II", cd[pos + 38 : pos + 46])
        member = cd[pos + 46 : pos + 46 + nlen].decode("utf-8")
        extra = cd[pos + 46 + nlen : pos + 46 + nlen + elen]
        usize, csize, offset = _zip64(extra, usize, csize, offset)
        rows.append((offset, member, csize, usize, method, crc, attributes >> 16))
        pos += 46 + nlen + elen + clen
    if len(rows) != count:
        raise BadZip(f"{name}: {len(rows)} members in the directory, {count} said")
    rows.sort()
    ends = [r[0] for r in rows[1:]] + [cd_offset]
    return [
        Member(member, offset, end, csize, usize, method, crc, mode & 0o777)
        for (offset, member, csize, usize, method, crc, mode), end in zip(
            rows, ends, strict=True
        )
    ]


def _zip64(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        kind, length = struct.unpack("<HH", extra[pos : pos + 4])
        if kind == 1:
            values = list(
                struct.unpack(f"<{length // 8}Q", extra[pos + 4 : pos + 4 + length])
            )
            if usize == 0xFFFFFFFF:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF:
                offset = values.pop(0)
        pos += 4 + length
    return usize, csize, offset


def spans(members: list[Member]) -> list[tuple[int, int, list[Member]]]:
    """(start, end, members): runs of members read in one request."""
    out: list[tuple[int, int, list[Member]]] = []
    for m in sorted(members, key=lambda m: m.offset):
        if out and m.offset - out[-1][1] <= GAP:
            start, _, group = out[-1]
            out[-1] = (start, m.end, [*group, m])
        else:
            out.append((m.offset, m.end, [m]))
    return out


def _content(name: str, member: Member, raw: bytes) -> bytes:
    """A member's bytes from its local header on."""
    if raw[:4] != b"PK\x03\x04":
        raise BadZip(f"{name}: {member.name}: no local header")
    nlen, elen = struct.unpack("<HH", raw[26:30])
    start = 30 + nlen + elen
    data = raw[start : start + member.compressed]
    if member.method == 8:
        data = zlib.decompressobj(-15).decompress(data)
    elif member.method != 0:
        raise BadZip(f"{name}: {member.name}: compression {member.method}")
    if len(data) != member.size or zlib.crc32(data) != member.crc:
        raise BadZip(f"{name}: {member.name}: its CRC or size is not the zip's")
    return data


def read(
    source: Source, name: str, chosen: list[Member], advance: Callable[[int], None]
) -> dict[str, bytes]:
    """The chosen members' bytes, by name."""
    found = {}
    for start, end, group in spans(chosen):
        data = source.read(start, end)
        advance(len(data))
        for m in group:
            found[m.name] = _content(name, m, data[m.offset - start : m.end - start])
    return found


def _digest(data: bytes) -> str:
    """A RECORD row's hash of data."""
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def record_name(members: list[Member]) -> str:
    found = [
        m.name for m in members if re.fullmatch(r"[^/]+\.dist-info/RECORD", m.name)
    ]
    if len(found) != 1:
        raise BadZip(f"{len(found)} .dist-info/RECORD files in the wheel")
    return found[0]


def verify(name: str, files: dict[str, bytes], record: str, record_sha256: str) -> None:
    """RECORD has the pinned sha256; every file read has RECORD's; every
    file RECORD lists but the native extensions was read."""
    actual = hashlib.sha256(files[record]).hexdigest()
    if actual != record_sha256:
        raise Refusal(
            f"{name}: its RECORD has sha256 {actual}, pinned {record_sha256}; discarded"
        )
    rows = {}
    for row in csv.reader(io.StringIO(files[record].decode("utf-8"))):
        if row:
            rows[row[0]] = row[1] if len(row) > 1 else ""
    for path, data in files.items():
        if path == record:
            continue
        if path not in rows:
            raise Refusal(f"{name}: {path} is not in its RECORD; discarded")
        if rows[path] != _digest(data):
            raise Refusal(f"{name}: {path} is not the file its RECORD lists; discarded")
    missing = [p for p in rows if p not in files and not NATIVE.search(p)]
    if missing:
        raise Refusal(f"{name}: {missing[0]} is in its RECORD, not in the wheel")


def record_sha256_of_whole(path: Path, name: str) -> str:
    """The sha256 of the RECORD of a whole wheel on disk (its own sha256
    checked by the caller): what pins.toml's record_sha256 is taken from."""
    source = Local(path)
    members = directory(source, name)
    record = record_name(members)
    wanted = [m for m in members if m.name == record]
    data = read(source, name, wanted, lambda n: None)[record]
    return hashlib.sha256(data).hexdigest()


def unpack(
    url: str,
    name: str,
    wheel_sha256: str,
    record_sha256: str,
    destination: Path,
    scratch: Path,
    step: str = "",
) -> None:
    """Write the wheel's members but the native extensions under
    `destination` (a new directory), verified (module docstring). `scratch`:
    where the whole wheel goes if the index answers no range requests (it
    is removed after)."""
    source = source_of(url)
    whole = None
    try:
        try:
            members = directory(source, name)
        except NoRanges:
            whole = index.download(url, name, wheel_sha256, scratch, step)
            source = Local(whole)
            members = directory(source, name)
        chosen = [m for m in members if not NATIVE.search(m.name)]
        chosen = [m for m in chosen if not m.name.endswith("/")]
        total = sum(s[1] - s[0] for s in spans(chosen))
        what = f"{name}, all but its native extensions"
        shown = progress.Download(what, total, step) if whole is None else None
        try:
            advance = shown.advance if shown else (lambda count: None)
            files = read(source, name, chosen, advance)
            verify(name, files, record_name(members), record_sha256)
        except BaseException:
            if shown is not None:
                shown.failed()
            raise
        if shown is not None:
            shown.verified(f"{len(files)} files, sha256 verified against its RECORD")
        modes = {m.name: m.mode for m in chosen}
        for path, data in files.items():
            target = destination / path
            if ".." in Path(path).parts or Path(path).is_absolute():
                raise BadZip(f"{name}: {path} is outside the wheel")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            os.chmod(target, modes.get(path) or 0o644)
    finally:
        if whole is not None:
            whole.unlink(missing_ok=True)
