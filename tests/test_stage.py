"""`make stage`: the upstream cut on a branch of a vLLM checkout -- the
newest release and an untagged, unreleased checkout derived from it --
checked with the tree's own pre-commit hooks, validated before/after, with
a vLLM-style commit and the tree's PR template; refusals.

The 0.33.0 sdist carries vLLM's .pre-commit-config.yaml, tools/pre_commit/
and .github/PULL_REQUEST_TEMPLATE.md, so the checkouts made from it have
them. Staging validates with .venv-tree (vLLM's dependencies); the in-tree
test runs on a few cases here (`--test-args -k ...`) to stay cheap."""

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from test_tool import _checkout_like

from support import releases, tool
from xpufakes import paths, treechecks

RELEASE = "0.33.0"  # the newest release
# vLLM's dependencies; XPUFAKES_TREE_PYTHON points at another .venv-tree
TREE_PYTHON = Path(
    os.environ.get("XPUFAKES_TREE_PYTHON")
    or paths.REPO / ".venv-tree" / "bin" / "python"
)
FEW_TESTS = "-k 'fp8_gemm_w8a16-2d or rejects'"
STAGED_PY = (
    "vllm/_xpu_gemm_fakes.py",
    "vllm/_xpu_ops.py",
    "tests/kernels/quantization/test_xpu_gemm_fakes.py",
    "tests/kernels/quantization/xpu_gemm_reference.py",
)
needs_tree_venv = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)


def _git(root, *args) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _identity(root) -> None:
    _git(root, "config", "user.name", "Ada Stager")
    _git(root, "config", "user.email", "ada@example.invalid")


def _unreleased(root) -> None:
    """A commit on top of the release: vLLM's _xpu_ops.py changed around the
    lines the recipe edits (the release's patch would not apply with -F0)."""
    ops = root / "vllm" / "_xpu_ops.py"
    text = ops.read_text()
    anchor = "logger = init_logger(__name__)\n"
    assert anchor in text
    helper = "\n\ndef _unreleased_helper() -> int:\n    return 1\n\n"
    ops.write_text(text.replace(anchor, anchor + helper, 1))
    env = tool.git_env("t")
    subprocess.run(["git", "commit", "-qam", "main moves on"], cwd=root, env=env)


def _stage(root, *extra: str) -> subprocess.CompletedProcess:
    return tool.run(
        "stage",
        str(root),
        "--python",
        str(TREE_PYTHON),
        "--test-args",
        FEW_TESTS,
        *extra,
    )


@pytest.fixture(scope="module")
def release_checkout(tmp_path_factory):
    """A checkout at the release tag, made once; tests work on clones."""
    root = tmp_path_factory.mktemp("base") / "vllm"
    _checkout_like(RELEASE, root)
    return root


def _clone(base, root):
    _git(base.parent, "clone", "-q", str(base), str(root))
    _identity(root)
    return root


