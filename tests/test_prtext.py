"""The pull-request text in each release's own template (0.33.0: Overview /
Claims / Validation / Details; 0.14.1: Purpose / Test Plan / Test Result),
and the upstream commit text without the packager's paragraphs."""

import dataclasses
import re

import pytest

from support import releases
from xpufakes.changes import recipes
from xpufakes.staging import prtext, treechecks

EVIDENCE = prtext.Evidence(
    before=prtext.Run("grid <tree>", "0 of 7 ops conform", ["op: Shapes differ"]),
    after=prtext.Run("grid <tree>", "7 of 7 ops conform"),
    tests=prtext.Run("pytest t.py", "12 passed in 3.0s"),
)
CHECKS = [
    treechecks.Result("ruff-check", treechecks.PASSED),
    treechecks.Result("markdownlint", treechecks.SKIPPED, output="needs node"),
]


def _text(release: str | None) -> tuple[str, str | None]:
    template = None
    if release:
        path = releases.pristine(release) / ".github" / "PULL_REQUEST_TEMPLATE.md"
        template = path.read_text()
    descriptions = [prtext.description(r.header) for r in recipes.RECIPES["kernels"]]
    text = prtext.pull_request(
        template, descriptions, EVIDENCE, CHECKS, {"vllm/x.py": (10, 2)}, "main"
    )
    return text, template


@pytest.mark.parametrize("template_of", ["0.33.0", "0.14.1", None])
def test_the_template_headings_are_filled(template_of):
    text, template = _text(template_of)
    headings = re.findall(r"^## (.+)$", template or "", re.M) or list(
        prtext.DEFAULT_HEADINGS
    )
    assert re.findall(r"^## (.+)$", text, re.M) == headings
    sections = re.split(r"^## .+$", text.split("\n---\n")[0], flags=re.M)[1:]
    assert all(s.strip() for s in sections)  # no heading left empty
    assert "PLEASE FILL IN" not in text and "<!-- Summarize" not in text
    comments = re.findall(r"<!--.*?-->", text, re.S)
    assert comments in ([], ["<!-- markdownlint-disable -->"])
    if template:  # the checklist and its footer, as the template has them
        footer = template[template.index("\n---\n") :]
        assert text.rstrip().endswith(footer.rstrip())
    else:
        assert "\n---\n" not in text  # no template, no checklist


def _before_and_after(text: str) -> tuple[str, str]:
    """The validation's runs: what it shows before the change, and after."""
    validation = text[text.index("Before, the tree's") :]
    before, after = validation.split("\nAfter:\n", 1)
    return before, after.split("\n## ", 1)[0]


def _evidence_in_place(text: str) -> None:
    before, after = _before_and_after(text)
    assert "    grid <tree>\n    -> 0 of 7 ops conform\n       op: Shapes differ\n" in (
        before
    )
    assert "7 of 7" not in before and "12 passed" not in before
    assert "    grid <tree>\n    -> 7 of 7 ops conform\n" in after
    assert "    pytest t.py\n    -> 12 passed in 3.0s\n" in after
    assert "0 of 7" not in after and "Shapes differ" not in after
    checks = " ".join(after.split())
    assert (
        "on the changed files: ruff-check pass; not run: markdownlint (needs node)"
        in (checks)
    )


@pytest.mark.parametrize("template_of", ["0.33.0", "0.14.1", None])
def test_the_evidence_is_shown_in_its_place(template_of):
    """Each run under its command, the grid before the change with its
    failure and after it with the new tests, the checks run and not run.
    Negative control: the same text with the runs the wrong way round (or
    markdownlint said to pass) fails."""
    text, _ = _text(template_of)
    _evidence_in_place(text)
    if template_of == "0.14.1":  # its Test Result: one line each
        result = text[text.index("## Test Result") :]
        assert "- before: 0 of 7 ops conform\n- after: 7 of 7 ops conform\n" in result
        assert "- new tests: 12 passed in 3.0s\n" in result
    descriptions = [prtext.description(r.header) for r in recipes.RECIPES["kernels"]]
    swapped = dataclasses.replace(
        EVIDENCE, before=EVIDENCE.after, after=EVIDENCE.before
    )
    passed = [dataclasses.replace(c, status=treechecks.PASSED) for c in CHECKS]
    for evidence, checks in ((swapped, CHECKS), (EVIDENCE, passed)):
        wrong = prtext.pull_request(None, descriptions, evidence, checks, {}, "main")
        with pytest.raises(AssertionError):
            _evidence_in_place(wrong)


