"""The whole-model proof on a vllm-xpu-kernels-era release (issue 33, item 1):
the models are built with vllm-xpu-kernels' `_C` activations, norms and
rotary embedding as the tree's kernels release registers them
(data/xpu_kernels_c.toml: CPU kernels, no fake of their own), and a cell
the tree itself cannot run on XPU is the tree's limit where
data/limits.toml lists its error exactly.

On 0.16.0 (vllm-xpu-kernels 0.1.2), unpatched:

  qwen3_w4a16   compressed-tensors int4: CompressedTensorsLinearMethod on
                XPUwNa16LinearKernel (`_xpu_C::int4_gemm_w4a16`), traced whole
  qwen3_moe     online fp8 (`_xpu_C::fp8_gemm_w8a16`), traced whole
  qwen3_awq     the tree's limit: 0.16.0 runs AWQ on XPU with
                AWQLinearMethod, which at the start-up's batch (256 tokens
                or more) calls `_C::awq_dequantize`, and below it
                `_C::awq_gemm`: the kernels lack both
  qwen2_gptq    the tree's limit: GPTQLinearMethod calls `_C::gptq_shuffle`
                while it processes the weights
  deepseek_v2_fp8  the tree's limit: its MLA backend needs vllm_flash_attn
  sp            the proof's limit: 0.16.0's VllmConfig turns sequence
                parallelism off at TP=1, and the proof runs one process

vLLM's own fakes for the two GEMMs suffice for these traces (the unpatched
tree traces whole: issue 33 item 4's question, answered for these models).
The negative control: the same tree with vLLM's two fake registrations
taken out fails each GEMM path with "Operator does not support running with
fake tensors", at the tree's own apply.
"""

import pytest
from test_model_trace import NO_FAKE, TREE_PYTHON, traces

from support import releases
from xpufakes.proof.model import report as modelproof
from xpufakes.proof.xpu import xpu_kernels

pytestmark = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)

KERNELS_ERA = "0.16.0"
MODELS = ["qwen3_w4a16", "qwen3_moe", "qwen3_awq", "qwen2_gptq", "deepseek_v2_fp8"]
# the tree's limits these meet (data/limits.toml's, each named by its test
# here: tests/test_catalog_records.py), exactly as the cells say them
LIMITS = {
    "qwen3_awq": "AttributeError: '_OpNamespace' '_C' object has no attribute "
    "'awq_dequantize'",
    "qwen2_gptq": "AttributeError: '_OpNamespace' '_C' object has no attribute "
    "'gptq_shuffle'",
    "deepseek_v2_fp8": "RuntimeError: MLA attention requires FlashAttention but it "
    "is not available. Please install flash_attn or use --attention-backend "
    "ROCM_AITER_MLA.",
}
# 0.16.0's vllm/_xpu_ops.py registers its fakes under these guards
FAKE_GUARDS = (
    'if hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"):',
    'if hasattr(torch.ops._xpu_C, "int4_gemm_w4a16"):',
)


def sp_is_the_proofs_limit(result: dict) -> None:
    """Never the tree's: its workers run sp at TP > 1."""
    assert result["result"] == modelproof.PROOF_LIMIT, result
    assert "turned enable_sp off" in result["error"], result
    assert modelproof.cell(result).startswith("the proof's limit (TP=1): ")


def test_kernels_era_int4_and_fp8_trace_whole_and_fail_without_vllms_fakes(
    tmp_path,
):
    found = traces(releases.pristine(KERNELS_ERA), tmp_path, MODELS)
    w4a16, moe, awq = (found[m] for m in MODELS[:3])
    assert w4a16["default"]["result"] == "traced", w4a16["default"]
    # 2 layers x (qkv, o, gate_up, down), on the XPU int4 kernel
    assert w4a16["default"]["methods"]["CompressedTensorsLinearMethod"] == 8
    assert "_xpu_C::int4_gemm_w4a16" in w4a16["default"]["ops"]
    assert moe["default"]["result"] == "traced", moe["default"]
    assert "_xpu_C::fp8_gemm_w8a16" in moe["default"]["ops"]
    # the start-up's 2048 tokens take AWQ's dequantize-and-matmul branch
    # (x.shape[:-1].numel() >= 256 in awq.py); 7 tokens took awq_gemm
    for model, reason in LIMITS.items():
        cell = found[model]["default"]
        assert cell["result"] == modelproof.TREE_LIMIT, cell
        assert cell["error"] == reason, cell
    assert "vllm-xpu-kernels 0.1.2" in awq["default"]["limit"]
    for model in found.values():
        sp_is_the_proofs_limit(model["sp"])
    assert not modelproof.failing(
        {"configurations": [w4a16["default"], awq["default"], awq["sp"]]}
    )

    # the negative control: without vLLM's fakes of the two GEMMs
    without = traces(
        without_fakes(KERNELS_ERA, tmp_path / "no-fakes"), tmp_path, MODELS[:2]
    )
    for model, op in (("qwen3_w4a16", "int4_gemm_w4a16"), ("qwen3_moe", None)):
        result = without[model]["default"]
        assert result["result"] == "failed", result
        assert result["error"] == NO_FAKE, result
        if op:
            assert f"_xpu_C.{op}" in modelproof.cell(result), result


