"""The tool under real faults: a full tmpfs (space and inodes), an
append-only directory, a reader that goes away, signals, SIGKILL, apply
racing revert, symlinks, a tree patched by an earlier version of the tool.
After each: the tree is pristine or fully patched (sha256 of every file
against the references), the exit status and the last line say which, and
no temporary or backup file is left."""

import hashlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from support import releases, small_tree, tool
from xpufakes.changes import engine, history, series, unidiff
from xpufakes.common import paths, transaction
from xpufakes.trees import pins

IPEX, KERNELS = "0.10.2", "0.33.0"
PAGE = 4096


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    work = tmp_path_factory.mktemp("refs")
    return {v: small_tree.references(v, work) for v in (IPEX, KERNELS)}


def _last_line(result) -> str:
    lines = (result.stdout + result.stderr).strip().splitlines()
    return lines[-1] if lines else ""


def _check_outcome(result, root, refs, verb: str) -> str:
    """The tree is pristine or patched, the status and last line agree, and
    no stray file is left. Returns the state."""
    pristine, patched = refs
    state = small_tree.state(root, pristine, patched)
    assert state in ("pristine", "patched"), (result.stdout, result.stderr)
    assert not small_tree.strays(root)
    done, before = (
        ("patched", "pristine") if verb == "apply" else ("pristine", "patched")
    )
    if result.returncode == 0:
        assert state == done
        last = result.stdout.strip().splitlines()[-1]
        assert last.startswith("applied" if verb == "apply" else "reverted"), last
    else:
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert state == before
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and "nothing changed" in last, last
    return state


# -- a full disk ------------------------------------------------------------


def _new_pages(version: str, verb: str, refs) -> list[int]:
    """Pages each file the verb writes takes, in the order it writes them."""
    pristine_dir = releases.pristine(version)
    loaded = series.load(pins.load().get(version).series)
    if verb == "apply":
        patched = releases.patched(version)
        sizes = [(patched / p).stat().st_size for p in loaded.targets]
        sizes += [series.overlay_source(p).stat().st_size for p in loaded.overlay]
    else:
        sizes = [(pristine_dir / p).stat().st_size for p in loaded.targets]
    return [max(1, math.ceil(s / PAGE)) for s in sizes]


def _fill(mount, free_pages: int) -> None:
    """Leave exactly free_pages pages free on the tmpfs."""
    st = os.statvfs(mount)
    avail = st.f_bavail * st.f_frsize
    filler = avail - free_pages * PAGE
    assert filler >= 0, "the tmpfs is too small for the scan"
    with open(mount / "filler", "wb") as f:
        f.write(b"\0" * filler)
    st = os.statvfs(mount)
    assert st.f_bavail * st.f_frsize == free_pages * PAGE


@pytest.mark.skipif(small_tree.can_mount() is not None, reason="needs root to mount")
@pytest.mark.parametrize("verb", ["apply", "revert"])
@pytest.mark.parametrize("version", [IPEX, KERNELS])
def test_full_tmpfs(version, verb, refs, tmp_path):
    """A tmpfs with just too little space at every threshold: the file
    whose temporary copy does not fit, and every one before it."""
    pages = _new_pages(version, verb, refs)
    needed = sum(pages)
    cumulative = [sum(pages[: i + 1]) for i in range(len(pages))]
    scan = sorted({0, *(c - 1 for c in cumulative), needed})
    mount = tmp_path / "mnt"
    outcomes = {}
    for free in scan:
        small_tree.mount_tmpfs(mount, "size=4m")
        try:
            root = small_tree.make(version, mount / "tree")
            if verb == "revert":
                releases.apply(root)
            _fill(mount, free)
            result = tool.run(verb, str(root))
            outcomes[free] = _check_outcome(result, root, refs[version], verb)
            if result.returncode:
                assert "No space left on device" in result.stderr
        finally:
            small_tree.umount(mount)
    done = "patched" if verb == "apply" else "pristine"
    assert outcomes[needed] == done  # enough space: it worked
    assert outcomes[0] != done  # no space: it failed (and changed nothing)


