"""`make stage`: the upstream cut of the fix as a branch of a vLLM git
checkout, ready for a pull request.

The tree may be any checkout: a release tag or an unreleased commit of
main. Its era comes from its contents (vllm/_xpu_ops.py with `_xpu_C` GEMM
fakes: kernels; vllm/_ipex_ops.py importing IPEX: ipex), and the recipes run
on its live files (an anchor that is not there stops staging with the file
and the anchor). The overlay files go in as their upstream cut
(upstream.py). Then, in a temporary `git worktree` (the user's working tree
and branch are not touched):

1. the tree's own pre-commit checks run on the staged files (treechecks.py);
   any failure stops staging;
2. the change is validated: the opcheck grid of the fakes the tree
   registers against the CPU reference kernels, before and after, and the
   new in-tree test (`VLLM_XPU_FAKES_CPU_REFERENCE=1 pytest ...`) after;
3. one commit per patch, authored and signed off by the checkout's git user,
   its message in vLLM's style (what, why, how it was tested).

It prints the pull-request text in the tree's own template. On any failure
the branch and the worktree are removed again.
"""

import ast
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import (
    base,
    live,
    prtext,
    recipes,
    series,
    transaction,
    tree,
    treechecks,
    upstream,
)
from .errors import Refusal


def _git(root: Path, *args: str, check: bool = True) -> str:
    result = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True
    )
    if check and result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["failed"])[-1]
        raise Refusal(f"git {' '.join(args)}: {last}")
    return result.stdout.strip()


def era_of_tree(root: Path) -> str:
    """The era from the tree's contents, not from its version (base.py's
    rule); a kernels-era tree must still have vLLM's `_xpu_C` GEMM fakes."""
    if (root / recipes.FAKES_MODULE).exists():
        raise Refusal(f"{root} already has {recipes.FAKES_MODULE}; nothing to stage")
    era, _ = base.files_era(root)
    if era == base.KERNELS:
        body = ast.parse((root / "vllm" / "_xpu_ops.py").read_text()).body
        if any(recipes._xpu_c_gemm_guard(node) for node in body):
            return era
    elif era == base.IPEX:
        return era
    raise Refusal(
        f"{root}: neither vllm/_xpu_ops.py with `if hasattr(torch.ops._xpu_C, "
        "<gemm>)` fakes nor vllm/_ipex_ops.py importing IPEX; nothing to stage"
    )


@dataclass
class Staged:
    """One patch of the cut: its recipe and the files it writes."""

    recipe: recipes.Recipe
    files: dict[str, str]  # path -> new text

    @property
    def subject_and_body(self) -> tuple[str, str]:
        return prtext.description(self.recipe.header)


def cut_of(root: Path, era: str) -> list[Staged]:
    """Every patch of the era, run on the tree's live files, with the
    upstream cut of the overlay files."""
    target = upstream.target_of(root, era)
    by_patch, _, faults = live.run_recipes(root, list(recipes.RECIPES[era]))
    if faults:
        raise Refusal("; ".join(faults))
    edited: list[dict[str, str]] = []
    for recipe in recipes.RECIPES[era]:
        files = dict(by_patch.get(recipe.name, {}))
        for rel in recipe.overlay:
            if rel.startswith("tests/") and not (root / "tests").is_dir():
                continue
            files[rel] = series.overlay_source(rel).read_text()
        edited.append(files)
    merged = upstream.cut({k: v for files in edited for k, v in files.items()}, target)
    staged = [
        Staged(recipe, {path: merged[path] for path in files})
        for recipe, files in zip(recipes.RECIPES[era], edited, strict=True)
    ]
    ci = root / upstream.INTEL_KERNEL_JOBS
    if era == "kernels" and ci.is_file():
        sources = sorted(staged[0].files) + ["tests/kernels/utils.py"]
        try:
            text = upstream.add_intel_ci_step(
                ci.read_text(), recipes.TREE_TEST, sources
            )
        except ValueError as e:
            raise Refusal(f"{upstream.INTEL_KERNEL_JOBS}: {e}") from None
        staged[0].files[upstream.INTEL_KERNEL_JOBS] = text
    return staged


