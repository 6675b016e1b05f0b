"""Change several files so that either all changes land or none does.

Each file is replaced atomically (a temporary file in the same directory,
then rename). If anything goes wrong before the last file is in place -- an
error, a full disk, SIGINT/SIGTERM/SIGHUP -- every file already changed is put
back as it was, byte for byte, and the error is raised again. Signals that
arrive meanwhile are held until the tree is consistent.

For tests, VLLM_XPU_FAKES_FAULT injects a failure while files are being
written: ``fail-after:N`` raises OSError after N files, ``pause-after:N``
waits after N files (printing ``paused`` to stderr) until a signal arrives.
"""

import contextlib
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import Refusal

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@dataclass
class Change:
    path: Path
    data: bytes | None  # None: delete the file
    mode: int | None = None  # for a new file; an existing file keeps its mode


def writable_or_refuse(changes: list[Change], root: Path) -> None:
    """Refuse before touching anything if a file or directory we must write is
    read-only (its write bits are clear, or we may not write it)."""
    for change in changes:
        target = change.path
        directory = _existing_parent(target.parent)
        for path in (target, directory):
            if not path.exists():
                continue
            mode = path.stat().st_mode
            if not (mode & 0o222) or not os.access(path, os.W_OK):
                kind = "directory" if path.is_dir() else "file"
                raise Refusal(
                    f"{_rel(path, root)}: {kind} is read-only; nothing changed"
                )


def _existing_parent(directory: Path) -> Path:
    while not directory.exists():
        directory = directory.parent
    return directory


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def commit(changes: list[Change]) -> None:
    """Make every change, or none."""
    done: list[tuple[Change, bytes | None, int | None, list[Path]]] = []
    with _held_signals() as pending:
        try:
            for count, change in enumerate(changes, 1):
                old, mode = _read(change.path)
                created = _make_parents(change.path.parent)
                done.append((change, old, mode, created))
                _write(
                    change.path, change.data, mode if mode is not None else change.mode
                )
                _fault(count, pending)
                if pending:
                    raise Interrupted(pending[0])
        except BaseException:
            for change, old, mode, created in reversed(done):
                _write(change.path, old, mode)
                for directory in reversed(created):
                    with contextlib.suppress(OSError):
                        directory.rmdir()
            raise
        if pending:
            raise Interrupted(pending[0])


def _read(path: Path) -> tuple[bytes | None, int | None]:
    if not path.exists():
        return None, None
    return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)


def _make_parents(directory: Path) -> list[Path]:
    created = []
    while not directory.exists():
        created.append(directory)
        directory = directory.parent
    for path in reversed(created):
        path.mkdir()
    return list(reversed(created))


def _write(path: Path, data: bytes | None, mode: int | None) -> None:
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    tmp = path.with_name(f".{path.name}.xpufakes-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def _held_signals():
    pending: list[int] = []

    def hold(signum, frame):
        pending.append(signum)

    previous = {}
    for signum in _SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[signum] = signal.signal(signum, hold)
    try:
        yield pending
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _fault(count: int, pending: list[int]) -> None:
    spec = os.environ.get("VLLM_XPU_FAKES_FAULT", "")
    kind, _, after = spec.partition(":")
    if not after or int(after) != count:
        return
    if kind == "fail-after":
        raise OSError(28, f"injected failure after {count} file(s)")
    if kind == "pause-after":
        print(f"paused after {count} file(s)", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 60
        while not pending and time.monotonic() < deadline:
            time.sleep(0.05)
