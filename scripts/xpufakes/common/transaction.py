"""Change several files so that either all changes land or none does.

The protocol, in three phases:

1. *prepare*: create missing directories, write each new content to a
   temporary file ``.NAME.xpufakes-PID.new`` next to its target, fsync it and
   give it the original's mode, owner and group. Nothing in the tree has
   changed yet; a failure here (a full disk, no inodes, EPERM) removes the
   temporary files and the new directories.
2. *swap*: for each file in turn, keep the original under
   ``.NAME.xpufakes-PID.orig`` (a hard link; for a deletion, or where hard
   links are not supported, a rename), then rename the new file over it.
   Nothing in this phase needs new space. A failure, or a held signal,
   rolls back every step done, in reverse, by renames (again no new space),
   continuing past a step that fails; if a step cannot be undone,
   ``Stranded`` says exactly which file is in which state.
3. *commit point*: every file is in place; the backups are removed, then the
   directories that deletions left empty.

Signals (``HELD``) are held while this runs, and by the command line for the
whole verb: one that arrives before the commit point rolls back and raises
``Interrupted``; one that arrives after it is reported by the caller.

Stray temporary files and backups of a killed run (``SIGKILL``) carry the
run's pid; ``strays`` finds them and ``sweep`` removes those of dead runs.

For tests, VLLM_XPU_FAKES_FAULT injects what no real fault can produce at a
chosen moment: ``fail-after:N`` raises OSError after N files are swapped,
``pause-after:N`` waits after N files (printing ``paused`` to stderr) until
a signal arrives; ``pause-after:committed`` waits just after the commit point.
"""

import contextlib
import errno
import fcntl
import os
import re
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from xpufakes.common.errors import Refusal

HELD = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)
STRAY = re.compile(r"^\.(?P<name>.+)\.xpufakes-(?P<pid>\d+)(?:\.(?P<kind>new|orig))?$")

_FS_IOC_GETFLAGS = 0x80086601
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20


class Interrupted(Exception):
    """A held signal stopped the change; every file was put back."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class Stranded(Exception):
    """The change failed and could not be completely undone. ``states``
    lists, file by file, what is where."""

    def __init__(self, cause: BaseException, states: list[str]):
        self.cause = cause
        self.states = states
        super().__init__(
            f"{reason(cause)}; could not put every file back: " + "; ".join(states)
        )


@dataclass
class Change:
    path: Path
    data: bytes | None  # None: delete the file
    mode: int | None = None  # for a new file; an existing file keeps its mode


def real_path(path: Path) -> Path:
    """Where a change to path lands: through a symlink to its target."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def writable_or_refuse(changes: list[Change], root: Path) -> None:
    """Refuse before touching anything if a file or directory we must write is
    on a file system mounted read-only, read-only itself (its write bits are
    clear, or we may not write it), append-only or immutable (chattr +a /
    +i)."""
    for change in changes:
        if change.path.is_symlink() and not change.path.exists():
            raise Refusal(
                f"{rel(change.path, root)} is a dangling symlink; nothing changed"
            )
        target = real_path(change.path)
        directory = _existing_parent(target.parent)
        for path in (target, directory):
            if not path.exists():
                continue
            kind = "directory" if path.is_dir() else "file"
            if os.statvfs(path).f_flag & os.ST_RDONLY:
                raise Refusal(
                    f"{rel(path, root)}: {kind} is on a read-only file system "
                    f"(mounted read-only at {_mount_point(path)}; chmod cannot "
                    "change that); nothing changed"
                )
            flags = _attributes(path)
            for flag, word in (
                (_FS_APPEND_FL, "append-only"),
                (_FS_IMMUTABLE_FL, "immutable"),
            ):
                if flags & flag:
                    raise Refusal(
                        f"{rel(path, root)}: {kind} is {word} (chattr); nothing changed"
                    )
            mode = path.stat().st_mode
            if not (mode & 0o222) or not os.access(path, os.W_OK):
                raise Refusal(
                    f"{rel(path, root)}: {kind} is read-only; nothing changed"
                )


