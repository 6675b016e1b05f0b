"""`make stage`: the fix as a branch of a vLLM git checkout, ready for a
pull request.

The tree may be any checkout: a release tag or an unreleased commit of
main. Its era comes from its contents (vllm/_xpu_ops.py with `_xpu_C` GEMM
fakes: kernels; vllm/_ipex_ops.py importing IPEX: ipex), and the recipes run
on its live files (an anchor that is not there stops staging with the file
and the anchor). Two cuts of the one source (vllm_overlay/, the recipes):

* by default (kernels era) the in-place cut (inplace.py): the fakes of
  vllm/_xpu_ops.py corrected where they stand, a small in-tree test that runs
  on an XPU, vllm::xpu_fp8_bmm's fake as a commit of its own;
* `full=True` (`make stage FULL=1`), and always in the IPEX era: the
  recipes' patches with the overlay files as their upstream cut
  (upstream.py), CPU reference kernels included.

`pr="indexer"` (`make stage PR=indexer`) cuts another pull request, of any
era: vllm::sparse_attn_indexer registered to return nothing, with its
in-tree test and its own validation (indexerpr.py).

Then, in a temporary `git worktree` (the user's working tree and branch are
not touched):

1. the tree's own pre-commit checks run on the staged files (treechecks.py);
   any failure stops staging;
2. the change is validated (prtext.validate): the opcheck grid of the fakes
   the change touches against the CPU reference kernels, before and after,
   and the new in-tree test after (in-place cut: its cases on the CPU
   stand-ins, before and after, testcases.py);
3. one commit per patch, authored and signed off by the checkout's git user,
   its message in vLLM's style (what, why, how it was tested).

It prints the pull-request text in the tree's own template. Signals are
held from start to end: on any failure or signal the branch, the worktrees
and the temporary directory are removed again (a running check or test is
stopped first, children.py).
"""

import ast
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from xpufakes.changes import live, lock, recipes, series
from xpufakes.common import children, transaction
from xpufakes.common.errors import Refusal
from xpufakes.staging import indexerpr, inplace, prtext, treechecks, upstream
from xpufakes.trees import pins, tree


def _git(root: Path, *args: str, check: bool = True, stop: bool = True) -> str:
    """git's output; `stop`: a held signal stops it (not while cleaning up)."""
    run = children.run if stop else subprocess.run
    result = run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["failed"])[-1]
        raise Refusal(f"git {' '.join(args)}: {last}")
    return result.stdout.strip()


def era_of_tree(root: Path) -> str:
    """The era from the tree's contents, not from its version (base.py's
    rule); a kernels-era tree must still have vLLM's `_xpu_C` GEMM fakes."""
    if (root / recipes.FAKES_MODULE).exists():
        raise Refusal(f"{root} already has {recipes.FAKES_MODULE}; nothing to stage")
    era, _ = tree.files_era(root)
    if era == pins.KERNELS:
        body = ast.parse((root / "vllm" / "_xpu_ops.py").read_text()).body
        if any(recipes.xpu_c_gemm_guard(node) for node in body):
            return era
    elif era == pins.IPEX:
        return era
    raise Refusal(
        f"{root}: neither vllm/_xpu_ops.py with `if hasattr(torch.ops._xpu_C, "
        "<gemm>)` fakes nor vllm/_ipex_ops.py importing IPEX; nothing to stage"
    )


Staged = inplace.Commit  # one commit of the cut: subject, body, files


