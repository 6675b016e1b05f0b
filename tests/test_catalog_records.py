"""The recorded catalog runs judged again against today's data/limits.toml
(issue 51, item 5). A recorded run (data/catalog_run.json: make catalog,
CI's trees; data/catalog_run_llm_scaler.json: the opt-in llm-scaler trees)
keeps of each failure and each limit its error, the lines of the tree it
passed through (ours apart) and our frames outside the tree, and of each
stage what its tree's limits are keyed by (release, image). So:

* every recorded failure is judged as the run judged it: a cell recorded as
  the tree's limit that no listed limit excuses today, or a failure one now
  excuses, fails here (catalog.rejudged, limits.excusing: classify's rule);
* every listed limit is met in CI: by a failure of CI's recorded run, or by
  the test its `met_by` names (which asserts that cell's reason exactly); a
  limit met only by the opt-in run is said, a line each (a warning); one
  that nothing meets fails.

No tree is built: the records are data (under 1 s)."""

import ast
import warnings
from dataclasses import replace

import pytest

from xpufakes.common import paths
from xpufakes.proof.model import catalog, limits, report

RECORDS = {
    name: catalog.load(run.record)
    for name, run in catalog.RUNS.items()
    if run.record.is_file()
}
CI_RUN = "catalog"  # the run of CI's trees (tests/test_model_catalog.py)


