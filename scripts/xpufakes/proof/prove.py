"""Proof before commit on the recipe path: the edited tree is audited as
`make audit` audits a tree -- the static scan of the ops it calls in traced
code (scan.py, here in this process, on the edited sources) and its own
fake registrations loaded against the stand-in kernels (verify.py, in a
separate Python with torch, on the edited vllm/ package laid out in a
temporary directory: the edited and added files written, every other file
a symlink to the tree's) -- and every op of ours that it calls from traced
code must have a conformant fake. Both run at once: while the proof's
Python imports torch, this process lays the edited tree out and scans it;
the proof's Python then loads the tree and runs the opcheck grid of the ops
the scan found called (sent on its stdin: an op not called gets no verdict,
so its grid would prove nothing here). It ends without tearing torch down.

A proof that passed is remembered (ProofCache): the same edited tree with
the same tool, stand-ins, Python, installed packages and environment is
proven again by looking it up, not by starting torch. A proof that fails is
never remembered, so a refusal always comes from a proof that ran.

The tool itself needs no torch; the proof does. Which Python runs it
(setting up this repository's .venv on a fresh clone) is proofpython.py's.
"""

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from xpufakes.changes import kernels
from xpufakes.common import isolated, paths, transaction
from xpufakes.common.errors import Refusal
from xpufakes.common.ops import is_ours
from xpufakes.common.transaction import Change
from xpufakes.proof import audit
from xpufakes.proof.static import reach, scan
from xpufakes.trees import tree

GOOD_VERDICTS = ("ok", "not traced", "ok (no tensor returned)")
# Not loaded by the proof (nor by the audit): a build's native extensions,
# which the stand-ins answer for.
EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".so",)


class EditedTree:
    """The tree's vllm/ package with the changes made, in memory: each file
    by its path relative to the tree, the changed ones' new bytes."""

    def __init__(self, root: Path, changes: list[Change]):
        self.root = root
        self.files: dict[str, Path] = {
            rel: path
            for rel, path in tree.vllm_files(root).items()
            if not rel.endswith(EXTENSIONS)
        }
        self.links = _directory_links(root)
        self.changed: dict[str, bytes | None] = {}
        for change in changes:
            rel = change.path.relative_to(root).as_posix()
            if rel.startswith("vllm/"):
                self.changed[rel] = change.data
                self.files.pop(rel, None)

    def digest(self) -> str:
        """sha256 over every file's path and content (a native extension's
        is not read: the stand-ins answer for it, whatever it holds)."""
        digest = hashlib.sha256()
        entries = {rel: None for rel in self.files} | self.changed
        for rel in sorted(entries):
            data = entries[rel]
            if data is None and rel in self.changed:
                continue  # deleted
            if data is None:
                try:
                    data = self.files[rel].read_bytes()
                except OSError as e:
                    data = f"unreadable: {e.strerror}".encode()
            digest.update(b"%d:%s\0" % (len(rel), rel.encode()))
            digest.update(hashlib.sha256(data).digest())
        for rel, target in sorted(self.links.items()):
            digest.update(f"link {rel} {target} {_listing(target)}\0".encode())
        return digest.hexdigest()

    def sources(self, before: dict[str, str]) -> dict[str, str]:
        """The Python files' texts after the changes (`before`: as they were)."""
        texts = dict(before)
        for rel, data in self.changed.items():
            if not rel.endswith(".py"):
                continue
            if data is None:
                texts.pop(rel, None)
            else:
                texts[rel] = data.decode("utf-8", errors="replace")
        return texts

    def lay_out(self, work: Path) -> Path:
        """The edited vllm/ under work: changed files written, the others
        symlinked to the tree's."""
        work.mkdir()
        for rel, path in self.files.items():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.realpath(path), target)
        for rel, real in self.links.items():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(real, target)
        for rel, data in self.changed.items():
            if data is not None:
                target = work / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        return work


def _directory_links(root: Path) -> dict[str, str]:
    """Symlinked directories in vllm/ (kept as symlinks, as a copy would)."""
    found = {}
    for directory, dirs, _ in os.walk(root / "vllm"):
        for name in dirs:
            path = Path(directory) / name
            if path.is_symlink():
                found[path.relative_to(root).as_posix()] = os.path.realpath(path)
    return found


def _listing(directory: str) -> str:
    """Every file below a directory with its size and mtime."""
    out = []
    for base, _, names in os.walk(directory):
        for name in sorted(names):
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(base, name))
                out.append(f"{base}/{name}:{st.st_size}:{st.st_mtime_ns}")
    return ";".join(sorted(out))