def full_cut(found: tree.Tree, era: str) -> list[Staged]:
    """Every patch of the era, run on the tree's live files, with the
    upstream cut of the overlay files."""
    root = found.root
    target = upstream.target_of(root, era)
    # the indexer's patch is not staged here: it is not the XPU fakes' PR
    # (vLLM's op of every platform), and has no validation of its own in stage
    chosen = [r for r in recipes.RECIPES[era] if not r.optional]
    by_patch, _, faults = live.run_recipes(root, chosen)
    if faults:
        raise Refusal("; ".join(faults))
    edited: list[dict[str, str]] = []
    for recipe in chosen:
        files = dict(by_patch.get(recipe.name, {}))
        for rel in recipe.overlay:
            if found.receives(rel):
                files[rel] = series.overlay_source(rel).read_text()
        edited.append(files)
    merged = upstream.cut({k: v for files in edited for k, v in files.items()}, target)
    staged = [
        Staged(*prtext.description(recipe.header), {p: merged[p] for p in files})
        for recipe, files in zip(chosen, edited, strict=True)
    ]
    ci = root / upstream.INTEL_KERNEL_JOBS
    if era == pins.KERNELS and ci.is_file():
        sources = sorted(staged[0].files) + ["tests/kernels/utils.py"]
        try:
            text = upstream.add_intel_ci_step(
                ci.read_text(), recipes.TREE_TEST, sources
            )
        except ValueError as e:
            raise Refusal(f"{upstream.INTEL_KERNEL_JOBS}: {e}") from None
        staged[0].files[upstream.INTEL_KERNEL_JOBS] = text
    return staged


def in_place_cut(root: Path) -> inplace.Cut:
    """The in-place cut of a kernels-era tree; the recipes must take the
    tree (their anchors are the ones the series needs)."""
    chosen = [r for r in recipes.RECIPES[pins.KERNELS] if not r.optional]
    _, _, faults = live.run_recipes(root, chosen)
    if faults:
        raise Refusal("; ".join(faults))
    if (root / recipes.TREE_TEST).exists():
        raise Refusal(f"{root} already has {recipes.TREE_TEST}; nothing to stage")
    try:
        return inplace.cut(root, treechecks.formatter(root))
    except inplace.CutError as e:
        raise Refusal(f"{inplace.XPU_OPS}: {e}") from None


def _python_for_tests(python: str | None) -> str:
    candidate = python or sys.executable
    if "/" in candidate:  # the tests run in the tree: not relative to here
        candidate = str(Path(candidate).absolute())
    probe = children.run(
        [candidate, "-c", "import torch, pytest, regex"], capture_output=True
    )
    if probe.returncode != 0:
        raise Refusal(
            f"{candidate} cannot import torch, pytest and regex; stage validates "
            "the change with them (make stage uses .venv-tree: make venv-tree)"
        )
    return candidate


# the pull requests stage cuts (make stage PR=...): the XPU fakes', the default
XPU_FAKES = "xpu-fakes"
PULL_REQUESTS = (XPU_FAKES, indexerpr.NAME)


def stage(
    path: str,
    branch: str | None = None,
    python: str | None = None,
    test_args: list[str] | None = None,
    full: bool = False,
    pr: str = XPU_FAKES,
) -> tuple[str, list[str], str, list[treechecks.Result]]:
    """(branch, commit ids, PR text, check results). `test_args`: extra
    pytest arguments for the full cut's in-tree tests (shown in the PR
    text); `pr`: which pull request (PULL_REQUESTS). Signals are held
    throughout; one that arrives stops staging (transaction.Interrupted)
    with nothing left behind."""
    if pr not in PULL_REQUESTS:
        raise Refusal(f"no pull request {pr!r}; stage cuts {', '.join(PULL_REQUESTS)}")
    if full and pr != XPU_FAKES:
        raise Refusal(f"FULL=1 is a cut of the {XPU_FAKES} pull request, not of {pr}")
    root = tree.locate(path).root
    with lock.tree_lock(root), transaction.held_signals() as pending:
        return _stage(path, branch, python, test_args or [], full, pr, pending)


