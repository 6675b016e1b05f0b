"""The texts of an upstream pull request: the validation run (its commands
and results), commit messages in vLLM's style, and the PR description in
the tree's own `.github/PULL_REQUEST_TEMPLATE.md`.

The validation runs on this CPU, against this project's CPU reference
kernels (vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py:
the kernels' schemas, checks and output layout), which the in-place cut does
not bring into the tree: the opcheck grid of the fakes the change touches,
on the tree before and after; then the new in-tree test: the in-place cut's
XPU-only test has its cases run on the stand-ins (testcases.py), before and
after; the full cut's test runs with pytest and its reference kernels."""

import json
import os
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from xpufakes.changes import kernels, recipes, series
from xpufakes.common import children, isolated
from xpufakes.common.errors import Refusal
from xpufakes.proof.model import report as model_report
from xpufakes.proof.model import runner as model_runner
from xpufakes.staging import intree, treechecks

# The sections of vLLM's template since it has Overview / Claims /
# Validation / Details; used when the tree has no template.
DEFAULT_HEADINGS = ("Overview", "Claims", "Validation", "Details")
CPU_REFERENCE = f"{intree.CPU_REFERENCE}=1"


def description(header: str) -> tuple[str, str]:
    """(subject, body) of a recipe's DEP-3 Description (series.description),
    as upstream text: without the packager's paragraphs (upstream status,
    which releases the variant applies to); links to earlier PRs are kept."""
    first, body = series.description(series.fields(header)["Description"][0])
    kept = []
    for paragraph in body.split("\n\n"):
        if paragraph.startswith("This variant applies"):
            continue
        if paragraph.startswith("Upstream status:"):
            sentences = re.split(r"(?<=\.)\s+", paragraph.replace("\n", " "))
            linked = [s for s in sentences if "https://" in s]
            if not linked:
                continue
            paragraph = wrap(" ".join(linked))
        kept.append(paragraph)
    body = "\n\n".join(kept).strip()
    body = body.replace(
        "against CPU reference kernels elsewhere.",
        f"against CPU reference kernels elsewhere ({CPU_REFERENCE}).",
    )
    return first, body


def wrap(text: str, width: int = 72) -> str:
    """text as lines of at most `width` characters."""
    out, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(out + [line])


@dataclass
class Run:
    command: str
    result: str  # the summary line
    details: list[str] = field(default_factory=list)


@dataclass
class Evidence:
    before: Run
    after: Run
    tests: Run  # the new in-tree test, after
    tests_before: Run | None = None  # its cases on the tree before (in place)
    unchecked: str = ""  # the ops of the grid the change leaves alone, and why
    # the whole-model proof before and after (MODEL_PROOF), where it ran
    model_before: Run | None = None
    model_after: Run | None = None


# A change that runs the calls Dynamo cannot trace as custom ops (0003's
# module) is validated on a whole model too: Qwen3-MoE fp8 (exists in every
# IPEX-era release; proof/model), vLLM's default compile configuration and
# sequence parallelism (which turns +rms_norm on).
OPAQUE_CALLS = recipes.OPAQUE_MODULE
MODEL_PROOF = ("qwen3_moe", "default,sp")
MODEL_WHAT = (
    "The whole model, traced as vLLM compiles it (its @support_torch_compile, "
    "fullgraph, the XPU platform's code paths and quantization methods; Dynamo "
    "and AOT autograd's functionalization with fake tensors, nothing run; the "
    "XPU kernels stood in): Qwen3-MoE at a tiny size (2 layers, 4 experts), "
    "online fp8, vLLM's default compile configuration and sequence "
    "parallelism."
)


def result_of(python: str, module_args: list[str], failed: str):
    """The JSON result of `python -m <module_args> --json-out <file>`, or a
    refusal: `failed` and the last line it said."""
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "result.json"
        done = children.run(
            [python, "-m", *module_args, "--json-out", str(out)],
            capture_output=True,
            text=True,
            env=isolated.env(),
        )
        if not out.is_file():
            last = (done.stderr.strip().splitlines() or ["no result"])[-1]
            raise Refusal(f"{failed}: {last}")
        return json.loads(out.read_text())


