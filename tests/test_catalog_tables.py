"""docs/traced-path.md's per-tree tables are written from the catalog's
recorded run (data/catalog_run.json: its date, commit and command), never
by hand (proof/model/catalog.py; `make catalog` records a run and writes
them). tests/test_model_catalog.py checks the recorded run against the
trees; here, no torch and no tree (well under a second). The same for the
real intel/llm-scaler trees' run (data/catalog_run_llm_scaler.json, `make
catalog-llm-scaler GIT=<git dir>`, its own places in the document), which
the opt-in tests/test_llm_scaler_trees.py -k catalog checks against the
trees; here only the committed JSON is read:

* the committed tables are what the recorded run gives; the controls: a
  cell edited in the document, and a cell changed in the run, each make
  the two differ;
* the run says when, at which commit and with which command it was made,
  and the document says it;
* a cell's words, the per-stage counts (the excused cells of each tree
  counted), the gathering of the stages and the comparison of a run with
  the recorded one, each with a wrong input that they must catch.
"""

import copy
import json
import re
import subprocess

import pytest

from xpufakes.common import paths
from xpufakes.proof.model import catalog
from xpufakes.proof.model import report as modelproof

DOCUMENT = paths.REPO / catalog.DOCUMENT


@pytest.fixture(scope="module", params=list(catalog.RUNS))
def run(request):
    """(the run's name, its Run, the recorded run)"""
    found = catalog.RUNS[request.param]
    if not found.record.is_file():  # said, never passed: see the skip reason
        pytest.skip(f"{found.record.name}: not recorded yet (`{found.command}`)")
    return request.param, found, catalog.load(found.record)


@pytest.fixture(scope="module")
def recorded(run):
    return run[2]


def test_the_committed_tables_are_the_recorded_runs(run):
    name, found, recorded = run
    kind = found.kind
    text = DOCUMENT.read_text()
    assert f"<!-- {kind}:tables -->" in text and f"<!-- {kind}:source -->" in text
    assert catalog.rewrite(text, recorded, kind) == text, (
        f"{catalog.DOCUMENT}'s {name} tables are not the recorded run's: "
        f"`python -m xpufakes.proof.model.catalog write` (or `{found.command}`)"
    )
    # the control: a cell edited by hand in the document is written back
    first = next(iter(recorded["trees"]))
    place = re.search(rf"<!-- {kind}:tables -->.*?<!-- /{kind} -->", text, re.S)
    edited = text.replace(
        place.group(0),
        place.group(0).replace("| traced whole |", "| fails at `nothing` |", 1),
    )
    assert edited != text
    assert catalog.rewrite(edited, recorded, kind) == text
    # the control: a cell of the run changed changes the tables
    changed = copy.deepcopy(recorded)
    stage = next(iter(changed["trees"][first].values()))
    cell = next(iter(next(iter(stage["cells"].values())).values()))
    cell["word"] = "fails at `nothing`"
    assert catalog.rewrite(text, changed, kind) != text


def test_each_run_writes_its_own_places_only():
    """A run's tables never land in the other run's places: the control,
    each recorded run written into the other's places, changes the
    document."""
    text = DOCUMENT.read_text()
    missing = [r.record.name for r in catalog.RUNS.values() if not r.record.is_file()]
    if missing:
        pytest.skip(f"not recorded yet: {', '.join(missing)}")
    kept = {name: catalog.load(r.record) for name, r in catalog.RUNS.items()}
    assert len({r.kind for r in catalog.RUNS.values()}) == len(catalog.RUNS)
    assert len({r.record for r in catalog.RUNS.values()}) == len(catalog.RUNS)
    names = list(catalog.RUNS)
    for name, other in zip(names, names[1:] + names[:1], strict=True):
        assert catalog.rewrite(text, kept[name], catalog.RUNS[name].kind) == text
        assert catalog.rewrite(text, kept[other], catalog.RUNS[name].kind) != text


