"""`make stage PR=indexer`: vllm::sparse_attn_indexer registered to return
nothing, as a pull request of its own.

The op is vLLM's, of every platform; its fix is not the XPU fakes' pull
request. The cut is the indexer recipe (changes/indexerop.py) run on the
checkout's live files (every module of vllm/ that registers or calls the
op), with its in-tree test (tests/kernels/test_sparse_attn_indexer_op.py).

Its validation, on the tree before and after the change:
* the new test (it reads the registered schema; any platform): it must fail
  before (copied into the tree as it was) and pass after;
* the op called eager and under torch.compile (aot_eager, Inductor, and
  Inductor with torch's aliasing check strict), the implementation's
  kernels stood in (proof/indexercompile.py): after, every compiled call
  must return the buffer itself with eager's values, torch warning of
  nothing.

The commit message and the PR text say what ran and what it gave."""

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import indexerop, live, recipes, series
from xpufakes.common import children, isolated
from xpufakes.common.errors import Refusal
from xpufakes.staging import intree, prtext, treechecks
from xpufakes.staging.inplace import Commit
from xpufakes.trees import tree

NAME = "indexer"  # make stage PR=indexer
BRANCH = "sparse-attn-indexer-returns-nothing"
TEST = recipes.INDEXER_TREE_TEST
COMPILE = "xpufakes.proof.indexercompile"
RUNS = ("aot_eager", "inductor", "inductor, strict")


def recipe() -> recipes.Recipe:
    """The indexer's recipe (one edit, the same in every era)."""
    for era in recipes.RECIPES.values():
        for r in era:
            if r.name.endswith(recipes.INDEXER_PATCH):
                return r
    raise AssertionError("no indexer recipe")  # the recipes' own data


@dataclass
class Site:
    module: str  # the dotted module that registers the op
    impl: str  # its implementation's name there


def cut(root: Path) -> tuple[list[Commit], Site]:
    """The one commit of the change on the checkout's live files, and where
    the op is registered; refused where there is nothing to change or a
    call cannot be rewritten."""
    if (root / TEST).exists():
        raise Refusal(f"{root} already has {TEST}; nothing to stage")
    sources = tree.python_sources(root)
    registering = {
        path: name
        for path, text in sources.items()
        if (name := indexerop.implementation(text)) is not None
    }
    if not registering:
        raise Refusal(
            f"no module of {root}/vllm registers vllm::{indexerop.OP}; nothing to stage"
        )
    chosen = recipe()
    by_patch, _, faults = live.run_recipes(root, [chosen], sources=sources)
    if faults:
        raise Refusal("; ".join(faults))
    files = dict(by_patch.get(chosen.name, {}))
    if not set(registering) & set(files):
        raise Refusal(
            f"{', '.join(sorted(registering))} registers vllm::{indexerop.OP} "
            "to return nothing already; nothing to stage"
        )
    files[TEST] = series.overlay_source(TEST).read_text()
    subject, body = prtext.description(chosen.header)
    path, impl = sorted(registering.items())[0]
    module = path.removesuffix(".py").replace("/", ".")
    return [Commit(subject, body, files)], Site(module, impl)


@dataclass
class Evidence:
    test_before: prtext.Run
    test_after: prtext.Run
    compiled_before: prtext.Run
    compiled_after: prtext.Run


def _counts(line: str) -> str:
    """pytest's summary line without its warnings and timing."""
    kept = re.findall(r"\d+ (?:passed|failed|errors?|skipped)", line)
    return ", ".join(kept) or line


def _short(text: str, width: int = 100) -> str:
    """text cut at a word boundary to at most `width` characters."""
    if len(text) <= width:
        return text
    return text[:width].rsplit(" ", 1)[0] + " ..."


def _test(tree_root: Path, python: str) -> prtext.Run:
    base = {k: v for k, v in isolated.env().items() if k != "PYTHONPATH"}
    done = children.run(
        intree.command(python, ["-rA", TEST]),
        cwd=tree_root,
        env=intree.environment(tree_root, base),
        capture_output=True,
        text=True,
    )
    lines = done.stdout.strip().splitlines() or ["no output"]
    why = [ln[1:].strip() for ln in lines if ln.startswith("E ")][:1]
    if why and "-> " in why[0]:  # the schema: what it returns is the point
        head, _, returns = why[0].rpartition("-> ")
        why = [f"{_short(head, 60)} -> {returns}"]
    return prtext.Run(f"pytest --noconftest {TEST}", _counts(lines[-1]), why)


def _compiled(tree_root: Path, site: Site, python: str) -> tuple[prtext.Run, dict]:
    found = prtext.result_of(
        python,
        [COMPILE, str(tree_root), site.module, site.impl],
        f"the op did not run eager and compiled on {tree_root.name}",
    )
    command = f"python -m {COMPILE} <tree> {site.module} {site.impl}"
    parts = summary(found)
    return prtext.Run(command, "; ".join(parts), parts), found