def prove(
    root: Path,
    changes: list[Change],
    standins: str,
    python: str,
    sources: dict[str, str],
) -> list[str]:
    """'<op>: <verdict>' for each op of ours the edited tree calls from
    traced code without a conformant fake, and each call on the traced path
    that Dynamo cannot trace (reach.py) that the edits left (empty:
    proven). `sources`: the tree's Python before the changes."""
    edited = EditedTree(root, changes)
    cache = ProofCache(edited, standins, python)
    if cache.hit():
        return []
    try:  # a full disk, a temporary directory that cannot be written
        with tempfile.TemporaryDirectory(
            prefix="xpufakes-proof-", ignore_cleanup_errors=True
        ) as work:
            laid_out = Path(work) / "tree"
            out, log = Path(work) / "result.json", Path(work) / "stderr"
            with open(log, "w") as stderr:
                child = subprocess.Popen(
                    [
                        python,
                        "-m",
                        "xpufakes.proof.prove",
                        str(laid_out),
                        standins,
                        str(out),
                    ],
                    cwd=work,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=isolated.env(),
                )
            try:  # while the proof's Python imports torch: lay out, then scan
                edited.lay_out(laid_out)
                _tell(child, "laid out")
                texts = edited.sources(sources)
                parsed: dict = {}  # each file parsed once, for both
                sites, declared = scan.scan(texts, parsed=parsed)
                _tell(child, json.dumps(sorted(sites)))
                ipex = kernels.IPEX in standins
                findings = reach.find(
                    texts, declared, upwards=False, ipex=ipex, parsed=parsed
                )
                untraceable = [f for f in findings if f.reached]
                with contextlib.suppress(BrokenPipeError):
                    child.stdin.close()
                while child.poll() is None and not transaction.pending():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.wait(timeout=0.05)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
                with contextlib.suppress(BrokenPipeError):
                    child.stdin.close()
            pending = transaction.pending()
            if pending:  # a held signal stops the proof (Ctrl-C reaches it too)
                raise transaction.Interrupted(pending[0])
            result = json.loads(out.read_text()) if out.is_file() else None
            said = log.read_text(errors="replace")
    except OSError as e:
        named = e.filename2 or e.filename
        where = f": {named}" if named else ""
        raise Refusal(
            f"the proof could not run ({e.strerror or e}{where}); nothing changed"
        ) from None
    if result is None:
        lines = said.strip().splitlines()
        errors = [line for line in lines if line.startswith("error: ")]
        if errors:
            why = "cannot load the tree's fakes against the stand-ins: "
            why += errors[-1].removeprefix("error: ")
        elif lines:
            why = lines[-1]
        elif child.returncode < 0:
            why = f"killed by {signal.Signals(-child.returncode).name}, no output"
        else:
            why = f"exit status {child.returncode}, no output"
        raise Refusal(f"the proof could not run ({python}: {why}); nothing changed")
    checked = {entry["op"]: entry for entry in result["results"]}
    reports = audit.reports(sites, declared, checked)
    failures = [
        f"{r.op}: {r.verdict}" + (f" ({r.detail[:120]})" if r.detail else "")
        for r in reports
        if is_ours(r.op) and r.verdict not in GOOD_VERDICTS
    ]
    failures += [
        f"{f.callee} ({f.kind}) at {f.site}, which the traced path reaches "
        f"({'; '.join(f.configurations)}), Dynamo cannot trace"
        for f in untraceable
    ]
    if not failures:
        cache.store(result["loaded"], result["directories"])
    return failures


def _tell(child: subprocess.Popen, line: str) -> None:
    """One line to the proof's Python (if it stopped, its stderr says why)."""
    with contextlib.suppress(BrokenPipeError):
        child.stdin.write(line.encode() + b"\n")
        child.stdin.flush()


# ---------------------------------------------------------------------------
# The proofs that passed
# ---------------------------------------------------------------------------

# Variables of the environment that cannot change what a Python process
# imports or computes: a shell's and make's bookkeeping, the terminal, the
# tree's path as make passes it (the tree itself is in the key), pytest's
# name of the running test.
IGNORED_ENV = frozenset(
    {
        "_",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "TERM",
        "COLUMNS",
        "LINES",
        "MAKEFLAGS",
        "MFLAGS",
        "MAKELEVEL",
        "MAKEOVERRIDES",
        "MAKE_TERMINAL_STDOUT",
        "MAKE_TERMINAL_STDERR",
        "XPUFAKES_VLLM",
        "PYTEST_CURRENT_TEST",
    }
)
KEEP = 200  # proofs remembered; the oldest are forgotten


def cache_directory() -> Path | None:
    """$VLLM_XPU_FAKES_PROOF_CACHE ("off": none), else proofs/ in the cache."""
    given = os.environ.get("VLLM_XPU_FAKES_PROOF_CACHE", "")
    if given == "off":
        return None
    return Path(given) if given else paths.cache_dir() / "proofs"


