"""Bad input to the patch tool: each gets a one-line error, a non-zero exit,
and the tree is left exactly as it was (every file's sha256 compared).

Partial application and failures midway use a three-patch fixture series
over a real release (support/fixture_series.py)."""

import shutil
import signal
import subprocess

import pytest

from support import fixture_series, releases, tool

RELEASE = "0.33.0"


@pytest.fixture
def tree(tmp_path):
    return releases.copy_of(RELEASE, tmp_path / "vllm-src")


@pytest.fixture
def fixture_env(tmp_path):
    patches, overlay = fixture_series.make(tmp_path / "fixture")
    return {
        "VLLM_XPU_FAKES_PATCHES": str(patches),
        "VLLM_XPU_FAKES_OVERLAY": str(overlay),
    }


def test_missing_path(tmp_path):
    tool.refused(tool.run("apply", str(tmp_path / "nowhere")), "no such directory")


def test_path_that_is_not_a_vllm_tree(tmp_path):
    (tmp_path / "vllm").mkdir()  # a vllm/ directory that is not the package
    (tmp_path / "vllm" / "README").write_text("x")
    before = releases.file_hashes(tmp_path)
    tool.refused(tool.run("apply", str(tmp_path)), "not a vLLM tree")
    assert releases.file_hashes(tmp_path) == before


def test_unsupported_release(tree):
    """A plain version inside the pinned range that is no pinned release
    (releases outside the range: tests/test_unaffected_and_newer.py)."""
    before = releases.file_hashes(tree)
    result = tool.run("apply", str(tree), env={"VLLM_VERSION": "0.14.2"})
    tool.refused(
        result, "0.14.2 is not a supported release", releases.first(), releases.newest()
    )
    assert releases.file_hashes(tree) == before


def test_modified_target_is_modified_not_applied(tree):
    """A locally modified target holding none of our changes: status says
    "modified, not applied" (never "partly applied"), revert has nothing to
    do. (apply takes it by recipe: tests/test_trees.py.)"""
    target = tree / "vllm" / "_xpu_ops.py"
    target.write_text(target.read_text() + "# a local change\n")
    before = releases.file_hashes(tree)
    status = tool.run("status", str(tree)).stdout
    assert "vllm/_xpu_ops.py: modified, not applied" in status
    assert "0001-xpu-use-exact-fakes-for-xpu-c-gemms.patch: not applied" in status
    assert "partly applied" not in status
    result = tool.run("revert", str(tree))
    assert result.returncode == 0 and "not applied; nothing changed" in result.stdout
    assert releases.file_hashes(tree) == before


def test_refusal_names_every_offending_file(tree):
    """Our changes applied by hand, then one target edited and a foreign file
    where an overlay file goes: apply and revert refuse, naming both."""
    loaded = releases.series.load(releases.pins.load().get(RELEASE).series)
    releases.gnu_patch(tree, [p.path for p in loaded.patches])
    target = tree / "vllm" / "_xpu_ops.py"
    target.write_text(target.read_text() + "# a local change\n")
    test_file = tree / "tests" / "kernels" / "quantization" / "test_xpu_gemm_fakes.py"
    test_file.write_text("# someone else's\n")
    before = releases.file_hashes(tree)
    for verb in ("apply", "revert"):
        tool.refused(
            tool.run(verb, str(tree)),
            "vllm/_xpu_ops.py",
            "tests/kernels/quantization/test_xpu_gemm_fakes.py",
            "nothing changed",
        )
    assert releases.file_hashes(tree) == before


def test_foreign_file_where_an_overlay_file_goes(tree):
    (tree / "vllm" / "_xpu_gemm_fakes.py").write_text("# someone else's\n")
    before = releases.file_hashes(tree)
    tool.refused(tool.run("apply", str(tree)), "vllm/_xpu_gemm_fakes.py exists")
    assert releases.file_hashes(tree) == before


def test_read_only_target(tree):
    target = tree / "vllm" / "_xpu_ops.py"
    target.chmod(0o444)
    before = releases.file_hashes(tree)
    tool.refused(tool.run("apply", str(tree)), "vllm/_xpu_ops.py", "read-only")
    assert releases.file_hashes(tree) == before
    assert target.stat().st_mode & 0o777 == 0o444


