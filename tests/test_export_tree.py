"""`make export VLLM=<tree> OUT=dir` for a packager whose tree carries a
downstream patch (support/downstream.py, shaped like llm-scaler's 0.14.0):
the pinned series does not apply to it with zero fuzz (the negative
control); the exported series does, with plain `patch -p1 -F0` and with
`git am`, and gives the tree `make apply` gives it (its recipe path, proven),
byte for byte, without the state file apply keeps -- none is exported."""

import shutil
import subprocess

import pytest

from support import downstream, releases, tool
from xpufakes.changes import live, series
from xpufakes.trees import pins

RELEASE = "0.14.0"


def _git(root, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        env=tool.git_env("packager"),
    )


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    """(the downstream tree, a git checkout of it, the exported series)."""
    work = tmp_path_factory.mktemp("export-tree")
    tree = releases.copy_of(RELEASE, work / "tree")
    downstream.change_next_to_the_woq_anchor(tree)
    downstream.add_woq_module(tree)
    checkout = work / "checkout"
    shutil.copytree(tree, checkout, symlinks=True)
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "-m", "downstream")):
        assert _git(checkout, *args).returncode == 0
    out = work / "series"
    result = tool.run("export", str(out), "--vllm", str(tree))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the proof's Python: " in result.stdout
    # 0001 (the fp8 fake), 0002 (the WOQ module), 0003 (the calls Dynamo
    # cannot trace), 0004 (vllm::sparse_attn_indexer): the IPEX era's four
    assert result.stdout.splitlines()[-1].startswith(f"exported 4 patch(es) to {out}")
    return tree, checkout, out


def test_the_pinned_series_does_not_apply_there(packaged, tmp_path):
    tree, _, _ = packaged
    pinned = series.load(pins.load().get(RELEASE).series).patches
    copy = shutil.copytree(tree, tmp_path / "pinned", symlinks=True)
    failed = []
    for patch in pinned:  # in order: 0003 edits what 0001 leaves
        done = subprocess.run(
            ["patch", "-p1", "-F0", "-s", "-N", "-r", "-", "-i", str(patch.path)],
            cwd=copy,
            capture_output=True,
            text=True,
        )
        failed += [patch.name] if done.returncode else []
    assert failed == ["0002-xpu-run-ipex-woq-linear-as-one-opaque-op.patch"]


def _applied_by_the_tool(tree, where):
    copy = shutil.copytree(tree, where, symlinks=True)
    result = tool.run("apply", str(copy))
    assert result.returncode == 0, result.stdout + result.stderr
    hashes = releases.file_hashes(copy)
    assert hashes.pop(live.STATE_FILE)
    return hashes


def test_the_exported_series_applies_with_patch_and_gives_apply_s_tree(
    packaged, tmp_path
):
    tree, _, out = packaged
    names = (out / "series").read_text().split()
    assert names == [
        "0001-xpu-register-fakes-for-ipex-gemms.patch",
        "0002-xpu-run-ipex-woq-linear-as-one-opaque-op.patch",
        "0003-xpu-run-untraceable-kernel-calls-as-custom-ops.patch",
        "0004-sparse-attn-indexer-register-the-op-to-return-nothing.patch",
    ]
    texts = [(out / name).read_text() for name in names]
    assert all(
        t.startswith("From 0000000000000000000000000000000000000000 ") for t in texts
    )
    assert not any(".xpufakes-state" in t for t in texts)
    assert f"b/{downstream.SYM_INT4}" in texts[1]  # the file the series misses
    copy = shutil.copytree(tree, tmp_path / "patched", symlinks=True)
    for name in names:
        done = subprocess.run(
            ["patch", "-p1", "-F0", "-N", "-i", str(out / name)],
            cwd=copy,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "offset" not in done.stdout and "fuzz" not in done.stdout
    assert not list(copy.rglob("*.orig")) and not list(copy.rglob("*.rej"))
    assert releases.file_hashes(copy) == _applied_by_the_tool(tree, tmp_path / "tool")


def test_the_exported_series_applies_with_git_am(packaged, tmp_path):
    tree, checkout, out = packaged
    names = (out / "series").read_text().split()
    done = _git(checkout, "am", "--keep-non-patch", *[str(out / n) for n in names])
    assert done.returncode == 0, done.stdout + done.stderr
    log = _git(checkout, "log", "--format=%s", "-4").stdout.splitlines()
    assert log == [
        "[Bugfix] Register vllm::sparse_attn_indexer to return nothing",
        "[XPU] Run the kernel calls torch.compile cannot trace as custom ops",
        "[XPU] Run IPEX's weight-only-quantized linear as one opaque op",
        "[XPU] Register fake kernels for the IPEX quantized GEMMs",
    ]
    hashes = releases.file_hashes(checkout)
    hashes = {k: v for k, v in hashes.items() if not k.startswith(".git/")}
    assert hashes == _applied_by_the_tool(tree, tmp_path / "tool")


def test_export_does_not_touch_the_tree(packaged, tmp_path):
    tree, _, _ = packaged
    before = releases.file_hashes(tree)
    result = tool.run("export", str(tmp_path / "again"), "--vllm", str(tree))
    assert result.returncode == 0, result.stderr
    assert releases.file_hashes(tree) == before
    assert not (tree / live.STATE_FILE).exists()
