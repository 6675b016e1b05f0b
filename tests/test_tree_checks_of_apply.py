"""What `make apply` writes into a downstream tree passes that tree's own
offline pre-commit checks (staging/treechecks.py: ruff check and ruff
format at the tree's pinned ruff, mypy through its tools/pre_commit/mypy.py
with the mypy its hook pins, its tools/pre_commit/*.py checks: SPDX headers,
forbidden imports, `import regex as re`, ...).

The trees (tests/support/downstream.py), each applied by recipe:

* the b6-like tree (0.14.1 edited as intel/llm-scaler's image edits it):
  the IPEX era's three patches and the opaque-calls module;
* the ESIMD-GEMV-like tree (the newest pin with b18beee's decode GEMV call
  of a lying ESIMD op): the kernels era's fakes and the same opaque-calls
  module, routing the lying call. Its target files are the pin's: the
  recipe path is taken because of that call (changes/base.py), which the
  series alone would leave;
* llm-scaler's 0.21.0-b3.1 image (tests/support/images.py, rebuilt from
  ../shared): its own `_xpu_ops.py` fake kept with ours registered after
  it (do no harm), the lying ESIMD calls routed, its two traced
  `logger.*_once` guarded.

Every hook that runs passes, except ruff's findings and unformatted files
that were the tree's own before apply (treechecks says whose each is), and
typos' findings in lines the tree had before apply and SPDX findings in
files whose header lacked the line before apply (b3.1's own comments and
model file).

Negative control: the opaque-calls module as it stood before it passed the
trees' mypy (llm-scaler b18beee's mypy hook found its `impl.__signature__`
and `fake.__signature__` assignments, among five errors) fails the newest
pin's mypy.

Costs ~40 s with the check tools cached (a virtual environment per tree's
pins, installed once: ~1 min each cold)."""

import json
import re
import shutil
import subprocess

import pytest

from support import downstream, images, releases, tool
from xpufakes.changes import live
from xpufakes.staging import treechecks

OPAQUE = "vllm/_xpu_opaque_calls.py"
IGNORED = "  # type: ignore[attr-defined]"
TREES = {
    "b6-like": downstream.b6_like,
    "ESIMD-GEMV-like": lambda root: downstream.esimd_gemv_like(releases.newest(), root),
    "llm-scaler 0.21.0-b3.1": images.b31_copy,
}


def _not_the_trees(result: treechecks.Result) -> list[str]:
    """The findings of a failing ruff hook that are the change's."""
    said = [line for line in result.output.splitlines() if line.strip()]
    findings = [line for line in said if line.endswith(")") and "(" in line]
    return [line for line in findings if not line.endswith(f"{treechecks.OLD})")]


def _typos_not_the_trees(result: treechecks.Result, root, before) -> list[str]:
    """The typos findings (`--> path:line:col`, or its box-drawn arrow) on
    a line the tree did not have before apply: the change's."""
    found = re.findall(r"(?:-->|\u256d\u25b8) (\S+?):(\d+):\d+", result.output)
    assert found, result.output  # a failure it cannot place is the change's
    changed = []
    for path, line in found:
        text = (root / path).read_text().splitlines()[int(line) - 1]
        if text not in (before / path).read_text().splitlines():
            changed.append(f"{path}:{line}")
    return changed


@pytest.mark.parametrize("name", list(TREES))
def test_what_apply_writes_passes_the_trees_own_checks(name, tmp_path):
    before = TREES[name](tmp_path / "before")
    root = tmp_path / "tree"
    shutil.copytree(before, root, symlinks=True)
    # a checkout, as an image builder's tree is (some hooks ask git)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the tree"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *command],
            cwd=root,
            check=True,
        )
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "by recipe" in applied.stdout, applied.stdout
    state = json.loads((root / live.STATE_FILE).read_text())
    written = sorted([*state["files"], *state["added"]])
    assert OPAQUE in written, written
    results = treechecks.run(root, written, before)
    ran = {r.hook: r for r in results}
    for hook in ("ruff-check", "ruff-format", "check-spdx-header"):
        assert hook in ran and ran[hook].status != treechecks.SKIPPED, hook
    mypy = [r for r in results if r.hook.startswith("mypy")]  # per tree: -3.10, ...
    assert mypy and all(r.status == treechecks.PASSED for r in mypy), mypy
    for result in results:
        if result.status != treechecks.FAILED:
            continue
        if result.hook == "typos":  # b3.1's own comments ("mis-scaling")
            assert not _typos_not_the_trees(result, root, before), result.output
            continue
        if result.hook == "check-spdx-header":  # b3.1's own muse_glimmer.py
            listed = re.findall(r"^\s+(vllm/\S+\.py)$", result.output, re.M)
            assert listed, result.output
            for path in listed:  # the tree had it so (the hook adds it)
                head = (before / path).read_text().splitlines()[:2]
                assert not head[1].startswith("# SPDX-FileCopyrightText"), path
            continue
        assert result.hook in ("ruff-check", "ruff-format"), result.output
        assert not _not_the_trees(result), result.output
    if name != "ESIMD-GEMV-like":
        return
    # the control: the module without the marks the newest mypy needs
    text = (root / OPAQUE).read_text()
    assert text.count(IGNORED) == 2
    (root / OPAQUE).write_text(text.replace(IGNORED, ""))
    again = treechecks.run(root, [OPAQUE], before)
    failed = [r for r in again if r.hook.startswith("mypy")]
    assert failed and all(r.status == treechecks.FAILED for r in failed), failed
    assert all('"__signature__"  [attr-defined]' in r.output for r in failed)