def summary(found: dict) -> list[str]:
    """What the schema returns, then what each compiled call gave."""
    returns = ", ".join(found["returns"]) or "nothing"
    parts = [f"the schema returns {returns}"]
    for name in RUNS:
        run = found[name]
        if run.get("error"):
            error = re.sub(
                r"^(\w+: )\S+ \(with implementation in [^)]*\): ", r"\1", run["error"]
            )
            said = f"fails, {_short(error)}"
        else:
            said = "the buffer itself" if run["buffer"] else "a copy of the buffer"
            said += ", eager's values" if run["equal"] else ", values NOT eager's"
            if run.get("warning"):
                said += ", and torch warns the output aliases an input"
        parts.append(f"{name}: {said}")
    return parts


def _right(found: dict) -> bool:
    return (
        not found["returns"]
        and found["eager"]["buffer"]
        and found["eager"]["written"]
        and all(
            not found[n].get("error")
            and not found[n].get("warning")
            and found[n]["buffer"]
            and found[n]["equal"]
            for n in RUNS
        )
    )


def validate(before: Path, after: Path, site: Site, python: str) -> Evidence:
    """The new test and the compiled calls, before and after; a staged tree
    that fails either is refused."""
    copied = before / TEST  # the new test on the tree as it was
    copied.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(after / TEST, copied)
    try:
        test_before = _test(before, python)
    finally:
        copied.unlink()
    test_after = _test(after, python)
    if "failed" in test_after.result or "passed" not in test_after.result:
        raise Refusal(f"the new test fails on the staged tree: {test_after.result}")
    compiled_before, _ = _compiled(before, site, python)
    compiled_after, found = _compiled(after, site, python)
    if not _right(found):
        raise Refusal(
            "the staged op does not give eager's buffer compiled: "
            + compiled_after.result
        )
    return Evidence(test_before, test_after, compiled_before, compiled_after)


STOOD_IN = (
    "On a CPU, the tree's module imported as it is (the op's schema, fake "
    "and registration); the implementation's kernels cannot run here, so "
    "its body is stood in: it writes topk_indices_buffer (the row-wise "
    "argsort of hidden_states) and returns it, as the implementation does. "
    "The caller returns what the tree's callers return."
)


def _validation(evidence: Evidence, results: list[treechecks.Result]) -> list[str]:
    e = evidence
    return [
        "The new test, on the tree before this change (the test copied in) and after:",
        "",
        f"    {e.test_after.command}",
        f"    -> before: {e.test_before.result}",
        *[f"       {d}" for d in e.test_before.details],
        f"    -> after: {e.test_after.result}",
        "",
        prtext.wrap(
            STOOD_IN + " The op is called eager and under torch.compile "
            "(fullgraph): aot_eager, Inductor, and Inductor with torch's "
            "aliasing check strict (error_on_custom_op_aliasing, its default "
            "where the CI variable is set)."
        ),
        "",
        f"    {e.compiled_after.command}",
        *[
            f"    -> {when}: " + "\n       ".join(run.details)
            for when, run in (
                ("before", e.compiled_before),
                ("after", e.compiled_after),
            )
        ],
        "",
        prtext.wrap(prtext.checks_line(results)),
    ]


def commit_message(
    subject: str, body: str, evidence: Evidence, results: list[treechecks.Result]
) -> str:
    """What, why, how it was tested; git adds the Signed-off-by."""
    lines = [subject, "", body, "", "Test Plan:", "", *_validation(evidence, results)]
    return "\n".join(lines) + "\n"


def pull_request(
    template: str | None,
    staged: list[Commit],
    evidence: Evidence,
    results: list[treechecks.Result],
    added: dict[str, tuple[int, int]],
    base: str,
) -> str:
    """The PR text in the tree's template."""
    (commit,) = staged
    paragraphs = commit.body.split("\n\n")
    plus = sum(a for a, _ in added.values())
    minus = sum(r for _, r in added.values())
    content = {
        "overview": [f"{commit.subject}.", "", paragraphs[0]],
        "claims": [
            f"- `vllm::{indexerop.OP}`'s schema marks the buffers it writes and "
            "returns nothing (`-> ()`); each call returns the buffer it passed.",
            "- Compiled (aot_eager, Inductor), a call returns that buffer itself "
            "with eager's values; torch warns of no aliasing, and its strict "
            "check passes.",
            f"- New test `{TEST}` (any platform: it reads the registered "
            f"schema): {evidence.test_after.result}; before this change: "
            f"{evidence.test_before.result}.",
        ],
        "validation": [f"Staged on vLLM {base}.", "", *_validation(evidence, results)],
        "results": [
            f"- new test: before {evidence.test_before.result}, after "
            f"{evidence.test_after.result}",
            f"- compiled, before: {evidence.compiled_before.result}",
            f"- compiled, after: {evidence.compiled_after.result}",
            "- " + prtext.checks_line(results),
        ],
        "details": [
            "\n\n".join(paragraphs[1:]),
            "",
            f"Lines: +{plus} -{minus}",
            *[f"- `{path}`: +{a} -{r}" for path, (a, r) in added.items()],
        ],
    }
    return prtext.fill(template, content)
