"""Releases outside the pinned range, on their real sdists: a release where
nothing on XPU is traced is not affected, which is success (exit 0, one
line, the tree untouched), for every verb and through make; one that
compiles on XPU and is older than every pin is refused; a release newer than
every pin goes down the recipe path, called what it is. And a VLLM_VERSION
that is no version says so.

Negative controls: 0.9.2, which compiles on XPU (vLLM's V1 engine), is
refused, not called unaffected; so is 0.10.1.1 with the line that forces
compilation off removed: the verdict comes from the tree's
vllm/platforms/xpu.py, not from its version alone."""

import re
import shutil
import subprocess

import pytest

from support import releases, small_tree, tool
from xpufakes.changes import base
from xpufakes.trees import tree

FORCED_OFF = (
    "vLLM 0.10.1.1 is not affected (torch.compile is off on XPU in this "
    "release): nothing to do"
)
V0_ONLY = (
    "vLLM 0.9.1 is not affected (XPU runs on vLLM's V0 engine in this release, "
    "which compiles nothing unless asked to with -O): nothing to do"
)


def _copy(version: str, destination):
    return shutil.copytree(releases.unpinned(version), destination, symlinks=True)


def _installed(version: str, site):
    """The release's vllm/ package alone, as in a site-packages directory."""
    site.mkdir()
    shutil.copytree(releases.unpinned(version) / "vllm", site / "vllm")
    return site


@pytest.mark.parametrize(
    ("version", "said", "shape"),
    [
        ("0.10.1.1", FORCED_OFF, "sdist"),
        ("0.10.1.1", FORCED_OFF, "installed"),
        ("0.9.1", V0_ONLY, "sdist"),
    ],
)
def test_a_release_that_traces_nothing_on_xpu_is_not_affected(
    version, said, shape, tmp_path
):
    root = (_copy if shape == "sdist" else _installed)(version, tmp_path / "tree")
    before = releases.file_hashes(root)
    for verb in ("apply", "check", "status", "revert"):
        result = tool.run(verb, str(root))
        assert result.returncode == 0, (verb, result.stdout, result.stderr)
        assert result.stdout.splitlines() == [said], (verb, result.stdout)
        assert result.stderr == "", (verb, result.stderr)
    assert releases.file_hashes(root) == before