@pytest.fixture(scope="module", params=["unreleased", "release"])
def staged(request, tmp_path_factory, release_checkout):
    """(checkout, stage result, branch, clone of the branch). The release
    itself is staged with --all-releases only: its cut is the unreleased
    checkout's (same era, same pins), and each staging takes a minute."""
    if not TREE_PYTHON.exists():
        pytest.skip("no .venv-tree (make venv-tree sets it up)")
    if request.param == "release" and not request.config.getoption("--all-releases"):
        pytest.skip("the tagged release is staged with --all-releases")
    work = tmp_path_factory.mktemp(request.param)
    root = _clone(release_checkout, work / "vllm")
    if request.param == "unreleased":
        _unreleased(root)
    _identity(root)
    head = _git(root, "rev-parse", "HEAD")
    result = _stage(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    branch = re.search(r"^branch (\S+):", result.stdout, re.M).group(1)
    assert _git(root, "rev-parse", "HEAD") == head  # the user's branch is untouched
    clone = work / "clone"
    _git(work, "clone", "-q", "--branch", branch, str(root), str(clone))
    _identity(clone)
    return root, result, branch, clone


def test_stage_makes_one_signed_vllm_style_commit(staged):
    root, _, branch, _ = staged
    commits = _git(root, "rev-list", f"HEAD..{branch}").split()
    assert len(commits) == 1
    author = _git(root, "log", "-1", "--format=%an <%ae>", branch)
    assert author == "Ada Stager <ada@example.invalid>"
    message = _git(root, "log", "-1", "--format=%B", branch)
    assert message.startswith("[XPU] Use exact fake kernels")
    assert message.rstrip().endswith("Signed-off-by: Ada Stager <ada@example.invalid>")
    for vendor_text in (
        "Upstream status",
        "This variant applies",
        "Bug:",
        "llm-scaler",
    ):
        assert vendor_text not in message
    # the seven _xpu_C GEMMs and vllm::xpu_fp8_bmm, which returns fp8_bmm's output
    assert "Test Plan:" in message and "0 of 8 ops conform" in message


def test_the_unreleased_checkout_is_staged_from_its_own_files(staged):
    root, _, branch, clone = staged
    if "unreleased" not in str(root):
        pytest.skip("the release")
    assert re.fullmatch(rf"xpu-gemm-fakes-{RELEASE}-1-g[0-9a-f]+", branch)
    ops = (clone / "vllm" / "_xpu_ops.py").read_text()
    assert "def _unreleased_helper" in ops and "register_xpu_gemm_fakes()" in ops
    assert "if hasattr(torch.ops._xpu_C" not in ops


def test_the_upstream_cut_has_only_what_the_tree_uses(staged):
    _, _, _, clone = staged
    text = {p: (clone / p).read_text() for p in STAGED_PY}
    everything = "\n".join(text.values())
    for absent in (
        "torch_ipex",  # the IPEX fakes, reference kernels and cases
        "ipex_",
        "IPEX",
        "_kernel_has",  # vllm-xpu-kernels version gating (the tree pins one)
        "importlib.metadata",
        'getattr(torch, "float',  # torch < 2.8 shims (the tree pins 2.14)
        "# xpufakes:",
        "logging.getLogger",
    ):
        assert absent not in everything, absent
    assert not re.search(r"^import re$", everything, re.M)
    fakes = text["vllm/_xpu_gemm_fakes.py"]
    assert "from vllm.logger import init_logger" in fakes
    diffstat = _git(clone, "diff", "--shortstat", "HEAD~1", "HEAD")
    added = int(re.search(r"(\d+) insertion", diffstat).group(1))
    assert added < 1600, diffstat  # the packager's series adds over 2,000


def test_the_pr_text_is_the_tree_template_filled_in(staged):
    root, result, _, _ = staged
    template = (root / ".github" / "PULL_REQUEST_TEMPLATE.md").read_text()
    text = result.stdout[result.stdout.index("<!-- markdownlint-disable -->") :]
    headings = re.findall(r"^## (.+)$", template, re.M)
    assert headings == ["Overview", "Claims", "Validation", "Details"]
    assert re.findall(r"^## (.+)$", text, re.M) == headings
    # the template's instructions are replaced, its checklist kept
    assert "<!-- Summarize" not in text and "<!--" not in text.split("\n", 1)[1]
    assert "Pull Request Checklist" in text
    for placeholder in ("(paste", "TODO", "TBD", "XXX"):
        assert placeholder not in text
    validation = text[text.index("## Validation") : text.index("## Details")]
    assert "0 of 8 ops conform" in validation  # before
    assert "MetadataMismatchError" in validation  # with the message
    assert "vllm::xpu_fp8_bmm: test_faketensor" in validation
    assert "8 of 8 ops conform" in validation  # after
    assert re.search(r"-> \d+ passed", validation)
    assert "check-forbidden-imports" in validation and "mypy" in validation


def test_the_tree_checks_pass_on_the_staged_branch(staged):
    _, result, _, clone = staged
    assert "check-forbidden-imports: passed" in result.stdout
    assert "ruff-check: passed" in result.stdout and "mypy: passed" in result.stdout
    results = treechecks.run(clone, list(STAGED_PY))
    assert [r.hook for r in results if r.status == treechecks.FAILED] == []
    ran = {r.hook for r in results if r.status == treechecks.PASSED}
    assert {"ruff-check", "ruff-format", "check-spdx-header", "mypy"} <= ran


def test_the_tree_checks_catch_import_re(staged):
    """Negative control: `import re` back in the staged test."""
    _, _, _, clone = staged
    test = clone / "tests/kernels/quantization/test_xpu_gemm_fakes.py"
    original = test.read_text()
    try:
        test.write_text(original.replace("import regex as re\n", "import re\n"))
        _git(clone, "add", "-A")
        results = treechecks.run(clone, [str(test.relative_to(clone))])
    finally:
        test.write_text(original)
        _git(clone, "add", "-A")
    failed = {r.hook: r.output for r in results if r.status == treechecks.FAILED}
    assert "check-forbidden-imports" in failed, failed
    assert "import regex as re" in failed["check-forbidden-imports"]


LEFTOVERS = textwrap.dedent(
    """
    import json, sys, torch
    NAMES = {"_xpu_C": ["fp8_gemm", "fp8_gemm_w8a16", "int4_gemm_w4a16"],
             "torch_ipex": ["fp8_gemm_w8a16"]}
    import tests.kernels.quantization.test_xpu_gemm_fakes  # noqa
    print(json.dumps([f"{ns}::{n}" for ns, names in NAMES.items() for n in names
                      if hasattr(getattr(torch.ops, ns), n)]))
    """
)


def test_importing_the_staged_test_off_xpu_defines_no_op(staged):
    _, _, _, clone = staged
    env = {k: v for k, v in os.environ.items() if k != "VLLM_XPU_FAKES_CPU_REFERENCE"}
    env.update(PYTHONPATH=str(clone), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [str(TREE_PYTHON), "-c", LEFTOVERS],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


# ---------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------


@pytest.fixture
def checkout(tmp_path, release_checkout):
    return _clone(release_checkout, tmp_path / "vllm")


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


def test_stage_names_the_file_and_anchor_it_misses(checkout):
    """The wrapper recipe's anchor: vllm::xpu_fp8_bmm returning the kernel's
    output unchanged. A tree where it no longer does is refused by name."""
    ops = checkout / "vllm" / "_xpu_ops.py"
    text = ops.read_text()
    assert "    return torch.ops._xpu_C.fp8_bmm(" in text
    ops.write_text(
        text.replace(
            "    return torch.ops._xpu_C.fp8_bmm(",
            "    return 2 * torch.ops._xpu_C.fp8_bmm(",
            1,
        )
    )
    _git(checkout, "commit", "-qam", "xpu_fp8_bmm scales its output")
    result = tool.run("stage", str(checkout))
    assert result.returncode == 1
    assert result.stderr == (
        "error: vllm/_xpu_ops.py: _xpu_fp8_bmm_impl no longer returns "
        "torch.ops._xpu_C.fp8_bmm(...) unchanged; _xpu_fp8_bmm_fake needs a new "
        "look (anchor of 0001-xpu-use-exact-fakes-for-xpu-c-gemms.patch)\n"
    ), result.stderr
    assert "xpu-gemm-fakes" not in _git(checkout, "branch")


def test_stage_refuses_a_tree_without_xpu_gemm_fakes(checkout):
    ops = checkout / "vllm" / "_xpu_ops.py"
    ops.write_text(ops.read_text().replace("torch.ops._xpu_C", "torch.ops._other"))
    _git(checkout, "commit", "-qam", "no _xpu_C GEMM fakes")
    result = tool.run("stage", str(checkout))
    assert result.returncode == 1 and "nothing to stage" in result.stderr
    assert result.stderr.count("\n") == 1


def test_failed_stage_leaves_no_branch(checkout):
    env = {"VLLM_XPU_FAKES_FAULT": "fail-after:2"}
    result = tool.run("stage", str(checkout), env=dict(os.environ, **env))
    assert result.returncode != 0
    assert "xpu-gemm-fakes" not in _git(checkout, "branch")
    assert _git(checkout, "worktree", "list").count("\n") == 0


@needs_tree_venv
def test_failing_tree_checks_fail_the_verb(checkout):
    """A tree whose own hook rejects the staged files (here: a forbidden
    import rule that bans `torch.library`) is refused, with no branch."""
    rules = checkout / "tools" / "pre_commit" / "check_forbidden_imports.py"
    text = rules.read_text()
    assert "CHECK_IMPORTS = {" in text
    rule = (
        'CHECK_IMPORTS = {\n    "torch_library_test": ForbiddenImport(\n'
        '        pattern=r"^\\s*import\\s+torch$", tip="test rule"),\n'
    )
    rules.write_text(text.replace("CHECK_IMPORTS = {\n", rule, 1))
    _git(checkout, "commit", "-qam", "a stricter rule")
    result = _stage(checkout)
    assert result.returncode == 1
    assert "the tree's own checks fail on the staged files: " in result.stderr
    assert "check-forbidden-imports" in result.stderr.splitlines()[-1]
    assert "xpu-gemm-fakes" not in _git(checkout, "branch")
    assert Path(checkout).is_dir()
