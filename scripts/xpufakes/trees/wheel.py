"""A release published only as a wheel (vLLM 0.15.0 and 0.15.1 have no
sdist), unpacked as it installs -- its vllm/ package and its .dist-info --
without its native extensions, read member by member.

The x86_64 wheel is ~509 MB, nearly all of it the compiled extensions
(vllm/_C.abi3.so, the flash-attention builds, ...), which nothing of this
tool opens: the stand-ins answer for them. The rest is ~5 MB. So the wheel
is read through HTTP range requests: the zip's central directory from its
end, then only the other members, in a few contiguous spans; `zipfile`
reads the zip from those bytes (RangeFile).

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
import urllib.parse
import zipfile
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
    zip: zipfile.ZipFile | None = None  # once its directory is read

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


class RangeFile(io.RawIOBase):
    """A Source as the seekable binary file `zipfile` reads, answered from
    the spans fetched so far (the tail at first; read() prefetches the
    chosen members' spans), fetching any other bytes asked for."""

    def __init__(self, source: Source):
        super().__init__()
        self.source = source
        tail = source.tail(TAIL)  # NoRanges here: the server cannot
        self.chunks: list[tuple[int, bytes]] = [(source.size - len(tail), tail)]
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.source.size}
        self.pos = base[whence] + offset
        return self.pos

    def fetched(self, start: int, data: bytes) -> None:
        self.chunks.append((start, data))

    def read(self, count: int = -1) -> bytes:
        end = self.source.size if count < 0 else min(self.pos + count, self.source.size)
        if end <= self.pos:
            return b""
        for start, data in self.chunks:
            if start <= self.pos and end <= start + len(data):
                found = data[self.pos - start : end - start]
                break
        else:
            found = self.source.read(self.pos, end)
            self.fetched(self.pos, found)
        self.pos = end
        return found

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _opened(source: Source, name: str) -> zipfile.ZipFile:
    """The zip of a source, its central directory read once."""
    if getattr(source, "zip", None) is None:
        try:
            source.zip = zipfile.ZipFile(RangeFile(source))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
            raise BadZip(f"{name}: not a zip file ({e})") from None
    return source.zip


def directory(source: Source, name: str) -> list[Member]:
    """Every member of the zip, from its central directory (zipfile's
    reading of it, zip64 included)."""
    opened = _opened(source, name)
    infos = sorted(opened.infolist(), key=lambda i: i.header_offset)
    ends = [i.header_offset for i in infos[1:]] + [opened.start_dir]
    return [
        Member(
            i.filename,
            i.header_offset,
            end,
            i.compress_size,
            i.file_size,
            i.compress_type,
            i.CRC,
            (i.external_attr >> 16) & 0o777,
        )
        for i, end in zip(infos, ends, strict=True)
    ]


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


def read(
    source: Source, name: str, chosen: list[Member], advance: Callable[[int], None]
) -> dict[str, bytes]:
    """The chosen members' bytes, by name: their spans fetched in one request
    each, then each member read by zipfile, which checks its CRC and size."""
    opened = _opened(source, name)
    found = {}
    for start, end, group in spans(chosen):
        data = source.read(start, end)
        advance(len(data))
        opened.fp.fetched(start, data)
        for m in group:
            try:
                found[m.name] = opened.read(m.name)
            except (zipfile.BadZipFile, NotImplementedError, EOFError) as e:
                raise BadZip(f"{name}: {m.name}: {e}") from None
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
