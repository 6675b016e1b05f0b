"""`make stage PR=indexer`: vllm::sparse_attn_indexer registered to return
nothing, as a pull request of its own, on an unreleased checkout (a commit
on top of the release that moves the op's module): one signed commit of
the module(s) that register or call the op and the in-tree test, the
tree's own checks, and the validation before and after (the new test; the
op eager and compiled, its kernels stood in); refusals.

Staging takes about 80 s (one tree's checks, two pytest runs, two compile
runs)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_stage import TREE_PYTHON, _clone, _git, _identity
from test_tool import _checkout_like

from support import releases, tool
from xpufakes.changes import indexerop, opfacts
from xpufakes.common import isolated
from xpufakes.staging import indexerpr

RELEASE = opfacts.DOC_RELEASE
MODULE = "vllm/model_executor/layers/sparse_attn_indexer.py"
TEST = "tests/kernels/test_sparse_attn_indexer_op.py"
SUBJECT = "[Bugfix] Register vllm::sparse_attn_indexer to return nothing"
# what the op's text looks like where a file registers or calls it (a plain
# search, not the edit's own test)
MARKS = ("torch.ops.vllm.sparse_attn_indexer(", 'op_name="sparse_attn_indexer"')

needs_tree_venv = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)


def _files_with_the_op(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in (root / "vllm").rglob("*.py")
        if any(mark in p.read_text() for mark in MARKS)
    }


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexer") / "vllm"
    _checkout_like(RELEASE, root)
    _identity(root)
    return root


def _unreleased(root: Path) -> None:
    """main moves on: a helper above the op's registration (the release's
    patch would not apply with -F0)."""
    module = root / MODULE
    text = module.read_text()
    anchor = "\n\ndirect_register_custom_op(\n"
    assert text.count(anchor) == 1
    helper = "\n\ndef _unreleased_helper() -> int:\n    return 1\n"
    module.write_text(text.replace(anchor, helper + anchor))
    subprocess.run(
        ["git", "commit", "-qam", "main moves on"], cwd=root, env=tool.git_env("t")
    )


@pytest.fixture(scope="module")
def staged(checkout, tmp_path_factory):
    if not TREE_PYTHON.exists():
        pytest.skip("no .venv-tree (make venv-tree sets it up)")
    root = _clone(checkout, tmp_path_factory.mktemp("unreleased") / "vllm")
    _unreleased(root)
    head = _git(root, "rev-parse", "HEAD")
    result = tool.run(
        "stage", str(root), "--python", str(TREE_PYTHON), "--pr", "indexer"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    branch = re.search(r"^branch (\S+):", result.stdout, re.M).group(1)
    assert _git(root, "rev-parse", "HEAD") == head  # the user's branch untouched
    return root, result, branch


def test_one_signed_bugfix_commit_of_the_op_and_its_test(staged, checkout):
    root, _, branch = staged
    assert branch.startswith(f"{indexerpr.BRANCH}-{RELEASE}-1-g")
    (commit,) = _git(root, "rev-list", f"HEAD..{branch}").split()
    message = _git(root, "log", "-1", "--format=%B", commit)
    assert message.startswith(SUBJECT + "\n")
    assert "Signed-off-by: Ada Stager <ada@example.invalid>" in message
    assert "Upstream status" not in message and "This variant" not in message
    files = set(_git(root, "show", "--name-only", "--format=", commit).split())
    assert files == _files_with_the_op(checkout) | {TEST}
    # staged from the checkout's own files: main's helper is kept
    staged_module = _git(root, "show", f"{commit}:{MODULE}")
    assert "def _unreleased_helper() -> int:" in staged_module
    assert "def sparse_attn_indexer_op(" in staged_module
    assert len(_git(root, "worktree", "list").splitlines()) == 1  # none left


def test_the_validation_fails_before_and_passes_after(staged):
    """The negative control is in the run itself: before the change the
    new test fails, and compiled calls give a copy, a warning and (strict)
    an error; after, the test passes and every compiled call returns the
    buffer with eager's values."""
    root, _, branch = staged
    message = _git(root, "log", "-1", "--format=%B", branch)
    plan = message.split("Test Plan:", 1)[1]
    assert "-> before: 1 failed" in plan and "-> after: 1 passed" in plan
    assert "-> Tensor" in plan  # the failing assertion shows what it returned
    before, after = plan.split("-> before: the schema returns", 1)[1].split(
        "-> after: the schema returns", 1
    )
    assert before.startswith(" Tensor")
    assert "aot_eager: a copy of the buffer, eager's values" in before
    assert "torch warns the output aliases an input" in before
    assert "inductor, strict: fails, RuntimeError" in before
    assert after.startswith(" nothing")
    after = after.split("pre-commit hooks", 1)[0]
    for run in indexerpr.RUNS:
        assert f"{run}: the buffer itself, eager's values\n" in after
    assert "warns" not in after and "fails" not in after
    assert "check-spdx-header" in plan and "mypy" in plan