def _attributes(path: Path) -> int:
    """The inode flags (lsattr), 0 where the filesystem has none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buf, True)
        return int.from_bytes(buf[:4], sys.byteorder)
    except OSError:
        return 0
    finally:
        os.close(fd)


def _mount_point(path: Path) -> Path:
    """The directory the file system holding `path` is mounted at."""
    path = Path(os.path.realpath(path))
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def _existing_parent(directory: Path) -> Path:
    while not directory.exists():
        directory = directory.parent
    return directory


def rel(path: Path, root: Path | None) -> str:
    """path relative to root, where it is below it; else as it is."""
    if root is not None:
        with contextlib.suppress(ValueError):
            return str(path.relative_to(root))
    return str(path)


def reason(error: BaseException) -> str:
    """What went wrong, in a few words ("No space left on device: <file>")."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return str(error) or type(error).__name__


def _name(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.xpufakes-{os.getpid()}.{kind}")


# -- signals ---------------------------------------------------------------

_active: list[int] | None = None


@contextlib.contextmanager
def held_signals():
    """Hold HELD signals; yields the list of those that arrived. Nested uses
    share the outermost list."""
    global _active
    if _active is not None:
        yield _active
        return
    pending: list[int] = []

    def hold(signum, frame):
        pending.append(signum)

    previous = {}
    for signum in HELD:
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[signum] = signal.signal(signum, hold)
    _active = pending
    try:
        yield pending
    finally:
        _active = None
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def held() -> list[int] | None:
    """The list the held signals arrive in (it grows as they do), or None
    when no signals are held."""
    return _active


def pending() -> list[int]:
    """The held signals that arrived (empty when none are held)."""
    return list(_active or [])


def stop_if(pending: list[int]) -> None:
    """Raise Interrupted if a held signal arrived."""
    if pending:
        raise Interrupted(pending[0])


# -- the commit ------------------------------------------------------------


@dataclass
class _Step:
    change: Change
    dest: Path  # the real file (through a symlink)
    tmp: Path | None = None  # the prepared new content
    backup: Path | None = None
    done: str = ""  # "", "linked", "replaced", "moved", "added", "deleted"


def commit(changes: list[Change], root: Path | None = None) -> list[Path]:
    """Make every change, or none. Returns backups that could not be removed
    after the commit point (the next run sweeps them)."""
    steps = [_Step(c, real_path(c.path)) for c in changes]
    created: list[Path] = []
    with held_signals() as pending:
        stop_if(pending)
        try:
            for step in steps:
                if step.change.data is None:
                    continue
                created += _make_parents(step.dest.parent)
                step.tmp = _name(step.dest, "new")
                _write_temp(step.tmp, step.change.data, step.dest, step.change.mode)
                stop_if(pending)
        except BaseException:
            for step in steps:
                if step.tmp is not None:
                    with contextlib.suppress(OSError):
                        step.tmp.unlink()
            _remove_dirs(created)
            raise
        try:
            for count, step in enumerate(steps, 1):
                _swap(step)
                _fault(count, pending)
                stop_if(pending)
        except BaseException as error:
            problems = _rollback(steps, created, root)
            if problems:
                raise Stranded(error, problems) from error
            raise
        # the commit point: every file is in place
        _fault("committed", pending)
        leftovers = []
        for step in steps:
            if step.backup is not None and step.done in (
                "replaced",
                "moved",
                "deleted",
            ):
                try:
                    step.backup.unlink()
                except FileNotFoundError:
                    pass
                except OSError:
                    leftovers.append(step.backup)
        for step in steps:
            if step.change.data is None:
                _prune_empty(step.dest.parent, root)
        _sync_dirs({s.dest.parent for s in steps})
    return leftovers


def _write_temp(tmp: Path, data: bytes, dest: Path, mode: int | None) -> None:
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.path.lexists(dest):
            st = dest.stat()
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            owner = (st.st_uid, st.st_gid)
        else:
            os.chmod(tmp, mode if mode is not None else 0o644)
            parent = dest.parent.stat()
            owner = (parent.st_uid, parent.st_gid)
        _chown_like(tmp, owner)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _chown_like(path: Path, owner: tuple[int, int]) -> None:
    st = path.stat()
    if (st.st_uid, st.st_gid) != owner and os.geteuid() == 0:
        os.chown(path, *owner)


def _swap(step: _Step) -> None:
    dest = step.dest
    if step.change.data is None:
        if os.path.lexists(dest):
            step.backup = _name(dest, "orig")
            os.rename(dest, step.backup)
            step.done = "deleted"
        return
    assert step.tmp is not None
    if os.path.lexists(dest):
        step.backup = _name(dest, "orig")
        try:
            os.link(dest, step.backup)
        except OSError as e:
            if e.errno not in (
                errno.EPERM,
                errno.EOPNOTSUPP,
                errno.EMLINK,
                errno.EXDEV,
            ):
                raise
            os.rename(dest, step.backup)  # no hard links here: move it aside
            step.done = "moved"
        else:
            step.done = "linked"
        os.replace(step.tmp, dest)
        step.done = "replaced"
    else:
        os.rename(step.tmp, dest)
        step.done = "added"
    step.tmp = None


def _rollback(steps: list[_Step], created: list[Path], root: Path | None) -> list[str]:
    """Undo every swap done, in reverse, by renames; go on past a failing
    step. Returns what could not be undone, one sentence per file."""
    problems = []
    for step in reversed(steps):
        where = rel(step.dest, root)
        try:
            if step.done == "linked":  # the original is still in place
                step.backup.unlink()
            elif step.done in ("replaced", "moved", "deleted"):
                os.replace(step.backup, step.dest)
            elif step.done == "added":
                os.unlink(step.dest)
            step.done = ""
        except OSError as e:
            if step.done == "added":
                problems.append(f"{where} was added and is still there ({reason(e)})")
            elif step.done == "linked":
                problems.append(
                    f"{where} is as before; a copy remains as "
                    f"{rel(step.backup, root)} ({reason(e)})"
                )
            else:
                now = "removed" if step.done == "deleted" else "changed"
                problems.append(
                    f"{where} is {now}, its original is kept as "
                    f"{rel(step.backup, root)} ({reason(e)})"
                )
        if step.tmp is not None:
            with contextlib.suppress(OSError):
                step.tmp.unlink()
    _remove_dirs(created)
    return problems


def _make_parents(directory: Path) -> list[Path]:
    created = []
    while not os.path.lexists(directory):
        created.append(directory)
        directory = directory.parent
    owner = directory.stat()
    for path in reversed(created):
        path.mkdir()
        _chown_like(path, (owner.st_uid, owner.st_gid))
    return created  # deepest first


def _remove_dirs(created: list[Path]) -> None:
    for directory in created:  # deepest first
        with contextlib.suppress(OSError):
            directory.rmdir()


def _prune_empty(directory: Path, root: Path | None) -> None:
    """Remove directories a deletion left empty, up to (not including) root."""
    if root is None:
        return
    while directory != root and root in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def _sync_dirs(directories) -> None:
    for directory in directories:
        with contextlib.suppress(OSError):
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


# -- strays of killed runs -------------------------------------------------


@dataclass
class Stray:
    path: Path
    pid: int

    @property
    def dead(self) -> bool:
        """True if no process has the pid (or it is ours: this run has not
        written anything yet when it looks)."""
        if self.pid == os.getpid():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def strays(directories) -> list[Stray]:
    found = []
    for directory in sorted(set(directories)):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in sorted(names):
            match = STRAY.match(name)
            if match:
                found.append(Stray(Path(directory) / name, int(match.group("pid"))))
    return found


def sweep(directories) -> list[Path]:
    """Remove the strays of dead runs; returns what was removed."""
    removed = []
    for stray in strays(directories):
        if stray.dead:
            with contextlib.suppress(FileNotFoundError):
                stray.path.unlink()
            removed.append(stray.path)
    return removed


def _fault(count: int | str, pending: list[int]) -> None:
    spec = os.environ.get("VLLM_XPU_FAKES_FAULT", "")
    kind, _, after = spec.partition(":")
    if not after or after != str(count):
        return
    if kind == "fail-after":
        raise OSError(28, f"injected failure after {count} file(s)")
    if kind == "pause-after":
        what = "the commit" if count == "committed" else f"{count} file(s)"
        print(f"paused after {what}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 60
        while not pending and time.monotonic() < deadline:
            time.sleep(0.05)