def _grid(
    tree: Path, standins: str, python: str, ops: list[str] | None = None
) -> tuple[Run, list[str]]:
    """The opcheck grid of the tree's fakes (of `ops` only, if given), and
    the ops of the grid left out."""
    args = ["xpufakes", "verify-xpu", "--vllm", str(tree), "--standins", standins]
    found = result_of(
        python, [*args, "--quick"], f"the opcheck grid did not run on {tree.name}"
    )
    left_out = [op["op"] for op in found if ops is not None and op["op"] not in ops]
    ops = [op for op in found if op["op"] not in left_out]
    shown = [a if " " not in a else shlex.quote(a) for a in args]
    shown[2] = "<tree>"
    conform = sum(1 for op in ops if op["ok"])
    cases = sum(op["passed"] + op["failed"] for op in ops)
    failed = sum(op["failed"] for op in ops)
    details = []
    for op in ops:
        if op["failures"]:
            case, message = next(iter(op["failures"].items()))
            details.append(f"{op['op']}: {message.splitlines()[0][:200]} [{case}]")
        elif op["fake"] != "registered":
            details.append(f"{op['op']}: no fake registered")
    run = Run(
        "python -m xpufakes " + " ".join(shown),
        f"{conform} of {len(ops)} ops conform; {cases - failed} of {cases} "
        f"opcheck cases pass",
        details,
    )
    return run, left_out


def _test_cases(tree: Path, test: Path, standins: str, python: str) -> Run:
    """The in-place cut's in-tree test, its cases run with the tree's fakes
    against the stand-ins (testcases.py)."""
    args = ["xpufakes.proof.testcases", str(tree), str(test), "--standins", standins]
    results = result_of(
        python, args, f"the new test's cases did not run on {tree.name}"
    )
    failed = {case: why for case, why in results.items() if why}
    details = [f"{case}: {why.splitlines()[0][:200]}" for case, why in failed.items()]
    shown = f"python -m xpufakes.proof.testcases <tree> {recipes.TREE_TEST} --standins "
    return Run(
        shown + shlex.quote(standins),
        f"{len(results) - len(failed)} of {len(results)} cases pass",
        details,
    )


def _in_tree_tests(tree: Path, era: str, python: str, extra: list[str]) -> Run:
    tests = [*extra, recipes.TREE_TEST]
    if era == "ipex":
        tests.append(recipes.WOQ_TREE_TEST)
    # always the CPU reference kernels, the tree alone on the Python path
    base = dict(os.environ, PYTHONPATH="", PYTHONDONTWRITEBYTECODE="1")
    base[intree.CPU_REFERENCE] = "1"
    done = children.run(
        intree.command(python, tests),
        cwd=tree,
        env=intree.environment(tree, base),
        capture_output=True,
        text=True,
    )
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    if done.returncode != 0:
        raise Refusal(f"the new tests fail on the staged tree: {summary}")
    shown = " ".join(shlex.quote(a) for a in tests)
    return Run(f"{CPU_REFERENCE} pytest --noconftest {shown}", summary)


def validate(
    before: Path,
    after: Path,
    era: str,
    root: Path,
    python: str,
    extra: list[str],
    cut=None,
) -> Evidence:
    """The opcheck grid before and after; the in-tree tests after (with the
    extra pytest arguments `extra`), or, for the in-place cut `cut`
    (inplace.Cut), the grid of the ops it touches and its test's cases before
    and after. A staged tree that fails any of it is refused."""
    standins = kernels.of_tree(root)
    ops = cut.ops if cut is not None else None
    grid_before, left_out = _grid(before, standins, python, ops)
    grid_after, _ = _grid(after, standins, python, ops)
    if not grid_after.result.startswith(_all_of(grid_after.result)):
        raise Refusal(f"the staged fakes fail the opcheck grid: {grid_after.result}")
    if cut is None:
        evidence = Evidence(
            grid_before, grid_after, _in_tree_tests(after, era, python, extra)
        )
        if (after / OPAQUE_CALLS).is_file():
            evidence.model_before = _model(before, standins, python)
            evidence.model_after = _model(after, standins, python)
            said = evidence.model_after.result
            if "fails" in said or "not built" in said:
                raise Refusal(
                    "the staged tree does not trace the whole model: "
                    + evidence.model_after.result
                )
        return evidence
    test = after / recipes.TREE_TEST
    if not test.is_file():  # a checkout without tests/
        return Evidence(grid_before, grid_after, Run("", "no tests/ tree"))
    cases_after = _test_cases(after, test, standins, python)
    if cases_after.details:
        raise Refusal(
            f"the new test fails on the staged tree: {cases_after.details[0]}"
        )
    unchecked = ""
    if left_out:
        unchecked = (
            f"{', '.join(left_out)}: left as they are; this tree calls them "
            "from no traced code (a GEMM called inside vLLM's own op only is "
            "that op's)."
        )
    return Evidence(
        grid_before,
        grid_after,
        cases_after,
        _test_cases(before, test, standins, python),
        unchecked,
    )


