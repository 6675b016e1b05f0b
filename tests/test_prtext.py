"""The pull-request text in each release's own template (0.33.0: Overview /
Claims / Validation / Details; 0.14.1: Purpose / Test Plan / Test Result),
and the upstream commit text without the packager's paragraphs."""

import re

import pytest

from support import releases
from xpufakes import prtext, recipes, treechecks

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
    assert "0 of 7 ops conform" in text and "7 of 7 ops conform" in text
    assert "12 passed" in text and "Shapes differ" in text
    assert "markdownlint (needs node)" in text
    if template:
        assert text.rstrip().endswith(template.rstrip().splitlines()[-1])


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
