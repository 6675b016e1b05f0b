"""`make export`: the plain series applies with `patch -p1 -F0`, with
`quilt push -a` and with `git am`, each giving the tree `make apply` gives."""

import os
import re
import shutil
import subprocess

import pytest

from support import releases, small_tree, tool
from xpufakes.changes import export, series
from xpufakes.common import paths
from xpufakes.trees import pins

GIT_ENV = tool.git_env("packager")
PACKAGER = "Pat Packager <pat@example.invalid>"


def _without(hashes: dict, *prefixes: str) -> dict:
    return {k: v for k, v in hashes.items() if not k.startswith(prefixes)}


@pytest.fixture
def exported(sample_release, tmp_path):
    out = tmp_path / "export"
    result = tool.run(
        "export", str(out), "--pin", sample_release, env={"AUTHOR": PACKAGER}
    )
    assert result.returncode == 0, result.stderr
    names = (out / "series").read_text().split()
    assert names and all((out / n).is_file() for n in names)
    # the same file names as the series (and `make status`)
    listed = series.load(pins.load().get(sample_release).series)
    assert names == [patch.name for patch in listed.patches]
    return out, names


@pytest.fixture
def applied(sample_release, tmp_path):
    tree = releases.copy_of(sample_release, tmp_path / "by-make-apply")
    releases.apply(tree)
    return releases.file_hashes(tree)


def _run(command, tree) -> str:
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    assert result.returncode == 0, (command, result.stdout + result.stderr)
    return result.stdout + result.stderr


def test_export_has_the_release_own_line_numbers(release, tmp_path):
    """`make export PIN=<release>` is for that release: each patch applies to
    its pristine files with plain `patch -p1 -F0` (as docs/packagers.md says) with
    no offset and no fuzz, and leaves no .orig file; `git apply --check`
    passes; the result is `make apply`'s, byte for byte. (A series serves
    several releases; before issue 16 its hunks had its first release's line
    numbers, and 0.33.0 took an offset of 40 lines and a .orig.)"""
    out = tmp_path / "export"
    result = tool.run("export", str(out), "--pin", release)
    assert result.returncode == 0, result.stderr
    names = (out / "series").read_text().split()
    tree = small_tree.make(release, tmp_path / "by-patch")
    for name in names:
        patch = str(out / name)
        _run(["git", "apply", "--check", "-v", patch], tree)
        for dry_run in (["--dry-run"], []):
            said = _run(["patch", "-p1", "-F0", *dry_run, "-i", patch], tree)
            lines = [line for line in said.splitlines() if line]
            assert all(
                line.startswith(("patching file ", "checking file ")) for line in lines
            ), said  # no "Hunk #n succeeded at ... (offset ...)", no fuzz
    assert not list(tree.rglob("*.orig")) and not list(tree.rglob("*.rej"))
    reference = small_tree.make(release, tmp_path / "by-make-apply")
    releases.apply(reference)
    assert releases.file_hashes(tree) == releases.file_hashes(reference)


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
        ["git", "am", "-q", "--keep-non-patch", *[str(out / n) for n in names]],
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
    assert log.splitlines()[0] == PACKAGER
    # --keep-non-patch keeps the subject's [tag] ([XPU], the indexer's [Bugfix])
    assert re.match(r"\[(XPU|Bugfix)\] ", log.splitlines()[1]), log
    assert f"Signed-off-by: {PACKAGER}" in log
    assert "Forwarded: " in log and "Origin: " in log


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


def _git(tree, *args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["git", *args], cwd=tree, env=GIT_ENV, capture_output=True, text=True
    )
    assert not check or result.returncode == 0, (args, result.stderr)
    return result


MOVED = "from vllm.platforms import current_platform\n"


def test_git_am_3way_applies_where_context_moved(tmp_path):
    """The index lines name the release's blobs: on a tree whose context
    around a hunk changed since the release, plain `git am` fails and
    `git am -3` merges."""
    out = tmp_path / "export"
    assert tool.run("export", str(out), "--pin", "0.33.0").returncode == 0
    names = (out / "series").read_text().split()
    text = (out / names[0]).read_text()
    pristine = (releases.pristine("0.33.0") / "vllm" / "_xpu_ops.py").read_bytes()
    assert f"index {export.blob_id(pristine)}.." in text
    tree = releases.copy_of("0.33.0", tmp_path / "tree")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "vLLM 0.33.0")
    ops = tree / "vllm" / "_xpu_ops.py"
    assert MOVED in ops.read_text()
    ops.write_text(ops.read_text().replace(MOVED, MOVED[:-1] + "  # moved\n"))
    _git(tree, "commit", "-q", "-am", "downstream change next to the hunk")
    patches = [str(out / n) for n in names]
    plain = _git(tree, "am", "-q", *patches, check=False)
    assert plain.returncode != 0  # the context does not match
    _git(tree, "am", "--abort")
    _git(tree, "am", "-q", "-3", "--keep-non-patch", *patches)
    merged = ops.read_text()
    assert "current_platform  # moved" in merged
    assert "register_xpu_gemm_fakes()" in merged
    assert (tree / "vllm" / "_xpu_gemm_fakes.py").is_file()


def test_export_identity_falls_back_to_git_config_then_project(tmp_path):
    local = subprocess.run(
        ["git", "-C", str(paths.REPO), "config", "--local", "user.name"],
        capture_output=True,
    )
    if local.returncode == 0:
        pytest.skip("this clone has its own git identity")
    env = {
        "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "AUTHOR": "",
    }
    (tmp_path / "gitconfig").write_text(
        "[user]\n\tname = Gil Config\n\temail = gil@example.invalid\n"
    )
    out = tmp_path / "by-config"
    assert tool.run("export", str(out), "--pin", "0.33.0", env=env).returncode == 0
    patch = next(out.glob("0001-*.patch")).read_text()
    assert "From: Gil Config <gil@example.invalid>" in patch
    assert "Signed-off-by: Gil Config <gil@example.invalid>" in patch
    (tmp_path / "gitconfig").write_text("")
    out = tmp_path / "by-project"
    assert tool.run("export", str(out), "--pin", "0.33.0", env=env).returncode == 0
    patch = next(out.glob("0001-*.patch")).read_text()
    assert "From: Seed a851f495 maintainers" in patch
    bad = tool.run("export", str(tmp_path / "x"), env=dict(env, AUTHOR="nobody"))
    assert bad.returncode == 1
    assert (
        bad.stderr.startswith("error: AUTHOR must be") and bad.stderr.count("\n") == 1
    )
