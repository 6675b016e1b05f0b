"""The catalog's entries for intel/llm-scaler's image 0.21.0-b3.1
(data/models.toml: qwen3_next_fp8, qwen3_next_fp8_fused_moe_off, gemma4_fp8,
gemma4_moe_fp8, gpt_oss_mxfp4; applies_to
its esimd_utils, so the other catalog trees run none of them) on the image's
own tree (support/images.py rebuilds it from ../shared/reference/images;
skipped without it, failing under CI), as it is and after `make apply`: each
stage one model process (runner.run_all, as `make audit MODEL=a,b,c`),
vLLM's default configuration, built with the image's transformers pin
(5.8.0: vLLM 0.21.0 cannot read Gemma 4's config with .venv-tree's 5.20.2),
compiled and eager compared at one token (NUMBERS=1: the decode path the
image's ESIMD fast paths take; the start-up's 2048 costs about a minute
more a stage and is measured in docs/traced-path.md).

What the image would do, cell by cell (docs/traced-path.md):

* Qwen3-Next traces whole at the start-up's 2048 tokens on both stages. At
  one token the compiled run raises unpatched at the ESIMD op
  esimd_gemv_fp8_pert_fused2, which has no fake (a lie the fix routes:
  the negative control of the patched stage); after apply compiled = eager,
  through the fused MoE kernel moe_ops::moe_forward_full, whose fake the
  fix gives it (KERNEL_FAKES) and whose CPU reference is
  proof/xpu/esimd_moe_kernels.py.
* Qwen3-Next with the image's fused MoE kernel off (DISABLE_ESIMD_MOE=1,
  the image's switch) is not staged here: its decode ops are
  qwen3_next_fp8's own, and its own process cost a minute of a worker
  (docs/traced-path.md has its cells, measured).
* Gemma 4 dense traces whole on both stages; at one token, unpatched, its
  compiled forward differs from eager (NaN: the image's ESIMD decode ops
  whose schemas hide their writes, dropped by functionalization); after
  apply compiled = eager (the fix's routed ops). The negative control of
  the patched stage is the unpatched one.
* Gemma 4 MoE fails at start-up unpatched, at
  moe_int4_prefill_ops::moe_prefill_gather_forward_v2 (no fake), reached by
  its expert-grouped ESIMD path; after apply it traces whole (the fix's
  fake of the gather), and at one token, through its fused fp8 decode
  kernel (moe_forward_full_gelu_tanh_decode), compiled = eager.
* gpt-oss traces whole on both, and compiled = eager on both (its MXFP4
  experts computed on the CPU: moe_kernels.py, tests/test_moe_mxfp4.py;
  no ESIMD op on its bfloat16 path).

Cost: two model processes (a stage's entries together); four, with the
own_process entry, took 169 s on 2 cores (load ~1.4), the tree and
transformers 5.8.0 cached."""

from pathlib import Path

import pytest
from test_do_no_harm import _b31_applied, _cached
from test_model_trace import TREE_PYTHON

from support import images
from xpufakes.proof import audit
from xpufakes.proof.model import models, runner
from xpufakes.proof.model import report as modelproof
from xpufakes.trees import tree

pytestmark = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)

# the image's pin (../shared/reference/images/llm-scaler-0.21.0-b3.1/Dockerfile)
TRANSFORMERS = "5.8.0"
B31_ENTRIES = [
    name
    for name, entry in models.load().items()
    if entry.applies_to.get("module") == "vllm.model_executor.layers.esimd_utils"
]
# the entries the stages run: all but qwen3_next_fp8_fused_moe_off, whose
# own process (DISABLE_ESIMD_MOE=1) costs a minute of a worker and whose
# decode ops qwen3_next_fp8 now reaches too, at one token, compiled = eager
# after apply (docs/traced-path.md keeps its measured table)
STAGED = [name for name in B31_ENTRIES if name != "qwen3_next_fp8_fused_moe_off"]
NO_FAKE = "Operator does not support running with fake tensors"


def _stage(root: Path) -> dict[str, dict]:
    kernels = audit.kernels_of(tree.locate(str(root)))
    found = runner.run_all(
        root,
        STAGED,
        kernels,
        "default",
        python=str(TREE_PYTHON),
        transformers=TRANSFORMERS,
        numbers="1",
    )
    return {m["model"]: m["configurations"][0] for m in found}


@pytest.fixture(scope="module")
def stages() -> dict[str, dict[str, dict]]:
    images.need(images.B31)
    return {
        "unpatched": _stage(images.b31_cached()),
        "applied": _stage(_cached("b31-applied", _b31_applied)),
    }


def _said(result: dict) -> str:
    """The error and Dynamo's whole message (which names the operator)."""
    return f"{result.get('error', '')} {result.get('message', '')}"


