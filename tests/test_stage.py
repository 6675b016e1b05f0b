"""`make stage`: the fix on a branch of a vLLM checkout -- the newest release
and an untagged, unreleased checkout derived from it -- checked with the
tree's own pre-commit hooks, validated before/after, with vLLM-style commits
and the tree's PR template; refusals; a signal midway.

Two cuts: by default the fix in place (the fakes of vllm/_xpu_ops.py
corrected where they stand, a small XPU-only test; its size is counted
here), and the full cut (--full: the fake module, the in-tree test with its
CPU reference kernels). Both are staged on the unreleased checkout; the
tagged release too with --all-releases (its cuts are the unreleased
checkout's: same era, same pins).

The 0.33.0 sdist carries vLLM's .pre-commit-config.yaml, tools/pre_commit/
and .github/PULL_REQUEST_TEMPLATE.md, so the checkouts made from it have
them. Staging validates with .venv-tree (vLLM's dependencies); the full
cut's in-tree test runs on a few cases here (`--test-args -k ...`)."""

import ast
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_tool import _checkout_like

from support import releases, tool
from xpufakes.changes import opfacts, recipes
from xpufakes.common import isolated, ops, paths
from xpufakes.common.errors import Refusal
from xpufakes.staging import inplace, treechecks
from xpufakes.trees import pins

# the release staged (the docs' figures of the in-place cut are of it)
RELEASE = opfacts.DOC_RELEASE
# its vllm-xpu-kernels pin ("vllm-xpu-kernels 0.1.15.4"), and the GEMMs of the
# op registry (data/fakes.toml) that it has
KERNELS = pins.load().get(RELEASE).kernels
RELEASE_GEMMS = [
    op["name"]
    for op in ops.FAKES
    if op["era"] == pins.KERNELS
    and pins.version_tuple(op["since"]) <= pins.version_tuple(KERNELS.split()[-1])
]
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


