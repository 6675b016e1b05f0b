"""The trees' limits are data, exact, and few (proof/model/limits.py,
data/limits.toml): a cell of the model proof that fails is excused as the
tree's limit only by a listed limit of its tree, model and configuration
whose reason is exactly the cell's error, and never if the error passed
through a file our series or recipes edit or add; a listed limit that no
longer happens is reported; a limit of the proof itself (TP=1) is never
called the tree's, and the table counts each kind. Cheap: no model is built
(the whole audit with the injected fault is in test_model_trace.py).

Negative controls in each test: the reason one character off, the limit of
another tree, model or configuration, the same reason through ipex_quant.py
(a file the series edits), a limited cell that traced."""

import dataclasses

import pytest

from support import downstream, releases
from xpufakes.changes import esimdfacts, live
from xpufakes.proof.model import limits, models, report
from xpufakes.trees import pins, tree

REASON = (
    "TypeError: FlashAttentionImpl.__init__() got an unexpected keyword "
    "argument 'q_lora_rank'"
)
ATTENTION = "vllm/v1/attention/backends/flash_attn.py"
OURS = "vllm/model_executor/layers/quantization/ipex_quant.py"
LIMIT = limits.Limit("0.14.1", "deepseek_v2_fp8", "default", REASON, "no MLA")


def _found(result: str, error: str = REASON, files=(ATTENTION,), model=None):
    cell = {
        "configuration": "default",
        "result": result,
        "error": error,
        "where": [f"{f}:1 f" for f in files],
        "files": list(files),
        "graphs": 0,
        "graph_breaks": 0,
        "ops": [],
        "custom_ops": ["none"],
    }
    return [{"model": model or LIMIT.model, "configurations": [cell]}]


def _classified(found, tree_name="0.14.1", ours=frozenset({OURS})):
    return limits.classify(found, tree_name, set(ours), [LIMIT])


def _cell(found) -> dict:
    return found[0]["configurations"][0]


def test_a_listed_limit_excuses_exactly_its_reason():
    for kind in report.ERRORS:  # not built, or failed in the trace
        found = _classified(_found(kind))
        assert _cell(found)["result"] == report.TREE_LIMIT
        assert _cell(found)["limit"] == "no MLA"
        assert not report.failing(found[0])
        assert report.cell(_cell(found)).startswith("the tree's limit: no MLA (")
    # the reason one character off: fails, and the listed one is reported
    # as no longer happening
    found = _classified(_found("not built", REASON + "."))
    assert _cell(found)["result"] == "not built"
    assert report.failing(found[0])
    assert _cell(found)["limit_gone"] == [REASON]
    # another tree, another model, another configuration: nothing listed
    for found in (
        _classified(_found("not built"), tree_name="0.14.0"),
        _classified(_found("not built", model="qwen3_moe")),
        _classified(
            [
                {
                    "model": LIMIT.model,
                    "configurations": [
                        dict(_cell(_found("not built")), configuration="sp")
                    ],
                }
            ]
        ),
    ):
        assert _cell(found)["result"] == "not built", found
        assert "limit_gone" not in _cell(found)
    # a failure of ours (writes lost) is never a limit, whatever its error
    found = _classified(_found("writes lost"))
    assert _cell(found)["result"] == "writes lost"


def test_no_error_through_a_file_of_ours_is_excused():
    """The issue's fault: the reason listed, exactly, but raised in
    ipex_quant.py (which the series edits): it fails, saying why."""
    found = _classified(_found("failed", files=(ATTENTION, OURS)))
    cell = _cell(found)
    assert cell["result"] == "failed" and report.failing(found[0])
    assert OURS in cell["not_excused"]
    assert "not excused: data/limits.toml lists it" in report.table(
        dict(found[0], what="m", standins="k")
    )
    # the control: the same cell with no file of ours is excused
    assert _cell(_classified(_found("failed")))["result"] == report.TREE_LIMIT