def _python_for_tests(python: str | None) -> str:
    candidate = python or sys.executable
    if "/" in candidate:  # the tests run in the tree: not relative to here
        candidate = str(Path(candidate).absolute())
    probe = subprocess.run(
        [candidate, "-c", "import torch, pytest, regex"], capture_output=True
    )
    if probe.returncode != 0:
        raise Refusal(
            f"{candidate} cannot import torch, pytest and regex; stage validates "
            "the change with them (make stage uses .venv-tree: make venv-tree)"
        )
    return candidate


def stage(
    path: str,
    branch: str | None = None,
    python: str | None = None,
    test_args: list[str] | None = None,
) -> tuple[str, list[str], str, list[treechecks.Result]]:
    """(branch, commit ids, PR text, check results). `test_args`: extra
    pytest arguments for the in-tree tests (shown in the PR text)."""
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
    era = era_of_tree(root)
    described = _git(root, "describe", "--tags", "--always", "HEAD").removeprefix("v")
    branch = branch or f"xpu-gemm-fakes-{described}"
    exists = subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "show-ref",
            "--verify",
            "--quiet",
            f"refs/heads/{branch}",
        ]
    )
    if exists.returncode == 0:
        raise Refusal(f"branch {branch} already exists in {root}")
    staged = cut_of(root, era)
    test_python = _python_for_tests(python)

    work = Path(tempfile.mkdtemp(prefix="xpufakes-stage-"))
    before, after = work / "before", work / "vllm"
    _git(root, "worktree", "add", "-q", "--detach", str(before), "HEAD")
    _git(root, "worktree", "add", "-q", "-b", branch, str(after), "HEAD")
    try:
        changes = [
            transaction.Change(after / rel, text.encode(), mode=0o644)
            for s in staged
            for rel, text in s.files.items()
        ]
        transaction.commit(changes)
        files = [rel for s in staged for rel in s.files]
        _git(after, "add", "--", *files)  # the checks see what git tracks
        results = treechecks.run(after, files)
        failed = [r for r in results if r.status == treechecks.FAILED]
        if failed:
            details = "\n".join(f"{r.hook}:\n{r.output}" for r in failed)
            print(treechecks.report(results))
            print(details)
            raise Refusal(
                "the tree's own checks fail on the staged files: "
                + ", ".join(r.hook for r in failed)
            )
        evidence = prtext.validate(
            before, after, era, root, test_python, test_args or []
        )
        added = _added_lines(after)
        _git(after, "reset", "-q")
        commits = []
        for s in staged:
            subject, body = s.subject_and_body
            message = prtext.commit_message(subject, body, evidence, results)
            _git(after, "add", "--", *s.files)
            subprocess.run(
                ["git", "-C", str(after), "commit", "-q", "-s", "-F", "-"],
                input=message,
                text=True,
                check=True,
                capture_output=True,
            )
            commits.append(_git(after, "rev-parse", "HEAD"))
        template = root / ".github" / "PULL_REQUEST_TEMPLATE.md"
        text = prtext.pull_request(
            template.read_text() if template.is_file() else None,
            [s.subject_and_body for s in staged],
            evidence,
            results,
            added,
            described,
        )
    except BaseException:
        _git(root, "worktree", "remove", "--force", str(after), check=False)
        _git(root, "worktree", "remove", "--force", str(before), check=False)
        _git(root, "branch", "-D", branch, check=False)
        shutil.rmtree(work, ignore_errors=True)
        raise
    _git(root, "worktree", "remove", "--force", str(after))
    _git(root, "worktree", "remove", "--force", str(before))
    shutil.rmtree(work, ignore_errors=True)
    return branch, commits, text, results


def _added_lines(worktree: Path) -> dict[str, tuple[int, int]]:
    """path -> (added, removed) of the staged change (git diff --numstat)."""
    out = _git(worktree, "diff", "--cached", "--numstat")
    stats = {}
    for line in out.splitlines():
        added, removed, name = line.split("\t")
        stats[name] = (int(added), int(removed))
    return stats