def _stage(path, branch, python, test_args, full, pr, pending):
    found = tree.locate(path)
    if found.shape != tree.CHECKOUT:
        raise Refusal(f"{found.root} is not a git checkout")
    root = found.root
    if _git(root, "status", "--porcelain", "--untracked-files=no"):
        raise Refusal(f"{root} has uncommitted changes; commit or stash them first")
    name = _git(root, "config", "user.name", check=False)
    email = _git(root, "config", "user.email", check=False)
    if not name or not email:
        raise Refusal("git user.name and user.email are not set in that checkout")
    indexer = pr == indexerpr.NAME
    era = None if indexer else era_of_tree(root)
    described = _git(root, "describe", "--tags", "--always", "HEAD").removeprefix("v")
    prefix = indexerpr.BRANCH if indexer else "xpu-gemm-fakes"
    branch = branch or f"{prefix}-{described}"
    if _git(root, "branch", "--list", branch):
        raise Refusal(f"branch {branch} already exists in {root}")
    cut = site = None
    if indexer:
        staged, site = indexerpr.cut(root)
    elif era == pins.KERNELS and not full:
        cut = in_place_cut(root)
        staged = cut.commits
    else:
        staged = full_cut(found, era)
    test_python = _python_for_tests(python)
    transaction.stop_if(pending)

    work = Path(tempfile.mkdtemp(prefix="xpufakes-stage-"))
    before, after = work / "before", work / "vllm"
    made: list[Path] = []
    try:
        # each worktree counts as made from before git creates it: a signal
        # between git's start and its end must not strand one
        made.append(before)
        _git(root, "worktree", "add", "-q", "--detach", str(before), "HEAD")
        made.append(after)
        _git(root, "worktree", "add", "-q", "-b", branch, str(after), "HEAD")
        transaction.stop_if(pending)
        changes = [
            transaction.Change(after / rel, text.encode(), mode=0o644)
            for rel, text in _final_files(staged).items()
        ]
        transaction.commit(changes)
        files = list(_final_files(staged))
        _git(after, "add", "--", *files)  # the checks see what git tracks
        results = treechecks.run(after, files, before=before)
        failed = [r for r in results if r.status == treechecks.FAILED]
        if failed:
            details = "\n".join(f"{r.hook}:\n{r.output}" for r in failed)
            print(treechecks.report(results))
            print(details)
            raise Refusal(
                "the tree's own checks fail on the staged files: "
                + ", ".join(r.hook for r in failed)
            )
        if indexer:
            evidence = indexerpr.validate(before, after, site, test_python)
            message_of = indexerpr.commit_message
        else:
            evidence = prtext.validate(
                before, after, era, root, test_python, test_args, cut
            )
            message_of = prtext.commit_message
        added = _added_lines(after)
        _git(after, "reset", "-q")
        commits = []
        for s in staged:
            for rel, text in s.files.items():  # each commit's own version
                (after / rel).write_text(text)
            message = message_of(s.subject, s.body, evidence, results)
            _git(after, "add", "--", *s.files)
            done = children.run(
                ["git", "-C", str(after), "commit", "-q", "-s", "-F", "-"],
                input=message,
                text=True,
                capture_output=True,
            )
            if done.returncode != 0:
                raise Refusal(f"git commit: {done.stderr.strip()}")
            commits.append(_git(after, "rev-parse", "HEAD"))
        template_file = root / ".github" / "PULL_REQUEST_TEMPLATE.md"
        template = template_file.read_text() if template_file.is_file() else None
        if indexer:
            text = indexerpr.pull_request(
                template, staged, evidence, results, added, described
            )
        else:
            text = prtext.pull_request(
                template,
                [(s.subject, s.body) for s in staged],
                evidence,
                results,
                added,
                described,
                cut,
            )
        transaction.stop_if(pending)
    except BaseException:
        _remove(root, made, work)
        if len(made) == 2:
            _git(root, "branch", "-D", branch, check=False, stop=False)
        raise
    _remove(root, made, work)
    if pending:  # it arrived while the worktrees were removed: undo it all
        _git(root, "branch", "-D", branch, check=False, stop=False)
        raise transaction.Interrupted(pending[0])
    return branch, commits, text, results


def _final_files(staged: list[Staged]) -> dict[str, str]:
    """Each file as the last commit that writes it leaves it."""
    return {rel: text for s in staged for rel, text in s.files.items()}


def _remove(root: Path, worktrees: list[Path], work: Path) -> None:
    for worktree in reversed(worktrees):
        _git(
            root,
            "worktree",
            "remove",
            "--force",
            str(worktree),
            check=False,
            stop=False,
        )
    _git(root, "worktree", "prune", check=False, stop=False)
    shutil.rmtree(work, ignore_errors=True)


def _added_lines(worktree: Path) -> dict[str, tuple[int, int]]:
    """path -> (added, removed) of the staged change (git diff --numstat)."""
    out = _git(worktree, "diff", "--cached", "--numstat")
    stats = {}
    for line in out.splitlines():
        added, removed, name = line.split("\t")
        stats[name] = (int(added), int(removed))
    return stats
