"""`make stage`: a branch with one commit per patch in a vLLM checkout,
authored and signed off by the checkout's git user; refusals."""

import os
import subprocess

import pytest
from test_tool import _checkout_like

from support import releases, tool
from xpufakes import pins, series

RELEASE = "0.10.2"  # the smallest tree: staging does not depend on the release


def _git(root, *args) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _work_tree(root) -> dict[str, str]:
    hashes = releases.file_hashes(root)
    return {k: v for k, v in hashes.items() if not k.startswith(".git/")}


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "vllm"
    _checkout_like(RELEASE, root)
    _git(root, "config", "user.name", "Ada Stager")
    _git(root, "config", "user.email", "ada@example.invalid")
    return root


def test_stage_makes_one_signed_commit_per_patch(checkout, tmp_path):
    head = _git(checkout, "rev-parse", "HEAD")
    before = _work_tree(checkout)
    result = tool.run("stage", str(checkout))
    assert result.returncode == 0, result.stderr
    branch = f"xpu-gemm-fakes-{RELEASE}"
    loaded = series.load(pins.load().get(RELEASE).series)
    commits = _git(checkout, "rev-list", f"{head}..{branch}").split()
    assert len(commits) == len(loaded.patches)
    for commit in commits:
        assert _git(checkout, "log", "-1", "--format=%an <%ae>", commit) == (
            "Ada Stager <ada@example.invalid>"
        )
        body = _git(checkout, "log", "-1", "--format=%B", commit)
        assert "Signed-off-by: Ada Stager <ada@example.invalid>" in body
    # the user's working tree and branch are untouched
    assert _work_tree(checkout) == before
    assert _git(checkout, "rev-parse", "HEAD") == head
    # the branch holds what make apply gives
    staged = tmp_path / "staged"
    subprocess.run(
        ["git", "clone", "-q", "--branch", branch, str(checkout), str(staged)],
        check=True,
    )
    applied = releases.copy_of(RELEASE, tmp_path / "applied")
    releases.apply(applied)
    for path in loaded.targets + loaded.overlay:
        assert (staged / path).read_bytes() == (applied / path).read_bytes(), path
    assert "## Purpose" in result.stdout and "## Test Plan" in result.stdout
    assert "https://github.com/intel/llm-scaler/issues/383" in result.stdout


def test_stage_refuses_a_dirty_checkout(checkout):
    (checkout / "vllm" / "envs.py").write_text("# changed\n")
    result = tool.run("stage", str(checkout))
    assert result.returncode == 1 and "uncommitted changes" in result.stderr
    assert "xpu-gemm-fakes" not in _git(checkout, "branch")


def test_stage_refuses_an_existing_branch(checkout):
    _git(checkout, "branch", f"xpu-gemm-fakes-{RELEASE}")
    result = tool.run("stage", str(checkout))
    assert result.returncode == 1 and "already exists" in result.stderr


def test_stage_refuses_what_is_not_a_checkout(tmp_path):
    tree = releases.copy_of(RELEASE, tmp_path / "sdist")
    result = tool.run("stage", str(tree))
    assert result.returncode == 1 and "not a git checkout" in result.stderr


def test_failed_stage_leaves_no_branch(checkout):
    env = {"VLLM_XPU_FAKES_FAULT": "fail-after:2"}
    result = tool.run("stage", str(checkout), env=dict(os.environ, **env))
    assert result.returncode != 0
    assert "xpu-gemm-fakes" not in _git(checkout, "branch")
    assert _git(checkout, "worktree", "list").count("\n") == 0
