"""`make export`: the plain series applies with `patch -p1 -F0`, with
`quilt push -a` and with `git am`, each giving the tree `make apply` gives."""

import os
import shutil
import subprocess

import pytest

from support import releases, tool

GIT_ENV = tool.git_env("packager")


def _without(hashes: dict, *prefixes: str) -> dict:
    return {k: v for k, v in hashes.items() if not k.startswith(prefixes)}


@pytest.fixture
def exported(sample_release, tmp_path):
    out = tmp_path / "export"
    result = tool.run("export", str(out), "--pin", sample_release)
    assert result.returncode == 0, result.stderr
    names = (out / "series").read_text().split()
    assert names and all((out / n).is_file() for n in names)
    return out, names


@pytest.fixture
def applied(sample_release, tmp_path):
    tree = releases.copy_of(sample_release, tmp_path / "by-make-apply")
    releases.apply(tree)
    return releases.file_hashes(tree)


def test_export_applies_with_patch(sample_release, exported, applied, tmp_path):
    out, names = exported
    tree = releases.copy_of(sample_release, tmp_path / "by-patch")
    releases.gnu_patch(tree, [out / name for name in names])
    assert releases.file_hashes(tree) == applied


@pytest.mark.skipif(shutil.which("quilt") is None, reason="quilt is not installed")
def test_export_applies_with_quilt(sample_release, exported, applied, tmp_path):
    out, _ = exported
    tree = releases.copy_of(sample_release, tmp_path / "by-quilt")
    env = dict(os.environ, QUILT_PATCHES=str(out), QUILTRC="-")
    result = subprocess.run(
        ["quilt", "push", "-a", "--fuzz=0"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert _without(releases.file_hashes(tree), ".pc/") == applied


def test_export_applies_with_git_am(sample_release, exported, applied, tmp_path):
    out, names = exported
    tree = releases.copy_of(sample_release, tmp_path / "by-git-am")
    for command in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", f"vLLM {sample_release}"],
        ["git", "am", "-q", *[str(out / n) for n in names]],
    ):
        result = subprocess.run(
            command, cwd=tree, env=GIT_ENV, capture_output=True, text=True
        )
        assert result.returncode == 0, (command, result.stdout + result.stderr)
    assert _without(releases.file_hashes(tree), ".git/") == applied
    log = subprocess.run(
        ["git", "log", "-1", "--format=%an <%ae>%n%B"],
        cwd=tree,
        capture_output=True,
        text=True,
    ).stdout
    assert "Seed a851f495 maintainers" in log.splitlines()[0]
    assert "Signed-off-by: " in log and "Forwarded: " in log and "Origin: " in log


def test_export_of_every_series(tmp_path):
    out = tmp_path / "all"
    result = tool.run("export", str(out))
    assert result.returncode == 0, result.stderr
    lines = (out / "releases").read_text().splitlines()
    assert len(lines) == len(releases.all_releases())
    for line in lines:
        _, name = line.split()
        assert (out / name / "series").is_file()
    again = tool.run("export", str(out))
    assert again.returncode == 1 and "not empty" in again.stderr