def test_read_only_directory(tree):
    directory = tree / "tests" / "kernels" / "quantization"
    directory.chmod(0o555)
    try:
        before = releases.file_hashes(tree)
        tool.refused(
            tool.run("apply", str(tree)), "tests/kernels/quantization", "read-only"
        )
        assert releases.file_hashes(tree) == before
    finally:
        directory.chmod(0o755)


def test_partially_applied_series(tree, fixture_env):
    """Patch 0001 applied by hand: apply refuses and says precisely what is
    and is not applied; status reports it; revert restores the release."""
    pristine = releases.file_hashes(tree)
    patches = fixture_env["VLLM_XPU_FAKES_PATCHES"]
    subprocess.run(
        ["patch", "-s", "-p1", "-F0", "-i", f"{patches}/fixture/0001-first.patch"],
        cwd=tree,
        check=True,
    )
    overlay = fixture_env["VLLM_XPU_FAKES_OVERLAY"]
    shutil.copy(f"{overlay}/vllm/_fixture_overlay.py", tree / "vllm")
    before = releases.file_hashes(tree)
    result = tool.run("apply", str(tree), env=fixture_env)
    tool.refused(
        result,
        "partially patched",
        "0001-first.patch applied",
        "0002-second.patch not applied",
        "0003-third.patch not applied",
    )
    assert releases.file_hashes(tree) == before
    status = tool.run("status", str(tree), env=fixture_env).stdout
    assert "vllm/envs.py: partially patched (1 of 2 diffs)" in status
    assert "state: partially patched" in status
    result = tool.run("revert", str(tree), env=fixture_env)
    assert result.returncode == 0, result.stderr
    assert releases.file_hashes(tree) == pristine


def test_fixture_series_round_trip(tree, fixture_env):
    """The fixture series itself applies and reverts (so the failures below
    are the injected ones)."""
    pristine = releases.file_hashes(tree)
    result = tool.run("apply", str(tree), env=fixture_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": applied") == 3
    assert "3 file(s) changed, 2 added" in result.stdout
    assert tool.run("revert", str(tree), env=fixture_env).returncode == 0
    assert releases.file_hashes(tree) == pristine


@pytest.mark.parametrize("after", [1, 3, 4])
def test_failure_midway_leaves_the_tree_unchanged(tree, fixture_env, after):
    """A write fails (injected, like a full disk) after some of the five
    files are already in place: every one of them is put back."""
    before = releases.file_hashes(tree)
    env = dict(fixture_env, VLLM_XPU_FAKES_FAULT=f"fail-after:{after}")
    tool.refused(
        tool.run("apply", str(tree), env=env), "injected failure", "nothing changed"
    )
    assert releases.file_hashes(tree) == before
    assert not list(tree.rglob(".*.xpufakes-*"))  # no temporary files left


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_midway_leaves_the_tree_unchanged(tree, fixture_env, signum):
    """The tool is stopped by a real signal while it is writing (held after
    two of five files): it puts every file back and exits 128 + signal."""
    before = releases.file_hashes(tree)
    env = dict(fixture_env, VLLM_XPU_FAKES_FAULT="pause-after:2")
    process = tool.start("apply", str(tree), env=env)
    line = process.stderr.readline()
    assert "paused after 2 file(s)" in line
    assert releases.file_hashes(tree) != before  # it really was midway
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, (stdout, stderr)
    assert f"interrupted by {signal.Signals(signum).name}" in stderr
    assert releases.file_hashes(tree) == before


def test_revert_of_a_pristine_tree_changes_nothing(tree):
    mtimes = {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()}
    result = tool.run("revert", str(tree))
    assert result.returncode == 0 and "not applied" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()} == mtimes


def test_make_without_vllm_is_a_usage_error():
    result = subprocess.run(
        ["make", "-s", "apply"], capture_output=True, text=True, cwd=tool.SCRIPTS.parent
    )
    assert result.returncode == 2
    assert "VLLM=path" in result.stderr