def test_make_apply_on_an_unaffected_release_succeeds(tmp_path):
    """The README's one-line Dockerfile (`make apply`) on such an image."""
    root = _installed("0.10.1.1", tmp_path / "site-packages")
    before = releases.file_hashes(root)
    result = subprocess.run(
        ["make", "-s", "-C", str(tool.SCRIPTS.parent), "apply", f"VLLM={root}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [FORCED_OFF]
    assert releases.file_hashes(root) == before


def test_audit_does_not_fail_an_unaffected_release(tmp_path):
    root = _copy("0.10.1.1", tmp_path / "tree")
    result = tool.run("audit", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "vLLM 0.10.1.1 is not affected (torch.compile is off on XPU in this "
        "release): nothing on XPU is traced, so no op needs a fake"
    ]


def test_a_release_that_compiles_on_xpu_is_not_called_unaffected(tmp_path):
    """0.9.2 runs XPU on V1, which compiles (vllm/config.py sets PIECEWISE
    before the XPU platform's check, whose enforce_eager only turns off
    CUDA graphs): refused, not "not affected"."""
    root = _copy("0.9.2", tmp_path / "tree")
    before = releases.file_hashes(root)
    for verb in ("apply", "check"):
        tool.refused(
            tool.run(verb, str(root)),
            "vLLM 0.9.2 (vllm/_version.py) compiles the model on XPU",
            "older than the oldest pinned release (0.10.2): not supported",
        )
    assert releases.file_hashes(root) == before


def test_the_verdict_comes_from_the_tree_files(tmp_path):
    root = _copy("0.10.1.1", tmp_path / "tree")
    platform = root / "vllm" / "platforms" / "xpu.py"
    text = platform.read_text()
    forced = re.compile(r"^.*compilation_config\.level = .*NO_COMPILATION.*\n", re.M)
    assert len(forced.findall(text)) == 1
    platform.write_text(forced.sub("            pass\n", text))
    tool.refused(tool.run("apply", str(root)), "compiles the model on XPU")


def test_a_version_that_is_no_version_says_so(tmp_path):
    root = _copy("0.10.1.1", tmp_path / "tree")
    before = releases.file_hashes(root)
    result = tool.run("apply", str(root), env={"VLLM_VERSION": "banana"})
    tool.refused(result, "VLLM_VERSION=banana is not a vLLM version")
    assert "set VLLM_VERSION" not in result.stderr
    assert releases.file_hashes(root) == before


def test_a_release_newer_than_every_pin(tmp_path, monkeypatch):
    """The next release on the day it ships: based on the newest pin and
    called what it is, the line saying how a maintainer pins it; its
    modified files go down the recipe path, whose proof is the one every
    downstream tree gets (tests/test_trees.py)."""
    newest, newer = releases.newest(), releases.newer_than_every_pin()
    root = small_tree.make(newest, tmp_path / "tree")
    version_file = root / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace(newest, newer))
    with open(root / "vllm" / "_xpu_ops.py", "a") as f:
        f.write(f"# a change in {newer}\n")
    before = releases.file_hashes(root)
    result = tool.run("status", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(
        f"vLLM {newer} (vllm/_version.py) is newer than the newest pinned release "
        f"({newest}): assuming base {newest}"
    ), first
    assert "applying by recipe" in first and "`make refresh`" in first
    assert "unreleased" not in first
    assert releases.file_hashes(root) == before
    monkeypatch.delenv("VLLM_VERSION", raising=False)
    detected = base.detect_base(tree.locate(str(root)))
    assert detected.by_recipe and detected.pin.version == newest


def test_revert_of_a_newer_release_says_what_the_tree_is(tmp_path):
    """A release newer than every pin whose files are the newest pin's (its
    _xpu_ops.py unchanged): the pin's series applies as is, and the revert's
    last line names the tree's own version, not the pin's (it used to say
    "the tree is the pristine vLLM <newest pin> again")."""
    newest, newer = releases.newest(), releases.newer_than_every_pin()
    root = small_tree.make(newest, tmp_path / "tree")
    version_file = root / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace(newest, newer))
    before = releases.file_hashes(root)
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    result = tool.run("revert", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last == (
        f"reverted: the tree is vLLM {newer} as it was before apply "
        f"(the series' files are vLLM {newest}'s again)"
    ), last
    assert f"pristine vLLM {newest}" not in result.stdout
    assert releases.file_hashes(root) == before


def test_a_tree_whose_fakes_are_already_right_is_not_affected(tmp_path):
    """A tree the recipes do not fit because it already has the fix (here
    0.14.1 patched, then changed downstream: as vLLM's own tree would be
    had it taken this fix) is proven as it is, and is not affected: exit 0,
    nothing changed. The negative control, a tree the recipes do not fit
    whose fakes are wrong, is refused: tests/test_trees.py,
    test_anchor_removed_is_refused."""
    root = shutil.copytree(releases.patched("0.14.1"), tmp_path / "tree")
    with open(root / "vllm" / "_ipex_ops.py", "a") as f:
        f.write("# a downstream change\n")
    before = releases.file_hashes(root)
    result = tool.run("apply", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert "already carries our changes" in out[1]
    assert out[-2].startswith("proof: every op of ours the tree as it is calls")
    assert out[-1] == (
        "vLLM 0.14.1 is not affected (every op of ours it calls from traced code "
        "already has a conformant fake, proven): nothing to do"
    )
    assert releases.file_hashes(root) == before