@pytest.mark.skipif(small_tree.can_mount() is not None, reason="needs root to mount")
def test_no_inodes(refs, tmp_path):
    """A tmpfs out of inodes after 0..n of the files apply writes (tmpfs
    counts a hard link, the backup of a replaced file, as an inode too)."""
    mount = tmp_path / "mnt"
    loaded = series.load(pins.load().get(KERNELS).series)
    count = 2 * len(loaded.targets) + len(loaded.overlay)
    results = []
    for spare in range(count + 1):
        small_tree.mount_tmpfs(mount, "size=4m")
        try:
            root = small_tree.make(KERNELS, mount / "tree")
            st = os.statvfs(mount)
            used = st.f_files - st.f_ffree
            subprocess.run(
                ["mount", "-o", f"remount,nr_inodes={used + spare}", str(mount)],
                check=True,
            )
            result = tool.run("apply", str(root))
            results.append(_check_outcome(result, root, refs[KERNELS], "apply"))
        finally:
            small_tree.umount(mount)
    assert results[0] == "pristine" and results[-1] == "patched"


# -- chattr +a / +i -----------------------------------------------------------


def _chattr(path, flags: str) -> bool:
    result = subprocess.run(["chattr", flags, str(path)], capture_output=True)
    return result.returncode == 0


