"""The whole catalog (data/models.toml) in `make test`: every model, under
each configuration, traced on three trees, each stage of a tree in one
model process (`make audit MODEL=all`'s runner.run_all, its cells classified
by data/limits.toml), the tree's static part (its stand-in kernels, the
files our series edits) found once per stage:

* b6-like (the report's image, rebuilt on 0.14.1: support/downstream.py)
  and plain 0.14.1 (the IPEX era's pinned release): unpatched, every cell
  the tree can run fails at an XPU call (the negative control); patched,
  every one traces whole (1 graph, 0 graph breaks). DeepSeek-V2's MLA is
  the tree's limit on both stages (data/limits.toml), llm-scaler's
  sym_int4 entry and the block-fp8 ones (the IPEX era's fp8 has no
  block-fp8 path) are not for these trees.
* the newest pin (releases.newest(), the kernels era): unpatched and
  patched, every model traces whole (vLLM's own fakes suffice there); the
  negative control is the tree without vLLM's fp8_gemm_w8a16 /
  int4_gemm_w4a16 fakes, where every quantized model fails at its GEMM.
  sp is the tree's limit (0.32.0 removed sequence parallelism: vLLM
  refuses the setting).
* every cell takes at most SECONDS to build and trace, and every result is
  the recorded run's (data/catalog_run.json, from which docs/traced-path.md's
  tables are written: proof/model/catalog.py): a change of any cell fails
  here until `make catalog` records it again.

The trees run on pytest-xdist's workers side by side (one module-scoped
fixture per tree: conftest.py groups its tests). Cost: docs/testing.md.
The real llm-scaler trees stay opt-in (tests/test_llm_scaler_trees.py).
"""

import os
import time
from pathlib import Path

import pytest
from test_model_trace import NO_FAKE, TREE_PYTHON
from test_model_trace_kernels import without_fakes

from support import downstream, releases, tool
from xpufakes.proof import audit
from xpufakes.proof.model import catalog, limits, models, runner
from xpufakes.proof.model import report as modelproof
from xpufakes.trees import tree

pytestmark = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)

ALL = list(models.load())
ELSEWHERE = (modelproof.TREE_LIMIT, modelproof.NOT_FOR_THIS_TREE)
# a cell's build and trace, at most (measured: docs/traced-path.md's tables)
SECONDS = 20
# `make catalog`: each tree's stages written here, for catalog.py to record
RECORDING = os.environ.get("XPUFAKES_CATALOG_RECORD", "")

B6 = f"b6-like ({downstream.B6_BASE})"
IPEX = "0.14.1"
NEWEST = releases.newest()
TREES = (B6, IPEX, NEWEST)
# block-fp8 checkpoints: for the vllm-xpu-kernels era only (models.toml
# applies_to; the IPEX era's fp8 method has no block-fp8 path)
BLOCK_FP8 = ("qwen3_fp8_block", "deepseek_v2_fp8_block")
# the entries for intel/llm-scaler's image trees only (applies_to a module
# these trees do not have: llm-scaler 0.21.0-b3.1's Qwen3-Next, Gemma 4 and
# gpt-oss; tests/test_model_catalog_b31.py runs them there)
IMAGE_ONLY = tuple(
    name for name, entry in models.load().items() if "module" in entry.applies_to
)


def run(name: str, stage: str, root: Path) -> dict[str, dict[str, dict]]:
    """Every model of the catalog on the tree, in one process: model ->
    configuration -> its classified cell (as `make audit MODEL=all`)."""
    start = time.monotonic()
    kernels = audit.kernels_of(tree.locate(str(root)))
    found = runner.run_all(root, ALL, kernels, "default,sp", python=str(TREE_PYTHON))
    seconds = time.monotonic() - start
    assert [m["model"] for m in found] == ALL
    if RECORDING:
        catalog.record_stage(
            Path(RECORDING),
            name,
            stage,
            found,
            seconds,
            TREES.index(name),
            limits.keys_of(root),
        )
    return {
        m["model"]: {c["configuration"]: c for c in m["configurations"]} for m in found
    } | {"__seconds__": seconds, "__found__": found}


@pytest.fixture(scope="module", params=TREES)
def traced(request, tmp_path_factory) -> tuple[str, dict[str, dict]]:
    """(tree, stage -> run's result), the stages traced one after another."""
    name = request.param
    work = tmp_path_factory.mktemp("catalog")
    if name == B6:
        root = downstream.b6_like(work / "tree")
        unpatched = run(name, "unpatched", root)
        applied = tool.run("apply", str(root), "--no-proof")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        return name, {"unpatched": unpatched, "patched": run(name, "patched", root)}
    stages = {
        "unpatched": run(name, "unpatched", releases.pristine(name)),
        "patched": run(name, "patched", releases.patched(name)),
    }
    if name == NEWEST:
        stage = "without vLLM's GEMM fakes"
        stages[stage] = run(name, stage, without_fakes(name, work / "no-fakes"))
    return name, stages


def cells(found: dict):
    for model in ALL:
        for configuration, cell in found[model].items():
            yield model, configuration, cell


def test_every_cell_in_time(traced):
    _, stages = traced
    for found in stages.values():
        for model, configuration, cell in cells(found):
            assert cell.get("seconds", 0) <= SECONDS, (model, configuration, cell)


