"""The whole catalog (data/models.toml, issue 33 items 2 and 6): every model
traced on a tree of each era, unpatched and patched, in one model process
per tree. Slow (2 min 34 s on 2 cores, load average ~3), so not in `make test` (which
runs the representative subset: test_model_trace.py,
test_model_trace_kernels.py); run it with

    XPUFAKES_CATALOG=1 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        tests/test_model_catalog.py

What it holds:

* b6-like tree (the report's image, rebuilt on 0.14.1): unpatched, every
  model the tree can run fails (the negative control); patched, every one
  traces whole. DeepSeek-V2's MLA is the tree's limit on both (its XPU
  platform gives MLA a FlashAttention backend; data/limits.toml), llm-scaler's
  sym_int4 entry and the block-fp8 ones are not for this tree.
* the newest pin (releases.newest()): unpatched and patched, every model
  traces whole (vLLM's own fakes suffice there); the negative control is
  the tree without vLLM's fp8_gemm_w8a16 / int4_gemm_w4a16 fakes, where
  every quantized model fails. sp is the tree's limit (no sequence
  parallelism: vLLM refuses the setting).
* every configuration of every model takes at most 30 s to build and trace.
"""

import os

import pytest
from test_model_trace import NO_FAKE, TREE_PYTHON, traces
from test_model_trace_kernels import without_fakes

from support import downstream, releases, tool
from xpufakes.proof.model import models
from xpufakes.proof.model import report as modelproof

pytestmark = [
    pytest.mark.skipif(
        not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
    ),
    pytest.mark.skipif(
        not os.environ.get("XPUFAKES_CATALOG"),
        reason="the whole catalog is slow: XPUFAKES_CATALOG=1 runs it",
    ),
]

ALL = list(models.load())
LIMIT_OR_ELSEWHERE = (
    modelproof.TREE_LIMIT,
    modelproof.PROOF_LIMIT,
    modelproof.NOT_FOR_THIS_TREE,
)
SECONDS = 30
# block-fp8 checkpoints: for the vllm-xpu-kernels era only (models.toml
# applies_to; the IPEX era's fp8 method has no block-fp8 path)
BLOCK_FP8 = ("qwen3_fp8_block", "deepseek_v2_fp8_block")


def every_cell(found: dict):
    for name, results in found.items():
        for configuration in ("default", "sp"):
            yield name, configuration, results[configuration]


def in_time(found: dict) -> None:
    for name, configuration, result in every_cell(found):
        assert result.get("seconds", 0) <= SECONDS, (name, configuration, result)


def whole(found: dict) -> None:
    """Every cell traced whole, or the tree's limit / not for this tree."""
    for name, configuration, result in every_cell(found):
        if result["result"] in LIMIT_OR_ELSEWHERE:
            continue
        assert result["result"] == "traced", (name, configuration, result)
        assert result["graphs"] == 1 and result["graph_breaks"] == 0, result


def test_the_catalog_on_the_b6_like_tree(tmp_path):
    root = downstream.b6_like(tmp_path / "tree")
    before = traces(root, tmp_path, ALL)
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    after = traces(root, tmp_path, ALL)
    for found in (before, after):
        in_time(found)
        assert found["deepseek_v2_fp8"]["default"]["result"] == modelproof.TREE_LIMIT
        assert "'q_lora_rank'" in found["deepseek_v2_fp8"]["default"]["error"]
        for name in ("qwen3_sym_int4", *BLOCK_FP8):
            elsewhere = found[name]["default"]
            assert elsewhere["result"] == modelproof.NOT_FOR_THIS_TREE, elsewhere
    whole(after)
    ran = 0
    for name, configuration, result in every_cell(before):
        if result["result"] in LIMIT_OR_ELSEWHERE:
            continue
        assert result["result"] == "failed", (name, configuration, result)
        ran += 1
    assert ran == 2 * (len(ALL) - 2 - len(BLOCK_FP8))


def test_the_catalog_on_the_newest_pin(tmp_path):
    version = releases.newest()
    pristine = traces(releases.pristine(version), tmp_path, ALL)
    patched_root = releases.copy_of(version, tmp_path / "patched")
    applied = tool.run("apply", str(patched_root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    patched = traces(patched_root, tmp_path, ALL)
    for found in (pristine, patched):
        in_time(found)
        whole(found)
        for name, _, result in every_cell(found):
            if name != "qwen3_sym_int4" and result["configuration"] == "sp":
                assert result["result"] == modelproof.TREE_LIMIT, (name, result)
        traced = [n for n in ALL if found[n]["default"]["result"] == "traced"]
        assert traced == [n for n in ALL if n != "qwen3_sym_int4"], traced
    # the negative control: without vLLM's two GEMM fakes, every quantized
    # model fails at its GEMM
    without = traces(without_fakes(version, tmp_path / "no-fakes"), tmp_path, ALL)
    for name in ALL:
        result = without[name]["default"]
        if name == "qwen3_sym_int4":
            continue
        assert result["result"] == "failed", (name, result)
        assert result["error"] == NO_FAKE, (name, result)
