"""`make stage`: put the series on a new branch of a vLLM git checkout, one
commit per patch (with the overlay files it brings), authored and signed off
by the checkout's git user, and print a pull-request description.

The commits are made in a temporary `git worktree`, so the user's working
tree and current branch are not touched; on any failure the branch and the
worktree are removed again.
"""

import re
import subprocess
import tempfile
from pathlib import Path

from . import engine, export, pins, series, transaction, tree, unidiff
from .errors import Refusal


def _git(root: Path, *args: str, check: bool = True) -> str:
    result = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True
    )
    if check and result.returncode != 0:
        raise Refusal(
            f"git {' '.join(args)}: {result.stderr.strip().splitlines()[-1:]}"
        )
    return result.stdout.strip()


def stage(path: str, branch: str | None = None) -> tuple[str, list[str], str]:
    """(branch, commit ids, PR description)."""
    found = tree.locate(path)
    if found.shape != tree.CHECKOUT:
        raise Refusal(f"{found.root} is not a git checkout")
    version, _ = tree.detect_version(found)
    pin = pins.load().get(version)
    loaded = series.load(pin.series)
    branch = branch or f"xpu-gemm-fakes-{version}"
    root = found.root
    if _git(root, "status", "--porcelain"):
        raise Refusal(f"{root} has uncommitted changes; commit or stash them first")
    if _git(
        root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
    ):
        raise Refusal(f"branch {branch} already exists in {root}")
    name = _git(root, "config", "user.name", check=False)
    email = _git(root, "config", "user.email", check=False)
    if not name or not email:
        raise Refusal("git user.name and user.email are not set in that checkout")
    state = engine.inspect(engine.Plan(found, pin, loaded))
    if state.summary != engine.PRISTINE:
        raise Refusal(
            f"the checkout is {state.summary}; stage needs the pristine release"
        )

    work = Path(tempfile.mkdtemp(prefix="xpufakes-stage-"))
    worktree = work / "vllm"
    _git(root, "worktree", "add", "-q", "-b", branch, str(worktree), "HEAD")
    commits = []
    try:
        for patch in loaded.patches:
            commits.append(_commit(worktree, patch))
    except BaseException:
        _git(root, "worktree", "remove", "--force", str(worktree), check=False)
        _git(root, "branch", "-D", branch, check=False)
        raise
    _git(root, "worktree", "remove", "--force", str(worktree))
    return branch, commits, pr_description(loaded, version)


def _commit(worktree: Path, patch: series.Patch) -> str:
    changes = []
    for d in patch.file_diffs:
        target = worktree / d.path
        text = target.read_bytes().decode("utf-8", errors="surrogateescape")
        try:
            new = unidiff.apply(text, d)
        except unidiff.DiffError as e:
            raise Refusal(f"{patch.name}: {e}") from None
        changes.append(
            transaction.Change(target, new.encode("utf-8", "surrogateescape"))
        )
    for path in patch.overlay:
        data = series.overlay_source(path).read_bytes()
        changes.append(transaction.Change(worktree / path, data, mode=0o644))
    transaction.commit(changes)
    subject, body = export._description(patch)
    bug = patch.field("Bug")
    message = f"{subject}\n\n{body}\n" + (f"\nBug: {bug}\n" if bug else "")
    _git(worktree, "add", "--", *patch.targets, *patch.overlay)
    subprocess.run(
        ["git", "-C", str(worktree), "commit", "-q", "-s", "-F", "-"],
        input=message,
        text=True,
        check=True,
        capture_output=True,
    )
    return _git(worktree, "rev-parse", "HEAD")


def pr_description(loaded: series.Series, version: str) -> str:
    first = loaded.patches[0]
    subject, body = export._description(first)
    files = sorted(
        {p for patch in loaded.patches for p in patch.targets + patch.overlay}
    )
    return "\n".join(
        [
            f"# {subject}",
            "",
            "## Purpose",
            "",
            body,
            "",
            "Files: " + ", ".join(f"`{f}`" for f in files),
            "",
            "## Test Plan",
            "",
            "- `pytest tests/kernels/quantization/test_xpu_gemm_fakes.py`: opcheck",
            "  (`test_faketensor`, `test_aot_dispatch_dynamic`) of every XPU GEMM fake",
            "  over 2-D, 3-D, transposed and row-sliced inputs, NN/NT weights, bias,",
            "  `out_dtype`, fp8 e4m3/e5m2, fp4 and int4 (with and without `g_idx`);",
            "  an Inductor compile of a quantized linear block; bad input; schema",
            "  checks.",
            "  On an XPU host it uses the real kernels, elsewhere CPU reference",
            "  kernels with the kernels' schemas.",
            f"- Staged on vLLM {version} by the vLLM XPU GEMM fakes project, whose CI",
            "  runs the same checks on every release 0.10.2-0.33.0, with negative",
            "  controls on the unpatched releases.",
            "",
            "## Test Result",
            "",
            "(paste the pytest summary from an XPU host)",
            "",
            "## Related",
            "",
            *[f"- {url}" for url in _links(first)],
        ]
    )


def _links(patch: series.Patch) -> list[str]:
    urls = [patch.field("Bug")] if patch.field("Bug") else []
    for url in re.findall(r"https://\S+", patch.field("Description")):
        url = url.rstrip(").,")
        if url not in urls:
            urls.append(url)
    return urls