def _model(tree: Path, standins: str, python: str) -> Run:
    name, configurations = MODEL_PROOF
    found = model_runner.run(tree, name, standins, configurations, python)
    command = (
        f"python -m xpufakes.proof.model.cli <tree> {name} <out> --standins "
        f"{shlex.quote(standins)} --configurations {configurations}"
    )
    if any(c.get("tensor_parallel", 1) > 1 for c in found["configurations"]):
        # runner.in_tensor_parallel: what one process could not run
        command += (
            "; sp again in two such processes, --tensor-parallel-size 2 "
            "--rank 0|1 (the tree turns sequence parallelism off at TP=1)"
        )
    return Run(command, model_report.summary(found))


def _all_of(result: str) -> str:
    """ "N of N" for a result that starts "M of N ..."."""
    match = re.match(r"(\d+) of (\d+)", result)
    return f"{match.group(2)} of {match.group(2)}" if match else result


def checks_line(results: list[treechecks.Result]) -> str:
    ran = [r.hook for r in results if r.status == treechecks.PASSED]
    skipped = [
        f"{r.hook} ({r.output})" for r in results if r.status == treechecks.SKIPPED
    ]
    text = f"pre-commit hooks of the tree, on the changed files: {', '.join(ran)} pass"
    return text + (f"; not run: {', '.join(skipped)}" if skipped else "")


def _by_op(details: list[str]) -> list[str]:
    """The failing cases of a test, one line per op: how many, and the
    first with its reason."""
    ops: dict[str, list[str]] = {}
    for detail in details:
        ops.setdefault(detail.split("-", 1)[0], []).append(detail)
    return [
        f"{op}: {len(cases)} case(s) fail, e.g. {cases[0].split('-', 1)[1]}"
        for op, cases in ops.items()
    ]


def _validation(evidence: Evidence, results: list[treechecks.Result]) -> list[str]:
    e = evidence
    before = [
        f"    {e.before.command}",
        f"    -> {e.before.result}",
        *[f"       {d}" for d in e.before.details],
    ]
    after = [f"    {e.after.command}", f"    -> {e.after.result}"]
    if e.tests_before is not None:
        before += [
            f"    {e.tests_before.command}",
            f"    -> {e.tests_before.result}",
            *[f"       {d}" for d in _by_op(e.tests_before.details)],
        ]
    if e.tests.command:
        after += [f"    {e.tests.command}", f"    -> {e.tests.result}"]
    unchecked = ["", wrap("Not in this change: " + e.unchecked)] if e.unchecked else []
    model = []
    if e.model_before is not None and e.model_after is not None:
        model = [
            "",
            wrap(MODEL_WHAT),
            "",
            f"    {e.model_after.command}",
            f"    -> before: {e.model_before.result}",
            f"    -> after: {e.model_after.result}",
        ]
    return [
        "On a CPU, against CPU reference kernels with the kernels' schemas,",
        "checks and output layout (not part of this change), opcheck's",
        "`test_faketensor` and `test_aot_dispatch_dynamic`. Before, the tree's",
        "own fakes:",
        "",
        *before,
        "",
        "After:",
        "",
        *after,
        *unchecked,
        *model,
        "",
        wrap(checks_line(results)),
    ]


def commit_message(
    subject: str, body: str, evidence: Evidence, results: list[treechecks.Result]
) -> str:
    """What, why, how it was tested; git adds the Signed-off-by."""
    return (
        "\n".join(
            [subject, "", body, "", "Test Plan:", "", *_validation(evidence, results)]
        )
        + "\n"
    )