def _stat(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None, None]
    return [path, st.st_size, st.st_mtime_ns]


def _tool_digest() -> str:
    """sha256 over this tool's code and data and the stand-in kernels."""
    digest = hashlib.sha256()
    package = Path(__file__).parents[1]
    files = sorted(package.rglob("*.py")) + sorted((package / "data").glob("*"))
    for path in [p for p in files if p.is_file()] + [kernels.REFERENCE]:
        name = path.relative_to(package) if path.is_relative_to(package) else path.name
        digest.update(str(name).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class ProofCache:
    """One proof that passed, as a file proofs/<key>.json. The key is the
    sha256 of every input of the proof but the installed packages: the
    edited vllm/ (every file's path and content), the stand-in kernels, this
    tool's code and data and the reference kernels, the proof's Python (its
    path, and the size and mtime of the file it resolves to), the
    environment (but IGNORED_ENV) and the machine. The file lists what the
    proof's Python loaded -- every module's file, every directory of
    sys.path and of those files -- with size and mtime: a hit needs all of
    them as they were (as Python's own bytecode cache judges a source)."""

    def __init__(self, edited: EditedTree, standins: str, python: str):
        self.directory = cache_directory()
        env = {k: v for k, v in isolated.env().items() if k not in IGNORED_ENV}
        resolved = os.path.realpath(python)
        inputs = {
            "tree": edited.digest(),
            "standins": standins,
            "tool": _tool_digest(),
            "python": [python, *_stat(resolved)],
            "environment": sorted(env.items()),
            "machine": platform.machine(),
        }
        text = json.dumps(inputs, sort_keys=True)
        self.key = hashlib.sha256(text.encode()).hexdigest()

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / f"{self.key}.json"

    def hit(self) -> bool:
        """Whether this proof passed before, with everything it loaded as it
        is now."""
        if self.path is None or not self.path.is_file():
            return False
        try:
            entry = json.loads(self.path.read_text())
            loaded = entry["loaded"] + entry["directories"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return all(_stat(path) == [path, size, mtime] for path, size, mtime in loaded)

    def store(self, loaded: list, directories: list) -> None:
        """Remember a proof that passed (a cache that cannot be written is
        no cache: nothing is said, the next proof runs again)."""
        if self.path is None:
            return
        entry = {"loaded": loaded, "directories": directories, "time": time.time()}
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f)
            os.replace(tmp, self.path)
            entries = sorted(self.directory.glob("*.json"), key=os.path.getmtime)
            for old in entries[:-KEEP]:
                old.unlink()


# ---------------------------------------------------------------------------
# The proof's Python: python -m xpufakes.proof.prove <tree> <stand-ins> <out>; on
# stdin "laid out" once <tree> is, then the ops to check (a JSON list)
# ---------------------------------------------------------------------------


def _loaded(work: Path) -> tuple[list, list]:
    """What this process loaded from outside `work`: the interpreter, every
    module's file, with size and mtime; every directory of sys.path and of
    those files, with its mtime (a file added or removed changes it)."""
    files = {os.path.realpath(sys.executable)}
    files |= {str(Path(sys.prefix) / "pyvenv.cfg")}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if isinstance(name, str) and not Path(name).is_relative_to(work):
            files.add(os.path.abspath(name))
    directories = {os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)}
    directories |= {os.path.dirname(f) for f in files}
    directories = {d for d in directories if not Path(d).is_relative_to(work)}
    return (
        [_stat(f) for f in sorted(files)],
        [_stat(d) for d in sorted(directories)],
    )


def _main(argv: list[str]) -> int:
    from xpufakes.proof import verify

    work, standins, out = Path(argv[0]), argv[1], Path(argv[2])
    try:  # torch while the tool lays the tree out (without: verify.run says)
        import torch._dynamo  # noqa: F401
        from torch.testing._internal import optests  # noqa: F401
    except ModuleNotFoundError:
        pass
    if sys.stdin.readline() != "laid out\n":
        return 1  # the tool stopped before the tree was laid out
    os.chdir(work)
    try:
        results = verify.run(
            work, standins, full=False, select=lambda: json.loads(sys.stdin.readline())
        )
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    loaded, directories = _loaded(work.parent)  # the proof's own directory
    result = {
        "results": [asdict(r) | {"ok": r.ok} for r in results],
        "loaded": loaded,
        "directories": directories,
    }
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    status = _main(sys.argv[1:])
    # Its result is written; a Python that loaded torch and Dynamo takes
    # ~0.9 s to tear them down, which nothing here needs.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
