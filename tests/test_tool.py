"""The patch tool on real pinned releases, run as a user runs it
(`python -m xpufakes <verb> <tree>`): apply, re-apply, check, status,
revert, and the three tree shapes."""

import shutil
import subprocess

import pytest

from support import releases, tool
from xpufakes.changes import series
from xpufakes.trees import pins


def _mtimes(root) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in root.rglob("*")
        if p.is_file()
    }


def test_apply_reapply_revert(sample_release, tmp_path):
    release = sample_release
    tree = releases.copy_of(release, tmp_path / "vllm-src")
    before = releases.file_hashes(tree)
    pin = pins.load().get(release)
    loaded = series.load(pin.series)

    result = tool.run("check", str(tree))
    assert result.returncode == 0, result.stderr
    assert "would apply" in result.stdout
    assert releases.file_hashes(tree) == before  # check changes nothing

    result = tool.run("apply", str(tree))
    assert result.returncode == 0, result.stderr
    for patch in loaded.patches:
        assert f"{patch.name}: applied" in result.stdout
    assert f"-> series {pin.series}" in result.stdout
    patched = releases.file_hashes(tree)
    changed = {p for p in patched if patched[p] != before.get(p)}
    assert changed == set(loaded.targets) | set(loaded.overlay)

    # the tree now holds what `patch -p1 -F0` and a copy of the overlay give
    reference = releases.copy_of(release, tmp_path / "by-patch")
    releases.gnu_patch(reference, [patch.path for patch in loaded.patches])
    for path in loaded.overlay:
        shutil.copy(series.overlay_source(path), reference / path)
    assert releases.file_hashes(reference) == patched

    mtimes = _mtimes(tree)
    result = tool.run("apply", str(tree))
    assert result.returncode == 0, result.stderr
    assert "already applied" in result.stdout
    assert _mtimes(tree) == mtimes  # not a file touched

    result = tool.run("status", str(tree))
    assert result.returncode == 0
    assert "state: patched" in result.stdout

    result = tool.run("revert", str(tree))
    assert result.returncode == 0, result.stderr
    assert releases.file_hashes(tree) == before

    result = tool.run("revert", str(tree))
    assert result.returncode == 0 and "not applied" in result.stdout
    assert "state: pristine" in tool.run("status", str(tree)).stdout


def _checkout_like(release: str, path) -> None:
    """A git checkout at the release tag: no generated _version.py, no
    sdist metadata; the release comes from `git describe`."""
    releases.copy_of(release, path)
    for generated in ("vllm/_version.py", "PKG-INFO"):
        (path / generated).unlink(missing_ok=True)
    shutil.rmtree(path / "vllm.egg-info", ignore_errors=True)
    env = tool.git_env("t")
    for command in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "release"],
        ["git", "tag", f"v{release}"],
    ):
        subprocess.run(command, cwd=path, check=True, env=env)


def _site_packages(release: str, path) -> None:
    """An installed package: vllm/ and its dist-info, no tests/ tree."""
    path.mkdir()
    shutil.copytree(releases.pristine(release) / "vllm", path / "vllm")
    info = path / f"vllm-{release}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n"
    )


SHAPES = ["checkout", "site-packages", "package-dir"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("version", ["0.14.1", "0.16.0"])
def test_tree_shapes(version, shape, tmp_path):
    root = tmp_path / "tree"
    if shape == "checkout":
        _checkout_like(version, root)
        target = root
    else:
        _site_packages(version, root)
        target = root / "vllm" if shape == "package-dir" else root
    before = releases.file_hashes(root)
    loaded = series.load(pins.load().get(version).series)

    result = tool.run("apply", str(target))
    assert result.returncode == 0, result.stderr
    expected_source = "git describe" if shape == "checkout" else "vllm/_version.py"
    assert f"vLLM {version} ({expected_source})" in result.stdout
    after = releases.file_hashes(root)
    added = set(after) - set(before)
    tests_overlay = {p for p in loaded.overlay if p.startswith("tests/")}
    if shape == "checkout":
        assert added == set(loaded.overlay)
    else:  # an installed package has no tests/ tree to receive them
        assert added == set(loaded.overlay) - tests_overlay
        assert not (root / "tests").exists()

    assert "already applied" in tool.run("apply", str(target)).stdout
    result = tool.run("revert", str(target))
    assert result.returncode == 0, result.stderr
    assert releases.file_hashes(root) == before
    if shape == "checkout":
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
        )
        assert status.stdout == ""


def test_version_override(tmp_path):
    """VLLM_VERSION names the release when nothing in the tree does."""
    tree = releases.copy_of("0.16.0", tmp_path / "tree")
    (tree / "vllm" / "_version.py").unlink()
    (tree / "PKG-INFO").unlink()
    shutil.rmtree(tree / "vllm.egg-info", ignore_errors=True)
    result = tool.run("status", str(tree))
    assert result.returncode == 1
    assert "VLLM_VERSION" in result.stderr
    result = tool.run("apply", str(tree), env={"VLLM_VERSION": "0.16.0"})
    assert result.returncode == 0, result.stderr
    assert "vLLM 0.16.0 (VLLM_VERSION)" in result.stdout