def test_the_run_says_when_where_and_how(run):
    _, found, recorded = run
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", recorded["date"]), recorded["date"]
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+changes)?", recorded["commit"])
    assert recorded["command"].split(" GIT=")[0] == found.command
    source = catalog.facts(recorded)["source"]
    assert recorded["date"] in source and recorded["commit"] in source
    place = f"<!-- {found.kind}:source -->{source}<!-- /{found.kind} -->"
    assert place in DOCUMENT.read_text()
    commit = recorded["commit"].removesuffix("+changes")
    known = subprocess.run(
        ["git", "-C", str(paths.REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
    )
    if known.returncode != 0:  # a shallow clone has no history
        pytest.skip(f"this checkout does not have commit {commit}")
    # the control: a run without its date cannot be written
    with pytest.raises(KeyError):
        catalog.facts({k: v for k, v in recorded.items() if k != "date"})


def _models_at(commit: str) -> set[str] | None:
    """The catalog's models at a commit (None: this checkout lacks it)."""
    import tomllib

    from xpufakes.proof.model import models

    path = models.MODELS.relative_to(paths.REPO).as_posix()
    done = subprocess.run(
        ["git", "-C", str(paths.REPO), "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
    )
    return set(tomllib.loads(done.stdout)) if done.returncode == 0 else None


def test_the_recorded_run_covers_the_catalog(run):
    """Every model of data/models.toml under every configuration, in each
    stage of each tree; the stages in their order. `make catalog` runs on
    any checkout, so its run covers today's catalog (make test runs it);
    the llm-scaler run needs the image's git dir, so it covers the catalog
    of its own commit, and the tables name that commit."""
    from xpufakes.proof.model import models

    name, _, recorded = run
    every = set(models.load())
    if name != "catalog":
        commit = recorded["commit"].removesuffix("+changes")
        every = _models_at(commit)
        if every is None:
            pytest.skip(f"this checkout does not have commit {commit}")
        assert every, commit
    for tree, stages in recorded["trees"].items():
        assert list(stages) == [s for s in catalog.STAGES if s in stages], tree
        for stage, found in stages.items():
            assert set(found["cells"]) == every, (tree, stage)
            for cells in found["cells"].values():
                assert set(cells) == set(models.CONFIGURATIONS), (tree, stage)


def _cell(result: str, **more) -> dict:
    return {"configuration": "default", "result": result} | more


def test_a_cells_words():
    assert catalog.word(_cell("traced", graphs=1, graph_breaks=0)) == "traced whole"
    # the control: a graph break is never "traced whole"
    assert catalog.word(_cell("traced", graphs=2, graph_breaks=1)) == (
        "traced, 2 graphs, 1 breaks"
    )
    failed = _cell(
        "failed",
        error="Unsupported: Operator does not support running with fake tensors",
        message="unsupported operator: torch_ipex.fp8_gemm_w8a16.xpu (see ...)",
        where=["vllm/a.py:1 f", "vllm/model_executor/ipex_quant.py:307 apply"],
    )
    assert catalog.word(failed) == "fails at `torch_ipex.fp8_gemm_w8a16.xpu`"
    # the control: with no call named, the error itself
    unnamed = dict(failed, message="something else", error="RuntimeError: x")
    assert catalog.word(unnamed) == "fails: RuntimeError: x"
    assert catalog.word(_cell(modelproof.TREE_LIMIT)) == "the tree's limit"
    assert catalog.word(_cell(modelproof.PROOF_LIMIT)) == "the proof's limit (TP=1)"
    assert catalog.word(_cell("not built", error="ValueError: no")) == (
        "not built: ValueError: no"
    )


def _found(*results: str) -> list[dict]:
    return [
        {
            "model": "m",
            "configurations": [
                dict(
                    _cell(r, graphs=1, graph_breaks=0, seconds=1.5),
                    configuration=c,
                    error="E: e",
                    where=[],
                )
                for r, c in zip(results, ("default", "sp"), strict=False)
            ],
        }
    ]


def test_the_stages_gathered_in_order_and_counted(tmp_path):
    catalog.record_stage(tmp_path, "b", "patched", _found("traced", "traced"), 3, 1)
    catalog.record_stage(
        tmp_path, "b", "unpatched", _found("failed", modelproof.TREE_LIMIT), 2, 1
    )
    catalog.record_stage(tmp_path, "a", "patched", _found("traced", "traced"), 4, 0)
    run = catalog.gather(tmp_path, "make catalog", "2026-12-05", "abc1234")
    assert list(run["trees"]) == ["a", "b"]  # by the trees' order, not names
    assert list(run["trees"]["b"]) == ["unpatched", "patched"]
    table = catalog.tree_table("b", run["trees"]["b"])
    # the excused cells of each tree's stage, counted
    assert (
        "* unpatched: 2 cells: 0 traced whole, 1 excused as the tree's limit, "
        "1 fail; one process, 2 s (the slowest cell 1.5 s)"
    ) in table
    assert "* patched: 2 cells: 2 traced whole, 0 excused" in table
    with pytest.raises(ValueError, match="unknown stage"):  # the control
        catalog.record_stage(tmp_path, "b", "half-patched", _found("traced"), 1)
    json.loads(next(tmp_path.glob("a-*.json")).read_text())  # one file a stage


def test_a_run_that_differs_from_the_recorded_one_is_named(tmp_path):
    catalog.record_stage(tmp_path, "t", "patched", _found("traced", "traced"), 3)
    recorded = catalog.gather(tmp_path, "make catalog", "2026-12-05", "abc1234")
    same = {"patched": catalog.cells(_found("traced", "traced"))}
    assert catalog.disagreements(same, recorded["trees"]["t"]) == []
    # the controls: a cell changed, a stage not recorded, a seconds change
    # (never compared)
    broken = {"patched": catalog.cells(_found("traced", "failed"))}
    broken["patched"]["m"]["sp"]["word"] = "fails at `x`"
    assert catalog.disagreements(broken, recorded["trees"]["t"]) == [
        "patched m sp: fails at `x` (recorded: traced whole)"
    ]
    extra = same | {"unpatched": same["patched"]}
    assert catalog.disagreements(extra, recorded["trees"]["t"]) == [
        "unpatched: not recorded"
    ]
    slower = copy.deepcopy(same)
    slower["patched"]["m"]["sp"]["seconds"] = 99
    assert catalog.disagreements(slower, recorded["trees"]["t"]) == []