def test_a_listed_limit_that_no_longer_happens_is_reported():
    traced = _found("traced", error="")
    _cell(traced).update(graphs=1, custom_ops=[], ops=[])
    found = _classified(traced)
    assert _cell(found)["result"] == "traced"
    assert _cell(found)["limit_gone"] == [REASON]
    table = report.matrix(found)
    assert "1 listed limit(s) no longer happen (data/limits.toml)" in table
    lines = report.table(dict(found[0], what="m", standins="k"))
    assert f"a listed limit no longer happens (data/limits.toml): {REASON}" in lines


def test_the_proofs_limit_is_never_the_trees_and_each_kind_is_counted():
    proof = {
        "configuration": "sp",
        "result": report.PROOF_LIMIT,
        "error": "the tree's VllmConfig turned enable_sp off: it needs tensor "
        "parallelism > 1, and the proof runs one process (TP=1)",
    }
    excused = _cell(_classified(_found("not built")))
    model = {"model": "m", "configurations": [excused, proof]}
    assert not report.failing(model)
    said = report.cell(proof, short=True)
    assert said == (
        "the proof's limit (TP=1): the tree's VllmConfig turned enable_sp off"
    )
    assert "the tree's limit" not in report.cell(proof)
    assert (
        "  0 of 2 traced whole; 1 excused as the tree's limit (data/limits.toml); "
        "1 the proof's limit (TP=1: not proven)"
    ) in report.matrix([model])
    # the control: a failure is counted as one, and fails the model
    broken = dict(excused, result="not built")
    failed = {"model": "m", "configurations": [broken, proof]}
    assert report.failing(failed)
    assert "0 excused as the tree's limit" in report.matrix([failed])
    assert "; 1 FAIL" in report.matrix([failed])


def test_the_listed_limits_are_well_formed():
    """Each names a pinned release, a model of the catalog (or "*"), a
    configuration (or "*"), vLLM's reason as "<Error>: <message>" and what
    it means; none twice."""
    listed = limits.load()
    assert listed, "data/limits.toml lists no limit"
    releases_pinned = set(pins.load().releases)
    catalog = set(models.load())
    images = esimdfacts.load()
    for limit in listed:
        assert limit.tree in releases_pinned, limit
        assert limit.model in catalog | {limits.ANY}, limit
        assert limit.configuration in set(models.CONFIGURATIONS) | {limits.ANY}
        error, _, message = limit.reason.partition(": ")
        assert error.isidentifier() and message, limit
        assert limit.why, limit
        if limit.image:  # an image commit of the data, whose image builds it
            assert images[limit.image]["vllm"] == limit.tree, limit
    keys = [(x.tree, x.image, x.model, x.configuration, x.reason) for x in listed]
    assert len(keys) == len(set(keys))


@pytest.fixture(scope="module")
def sources_of():
    return {
        "0.14.1": tree.python_sources(releases.pristine("0.14.1")),
        "0.14.1 patched": tree.python_sources(releases.patched("0.14.1")),
    }


def test_the_files_our_series_and_recipes_edit(sources_of, tmp_path):
    pristine = live.edited_by_us(sources_of["0.14.1"])
    patched = live.edited_by_us(sources_of["0.14.1 patched"])
    for ours in (pristine, patched):
        assert {OURS, "vllm/_ipex_ops.py", "vllm/_xpu_gemm_fakes.py"} <= ours
        # the negative control: the tree's own files that we do not touch
        assert (
            not {
                "vllm/model_executor/layers/layernorm.py",
                "vllm/model_executor/models/llama.py",
                ATTENTION,
            }
            & ours
        )
    # a downstream tree's module that makes an IPEX WOQ module: the recipe
    # path edits it wherever it is (0.14.0-like, llm-scaler 0a85564's shape)
    root = releases.copy_of("0.14.1", tmp_path / "tree")
    made = downstream.add_woq_module(root).relative_to(root).as_posix()
    assert made not in pristine
    assert made in live.edited_by_us(tree.python_sources(root))