def _stage(root, *extra: str, **kwargs) -> subprocess.CompletedProcess:
    return tool.run(
        "stage",
        str(root),
        "--python",
        str(TREE_PYTHON),
        "--test-args",
        FEW_TESTS,
        *extra,
        **kwargs,
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


def _staged(tmp_path_factory, release_checkout, kind: str, *extra: str):
    """(checkout, stage result, branch, clone of the branch)."""
    if not TREE_PYTHON.exists():
        pytest.skip("no .venv-tree (make venv-tree sets it up)")
    work = tmp_path_factory.mktemp(kind)
    root = _clone(release_checkout, work / "vllm")
    if kind == "unreleased":
        _unreleased(root)
    _identity(root)
    head = _git(root, "rev-parse", "HEAD")
    result = _stage(root, *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    branch = re.search(r"^branch (\S+):", result.stdout, re.M).group(1)
    assert _git(root, "rev-parse", "HEAD") == head  # the user's branch is untouched
    clone = work / "clone"
    _git(work, "clone", "-q", "--branch", branch, str(root), str(clone))
    _identity(clone)
    return root, result, branch, clone


@pytest.fixture(scope="module", params=["unreleased", "release"])
def staged(request, tmp_path_factory, release_checkout):
    """The full cut (--full). The release itself is staged so with
    --all-releases only: its cut is the unreleased checkout's (same era,
    same pins), and each staging takes a minute."""
    if request.param == "release" and not request.config.getoption("--all-releases"):
        pytest.skip("the tagged release is staged with --all-releases")
    return _staged(tmp_path_factory, release_checkout, request.param, "--full")


@pytest.fixture(scope="module", params=["unreleased", "release"])
def in_place(request, tmp_path_factory, release_checkout):
    """The default cut, the fix in place. The release itself is staged so
    with --all-releases only, as the full cut: its cut is the unreleased
    checkout's (same era, same pins; the checkout moved on around the lines
    the recipe edits), and each staging takes a minute or two of CI."""
    if request.param == "release" and not request.config.getoption("--all-releases"):
        pytest.skip("the tagged release is staged with --all-releases")
    return _staged(tmp_path_factory, release_checkout, request.param)


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
    # the registry's _xpu_C GEMMs the release's kernels have, and vLLM's own
    # ops that return one's output (vllm::xpu_fp8_bmm: fp8_bmm's)
    every = len(RELEASE_GEMMS) + len(ops.WRAPPERS)
    assert "Test Plan:" in message and f"0 of {every} ops conform" in message


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
    every = len(RELEASE_GEMMS) + len(ops.WRAPPERS)
    assert f"0 of {every} ops conform" in validation  # before
    assert "MetadataMismatchError" in validation  # with the message
    assert "vllm::xpu_fp8_bmm: test_faketensor" in validation
    assert f"{every} of {every} ops conform" in validation  # after
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
# The default cut: the fix in place
# ---------------------------------------------------------------------------

AIM = opfacts.INPLACE_AIM  # changed lines in all (issue 19), tests included
XPU_OPS = "vllm/_xpu_ops.py"
QUANTIZATION_CI = ".buildkite/intel_jobs/quantization_intel.yaml"
IN_PLACE_FILES = {XPU_OPS, recipes.TREE_TEST, QUANTIZATION_CI}
# The release's fake blocks and vLLM's own op that returns fp8_bmm's output:
# facts of the release's vllm/_xpu_ops.py, not of the registry (an op added
# to the registry is not in a released tree)
GEMMS = ("fp8_gemm", "fp8_gemm_w8a16", "fp4_gemm", "int4_gemm_w4a8", "int4_gemm_w4a16")
OPS = {f"_xpu_C::{g}" for g in GEMMS} | {"vllm::xpu_fp8_bmm"}


def _numstat(root, *revisions) -> dict[str, int]:
    """path -> lines added + removed."""
    out = _git(root, "diff", "--numstat", *revisions)
    return {
        name: int(added) + int(removed)
        for added, removed, name in (line.split("\t") for line in out.splitlines())
    }


def test_in_place_cut_is_two_signed_commits(in_place):
    root, _, branch, _ = in_place
    commits = _git(root, "log", "--format=%s", f"HEAD..{branch}").splitlines()
    assert commits == [inplace.WRAPPER_SUBJECT, inplace.SUBJECT]
    for commit in (branch, f"{branch}~1"):
        author = _git(root, "log", "-1", "--format=%an <%ae>", commit)
        assert author == "Ada Stager <ada@example.invalid>"
        message = _git(root, "log", "-1", "--format=%B", commit)
        assert message.rstrip().endswith(f"Signed-off-by: {author}")
        conform = f"{len(OPS)} of {len(OPS)} ops conform"
        assert "Test Plan:" in message and conform in message
        for vendor_text in ("Upstream status", "This variant applies", "llm-scaler"):
            assert vendor_text not in message
    # the wrapper's commit: its fake and its test cases, nothing else
    assert set(_numstat(root, f"{branch}~1", branch)) == {XPU_OPS, recipes.TREE_TEST}
    wrapper = _git(root, "diff", f"{branch}~1", branch, "--", XPU_OPS)
    assert "_xpu_fp8_bmm_fake" in wrapper and "if hasattr" not in wrapper


def test_in_place_cut_is_within_the_aim(in_place):
    """The size a reviewer reads, counted: under the aim, in three files, no
    new module, no reference kernels."""
    root, _, branch, _ = in_place
    stat = _numstat(root, "HEAD", branch)
    assert set(stat) == IN_PLACE_FILES, stat
    assert sum(stat.values()) <= AIM, stat
    diff = _git(root, "diff", "HEAD", branch)
    for absent in ("vllm._xpu_gemm_fakes", "xpu_gemm_reference", "define_xpu_c_"):
        assert absent not in diff, absent


def _signature(function: ast.FunctionDef) -> str:
    return ast.dump(function.args) + ast.dump(function.returns)


def _fakes(text: str) -> list[tuple[str, ast.FunctionDef]]:
    """(op, its fake) of each `if hasattr(torch.ops._xpu_C, op)` block, in
    order, and vLLM's own xpu_fp8_bmm fake."""
    body = ast.parse(text).body
    found = [
        (recipes.xpu_c_gemm_guard(n), next(f for f in n.body if hasattr(f, "args")))
        for n in body
        if recipes.xpu_c_gemm_guard(n)
    ]
    return found + [
        ("xpu_fp8_bmm", n)
        for n in body
        if getattr(n, "name", "") == "_xpu_fp8_bmm_fake"
    ]


def test_the_fakes_are_corrected_where_they_stand(in_place):
    """Each fake keeps its block, name and signature; its body is a few
    lines calling one shared output rule, defined once before the blocks."""
    root, _, _, clone = in_place
    before = _fakes((root / XPU_OPS).read_text())
    text = (clone / XPU_OPS).read_text()
    after = _fakes(text)
    assert (
        [op for op, _ in before] == [op for op, _ in after] == [*GEMMS, "xpu_fp8_bmm"]
    )
    for (_, old), (op, new) in zip(before, after, strict=True):
        assert (new.name, _signature(new)) == (old.name, _signature(old)), op
        assert new.end_lineno - new.body[0].lineno < 5, op  # a few lines
        assert "_onednn_output(" in ast.unparse(new), op
    helpers = [
        n for n in ast.parse(text).body if getattr(n, "name", "").startswith("_")
    ]
    first_block = min(f.lineno for _, f in after[:-1])
    rule = next(n for n in helpers if n.name == "_onednn_output")
    assert rule.lineno < first_block
    assert [n.name for n in helpers].count("_onednn_output") == 1
    assert "import regex" not in text and "_kernel_has" not in text  # pinned release


def test_the_tree_checks_pass_on_the_in_place_branch(in_place):
    _, result, _, clone = in_place
    assert "ruff-check: passed" in result.stdout and "mypy: passed" in result.stdout
    results = treechecks.run(clone, sorted(IN_PLACE_FILES))
    assert [r.hook for r in results if r.status == treechecks.FAILED] == []
    ran = {r.hook for r in results if r.status == treechecks.PASSED}
    assert {"ruff-check", "ruff-format", "mypy", "check-test-tethering"} <= ran


def _grid(tree: Path) -> dict[str, dict]:
    done, ops = isolated.run_verb(
        ["verify-xpu", "--vllm", str(tree), "--standins", KERNELS] + ["--quick"],
        "--json-out",
    )
    assert ops is not None, done.stderr[-2000:]
    return {op["op"]: op for op in ops}


def test_the_in_place_fakes_pass_the_grid_and_the_unpatched_ones_fail(in_place):
    """Validation, independently of stage's own run: the staged tree's fakes
    conform on the opcheck grid against the CPU reference kernels; the
    checkout's own (unpatched) fakes fail it (negative control)."""
    root, _, _, clone = in_place
    if "unreleased" not in str(root):
        pytest.skip("stage's own run shows the release's (test_the_in_place_pr_text)")
    after, before = _grid(clone), _grid(root)
    assert {op for op, r in after.items() if r["ok"]} >= OPS
    for op in OPS:
        assert not before[op]["ok"], op
        assert any("test_faketensor" in m for m in before[op]["failures"].values()), op


def test_the_in_place_pr_text_says_what_was_validated(in_place):
    root, result, _, _ = in_place
    text = result.stdout[result.stdout.index("<!-- markdownlint-disable -->") :]
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Overview", "Claims", "Validation", "Details"]
    validation = text[text.index("## Validation") : text.index("## Details")]
    assert f"0 of {len(OPS)} ops conform" in validation
    assert f"{len(OPS)} of {len(OPS)} ops conform" in validation
    before, after = re.findall(r"-> (\d+) of (\d+) cases pass", validation)
    assert int(before[0]) < int(before[1]) and after[0] == after[1]
    assert "test_faketensor: MetadataMismatchError" in validation  # the messages
    # the registry's GEMMs of the release that the tree does not call itself
    left_alone = re.search(
        r"Not in this change: (.*?): left", " ".join(validation.split())
    )
    assert left_alone, validation
    assert sorted(left_alone.group(1).split(", ")) == sorted(set(RELEASE_GEMMS) - OPS)
    assert "CPU reference kernels" in validation  # how it was validated
    lines = re.search(r"^Lines: \+(\d+) -(\d+)$", text, re.M)
    assert int(lines.group(1)) + int(lines.group(2)) <= AIM


def test_the_in_place_test_skips_off_xpu_and_defines_no_op(in_place):
    root, _, _, clone = in_place
    if "unreleased" not in str(root):
        pytest.skip("the release's test is the same file")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_XPU_FAKES_CPU_REFERENCE"}
    env.update(PYTHONPATH=str(clone), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [str(TREE_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["--noconftest", recipes.TREE_TEST],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert re.search(r"\b60 skipped\b", done.stdout), done.stdout[-500:]


@pytest.mark.parametrize(
    ("variable", "option"), [("FULL=1", " --full"), ("PR=indexer", ' --pr "indexer"')]
)
def test_make_stage_passes_its_options(variable, option):
    done = subprocess.run(
        ["make", "-n", "-C", str(paths.REPO), "stage", "VLLM=/x", variable],
        capture_output=True,
        text=True,
    )
    assert option in done.stdout, done.stdout
    default = subprocess.run(
        ["make", "-n", "-C", str(paths.REPO), "stage", "VLLM=/x"],
        capture_output=True,
        text=True,
    )
    assert option.split()[0] not in default.stdout


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


@needs_tree_venv
def test_lint_debt_says_whose_each_finding_is(checkout):
    """Issue 16 part 4: the tree's ruff fails on a file the change touches;
    each finding says whether the change brings it or the tree had it. Here
    the tree has an unused import in vllm/_xpu_ops.py, and its ruff selects
    N803 (argument names in lower case), which the shared helper's `A`, `B`
    break."""
    ops = checkout / XPU_OPS
    ops.write_text(
        ops.read_text().replace("import torch\n", "import torch\nimport copy\n", 1)
    )
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    assert text.count("\nselect = [\n") == 1
    pyproject.write_text(text.replace("\nselect = [\n", '\nselect = [\n    "N803",\n'))
    _git(checkout, "commit", "-qam", "lint debt")
    result = _stage(checkout)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "error: the tree's own checks fail on the staged files: ruff-check"
    ), result.stderr
    findings = re.findall(r"^(\S+):\d+:\d+: (\w+) (.*) \((.*)\)$", result.stdout, re.M)
    whose: dict[tuple, set[str]] = {}
    for path, code, message, who in findings:
        whose.setdefault((path, code, message), set()).add(who)
    assert whose[(XPU_OPS, "F401", "`copy` imported but unused")] == {treechecks.OLD}
    # the shared helper's `A`, and the tree's own `A` further down the file
    ours = (XPU_OPS, "N803", "Argument name `A` should be lowercase")
    assert whose[ours] == {treechecks.ADDED, treechecks.OLD}, findings
    assert "xpu-gemm-fakes" not in _git(checkout, "branch")


def test_classify_tells_added_old_and_caused_findings():
    def finding(row, code="F401", text="import x"):
        return {
            "path": "a.py",
            "code": code,
            "message": "m",
            "text": text,
            "location": {"row": row, "column": 1},
        }

    after = [finding(3), finding(9, "E501", "y = 1"), finding(12, text="import z")]
    before = [finding(5)]  # the same finding, moved down by the change
    found = treechecks.classify(after, before, {"a.py": {9, 10}})
    assert [whose for _, whose in found] == [
        treechecks.OLD,
        treechecks.ADDED,
        treechecks.CAUSED,  # a line the change kept, a finding it brought
    ]
    # a line the change only marked for the linter (b6's `import vllm._C.ops`
    # after its try, E402 before and after): the tree's finding still; the
    # control, the statement itself changed, is the change's
    marked = finding(25, "E402", "import vllm._C.ops  # noqa: F401")
    old = [finding(17, "E402", "import vllm._C.ops")]
    assert treechecks.classify([marked], old, {})[0][1] == treechecks.OLD
    other = finding(25, "E402", "import vllm._C.ops as ops  # noqa: F401")
    assert treechecks.classify([other], old, {})[0][1] == treechecks.CAUSED


# ---------------------------------------------------------------------------
# A signal midway (issue 16 part 6)
# ---------------------------------------------------------------------------

# The last commit whose stage neither held signals nor added its worktrees
# inside the clean-up (the negative control runs its code).
UNHELD_COMMIT = "413d9e8"


def _terminate_midway(checkout: Path, scripts: Path, tmp: Path):
    """Start stage, SIGTERM it once its two worktrees exist; (status,
    stderr). Its temporary files go to `tmp`."""
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(scripts), TMPDIR=str(tmp))
    child = subprocess.Popen(
        [sys.executable, "-m", "xpufakes", "stage", str(checkout)]
        + ["--python", str(TREE_PYTHON)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def worktrees() -> int:  # git may fail on one it is still making
        listed = subprocess.run(
            ["git", "-C", str(checkout), "worktree", "list"],
            capture_output=True,
            text=True,
        )
        return len(listed.stdout.splitlines()) if listed.returncode == 0 else 0

    deadline = time.monotonic() + 300
    while worktrees() < 3:
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "stage made no worktrees"
        time.sleep(0.02)
    time.sleep(0.5)  # into the tree's checks
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=300)
    return child.returncode, err


def _leftovers(checkout: Path, tmp: Path) -> list[str]:
    return (
        [b for b in _git(checkout, "branch").split() if "xpu-gemm-fakes" in b]
        + _git(checkout, "worktree", "list").splitlines()[1:]
        + [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]
    )


@needs_tree_venv
def test_sigterm_midway_leaves_nothing(checkout, tmp_path):
    status, err = _terminate_midway(checkout, tool.SCRIPTS, tmp_path / "tmp")
    assert status == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err.splitlines()[-1], err
    assert _leftovers(checkout, tmp_path / "tmp") == []
    assert _git(checkout, "status", "--porcelain") == ""


@needs_tree_venv
@pytest.mark.skipif(
    not (paths.REPO / ".git").exists(), reason="needs this project's git history"
)
def test_sigterm_midway_stranded_todays_stage(checkout, tmp_path):
    """Negative control: the stage of UNHELD_COMMIT, killed the same way,
    leaves its branch, both worktrees and its temporary directory."""
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(paths.REPO), "archive", UNHELD_COMMIT]
        + ["scripts", "vllm_overlay", "patches"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    status, _ = _terminate_midway(checkout, old / "scripts", tmp_path / "tmp")
    assert status == -signal.SIGTERM
    left = _leftovers(checkout, tmp_path / "tmp")
    assert len(left) == 4, left  # the branch, two worktrees, the directory


# the hooks' lines as the trees' .pre-commit-config.yaml write them
RUFF_BY_RELEASE = """- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: v0.14.0
"""
RUFF_FROZEN = """- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: f368fb366ff7f2f808dd324b83a6d32267799e19  # frozen: v0.17.2
"""
MYPY_0_21_0 = (
    "  - id: mypy-local\n"
    "    name: Run mypy locally for lowest supported Python version\n"
    '    entry: python tools/pre_commit/mypy.py 0 "3.10"\n'
    "    stages: [pre-commit] # Don't run in CI\n"
    "    <<: &mypy_common\n"
    "      language: python\n"
    "      types_or: [python, pyi]\n"
    "      require_serial: true\n"
    '      additional_dependencies: ["mypy[faster-cache]==1.19.1", regex, '
    "types-cachetools, types-setuptools, types-PyYAML, types-requests, "
    "types-torch, pydantic]\n"
)


def test_the_check_tools_are_the_releases_the_config_pins():
    """0.21.0's mypy hook lists "mypy[faster-cache]==1.19.1" (brackets in a
    flow sequence: the list used to end at its ']', asking pip for
    'mypy[faster-cache', and `make stage` on that tree could not install
    its tools); the newest pin pins ruff by commit with the release in a 'frozen'
    comment (it used to ask for ruff==<commit>). Negative control: a commit
    with no release said is refused in one line, not guessed."""
    wanted = treechecks.tool_requirements(RUFF_BY_RELEASE + MYPY_0_21_0)
    assert wanted == [
        "ruff==0.14.0",
        "regex",
        "PyYAML",
        "mypy[faster-cache]==1.19.1",
        "types-cachetools",
        "types-setuptools",
        "types-PyYAML",
        "types-requests",
        "types-torch",
        "pydantic",
    ]
    assert treechecks.tool_requirements(RUFF_FROZEN)[0] == "ruff==0.17.2"
    bare = RUFF_FROZEN.split("  # frozen")[0] + "\n"
    with pytest.raises(Refusal, match="pins ruff by commit"):
        treechecks.tool_requirements(bare)