def _one_token(cell: dict) -> list[dict]:
    numbers = cell["numbers"]["cells"]
    assert {c["tokens"] for c in numbers} == {1}, numbers
    return numbers


def test_an_own_process_entry_runs_alone_where_it_may_apply(tmp_path):
    """runner.processes: qwen3_next_fp8_fused_moe_off (own_process: the
    image's esimd_utils.py reads DISABLE_ESIMD_MOE once, at import) gets a
    process of its own with its environment from the start, on a tree that
    has that module; on one without it (the catalog's other trees: the
    negative control) it stays with the others, costing no process."""
    chosen = ["qwen3_next_fp8", "qwen3_next_fp8_fused_moe_off", "gemma4_fp8"]
    without = tmp_path / "without"
    (without / "vllm" / "model_executor" / "layers").mkdir(parents=True)
    assert runner.processes(without, chosen) == [(chosen, {})]
    image = tmp_path / "image"
    (image / "vllm" / "model_executor" / "layers").mkdir(parents=True)
    (image / "vllm" / "model_executor" / "layers" / "esimd_utils.py").write_text("")
    assert runner.processes(image, chosen) == [
        (["qwen3_next_fp8", "gemma4_fp8"], {}),
        (["qwen3_next_fp8_fused_moe_off"], {"DISABLE_ESIMD_MOE": "1"}),
    ]


def test_the_entries_are_the_images():
    assert B31_ENTRIES == [
        "qwen3_next_fp8",
        "qwen3_next_fp8_fused_moe_off",
        "gemma4_fp8",
        "gemma4_moe_fp8",
        "gpt_oss_mxfp4",
    ]


def test_qwen3_next_decode_has_no_fake_before_apply_and_agrees_after(stages):
    for stage, found in stages.items():
        cell = found["qwen3_next_fp8"]
        assert cell["result"] == "traced", (stage, cell)
        assert (cell["graphs"], cell["graph_breaks"]) == (1, 0), (stage, cell)
        for run in _one_token(cell):
            if stage == "unpatched":
                assert run["result"] == modelproof.NUMBERS_RAISED, (stage, run)
                assert NO_FAKE in run["error"], (stage, run)
                assert "esimd_gemv_fp8_pert_fused2" in _said(run), (stage, run)
            else:  # the fused MoE kernel, faked by the fix (KERNEL_FAKES)
                assert run["result"] == modelproof.NUMBERS_EQUAL, (stage, run)
                assert run["difference"] <= 0.02 * run["largest"], run


def test_gemma4_dense_decode_differs_before_apply_and_agrees_after(stages):
    for stage, found in stages.items():
        cell = found["gemma4_fp8"]
        assert cell["result"] == "traced", (stage, cell)
        assert (cell["graphs"], cell["graph_breaks"]) == (1, 0), (stage, cell)
        runs = _one_token(cell)
        assert {r["backend"] for r in runs} == {"aot_eager", "inductor"}, runs
        for run in runs:
            if stage == "unpatched":
                assert run["result"] == modelproof.NUMBERS_DIFFERENT, (stage, run)
                assert run["difference"] != run["difference"], run  # NaN
            else:
                assert run["result"] == modelproof.NUMBERS_EQUAL, (stage, run)
                assert run["difference"] <= 0.02 * run["largest"], run


def test_gemma4_moe_fails_at_start_up_before_apply_and_traces_after(stages):
    unpatched = stages["unpatched"]["gemma4_moe_fp8"]
    assert unpatched["result"] == "failed", unpatched
    assert NO_FAKE in unpatched["error"], unpatched
    assert "moe_prefill_gather_forward_v2" in _said(unpatched), unpatched
    # the fix's fake of the gather: the grouped path traces at 2048 tokens
    applied = stages["applied"]["gemma4_moe_fp8"]
    assert applied["result"] == "traced", applied
    assert (applied["graphs"], applied["graph_breaks"]) == (1, 0), applied
    # at one token: the fused fp8 decode kernel (faked by the tree, its CPU
    # reference proof/xpu/esimd_moe_kernels.py) in the graph, and compiled
    # = eager
    for run in _one_token(applied):
        assert run["result"] == modelproof.NUMBERS_EQUAL, run
        assert run["difference"] <= 0.02 * run["largest"], run
        assert "moe_ops::moe_forward_full_gelu_tanh_decode" in run["ops"], run


def test_gpt_oss_traces_whole_and_compiled_is_eager(stages):
    for stage, found in stages.items():
        cell = found["gpt_oss_mxfp4"]
        assert cell["result"] == "traced", (stage, cell)
        assert (cell["graphs"], cell["graph_breaks"]) == (1, 0), (stage, cell)
        for run in _one_token(cell):
            assert run["result"] == modelproof.NUMBERS_EQUAL, (stage, run)
            assert run["difference"] <= 0.02 * run["largest"], run