# The newest pin's MLA and GPTQ, with and without vLLM's fakes
# (without_fakes): tests/test_model_catalog.py, which traces every model there.


def without_fakes(version: str, destination, guards=FAKE_GUARDS):
    """A copy of the release whose vllm/_xpu_ops.py registers no fake for
    fp8_gemm_w8a16 and int4_gemm_w4a16 (a negative control)."""
    root = releases.copy_of(version, destination)
    ops = root / "vllm" / "_xpu_ops.py"
    text = ops.read_text()
    for guard in guards:
        assert guard in text
        text = text.replace(guard, "if False:")
    ops.write_text(text)
    return root


def test_the_kernels_c_schemas_are_the_releases():
    """Each release gets the schemas its csrc/torch_bindings.cpp defines
    (read at the tags): 0.1.2 declares silu_and_mul's input and rms_norm's
    weight mutated, 0.1.6 stopped, 0.1.12 made the norms' weight optional."""
    old = xpu_kernels.xpu_kernels_c_schemas("vllm-xpu-kernels 0.1.2")
    assert old["silu_and_mul"] == "silu_and_mul(Tensor! out, Tensor! input) -> ()"
    assert old["rms_norm"] == (
        "rms_norm(Tensor! result, Tensor! input, Tensor! weight, float epsilon) -> ()"
    )
    assert "rms_norm_static_fp8_quant" not in old  # since 0.1.6
    new = xpu_kernels.xpu_kernels_c_schemas("vllm-xpu-kernels 0.1.15.4")
    assert new["silu_and_mul"] == "silu_and_mul(Tensor! result, Tensor input) -> ()"
    assert new["rms_norm"] == (
        "rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()"
    )
    assert xpu_kernels.xpu_kernels_c_schemas("intel-extension-for-pytorch 2.8.10") == {}
    assert xpu_kernels.xpu_kernels_c_has("vllm-xpu-kernels 0.1.2", "awq_gemm") is False
    assert xpu_kernels.xpu_kernels_c_has("vllm-xpu-kernels 0.1.2", "rms_norm") is True
    has = xpu_kernels.xpu_kernels_c_has
    assert has("vllm-xpu-kernels 0.1.5", "situ_and_mul") is False
    assert xpu_kernels.xpu_kernels_c_has("vllm-xpu-kernels 0.1.13", "situ_and_mul")
    assert has("intel-extension-for-pytorch 2.8.10", "x") is None


def test_the_trees_limit_is_its_own_cell_and_no_failure():
    limit = {
        "configuration": "sp",
        "result": modelproof.TREE_LIMIT,
        "error": "ValidationError: 1 validation error for CompilationConfig: "
        "pass_config.enable_sp Unexpected keyword argument",
        "limit": "the tree has no sequence parallelism",
        "where": [],
        "graphs": 0,
        "graph_breaks": 0,
        "ops": [],
    }
    traced = {"configuration": "default", "result": "traced", "graphs": 1}
    traced["graph_breaks"] = 0
    model = {"model": "m", "configurations": [traced, limit]}
    assert not modelproof.failing(model)
    # what it means, then vLLM's words; in the table what it means only
    assert modelproof.cell(limit) == (
        f"the tree's limit: the tree has no sequence parallelism ({limit['error']})"
    )
    table = modelproof.matrix([model])
    assert "1 of 2 traced whole; 1 excused as the tree's limit" in table
    assert "| the tree's limit: the tree has no sequence parallelism\n" in table
    # the control: the same cell not built is a failure
    broken = dict(limit, result="not built")
    assert modelproof.failing({"model": "m", "configurations": [traced, broken]})
    table = modelproof.matrix([{"model": "m", "configurations": [traced, broken]}])
    assert "| the tree's limit" not in table
    assert "1 of 2 traced whole; 0 excused as the tree's limit" in table