def test_unpatched_the_ipex_era_fails_at_an_xpu_call(traced):
    """The negative control of the patched stage: on the IPEX era every
    cell the tree can run fails, at a call Dynamo cannot trace under fake
    tensors (an op with no fake, a pybind11 function)."""
    name, stages = traced
    if name == NEWEST:
        pytest.skip("the kernels era's negative control: without vLLM's fakes")
    ran = 0
    for model, configuration, cell in cells(stages["unpatched"]):
        if cell["result"] in ELSEWHERE:
            continue
        assert cell["result"] == "failed", (model, configuration, cell)
        assert catalog.word(cell).startswith("fails at `"), cell
        ran += 1
    # every model but MLA (the tree's limit), sym_int4, block fp8 and the
    # image trees' entries (not for it)
    assert ran == 2 * (len(ALL) - 2 - len(BLOCK_FP8) - len(IMAGE_ONLY)), ran


def test_patched_every_model_traces_whole(traced):
    name, stages = traced
    for stage in ("unpatched", "patched") if name == NEWEST else ("patched",):
        for model, configuration, cell in cells(stages[stage]):
            if cell["result"] in ELSEWHERE:
                continue
            assert cell["result"] == "traced", (stage, model, configuration, cell)
            assert cell["graphs"] == 1 and cell["graph_breaks"] == 0, cell
        assert not any(modelproof.failing(m) for m in stages[stage]["__found__"]), stage


def test_the_trees_limits_and_the_entries_for_other_trees(traced):
    name, stages = traced
    for found in stages.values():
        sym_int4 = found["qwen3_sym_int4"]["default"]
        assert sym_int4["result"] == modelproof.NOT_FOR_THIS_TREE, sym_int4
        mla = found["deepseek_v2_fp8"]["default"]
        for model in IMAGE_ONLY:
            for cell in found[model].values():
                assert cell["result"] == modelproof.NOT_FOR_THIS_TREE, (model, cell)
                assert "vllm.model_executor.layers.esimd_utils" in cell["error"], cell
        if name == NEWEST:
            continue
        for model in BLOCK_FP8:
            block = found[model]["default"]
            assert block["result"] == modelproof.NOT_FOR_THIS_TREE, (model, block)
        assert mla["result"] == modelproof.TREE_LIMIT, mla
        assert "'q_lora_rank'" in mla["error"], mla
    if name == NEWEST:
        for stage in ("unpatched", "patched"):
            for model, configuration, cell in cells(stages[stage]):
                if model == "qwen3_sym_int4" or model in IMAGE_ONLY:
                    continue
                if configuration == "sp":
                    assert cell["result"] == modelproof.TREE_LIMIT, (model, cell)
                    assert "enable_sp Unexpected keyword" in cell["error"], cell
                else:
                    assert cell["result"] == "traced", (model, cell)


def test_the_newest_pin_without_vllms_fakes_fails_at_each_gemm(traced):
    """The kernels era's negative control: every quantized model fails at
    its GEMM, which has no fake then; but the block-fp8 ones, whose GEMM is
    not one of those two (vLLM's block-scaled path), and trace."""
    name, stages = traced
    if name != NEWEST:
        pytest.skip("the IPEX era's negative control is its unpatched tree")
    without = stages["without vLLM's GEMM fakes"]
    for model in ALL:
        cell = without[model]["default"]
        if model == "qwen3_sym_int4" or model in IMAGE_ONLY:
            continue
        if model in BLOCK_FP8:
            assert cell["result"] == "traced", (model, cell)
            assert not any("_gemm_w" in op for op in cell["ops"]), cell["ops"]
            continue
        assert cell["result"] == "failed", (model, cell)
        assert cell["error"] == NO_FAKE, (model, cell)
        assert "_xpu_C." in catalog.word(cell), cell


def test_the_recorded_run_is_what_the_tree_gives(traced):
    """docs/traced-path.md's tables are written from data/catalog_run.json
    (tests/test_catalog_tables.py); here that run is checked against the
    tree: every cell's result and words."""
    name, stages = traced
    if RECORDING:
        pytest.skip("recording this run (make catalog)")
    recorded = catalog.load()["trees"]
    assert name in recorded, (
        f"the recorded run has no tree {name} (`make catalog` records it)"
    )
    live = {s: catalog.cells(found["__found__"]) for s, found in stages.items()}
    differ = catalog.disagreements(live, recorded[name])
    assert not differ, (
        f"{name}: the recorded run (data/catalog_run.json) is not what the "
        "tree gives; `make catalog` records it again: " + "; ".join(differ)
    )


def test_the_newest_pins_mla_and_gptq_on_the_xpu_paths(traced):
    """The newest pin runs MLA on XPU (its Triton MLA backend, inside vLLM's
    opaque vllm::unified_mla_attention_with_output) and GPTQ on the XPU
    int4 kernel (AutoGPTQLinearMethod on XPUwNa16LinearKernel); without
    vLLM's fakes each fails at its own GEMM (fp8, int4)."""
    name, stages = traced
    if name != NEWEST:
        pytest.skip("the newest pin's paths")
    mla = stages["unpatched"]["deepseek_v2_fp8"]["default"]
    gptq = stages["unpatched"]["qwen2_gptq"]["default"]
    assert "vllm::unified_mla_attention_with_output (writes carried)" in mla["ops"]
    assert "_xpu_C::fp8_gemm_w8a16" in mla["ops"], mla["ops"]
    assert gptq["methods"]["AutoGPTQLinearMethod"] == 8, gptq["methods"]
    assert "_xpu_C::int4_gemm_w4a16" in gptq["ops"], gptq["ops"]
    without = stages["without vLLM's GEMM fakes"]
    for model, op in (("deepseek_v2_fp8", "fp8"), ("qwen2_gptq", "int4")):
        said = catalog.word(without[model]["default"])
        assert said.startswith(f"fails at `_xpu_C.{op}_gemm_w"), said