def test_the_pr_text_is_the_template_filled_in(staged):
    _, result, _ = staged
    text = result.stdout
    for heading in ("## Overview", "## Claims", "## Validation"):
        assert heading in text
    assert f"{SUBJECT}." in text
    assert f"Staged on vLLM {RELEASE}-1-g" in text
    assert f"- New test `{TEST}`" in text and "before this change: 1 failed" in text
    assert f"- `{MODULE}`: +" in text


@needs_tree_venv
def test_the_compile_check_tells_the_unpatched_op_from_the_patched(tmp_path):
    """The check stage refuses a staged tree by (indexerpr._right), on the
    release as it is (wrong) and with the op's module edited (right)."""
    tree = tmp_path / "vllm"
    (tree / "vllm").parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["cp", "-r", str(releases.pristine(RELEASE) / "vllm"), str(tree / "vllm")],
        check=True,
    )
    site = indexerpr.Site(
        MODULE.removesuffix(".py").replace("/", "."),
        indexerop.implementation((tree / MODULE).read_text()),
    )
    found = {}
    for state in ("release", "edited"):
        if state == "edited":
            (tree / MODULE).write_text(indexerop.edit((tree / MODULE).read_text()))
        out = tmp_path / f"{state}.json"
        subprocess.run(
            [str(TREE_PYTHON), "-m", indexerpr.COMPILE, str(tree), site.module]
            + [site.impl, "--json-out", str(out)],
            env=dict(isolated.env(), CI="true"),
            capture_output=True,
            check=True,
        )
        found[state] = json.loads(out.read_text())
    assert not indexerpr._right(found["release"])
    assert found["release"]["aot_eager"]["buffer"] is False
    assert found["release"]["inductor, strict"]["error"].startswith("RuntimeError")
    assert indexerpr._right(found["edited"])


# -- refusals ----------------------------------------------------------------


@pytest.fixture
def clone(checkout, tmp_path):
    return _clone(checkout, tmp_path / "vllm")


def _refused(clone: Path) -> str:
    """Stage PR=indexer on the clone with its change committed: refused
    (exit 1, no branch); what it said."""
    subprocess.run(["git", "commit", "-qam", "moved"], cwd=clone, env=tool.git_env("t"))
    result = tool.run("stage", str(clone), "--pr", "indexer")
    assert result.returncode == 1, result.stdout[-2000:]
    assert indexerpr.BRANCH not in _git(clone, "branch")
    return result.stderr


def test_a_checkout_whose_op_returns_nothing_has_nothing_to_stage(clone):
    module = clone / MODULE
    module.write_text(indexerop.edit(module.read_text()))
    assert "to return nothing already; nothing to stage" in _refused(clone)


def test_a_checkout_without_the_op_has_nothing_to_stage(clone):
    for path in _files_with_the_op(clone):
        (clone / path).unlink()
    said = _refused(clone)
    assert "registers vllm::sparse_attn_indexer; nothing to stage" in said


def test_a_call_it_cannot_rewrite_is_refused_with_its_file(clone):
    module = clone / MODULE
    text = module.read_text()
    call = "return torch.ops.vllm.sparse_attn_indexer("
    assert call in text
    module.write_text(
        text.replace(call, "out = torch.ops.vllm.sparse_attn_indexer(", 1)
    )
    said = _refused(clone)
    assert MODULE in said and "not a return statement's value" in said


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--pr", "sampler"], "no pull request 'sampler'"),
        (["--pr", "indexer", "--full"], "FULL=1 is a cut of the xpu-fakes"),
    ],
)
def test_what_stage_cannot_cut_is_refused(clone, extra, said):
    result = tool.run("stage", str(clone), *extra)
    assert result.returncode == 1 and said in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_stand_in_replaces_only_the_innermost_body():
    """The compile check's stand-in swaps the code of the function under the
    decorators (the registered wrapper keeps its own), and writes the
    buffer it is given."""
    import functools

    import torch

    from xpufakes.proof import indexercompile

    def inner(hidden_states, buffer):
        raise RuntimeError("a kernel that cannot run here")

    @functools.wraps(inner)
    def outer(*args):
        return inner(*args)

    module = type(sys)("m")
    module.impl = outer
    indexercompile._replace_body(module, "impl", 1)
    hidden, buffer = (
        torch.tensor([[3.0, 1.0, 2.0]]),
        torch.zeros(1, 3, dtype=torch.int32),
    )
    assert module.impl(hidden, buffer) is buffer
    assert buffer.tolist() == [[1, 2, 0]]