def test_the_commit_text_has_no_vendor_paragraphs():
    subject, body = prtext.description(recipes.RECIPES["kernels"][0].header)
    assert subject.startswith("[XPU] ")
    for vendor in ("Upstream status", "This variant", "{releases}", "llm-scaler"):
        assert vendor not in body
    # the links to the PRs that added the replaced fakes are kept
    assert "https://github.com/vllm-project/vllm/pull/39984" in body
    header = recipes.RECIPES["kernels"][0].header
    assert "Upstream status" in header  # the packager's series keeps it


def test_the_in_place_validation_shows_the_test_cases_before_and_after():
    """The in-place cut's evidence: the new test's cases on the stand-ins
    before (failing, grouped by op) and after, and the ops left alone."""
    evidence = prtext.Evidence(
        before=prtext.Run("grid <tree>", "0 of 2 ops conform", ["a: Shapes differ"]),
        after=prtext.Run("grid <tree>", "2 of 2 ops conform"),
        tests=prtext.Run("cases <tree>", "4 of 4 cases pass"),
        tests_before=prtext.Run(
            "cases <tree>",
            "1 of 4 cases pass",
            ["fp8_gemm-3d-nt: Shapes differ", "fp8_gemm-2d-nn: Dtypes", "bmm-3d: x"],
        ),
        unchecked="_xpu_C::fp8_gemm_out: left as it is.",
    )
    descriptions = [prtext.description(r.header) for r in recipes.RECIPES["kernels"]]
    text = prtext.pull_request(None, descriptions, evidence, CHECKS, {}, "main", cut=1)
    validation = text[text.index("## Validation") : text.index("## Details")]
    before, after = validation.split("After:")
    assert "1 of 4 cases pass" in before and "4 of 4 cases pass" in after
    assert "fp8_gemm: 2 case(s) fail, e.g. 3d-nt: Shapes differ" in before
    assert "bmm: 1 case(s) fail, e.g. 3d: x" in before
    assert "Not in this change: _xpu_C::fp8_gemm_out" in validation
    assert "(before this change: 1 of 4 cases pass)" in text  # the claims


def test_an_ipex_change_claims_each_commit_and_shows_the_whole_model():
    """The IPEX-era change: each further commit (0002, 0003) is a claim of
    its own, and the whole-model proof (validate runs it when the change
    brings vllm/_xpu_opaque_calls.py) is in the validation and the results.
    Negative control: without that proof, no line claims a whole model."""
    descriptions = [prtext.description(r.header) for r in recipes.RECIPES["ipex"]]
    model = dataclasses.replace(
        EVIDENCE,
        model_before=prtext.Run("trace <tree>", "default: fails, X at y.py:1"),
        model_after=prtext.Run("trace <tree>", "default: traced whole, 1 graph(s)"),
    )
    for evidence in (model, EVIDENCE):
        text = prtext.pull_request(
            "## Purpose\n\n## Test Plan\n\n## Test Result\n",
            descriptions,
            evidence,
            CHECKS,
            {},
            "v0.14.1",
        )
        purpose = text[: text.index("## Test Plan")]
        assert "- [XPU] Run the kernel calls torch.compile cannot trace as custom" in (
            purpose
        )
        assert "- [XPU] Run IPEX's weight-only-quantized linear as one" in purpose
        assert "- [XPU] Register fake kernels for the IPEX quantized GEMMs." in (
            purpose
        )
        shown = "-> after: default: traced whole, 1 graph(s)" in text
        assert shown == (evidence is model)
        assert (prtext.MODEL_WHAT[:40] in text) == (evidence is model)
        assert ("- whole model (Qwen3-MoE fp8): default: traced" in text) == (
            evidence is model
        )
        assert "-> before: default: fails, X at y.py:1" in text or evidence is EVIDENCE