@pytest.mark.parametrize("where", ["vllm", "tests/kernels/quantization"])
def test_append_only_directory(where, refs, tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    directory = root / where
    if shutil.which("chattr") is None or not _chattr(directory, "+a"):
        pytest.skip("chattr +a is not supported here")
    try:
        result = tool.run("apply", str(root))
        assert result.returncode == 1
        assert "append-only" in result.stderr and where in result.stderr
        _check_outcome(result, root, refs[KERNELS], "apply")
    finally:
        _chattr(directory, "-a")


def test_append_only_without_the_precheck_reports_exactly(refs, tmp_path):
    """Negative control for the pre-check, and the Stranded message: the
    commit itself on an append-only vllm/ cannot rename over the target
    nor remove its backup; the tree's files stay as they were and the error
    says which copy is left where."""
    root = small_tree.make(KERNELS, tmp_path / "tree")
    if shutil.which("chattr") is None or not _chattr(root / "vllm", "+a"):
        pytest.skip("chattr +a is not supported here")
    try:
        target = root / "vllm" / "_xpu_ops.py"
        with pytest.raises(transaction.Stranded) as caught:
            transaction.commit([transaction.Change(target, b"new\n")], root)
        message = str(caught.value)
        assert "vllm/_xpu_ops.py is as before; a copy remains as" in message
        assert "Operation not permitted" in message
        pristine, _ = refs[KERNELS]
        hashes = releases.file_hashes(root)
        assert {p: hashes[p] for p in pristine} == pristine
    finally:
        _chattr(root / "vllm", "-a")


def test_immutable_target(refs, tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    target = root / "vllm" / "_xpu_ops.py"
    if shutil.which("chattr") is None or not _chattr(target, "+i"):
        pytest.skip("chattr +i is not supported here")
    try:
        result = tool.run("apply", str(root))
        assert "immutable" in result.stderr
        _check_outcome(result, root, refs[KERNELS], "apply")
    finally:
        _chattr(target, "-i")


# -- partly applied -------------------------------------------------------------


def test_partly_applied_is_not_pristine(refs, tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    assert tool.run("apply", str(root)).returncode == 0
    (root / "vllm" / "_xpu_gemm_fakes.py").unlink()
    status = tool.run("status", str(root)).stdout
    assert "partly applied" in status
    assert "state: partially patched" in status
    before = releases.file_hashes(root)
    result = tool.run("apply", str(root))
    assert result.returncode == 1 and "partially patched" in result.stderr
    assert releases.file_hashes(root) == before
    result = tool.run("revert", str(root))
    assert result.returncode == 0, result.stderr
    assert small_tree.state(root, *refs[KERNELS]) == "pristine"


# -- a reader that goes away; signals ---------------------------------------------


@pytest.mark.parametrize("verb", ["apply", "revert"])
def test_output_into_a_closed_pipe(verb, refs, tmp_path):
    """`| true`: the work is done and the status says so."""
    root = small_tree.make(KERNELS, tmp_path / "tree")
    if verb == "revert":
        releases.apply(root)
    env = dict(os.environ, PYTHONPATH=str(tool.SCRIPTS), PYTHONUNBUFFERED="1")
    script = f'set -o pipefail; "$0" -m xpufakes {verb} "$1" | true'
    result = subprocess.run(
        ["bash", "-c", script, sys.executable, str(root)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    done = "patched" if verb == "apply" else "pristine"
    assert small_tree.state(root, *refs[KERNELS]) == done


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGALRM, signal.SIGHUP])
def test_signal_before_the_commit_point(signum, refs, tmp_path):
    """Signals whose default action kills the process are held: midway,
    every file is put back and the status is 128 + n."""
    root = small_tree.make(IPEX, tmp_path / "tree")
    process = tool.start(
        "apply", str(root), env={"VLLM_XPU_FAKES_FAULT": "pause-after:2"}
    )
    assert "paused after 2 file(s)" in process.stderr.readline()
    assert small_tree.state(root, *refs[IPEX]) == "mixed"  # really midway
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert "nothing changed" in stderr.strip().splitlines()[-1]
    assert small_tree.state(root, *refs[IPEX]) == "pristine"
    assert not small_tree.strays(root)


@pytest.mark.parametrize("verb", ["apply", "revert"])
def test_signal_after_the_commit_point(verb, refs, tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    if verb == "revert":
        releases.apply(root)
    process = tool.start(
        verb, str(root), env={"VLLM_XPU_FAKES_FAULT": "pause-after:committed"}
    )
    assert "paused after the commit" in process.stderr.readline()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    last = stderr.strip().splitlines()[-1]
    done = "patched" if verb == "apply" else "pristine"
    assert small_tree.state(root, *refs[KERNELS]) == done
    assert process.returncode == 3, stderr
    expected = (
        "applied; interrupted by SIGINT after the tree was fully patched"
        if verb == "apply"
        else "reverted; interrupted by SIGINT after the tree was the pristine release"
    )
    assert last == expected
    assert "nothing changed" not in stderr
    assert not small_tree.strays(root)


# -- SIGKILL and strays -------------------------------------------------------------


def test_sigkill_midway_then_status_and_revert(refs, tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    process = tool.start(
        "apply", str(root), env={"VLLM_XPU_FAKES_FAULT": "pause-after:1"}
    )
    assert "paused after 1 file(s)" in process.stderr.readline()
    process.kill()
    process.wait()
    left = small_tree.strays(root)
    assert left  # the backup of the swapped file, the other temporary files
    status = tool.run("status", str(root)).stdout
    for path in left:
        assert f"{path.relative_to(root)}: left by an interrupted run" in status
    assert "state: partially patched" in status
    result = tool.run("revert", str(root))
    assert result.returncode == 0, result.stderr
    assert "removed (left by an interrupted run)" in result.stdout
    assert small_tree.state(root, *refs[KERNELS]) == "pristine"
    assert not small_tree.strays(root)


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("pause-after:1", "state: an apply by recipe was interrupted before it"),
        ("pause-after:committed", "state: patched by recipe"),
    ],
)
def test_sigkill_on_the_recipe_path_then_status_and_revert(fault, said, tmp_path):
    """A tree that takes the recipe path (0.14.1 with a downstream change),
    its apply killed before anything changed or just after the commit
    point: status names each file the run left and says what the tree is;
    revert removes them and gives back every byte of the tree as it was.
    (Before, status on the recipe path named none of them, and called a
    tree with no file changed "partly applied".)"""
    root = small_tree.make("0.14.1", tmp_path / "tree")
    with open(root / "vllm" / "_ipex_ops.py", "a") as f:
        f.write("# a downstream change\n")
    before = _tree_bytes(root)
    process = tool.start(
        "apply", str(root), "--no-proof", env={"VLLM_XPU_FAKES_FAULT": fault}
    )
    assert process.stderr.readline().startswith("paused after")
    process.kill()
    process.wait()
    left = small_tree.strays(root)
    assert left
    status = tool.run("status", str(root)).stdout
    for path in left:
        assert f"{path.relative_to(root)}: left by an interrupted run" in status
    assert said in status.splitlines()[-1]
    result = tool.run("revert", str(root))
    assert result.returncode == 0, result.stderr
    for path in left:
        assert f"{path.relative_to(root)}: removed (left by an interrupted run)" in (
            result.stdout
        )
    assert _tree_bytes(root) == before
    assert not small_tree.strays(root)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_strays_of_live_processes_are_kept(tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    live = subprocess.Popen(["sleep", "60"])
    try:
        mine = root / "vllm" / f"._xpu_ops.py.xpufakes-{live.pid}.new"
        dead = root / "vllm" / f"._xpu_ops.py.xpufakes-{small_tree.dead_pid()}.new"
        old_style = root / "vllm" / f"._xpu_ops.py.xpufakes-{small_tree.dead_pid()}"
        for path in (mine, dead, old_style):
            path.write_text("x")
        status = tool.run("status", str(root)).stdout
        assert f"being written by the running process {live.pid}" in status
        assert status.count("left by an interrupted run") == 2
        assert tool.run("apply", str(root)).returncode == 0
        assert mine.exists() and not dead.exists() and not old_style.exists()
    finally:
        live.kill()
        live.wait()
    assert tool.run("revert", str(root)).returncode == 0
    assert not small_tree.strays(root)


def test_sigkill_at_random_moments(refs, tmp_path):
    """Up to 30 runs killed at random moments around the run's own length;
    after each, status names every stray file and revert (for a partly
    patched tree or strays) gives a pristine tree with none left."""
    root = small_tree.make(KERNELS, tmp_path / "tree")
    start = time.monotonic()
    tool.run("apply", str(root))
    duration = time.monotonic() - start
    tool.run("revert", str(root))
    rng = random.Random(12)
    deadline = time.monotonic() + 60
    kills = 0
    changed = 0
    while kills < 30 and time.monotonic() < deadline:
        state = small_tree.state(root, *refs[KERNELS])
        verb = "apply" if state == "pristine" else "revert"
        process = tool.start(verb, str(root))
        time.sleep(rng.uniform(0.5, 1.1) * duration)
        process.kill()
        process.communicate()
        kills += 1
        changed += small_tree.state(root, *refs[KERNELS]) != state
        left = small_tree.strays(root)
        status = tool.run("status", str(root)).stdout
        for path in left:
            assert str(path.relative_to(root)) in status
        if "state: partially patched" in status or left:
            result = tool.run("revert", str(root))
            assert result.returncode == 0, result.stderr
            assert small_tree.state(root, *refs[KERNELS]) == "pristine"
        assert small_tree.state(root, *refs[KERNELS]) in ("pristine", "patched")
        assert not small_tree.strays(root)
    assert kills >= 10
    assert 0 < changed < kills  # the kills fell before and after the writes


# -- apply racing revert --------------------------------------------------------------


def _outcome(verb: str, state: str) -> tuple[str, str]:
    """(message, state after) of one verb run on a tree in state."""
    if verb == "apply":
        return ("already applied" if state == "patched" else "applied"), "patched"
    return ("not applied" if state == "pristine" else "reverted"), "pristine"


def test_apply_racing_revert(refs, tmp_path):
    """20 rounds of three applies and three reverts started at once on one
    tree: every run succeeds and what each said is what a serial order of
    the six runs would have said, ending in the state the tree is in."""
    root = small_tree.make(KERNELS, tmp_path / "tree")
    state = "pristine"
    verbs = ["apply", "revert"] * 3
    for _ in range(20):
        runs = [tool.start(v, str(root)) for v in verbs]
        said = []
        for process in runs:
            stdout, stderr = process.communicate(timeout=120)
            assert process.returncode == 0, stderr
            said.append(stdout.strip().splitlines()[-1])
        end = small_tree.state(root, *refs[KERNELS])
        assert end in ("pristine", "patched"), said
        assert not small_tree.strays(root)
        assert any(
            _serial(order, verbs, said, state) == end
            for order in itertools.permutations(range(len(verbs)))
        ), (state, said, end)
        state = end


def _serial(order, verbs, said, state) -> str | None:
    """The end state if the runs, in this order, said what they said."""
    for index in order:
        message, state = _outcome(verbs[index], state)
        if not said[index].startswith(message):
            return None
    return state


# -- symlinks -----------------------------------------------------------------------


@pytest.mark.parametrize("inside", [True, False])
def test_symlinked_target_stays_a_symlink(inside, refs, tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    link = root / "vllm" / "_xpu_ops.py"
    real_dir = (root / "real") if inside else (tmp_path / "outside")
    real_dir.mkdir()
    real = real_dir / "_xpu_ops.py"
    shutil.move(link, real)
    link.symlink_to(os.path.relpath(real, link.parent))
    pristine_bytes = real.read_bytes()
    assert tool.run("apply", str(root)).returncode == 0
    assert link.is_symlink() and link.resolve() == real.resolve()
    patched_dir = small_tree.make(KERNELS, tmp_path / "ref")
    releases.apply(patched_dir)
    assert real.read_bytes() == (patched_dir / "vllm" / "_xpu_ops.py").read_bytes()
    assert tool.run("revert", str(root)).returncode == 0
    assert link.is_symlink() and real.read_bytes() == pristine_bytes
    assert not small_tree.strays(root) and not small_tree.strays(real_dir)


def test_dangling_symlink_at_an_overlay_path_is_refused(tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    link = root / "vllm" / "_xpu_gemm_fakes.py"
    link.symlink_to(tmp_path / "nowhere.py")
    for verb in ("apply", "revert"):
        result = tool.run(verb, str(root))
        assert result.returncode == 1
        assert "vllm/_xpu_gemm_fakes.py is a dangling symlink" in result.stderr
        assert link.is_symlink() and not (tmp_path / "nowhere.py").exists()


def test_overlay_path_that_is_a_directory(tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    (root / "vllm" / "_xpu_gemm_fakes.py").mkdir()
    result = tool.run("apply", str(root))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a directory" in lines[0], result.stderr


# -- a tree patched by an earlier version of the tool ---------------------------------


def _git_repo() -> bool:
    return (paths.REPO / ".git").exists() and shutil.which("git") is not None


@pytest.mark.skipif(not _git_repo(), reason="needs this project's git history")
def test_overlay_history_covers_git_history():
    """The data names every committed version (regenerate it with
    `make overlay-history` after the overlay changes)."""
    for path, versions in history.from_git().items():
        missing = set(versions) - history.known(path)
        assert not missing, f"{path}: run `make overlay-history`"


@pytest.mark.skipif(not _git_repo(), reason="needs this project's git history")
def test_patch_history_covers_git_history():
    """The data holds every committed version of each target file's diffs
    (regenerate it with `make overlay-history` after patches/ changes)."""
    for path, versions in history.diffs_from_git().items():
        known = history.earlier_diffs(path)
        for text in versions:
            assert unidiff.parse(text) in known, f"{path}: run `make overlay-history`"


# The last commit before the wrapper fakes changed the kernels series' diff
# of vllm/_xpu_ops.py (0.27.0+) and the overlay.
EARLIER = "b878c97"


@pytest.mark.skipif(not _git_repo(), reason="needs this project's git history")
def test_kernels_tree_patched_by_an_earlier_series(refs, tmp_path):
    """0.33.0 patched as this project's series and overlay were at EARLIER
    (an image built with that version): its vllm/_xpu_ops.py differs from
    today's patched file, and is recognised: apply upgrades the tree to
    today's patched release, revert restores the pristine one. Negative
    control: the same file with a line changed is modified, and refused."""

    def patch_as_then(root: Path) -> None:
        _patch_as_at(EARLIER, KERNELS, root, tmp_path)

    target = "vllm/_xpu_ops.py"
    for verb, end in (("apply", "patched"), ("revert", "pristine")):
        root = small_tree.make(KERNELS, tmp_path / verb)
        patch_as_then(root)
        assert small_tree.state(root, *refs[KERNELS]) == "mixed"
        status = tool.run("status", str(root)).stdout
        assert f"{target}: {engine.PATCHED_OLDER}" in status, status
        result = tool.run(verb, str(root))
        assert result.returncode == 0, result.stderr
        assert small_tree.state(root, *refs[KERNELS]) == end
    root = small_tree.make(KERNELS, tmp_path / "changed")
    patch_as_then(root)
    with open(root / target, "a") as f:
        f.write("# a local change\n")
    before = releases.file_hashes(root)
    result = tool.run("revert", str(root))
    assert result.returncode == 1 and f"{target} is locally modified" in result.stderr
    assert releases.file_hashes(root) == before


@pytest.mark.skipif(not _git_repo(), reason="needs this project's git history")
def test_tree_patched_by_an_earlier_version(refs, tmp_path):
    """The first committed _xpu_gemm_fakes.py in a patched tree: ours, older;
    apply upgrades it, revert removes it."""
    path = "vllm/_xpu_gemm_fakes.py"
    first = subprocess.run(
        [
            "git",
            "-C",
            str(paths.REPO),
            "log",
            "--reverse",
            "--format=%H",
            "--",
            f"vllm_overlay/{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    old = subprocess.run(
        ["git", "-C", str(paths.REPO), "show", f"{first}:vllm_overlay/{path}"],
        capture_output=True,
        check=True,
    ).stdout
    assert old != series.overlay_source(path).read_bytes()
    root = small_tree.make(KERNELS, tmp_path / "tree")
    releases.apply(root)
    for verb, end in (("apply", "patched"), ("revert", "pristine")):
        (root / path).write_bytes(old)
        status = tool.run("status", str(root)).stdout
        assert f"{path}: {engine.OLDER}" in status
        result = tool.run(verb, str(root))
        assert result.returncode == 0, result.stderr
        assert small_tree.state(root, *refs[KERNELS]) == end
    # negative control: a file that is no version of ours is still refused
    releases.apply(root)
    (root / path).write_bytes(old + b"# changed\n")
    result = tool.run("revert", str(root))
    assert (
        result.returncode == 1 and "not the file this series installs" in result.stderr
    )


def _git_show(spec: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(paths.REPO), "show", spec], capture_output=True, check=True
    ).stdout


def _patch_as_at(commit: str, release: str, root: Path, scratch: Path) -> None:
    """Patch the tree at root as this project's series and overlay for the
    release were at commit."""
    pinned = tomllib.loads(_git_show(f"{commit}:patches/pins.toml").decode())
    name = pinned["releases"][release]["series"]  # the series as it was named
    listing = _git_show(f"{commit}:patches/{name}/series").decode().split()
    for entry in listing:
        text = _git_show(f"{commit}:patches/{name}/{entry}")
        (scratch / entry).write_bytes(text)
        releases.gnu_patch(root, [scratch / entry])
        for line in text.decode().splitlines():
            if line.startswith("X-Overlay:"):
                path = line.split(":", 1)[1].strip()
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_bytes(_git_show(f"{commit}:vllm_overlay/{path}"))


@pytest.mark.skipif(not _git_repo(), reason="needs this project's git history")
@pytest.mark.parametrize(
    ("version", "patches", "keep"),
    [(KERNELS, "0001", None), (IPEX, "0002", "0001")],
    ids=["kernels-0001", "ipex-0002"],
)
def test_patches_revert_of_a_tree_patched_by_an_earlier_version(
    version, patches, keep, tmp_path
):
    """`revert PATCHES=...` on a tree patched as at EARLIER removes the
    reverted patches' overlay files of that version too, and what it keeps
    is this version's: the tree equals one where only `keep` was applied
    (negative control: before issue 16 the older overlay file stayed)."""
    root = small_tree.make(version, tmp_path / "tree")
    _patch_as_at(EARLIER, version, root, tmp_path)
    assert engine.OLDER in tool.run("status", str(root)).stdout
    result = tool.run("revert", str(root), "--patches", patches)
    assert result.returncode == 0, result.stderr
    reference = small_tree.make(version, tmp_path / "reference")
    if keep:
        assert tool.run("apply", str(reference), "--patches", keep).returncode == 0
    assert releases.file_hashes(root) == releases.file_hashes(reference)
    assert not small_tree.strays(root)


@pytest.mark.skipif(not _git_repo(), reason="needs this project's git history")
def test_ipex_tree_patched_by_the_first_version(refs, tmp_path):
    """0.10.2 patched as the first committed version of the series and
    overlay did it (one patch, older overlay files): status calls those
    files ours, revert restores the release, apply then patches it."""
    first = subprocess.run(
        ["git", "-C", str(paths.REPO), "log", "--reverse", "--format=%H", "--"]
        + ["vllm_overlay/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    root = small_tree.make(IPEX, tmp_path / "tree")
    _patch_as_at(first, IPEX, root, tmp_path)
    status = tool.run("status", str(root)).stdout
    assert "state: modified" not in status and engine.OLDER in status, status
    result = tool.run("revert", str(root))
    assert result.returncode == 0, result.stderr
    assert small_tree.state(root, *refs[IPEX]) == "pristine"
    assert tool.run("apply", str(root)).returncode == 0
    assert small_tree.state(root, *refs[IPEX]) == "patched"


# -- smaller items -------------------------------------------------------------------


def test_revert_removes_directories_apply_created(tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree", quantization_dir=False)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    assert tool.run("apply", str(root)).returncode == 0
    assert (root / "tests" / "kernels" / "quantization").is_dir()
    assert tool.run("revert", str(root)).returncode == 0
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_owner_and_group_are_kept(refs, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the tree another owner")
    root = small_tree.make(KERNELS, tmp_path / "tree")
    for path in [root, *root.rglob("*")]:
        os.chown(path, 1234, 2345)
    assert tool.run("apply", str(root)).returncode == 0
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [root, *root.rglob("*")]}
    assert owners == {(1234, 2345)}
    assert tool.run("revert", str(root)).returncode == 0
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [root, *root.rglob("*")]}
    assert owners == {(1234, 2345)}


def test_version_tag_preferred_over_moving_tags(tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    (root / "vllm" / "_version.py").unlink()
    (root / "PKG-INFO").unlink()
    env = tool.git_env("t")
    for command in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "release"],
        ["git", "tag", "latest"],
        ["git", "tag", "nightly"],
        ["git", "tag", f"v{KERNELS}"],
    ):
        subprocess.run(command, cwd=root, check=True, env=env)
    result = tool.run("status", str(root))
    assert result.returncode == 0, result.stderr
    assert f"vLLM {KERNELS} (git describe)" in result.stdout


def test_wrong_version_override_names_the_release(tmp_path):
    root = small_tree.make(KERNELS, tmp_path / "tree")
    result = tool.run("apply", str(root), env={"VLLM_VERSION": "0.21.0"})
    assert result.returncode == 1
    assert "this tree is not vLLM 0.21.0" in result.stderr
    assert KERNELS in result.stderr.split("matches", 1)[1]


def test_verify_xpu_without_torch(tmp_path):
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3")
    check = subprocess.run([python, "-c", "import torch"], capture_output=True)
    if check.returncode == 0:
        pytest.skip(f"{python} has torch")
    result = subprocess.run(
        [str(paths.REPO / "bin" / "xpufakes"), "verify-xpu"],
        env=dict(os.environ, PYTHON=python),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 77, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot import torch" in lines[0]


def test_make_passes_vllm_without_expansion(refs, tmp_path):
    """`$` and backticks in VLLM name a directory, not a variable or a
    command; a decoy tree at what `$lar` would expand to stays pristine."""
    parent = tmp_path / "x"
    decoy = small_tree.make(KERNELS, parent / "dolar")
    name = "dol$lar`touch pwned`"
    root = small_tree.make(KERNELS, parent / name)
    result = subprocess.run(
        ["make", "-s", "-C", str(paths.REPO), "apply", f"VLLM={root}"],
        capture_output=True,
        text=True,
        cwd=parent,
    )
    assert result.returncode == 0, result.stderr
    assert small_tree.state(root, *refs[KERNELS]) == "patched"
    assert small_tree.state(decoy, *refs[KERNELS]) == "pristine"
    assert not (parent / "pwned").exists() and not (paths.REPO / "pwned").exists()


def test_rollback_that_fails_says_what_is_where(refs, tmp_path, monkeypatch, capsys):
    """No real fault makes a rename back fail, so os.replace is made to
    fail twice (the second file's swap, then the first file's restore): the
    exit status is 4, the message names the changed file and where its
    original is, and the command it gives finishes the job."""
    from xpufakes import cli

    root = small_tree.make(IPEX, tmp_path / "tree")
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(dst))
        if len(calls) == 3:
            raise OSError(5, "Input/output error", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(transaction.os, "replace", failing_replace)
    status = cli.main(["apply", str(root)])
    monkeypatch.setattr(transaction.os, "replace", real_replace)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 4, err
    first = series.load(pins.load().get(IPEX).series).targets
    assert f"{first[0]} is changed, its original is kept as" in err
    assert f"make revert VLLM={root}`" in err
    assert first[1] not in err.split("could not put every file back")[1]
    assert small_tree.state(root, *refs[IPEX]) == "mixed"
    (backup,) = small_tree.strays(root)  # the original, where it says
    assert str(backup.relative_to(root)) in err
    pristine_dir = releases.pristine(IPEX)
    assert backup.read_bytes() == (pristine_dir / first[0]).read_bytes()
    # that run ended here (this test is its process): its pid is gone
    backup.rename(str(backup).replace(str(os.getpid()), str(small_tree.dead_pid())))
    result = tool.run("revert", str(root))
    assert result.returncode == 0, result.stderr
    assert small_tree.state(root, *refs[IPEX]) == "pristine"
    assert not small_tree.strays(root)


def test_overlay_history_keeps_what_it_recorded(tmp_path, monkeypatch):
    """`make overlay-history` adds what git has to what was recorded: a
    version recorded once (a tree in the field may hold it) but in no
    reachable commit stays. The negative control is the history made from
    git alone, which drops it (as the tool did before)."""
    repo = tmp_path / "repo"
    (repo / "vllm_overlay" / "vllm").mkdir(parents=True)
    (repo / "vllm_overlay" / "vllm" / "_x.py").write_text("x = 1\n")
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    gone = "0" * 64
    data, diffs = tmp_path / "overlay_history.toml", tmp_path / "patch_history.json"
    data.write_text(history.render({"vllm/_x.py": [gone], "vllm/_y.py": [gone]}))
    diffs.write_text('{"files": {"vllm/a.py": ["--- old\\n"]}}\n')
    monkeypatch.setattr(history, "DATA", data)
    monkeypatch.setattr(history, "DIFFS", diffs)
    history.write(repo)
    kept = tomllib.loads(data.read_text())["files"]
    now = hashlib.sha256(b"x = 1\n").hexdigest()
    assert kept == {"vllm/_x.py": [gone, now], "vllm/_y.py": [gone]}
    assert json.loads(diffs.read_text())["files"] == {"vllm/a.py": ["--- old\n"]}
    assert history.from_git(repo) == {"vllm/_x.py": [now]}  # git alone drops it