def test_a_limit_of_a_release_and_every_later_one():
    """`and_later`: a limit a release brought (0.32.0 removed sequence
    parallelism) covers every later tree, so that a new pin needs no new
    entry; never an earlier tree, and without it only its own release."""
    later = limits.Limit("0.32.0", limits.ANY, "sp", REASON, "no sp", True)
    assert later.covers("0.32.0", "m", "sp")
    assert later.covers(releases.newest(), "m", "sp")
    assert later.covers(releases.newer_than_every_pin(), "m", "sp")
    assert not later.covers("0.31.0", "m", "sp")  # the control: earlier
    assert not later.covers(releases.newest(), "m", "default")
    assert not later.covers("", "m", "sp")  # a tree that cannot tell
    exact = limits.Limit("0.32.0", limits.ANY, "sp", REASON, "no sp")
    assert exact.covers("0.32.0", "m", "sp")
    assert not exact.covers(releases.newest(), "m", "sp")  # the control: exact only
    listed = [x for x in limits.load() if x.and_later]
    assert any(x.covers(releases.newest(), "qwen3_moe", "sp") for x in listed)


def test_a_cell_not_run_never_shows_a_listed_limit_gone():
    """A cell the proof did not run (its own limit, an entry for other
    trees) says nothing of a listed limit; the control: the same cell run
    and traced reports the limit gone."""
    for kind in (report.PROOF_LIMIT, report.NOT_FOR_THIS_TREE):
        cell = _cell(_classified(_found(kind, error="the proof's limit: sp off")))
        assert cell["result"] == kind and "limit_gone" not in cell, cell
    traced = _cell(_classified(_found("traced", error="")))
    assert traced["limit_gone"] == [REASON]


def test_a_limit_of_an_image_covers_its_tree_and_never_the_plain_release():
    """`image`: a limit of intel/llm-scaler's b18beee (built on 0.21.0)
    covers the tree whose own Python names the image's ESIMD package, and
    neither a plain 0.21.0 nor the fix's own module naming it (the
    controls), nor another release."""
    esimd = {"vllm/layers/esimd_fake_ops.py": "import custom_esimd_kernels_vllm"}
    plain = {"vllm/platforms/xpu.py": "class XPUPlatform: ..."}
    routing = {"vllm/_xpu_opaque_calls.py": "'custom_esimd_kernels_vllm::esimd_x'"}
    assert limits.image_of(plain | esimd, "0.21.0") == "b18beee"
    assert limits.image_of(plain, "0.21.0") == ""
    assert limits.image_of(plain | routing, "0.21.0") == ""
    assert limits.image_of(plain | esimd, "0.22.0") == ""
    assert limits.image_of(plain | esimd, "") == ""
    image = limits.Limit(
        "0.21.0", "deepseek_v2_fp8", "default", REASON, "MLA", image="b18beee"
    )
    assert image.covers("0.21.0", "deepseek_v2_fp8", "default", "b18beee")
    assert not image.covers("0.21.0", "deepseek_v2_fp8", "default")  # plain
    assert not image.covers("0.21.0", "deepseek_v2_fp8", "default", "0a85564")
    assert not image.covers("0.22.0", "deepseek_v2_fp8", "default", "b18beee")
    # a limit of the release covers the image's tree built on it too
    assert dataclasses.replace(image, image="").covers(
        "0.21.0", "deepseek_v2_fp8", "default", "b18beee"
    )
    on_image = limits.classify(_found("failed"), "0.21.0", set(), [image], "b18beee")
    assert _cell(on_image)["result"] == report.TREE_LIMIT
    on_plain = limits.classify(_found("failed"), "0.21.0", set(), [image])
    assert _cell(on_plain)["result"] == "failed"