def _sections(template: str) -> tuple[str, list[tuple[str, str]], str]:
    """(preamble, [(heading, body)], tail) of a PR template; the tail starts
    at the first `---` rule after the last heading."""
    head, *parts = re.split(r"^## ", template, flags=re.M)
    sections = []
    tail = ""
    for i, part in enumerate(parts):
        title, _, body = part.partition("\n")
        if i == len(parts) - 1:
            rule = re.search(r"^---\s*$", body, re.M)
            if rule:
                body, tail = body[: rule.start()], body[rule.start() :]
        sections.append((title.strip(), body))
    return head, sections, tail


def pull_request(
    template: str | None,
    descriptions: list[tuple[str, str]],
    evidence: Evidence,
    results: list[treechecks.Result],
    added: dict[str, tuple[int, int]],
    base: str,
    cut=None,
) -> str:
    """The PR text in the tree's template; `cut`: the in-place cut
    (inplace.Cut), None for the full one."""
    subject, body = descriptions[0]
    paragraphs = body.split("\n\n")
    bullets = [
        "- " + " ".join(p.strip(" -") for p in item.splitlines())
        for text in paragraphs
        for item in re.split(r"\n(?= *- )", text)
        if item.lstrip().startswith("- ")
    ]
    links = sorted({u.rstrip(").,") for u in re.findall(r"https://\S+", body)})
    overview = re.sub(r":$", " (see Claims).", paragraphs[0])
    plus = sum(a for a, _ in added.values())
    minus = sum(r for _, r in added.values())
    files = [f"- `{path}`: +{a} -{r}" for path, (a, r) in added.items()]
    content = {
        "overview": [
            f"{subject}.",
            "",
            overview,
            *(["", "Related: " + ", ".join(links)] if links else []),
        ],
        "claims": [
            "Fixes these defects of the fakes torch.compile uses for the XPU "
            "quantized GEMMs:"
            if bullets
            else "Fixes what stops torch.compile on XPU, one commit each:",
            *(bullets or [f"- {subject}."]),
            *[f"- {s}." for s, _ in descriptions[1:]],
            f"- New test `{recipes.TREE_TEST}`: {_new_test(evidence, cut)}.",
        ],
        "validation": [f"Staged on vLLM {base}.", "", *_validation(evidence, results)],
        "results": [
            f"- before: {evidence.before.result}",
            f"- after: {evidence.after.result}",
            f"- new tests: {_new_test(evidence, cut)}",
            *(
                [f"- whole model (Qwen3-MoE fp8): {evidence.model_after.result}"]
                if evidence.model_after is not None
                else []
            ),
            "- " + checks_line(results),
        ],
        "details": [
            "\n\n".join(
                [p for p in paragraphs[1:] if not p.lstrip().startswith("- ")]
                + [f"{s}.\n\n{b}" for s, b in descriptions[1:]]
            ),
            "",
            f"Lines: +{plus} -{minus}",
            *files,
        ],
    }
    return fill(template, content)


def fill(template: str | None, content: dict[str, list[str]]) -> str:
    """The PR template with each section's lines: `content` by kind
    (overview, claims, validation, results, details); where the template
    has no details section, claims and details go under the overview."""
    if template is None:
        head, sections, tail = "", [(h, "") for h in DEFAULT_HEADINGS], ""
    else:
        head, sections, tail = _sections(template)
    # of the text before the first heading only markup comments are kept
    kept = [ln for ln in head.splitlines() if ln.strip().startswith("<!--")]
    out = [*kept]
    kinds = [_kind(title) for title, _ in sections]
    if "details" not in kinds and "overview" in kinds:
        content = dict(content)
        content["overview"] = [
            *content["overview"],
            "",
            *content["claims"],
            "",
            *content["details"],
        ]
    for title, kind in zip([s[0] for s in sections], kinds, strict=True):
        out += [f"## {title}", "", *content[kind], ""]
    text = "\n".join(out) + ("\n" + tail if tail else "")
    return text.rstrip("\n") + "\n"


def _new_test(evidence: Evidence, cut) -> str:
    if cut is None or evidence.tests_before is None:
        return evidence.tests.result
    return (
        "runs on an XPU; on a CPU against the reference kernels "
        f"{evidence.tests.result} (before this change: "
        f"{evidence.tests_before.result})"
    )


def _kind(title: str) -> str:
    lowered = title.lower()
    for words, kind in (
        (("overview", "purpose", "summary", "essential"), "overview"),
        (("claim",), "claims"),
        (("result",), "results"),
        (("validation", "test"), "validation"),
    ):
        if any(w in lowered for w in words):
            return kind
    return "details"