def _meets_by_test(limit: limits.Limit) -> bool:
    """Its met_by names a test function of tests/ whose file asserts the
    limit's reason exactly."""
    path, _, name = limit.met_by.partition("::")
    file = paths.REPO / path
    if not path.startswith("tests/") or not file.is_file():
        return False
    text = file.read_text()
    tree = ast.parse(text)
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    strings = "".join(
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
    return name in defined and limit.reason in strings


def coverage(records: dict, listed: list) -> tuple[list, list]:
    """(limits met only by an opt-in run: (limit, runs); limits nothing in
    CI or the records meets)."""
    opt_in, unmet = [], []
    for limit, runs in catalog.met(records, listed).items():
        if CI_RUN in runs or (limit.met_by and _meets_by_test(limit)):
            continue
        (opt_in if runs else unmet).append((limit, runs))
    return opt_in, unmet


def _said(limit: limits.Limit) -> str:
    where = f"{limit.tree}{' + ' + limit.image if limit.image else ''}"
    return f"{where} {limit.model} {limit.configuration}: {limit.reason[:80]}"


def test_the_records_keep_what_judging_them_takes():
    assert set(RECORDS) == set(catalog.RUNS)
    for name, recorded in RECORDS.items():
        failures = list(catalog._failures(recorded))
        assert failures, name
        for tree, stage, model, configuration, _, failure, release, _ in failures:
            at = (name, tree, stage, model, configuration)
            assert release, at
            assert failure.get("error"), at


def test_every_recorded_failure_is_judged_today_as_it_was():
    listed = limits.load()
    for name, recorded in RECORDS.items():
        differ = catalog.rejudged(recorded, listed)
        assert not differ, (
            f"{catalog.RUNS[name].command}: the recorded run is judged otherwise "
            "today (data/limits.toml changed since it was recorded):\n"
            + "\n".join(differ)
        )


def _a_limit_cell(recorded: dict):
    return next(
        (model, configuration, failure, release, image)
        for _, _, model, configuration, _, failure, release, image in (
            catalog._failures(recorded)
        )
        if failure["result"] == report.TREE_LIMIT
    )


def _a_failed_cell(recorded: dict):
    return next(
        (model, configuration, failure, release, image)
        for _, _, model, configuration, _, failure, release, image in (
            catalog._failures(recorded)
        )
        if failure["result"] in report.ERRORS
        and not failure.get("through_ours")
        and not failure.get("ours")
    )


def test_rejudging_notices_a_limit_removed_reworded_or_added():
    """Negative controls, on CI's record: the limit a recorded cell met
    taken out, or its reason reworded by a word; a limit added that
    excuses a recorded failure; a recorded limit that passed through a line
    of ours (never excused)."""
    recorded = RECORDS[CI_RUN]
    listed = limits.load()
    model, configuration, failure, release, image = _a_limit_cell(recorded)
    used = limits.excusing(listed, release, model, configuration, image, failure)
    assert used is not None
    without = [limit for limit in listed if limit != used]
    assert catalog.rejudged(recorded, without)
    reworded = [
        replace(limit, reason=limit.reason + " (again)") if limit == used else limit
        for limit in listed
    ]
    assert catalog.rejudged(recorded, reworded)
    model, configuration, failure, release, image = _a_failed_cell(recorded)
    added = limits.Limit(release, model, configuration, failure["error"], "new")
    differ = catalog.rejudged(recorded, [*listed, added])
    assert any("today excused by data/limits.toml" in d for d in differ), differ
    ours = {
        **recorded,
        "trees": {
            tree: {
                stage: {
                    **found,
                    "cells": {
                        m: {
                            c: dict(cell, through_ours=["vllm/x.py:1"])
                            if cell["result"] == report.TREE_LIMIT
                            else cell
                            for c, cell in cells.items()
                        }
                        for m, cells in found["cells"].items()
                    },
                }
                for stage, found in stages.items()
            }
            for tree, stages in recorded["trees"].items()
        },
    }
    assert any(
        "no listed limit excuses it" in d for d in catalog.rejudged(ours, listed)
    )


def test_every_limit_is_met_in_ci_or_said():
    opt_in, unmet = coverage(RECORDS, limits.load())
    for limit, runs in opt_in:
        commands = ", ".join(catalog.RUNS[r].command for r in runs)
        warnings.warn(
            f"limit met only by the opt-in {commands}: {_said(limit)}", stacklevel=1
        )
    assert not unmet, (
        "limits nothing meets (neither CI's recorded run nor a test):\n"
        + ("\n".join(_said(limit) for limit, _ in unmet))
    )


def test_a_limit_nothing_meets_fails_and_a_test_that_names_it_must_assert_it():
    """Negative controls: a limit of a release no record holds; a met_by
    naming a test that does not exist, or one whose file does not assert
    the reason."""
    listed = limits.load()
    phantom = limits.Limit("0.12.0", "llama3_fp8", "*", "ValueError: gone", "gone")
    _, unmet = coverage(RECORDS, [*listed, phantom])
    assert [limit for limit, _ in unmet] == [phantom]
    test = "tests/test_model_trace_kernels.py::test_kernels_era_int4_and_fp8_trace_"
    test += "whole_and_fail_without_vllms_fakes"
    assert _meets_by_test(replace(phantom, met_by=test, reason=listed[1].reason))
    assert not _meets_by_test(replace(phantom, met_by=test))
    assert not _meets_by_test(replace(phantom, met_by=test + "_renamed"))


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_each_stage_is_keyed_as_its_tree_is(name):
    """The keys a stage was recorded with are the release its name says
    and, for an llm-scaler tree whose Python names the image's ESIMD
    package (0.14.0 on), its image commit (limits.image_of); CI's trees
    are no image's."""
    for tree, stages in RECORDS[name]["trees"].items():
        for stage, found in stages.items():
            assert found["release"] and found["release"] in tree, (tree, stage)
            if name == "llm-scaler":
                image = found["image"]
                assert not image or f" {image}," in tree, (tree, found)
            else:
                assert found["image"] == "", (tree, found)
    if name == "llm-scaler":
        images = {
            s["image"] for t in RECORDS[name]["trees"].values() for s in t.values()
        }
        assert {"0a85564", "b18beee"} <= images, images


def test_which_model_reaches_which_routed_op_is_tabled():
    """routed_table names, for each op the fix routes, the models whose
    compiled graphs call it (numbers.custom_ops, kept in each numbers cell
    of a `make audit MODEL=... --json` report) unpatched (the kernel op)
    and patched (the vLLM op), with the worst difference from eager.
    Controls: a model whose graphs call another op is not named; NaN is
    the worst of all."""
    kernel, routed = "custom_esimd_kernels_vllm::esimd_rms_norm", "vllm::esimd_rms_norm"

    def model(name, ops, differences):
        numbers = [
            {"tokens": 1, "backend": b, "result": report.NUMBERS_EQUAL}
            | {"difference": d, "largest": 2.0, "ops": ops}
            for b, d in zip(("aot_eager", "inductor"), differences, strict=True)
        ]
        return {
            "model": name,
            "configurations": [
                {"configuration": "default", "numbers": {"cells": numbers}}
            ],
        }

    raised = model("c", [], [0.0, 0.0])
    raised["configurations"][0]["numbers"]["cells"][0] |= {
        "result": report.NUMBERS_RAISED,
        "message": "Unsupported: ... unsupported operator: "
        "custom_esimd_kernels_vllm.esimd_rms_norm.default",
    }
    unpatched = [
        model("a", [kernel], [float("nan"), 0.0]),
        model("b", ["vllm::other"], [0.0, 0.0]),
        raised,
    ]
    patched = [
        model("a", [routed], [0.002, 0.004]),
        model("b", ["vllm::other"], [0.0, 0.0]),
    ]
    table = catalog.routed_table(
        unpatched, patched, {kernel: routed, "x::y": "vllm::y"}
    )
    assert (
        f"| `{kernel}` | `a`, `c` | a NaN; c compiling stops at it | a 0.20% |" in table
    )
    assert "| `x::y` | none of these | - | - |" in table
    assert "`b`" not in table
