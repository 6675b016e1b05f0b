"""The whole-model proof (scripts/xpufakes/proof/model): the report's model,
the text model of Qwen3-VL-MoE at a tiny size (2 layers, 4 experts,
interleaved MRoPE, online fp8: data/models.toml), built from the tree's own
model module on the XPU platform's paths (XPUFp8LinearMethod,
XPUFp8MoEMethod, vLLM's CustomOp dispatch, attention and MoE in vLLM's
opaque ops) and traced through vLLM's own @support_torch_compile
(fullgraph) with a backend that functionalizes the graph and stops.

On a b6-like tree (support/downstream.py: 0.14.1 edited as intel/llm-scaler
b5571c3 edits 0.10.2; the real trees are tests/test_llm_scaler_trees.py),
each stage gives the issue's result, under vLLM's default compile
configuration and with sequence parallelism (which turns +rms_norm on):

  unpatched           fails with the report's error (fp8_gemm_w8a16 has no
                      fake); with sp, at the pybind11 vllm._C.ops.rms_norm
                      (the first layer norm runs before the first GEMM)
  GEMM fakes only     fails at the pybind11 vllm._C.ops.rotary_embedding
                      (MRoPE's forward_native -> forward_xpu)
  full fix            traces whole: one graph, 0 graph breaks, the image's
                      kernels as custom ops whose writes functionalization
                      carries
  full fix, a wrong   'writes lost': the wrapper of rotary_embedding that
  wrapper             declares no mutation is dropped from the graph

The unpatched and GEMM-only stages are the negative controls of the full
fix; the wrong wrapper is the control of 'writes lost'. The full fix and
the wrong wrapper run through `make audit MODEL=qwen3_vl_moe` (its exit
status: 0, then 1 with the rest of the audit clean). One model process per
tree (registrations are process-global), both configurations in it.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from support import downstream, releases, tool
from support import plugin as plugin_support
from xpufakes.changes import live, ourlines
from xpufakes.common import paths
from xpufakes.common.errors import Refusal
from xpufakes.proof import audit
from xpufakes.proof.model import limits
from xpufakes.proof.model import report as model_report
from xpufakes.proof.model import runner as model_runner
from xpufakes.trees import tree

TREE_PYTHON = paths.REPO / ".venv-tree" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)

MODEL = "qwen3_vl_moe"


def trace(root, tmp_path, model: str = MODEL, plugin=None) -> dict[str, dict]:
    """configuration -> modeltrace's result for it. (Nothing is written to
    the tree: the cached trees of the releases are shared.) With `plugin`
    (the directory it is installed in): the results without it, then with
    its register(), in one process; 'without plugin' and 'plugin' keys."""
    return traces(root, tmp_path, [model], plugin)[model]


def traces(root, tmp_path, models: list[str], plugin=None) -> dict[str, dict]:
    """model -> trace()'s result for it, the models traced in one process,
    each cell classified by the tree's listed limits as `make audit` does
    (data/limits.toml)."""
    out = tmp_path / "model.json"
    kernels = audit.kernels_of(tree.locate(str(root)))
    extra = ["--plugin", str(plugin), "--without-plugin-first"] if plugin else []
    done = subprocess.run(
        [
            str(TREE_PYTHON),
            "-m",
            "xpufakes.proof.model.cli",
            str(root),
            ",".join(models),
            str(out),
        ]
        + ["--standins", kernels, "--configurations", "default,sp", *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS), PYTHONDONTWRITEBYTECODE="1"),
    )
    assert done.returncode == 0 and out.is_file(), done.stderr[-3000:]
    found = limits.classify_tree(json.loads(out.read_text())["models"], root)
    assert [m["model"] for m in found] == models
    every = {}
    for model in found:
        results = {c["configuration"]: c for c in model["configurations"]}
        if plugin:
            results["plugin"] = model["plugin"]
            results["without plugin"] = {
                c["configuration"]: c for c in model["without_plugin"]
            }
        every[model["model"]] = results
    return every


def audited(root) -> tuple[int, dict]:
    """`make audit VLLM=root MODEL=qwen3_vl_moe ARGS=--json`: its exit
    status and report."""
    done = subprocess.run(
        [str(TREE_PYTHON), "-m", "xpufakes", "audit", str(root)]
        + ["--model", MODEL, "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS)),
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{\n") :])
    assert report["model"]["model"] == MODEL
    return done.returncode, report


def on_the_xpu_paths(result: dict) -> None:
    """What vLLM chose for the XPU platform: its fp8 methods, the MRoPE's
    forward_native (custom ops off with Inductor), RMSNorm's forward_xpu
    where sequence parallelism turns +rms_norm on."""
    assert result["methods"]["XPUFp8LinearMethod"] > 0, result["methods"]
    assert result["methods"]["XPUFp8MoEMethod"] == 2, result["methods"]
    assert result["forwards"]["MRotaryEmbedding"] == "forward_native"
    sp = result["configuration"] == "sp"
    assert ("+rms_norm" in result["custom_ops"]) == sp, result["custom_ops"]
    assert result["forwards"]["RMSNorm"] == ("forward_xpu" if sp else "forward_native")


NO_FAKE = "Unsupported: Operator does not support running with fake tensors"

# The IPEX era's int4 (issue 33): Qwen3, int4 AWQ from its checkpoint's
# quantization_config, float16; vLLM runs it as its deprecated "ipex" method
# (allowed, as a user allows it on 0.14), IPEXAWQLinearMethod, which makes
# IPEX's WOQ linear module while loading (the reference one: its forward
# calls the torch_ipex WOQ ops, CompositeImplicitAutograd kernels that read
# the tensors' data, as IPEX's XPU build registers them). Before the WOQ
# stand-in was given to the trace, the model was not built at all ("no IPEX
# WOQ linear stand-in was given").
AWQ = "qwen3_awq"


def unpatched_int4_fails(results: dict) -> None:
    """Unpatched: built (IPEXAWQLinearMethod on every linear layer, in
    float16), its trace fails at the WOQ module's op under fake tensors."""
    for configuration, result in results.items():
        assert result["result"] == "failed", result
        # 2 layers x (qkv, o, gate_up, down)
        assert result["methods"]["IPEXAWQLinearMethod"] == 8, result["methods"]
        if configuration == "default":  # sp stops at the norm first
            assert result["error"].startswith("TorchRuntimeError: "), result
            assert "(torch_ipex.mm_int4)" in model_report.cell(result), result
            assert result["where"][-2].startswith(
                "vllm/model_executor/layers/quantization/ipex_quant.py:"
            ), result["where"]


PYBIND11 = (
    "Attempted to call function marked as skipped Explanation: Dynamo does not "
    "know how to trace the builtin `vllm._C.ops.PyCapsule.{}.`"
)


def test_unpatched_b6_like_tree_fails_with_the_reports_error(tmp_path):
    root = downstream.b6_like(tmp_path / "tree")
    every = traces(root, tmp_path, [MODEL, AWQ])
    unpatched_int4_fails(every[AWQ])
    results = every[MODEL]
    default, sp = results["default"], results["sp"]
    for result in results.values():
        on_the_xpu_paths(result)
        assert result["result"] == "failed" and result["graphs"] == 0, result
    assert default["error"] == NO_FAKE, default
    assert "unsupported operator: torch_ipex.fp8_gemm_w8a16" in default["message"]
    assert default["where"][-1].startswith(
        "vllm/model_executor/layers/quantization/ipex_quant.py:"
    ), default["where"]
    assert default["where"][-1].endswith(" apply"), default["where"]
    assert PYBIND11.format("rms_norm") in sp["message"], sp
    assert sp["where"][-2].startswith("vllm/model_executor/layers/layernorm.py:")


def test_gemm_fakes_only_fails_at_the_rotary_call(tmp_path):
    root = downstream.b6_like(tmp_path / "tree")
    applied = tool.run("apply", str(root), "--patches", "0001 0002", "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    results = trace(root, tmp_path)
    default, sp = results["default"], results["sp"]
    for result in results.values():
        on_the_xpu_paths(result)
        assert result["result"] == "failed" and result["graphs"] == 0, result
    assert PYBIND11.format("rotary_embedding") in default["message"], default
    assert [w.rsplit(" ", 1)[1] for w in default["where"][-3:]] == [
        "forward_native",
        "forward_xpu",
        "rotary_embedding",
    ], default["where"]
    assert default["where"][-3].startswith(
        "vllm/model_executor/layers/rotary_embedding/mrope.py:"
    )
    assert default["where"][-1].startswith("vllm/_ipex_ops.py:")
    # sequence parallelism reaches the pybind11 norm first
    assert PYBIND11.format("rms_norm") in sp["message"], sp


IMAGE_KERNELS = {
    "default": {"vllm::xpu_c_rotary_embedding (writes carried)"},
    "sp": {
        "vllm::xpu_c_rotary_embedding (writes carried)",
        "vllm::xpu_c_rms_norm (writes carried)",
        "vllm::xpu_c_fused_add_rms_norm (writes carried)",
    },
}
OPAQUE = {
    "torch_ipex::fp8_gemm_w8a16",
    "vllm::moe_forward (writes carried)",
    "vllm::unified_attention_with_output (writes carried)",
}


def test_full_fix_traces_the_whole_model_with_no_graph_break(tmp_path):
    """Through `make audit MODEL=qwen3_vl_moe`, which exits 0 only when the
    static search finds no untraceable call and every configuration traces."""
    root = downstream.b6_like(tmp_path / "tree")
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    status, report = audited(root)
    assert status == 0 and report["ok"] is True, report["untraceable"]
    # traced with the start-up's dummy batch: the tree's scheduler default
    # of max_num_batched_tokens (7 tokens before 2026-12-05 took a decode
    # branch the start-up never takes)
    scheduler = (root / "vllm/config/scheduler.py").read_text()
    warm_up = re.search(r"DEFAULT_MAX_NUM_BATCHED_TOKENS: \S+ = (\d+)", scheduler)
    for result in report["model"]["configurations"]:
        configuration = result["configuration"]
        assert result["tokens"] == int(warm_up.group(1)), result.get("tokens")
        on_the_xpu_paths(result)
        assert result["result"] == "traced", result
        assert (result["graphs"], result["graph_breaks"]) == (1, 0), result
        assert set(result["ops"]) == OPAQUE | IMAGE_KERNELS[configuration], result


def test_a_wrapper_that_drops_its_writes_is_caught(tmp_path):
    """The known-wrong wrapper: rotary_embedding's op declares that it
    mutates nothing (its kernel writes query and key). Through `make audit
    MODEL=`: the negative control of its exit status (the static search
    and the GEMM fakes' opcheck pass; the model proof fails it)."""
    root = downstream.b6_like(tmp_path / "tree")
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wrappers = root / "vllm" / "_xpu_opaque_calls.py"
    text = wrappers.read_text()
    declared = '        "bool is_neox",\n        ),\n        ("query", "key"),\n'
    assert text.count(declared) == 1
    wrappers.write_text(text.replace(declared, declared.replace('"query", "key"', "")))
    status, report = audited(root)
    # the audit's other parts pass: only the model proof can fail it here
    assert not [r["op"] for r in report["ops"] if r["verdict"].startswith("FAIL")]
    assert [f["callee"] for f in report["untraceable"] if f["reached"]] == []
    assert status == 1 and report["ok"] is False
    for result in report["model"]["configurations"]:
        assert result["result"] == "writes lost", result
        assert result["dropped"] == ["vllm::xpu_c_rotary_embedding"], result


# Plain 0.14.1 (no downstream edit), Qwen3-MoE fp8 (Qwen/Qwen3-30B-A3B's
# architecture, tiny): sequence parallelism turns +rms_norm on, and
# RMSNorm.forward_xpu reaches torch_ipex::rms_norm_vllm, which IPEX's XPU
# build registers without a dispatch key (CompositeImplicitAutograd): no fake
# can be given to it, and traced, the stand-in reads the fake tensors' data,
# as the C++ does. The GEMM fakes alone trace the default configuration and
# not sp; 0003 (the op as a wrapper with a fake) traces both.

PLAIN = "0.14.1"
SP_NORM = "vllm/_ipex_ops.py:"


def test_plain_release_gemm_fakes_only_fail_with_sequence_parallelism(tmp_path):
    root = releases.copy_of(PLAIN, tmp_path / "tree")
    applied = tool.run("apply", str(root), "--patches", "0001 0002", "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    results = trace(root, tmp_path, "qwen3_moe")
    default, sp = results["default"], results["sp"]
    assert default["result"] == "traced", default
    assert (default["graphs"], default["graph_breaks"]) == (1, 0)
    assert sp["result"] == "failed" and sp["graphs"] == 0, sp
    assert "rms_norm_vllm" in sp["message"], sp
    assert sp["where"][-2].startswith("vllm/model_executor/layers/layernorm.py:")
    assert sp["where"][-1].startswith(SP_NORM), sp["where"]
    assert sp["forwards"]["RMSNorm"] == "forward_xpu"
    # the line make stage's PR text shows for it (prtext: before 0003)
    said = model_report.summary({"configurations": [default, sp]})
    assert said.startswith(
        "default: traced whole, 1 graph(s), 0 graph break(s); sp: fails, "
        "TorchRuntimeError: RuntimeError when making fake tensor call "
        "(torch_ipex.rms_norm_vllm) at vllm/_ipex_ops.py:"
    ), said


def test_plain_release_full_fix_traces_with_and_without_sequence_parallelism(
    tmp_path,
):
    results = trace(releases.patched(PLAIN), tmp_path, "qwen3_moe")
    wrapped = {
        "default": set(),
        "sp": {
            "vllm::ipex_rms_norm_vllm (writes carried)",
            "vllm::ipex_fused_add_rms_norm_vllm (writes carried)",
        },
    }
    for configuration, result in results.items():
        assert result["methods"]["XPUFp8MoEMethod"] == 2, result["methods"]
        assert result["result"] == "traced", result
        assert (result["graphs"], result["graph_breaks"]) == (1, 0), result
        assert set(result["ops"]) == OPAQUE | wrapped[configuration], result
    assert model_report.summary({"configurations": list(results.values())}) == (
        "default: traced whole, 1 graph(s), 0 graph break(s); "
        "sp: traced whole, 1 graph(s), 0 graph break(s)"
    )


# The vLLM plugin (plugin/, issue: a running image fixed by `pip install`):
# the same unpatched trees, each model traced in one process first without
# the plugin (the report's errors: the negative control) and then after its
# register(), as vLLM runs it in a worker before the model is built.

TREES = {"b6-like": lambda path: downstream.b6_like(path), PLAIN: None}
# the kernel calls each tree's model runs as custom ops: the b6-like tree's
# pybind11 norms and rotary embedding (MRoPE: Qwen3-VL-MoE), 0.14.1's
# CompositeImplicitAutograd norms of IPEX (sequence parallelism)
PLUGIN_OPS = {
    ("b6-like", MODEL, "default"): {"vllm::xpu_c_rotary_embedding (writes carried)"},
    ("b6-like", MODEL, "sp"): IMAGE_KERNELS["sp"],
    ("b6-like", "qwen3_moe", "default"): set(),
    ("b6-like", "qwen3_moe", "sp"): IMAGE_KERNELS["sp"]
    - {"vllm::xpu_c_rotary_embedding (writes carried)"},
    (PLAIN, MODEL, "default"): set(),
    (PLAIN, MODEL, "sp"): {
        "vllm::ipex_rms_norm_vllm (writes carried)",
        "vllm::ipex_fused_add_rms_norm_vllm (writes carried)",
    },
    (PLAIN, "qwen3_moe", "default"): set(),
}
PLUGIN_OPS[(PLAIN, "qwen3_moe", "sp")] = PLUGIN_OPS[(PLAIN, MODEL, "sp")]


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    return plugin_support.installed(tmp_path_factory.mktemp("plugin"))


@pytest.mark.parametrize("model", [MODEL, "qwen3_moe"])
@pytest.mark.parametrize("which", list(TREES))
def test_plugin_traces_the_unpatched_tree_whole(which, model, plugin_site, tmp_path):
    make = TREES[which]
    root = releases.pristine(PLAIN) if make is None else make(tmp_path / "tree")
    results = trace(root, tmp_path, model, plugin=plugin_site)
    without = results["without plugin"]
    default, sp = without["default"], without["sp"]
    assert default["error"] == NO_FAKE, default
    assert "unsupported operator: torch_ipex.fp8_gemm_w8a16" in default["message"]
    assert default["where"][-1].endswith(" apply"), default["where"]
    assert sp["result"] == "failed" and sp["graphs"] == 0, sp
    assert sp["where"][-2].startswith("vllm/model_executor/layers/layernorm.py:")
    state = results["plugin"]
    assert state["registered"] == ["torch_ipex::fp8_gemm_w8a16.xpu"], state
    assert state["not_reached"] == [] and state["differs"] == [], state
    for configuration in ("default", "sp"):
        result = results[configuration]
        if model == MODEL:
            on_the_xpu_paths(result)
        assert result["result"] == "traced", result
        assert (result["graphs"], result["graph_breaks"]) == (1, 0), result
        expected = OPAQUE | PLUGIN_OPS[(which, model, configuration)]
        assert set(result["ops"]) == expected, result


# `make audit MODEL=a,b` and `MODEL=all` (issue 33): the audit's own part
# once, then every model in one process, a table of model x configuration;
# a model that cannot be built is "not built" with the first line of its
# real error, and the static result is printed all the same. (Before, the
# audit printed only "the model proof ... did not finish ...: it needs the
# tree's dependencies (... make venv-tree)", whatever the cause.)

BUILD_ERROR = "raised by this test while Qwen3MoeForCausalLM is built"


def test_models_by_commas_a_table_with_a_model_not_built(tmp_path):
    root = downstream.b6_like(tmp_path / "tree")
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # Qwen3-MoE's class raises while it is built; Qwen3-VL-MoE's text model
    # does not call its __init__ (it is built as before)
    module = root / "vllm" / "model_executor" / "models" / "qwen3_moe.py"
    text = module.read_text()
    start = text.index("class Qwen3MoeForCausalLM(")
    body = text.index("        super().__init__()\n", start)
    module.write_text(
        text[:body]
        + f"        raise RuntimeError({BUILD_ERROR!r} + '\\nmore')\n"
        + text[body:]
    )
    done = subprocess.run(
        [str(TREE_PYTHON), "-m", "xpufakes", "audit", str(root)]
        + ["--model", f"qwen3_vl_moe,qwen3_moe,{AWQ}"],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS)),
    )
    out = done.stdout
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    # the static audit's result, in full: nothing fails, and nothing lies on
    # the traced path (the series' 0004 made vllm::sparse_attn_indexer return
    # nothing: before, its undeclared alias was this tree's one warning)
    assert "\nOK: every traced tensor-returning op has a conformant fake" in out
    assert "no op's schema lies on the traced path" in out, out
    assert "vllm::sparse_attn_indexer: its schema lies" not in out
    # the table: model x configuration
    # built with .venv-tree's transformers, and the table says which
    version = subprocess.run(
        [
            str(TREE_PYTHON),
            "-c",
            "import transformers; print(transformers.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    head = out.index(
        "Models traced whole (model x configuration; built with "
        f"transformers {version}):\n"
    )
    rows = [line.split(" | ") for line in out[head:].splitlines()[1:5]]
    assert [[c.strip() for c in row] for row in rows[:1]] == [
        ["model", "default", "sp"]
    ], rows
    cells = {row[0].strip(): [c.strip() for c in row[1:]] for row in rows[1:]}
    for model in ("qwen3_vl_moe", AWQ):
        assert cells[model] == ["traced whole, 1 graph(s), 0 graph break(s)"] * 2
    # the int4 AWQ model, patched: IPEX's WOQ module as the one op
    awq = out[out.index(f"model {AWQ}: ") : head]
    assert awq.count("ops in the graph: vllm::ipex_woq_linear, ") == 2, awq
    for said in cells["qwen3_moe"]:
        assert said.startswith(f"not built: RuntimeError: {BUILD_ERROR} (qwen3_moe.py:")
    assert "  4 of 6 traced whole" in out
    # the real error, where it was raised; no word of a missing venv
    assert f"  default: FAIL: not built: RuntimeError: {BUILD_ERROR}\n" in out
    assert "venv-tree" not in out + done.stderr and "did not finish" not in out


def test_the_venv_is_named_only_where_it_is_missing(tmp_path, monkeypatch):
    """A Python without the tree's dependencies (here: a bare venv, no
    torch): `make venv-tree` is named only where .venv-tree does not exist;
    where it does, the Python that lacks the module is named."""
    bare = tmp_path / "bare"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True
    )
    python = str(bare / "bin" / "python")
    root = releases.pristine(PLAIN)
    kernels = audit.kernels_of(tree.locate(str(root)))
    assert model_runner.TREE_PYTHON.exists()
    monkeypatch.setattr(model_runner, "TREE_PYTHON", tmp_path / "no-venv" / "python")
    [found] = model_runner.run_all(root, ["qwen3_moe"], kernels, "default,sp", python)
    for result in found["configurations"]:
        assert result["result"] == "not built", result
        assert result["error"].startswith(f"the model proof's Python ({python})")
        assert result["error"].endswith(": No module named 'torch'"), result
    assert "make venv-tree" in found["venv"], found["venv"]
    assert "make venv-tree" in model_report.table(found)
    monkeypatch.undo()  # .venv-tree exists
    said = model_runner.venv_missing(found, python)
    assert "venv-tree" in said and "make venv-tree" not in said, said
    assert f"{python} has no module 'torch'" in said, said
    # its own Python: the missing module is the tree's error alone
    assert model_runner.venv_missing(found, str(model_runner.TREE_PYTHON)) == ""


def test_model_names():
    assert model_runner.names(" qwen3_moe, qwen3_vl_moe ") == [
        "qwen3_moe",
        "qwen3_vl_moe",
    ]
    every = model_runner.names("all")
    assert {"qwen3_moe", "qwen3_vl_moe"} <= set(every) and len(every) == len(set(every))
    with pytest.raises(Refusal, match="unknown model 'nope' \\(known: "):
        model_runner.names("qwen3_moe,nope")


def test_a_model_not_built_by_a_pydantic_error_says_why(tmp_path):
    """vLLM's configs are pydantic models: a ValidationError's first line is
    only "1 validation error for ModelConfig" (what the audit showed for
    gemma3 and qwen2_5_vl on the report's tree). The cell says the reason
    under it; the first line alone (the negative control) does not."""
    pydantic = pytest.importorskip("pydantic")
    from xpufakes.proof.model import trace

    class ModelConfig(pydantic.BaseModel):
        size: int

        @pydantic.model_validator(mode="after")
        def _check(self):
            if self.size > 1:
                raise ValueError("Gemma3ForCausalLM is not supported")
            return self

    for value, reason in (
        (2, "Value error, Gemma3ForCausalLM is not supported"),
        ("x", "size Input should be a valid integer, unable to parse string"),
    ):
        with pytest.raises(pydantic.ValidationError) as raised:
            ModelConfig(size=value)
        first = str(raised.value).splitlines()[0]
        assert first == "1 validation error for ModelConfig"  # says no reason
        said = trace.not_built(raised.value, tmp_path)
        assert said["result"] == "not built"
        assert said["error"].startswith(f"ValidationError: {first}: {reason}"), said
        assert "[type=" not in said["error"] and "errors.pydantic" not in said["error"]


def test_the_sym_int4_library_stand_in_keeps_the_images_layout(tmp_path):
    """intel/llm-scaler's sym_int4 quantizes with a ctypes library; the
    stand-in is built and called as sym_int4.py calls it (its argtypes), and
    read back as the image's own test reads the library's output
    (custom-esimd-kernels-vllm/tests/test_norm_gemv_int4.py,
    cpu_dequantize: value k in bits 4*(k%8) of word k/8, (q - 8) * scale).
    Negative control: reading the nibbles in the other order does not give
    the weight back."""
    import ctypes

    import torch

    from xpufakes.proof.xpu import sym_int4

    library = ctypes.CDLL(str(sym_int4.q4_0_library(tmp_path)))
    function = library.quantize_q4_0_to_qweight_and_scale
    function.argtypes = [
        ctypes.POINTER(ctypes.c_float),
        ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(ctypes.c_uint16),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    function.restype = ctypes.c_size_t
    n, k, block = 4, 256, 128
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    qweight = torch.zeros(n, k // 8, dtype=torch.int32)
    scale = torch.zeros(n, k // block, dtype=torch.float16)
    written = function(
        ctypes.cast(weight.data_ptr(), ctypes.POINTER(ctypes.c_float)),
        ctypes.cast(qweight.data_ptr(), ctypes.POINTER(ctypes.c_int32)),
        ctypes.cast(scale.data_ptr(), ctypes.POINTER(ctypes.c_uint16)),
        n,
        k,
        block,
    )
    assert written == qweight.numel() * 4 + scale.numel() * 2

    def read(order):
        words = qweight.to(torch.int64) & 0xFFFFFFFF
        q = torch.stack([(words >> (4 * b)) & 0xF for b in order], dim=-1)
        q = q.reshape(n, k).float() - 8
        return q * scale.float().repeat_interleave(block, dim=1)

    step = (weight.abs().reshape(n, -1, block).amax(-1) / 8).repeat_interleave(
        block, dim=1
    )
    # Q4_0: half a step, a whole one where +8 steps is clamped to +7
    within = step * 1.01
    assert ((read(range(8)) - weight).abs() <= within).all()
    assert ((read(range(8)) - weight).abs() <= step * 0.51).float().mean() > 0.95
    assert not ((read(reversed(range(8))) - weight).abs() <= within).all()


def _int4_values(rows, columns, seed):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (rows, columns), generator=generator)


def _pack_columns(values, order):
    """Eight 4-bit values per int32 along the columns, nibble i holding
    column `order[i]` of each eight (AutoAWQ's packer: order 0 2 4 6 1 3 5
    7; GPTQ's zero points: 0..7)."""
    import torch

    grouped = values.reshape(values.shape[0], -1, 8)
    packed = torch.zeros(grouped.shape[:2], dtype=torch.int64)
    for nibble, column in enumerate(order):
        packed |= grouped[:, :, column].long() << (4 * nibble)
    return packed.to(torch.int32)  # wraps as the checkpoints' int32 does


def test_the_int4_layout_stand_ins_give_the_gemm_the_checkpoints_weight():
    """intel/llm-scaler's 0.21.0 tree lays AWQ and act-order GPTQ weights out
    with vllm_xpu_kernels.quantization._quantize_convert before the int4
    GEMM; the stand-in (quantize_convert_standin.py) must give the reference
    GEMM (xpu_gemm_reference.dequantize_int4, the layout of
    kernel-contracts.md 5.6) the checkpoint's weight back, stored NT.
    Negative controls: a checkpoint packed in natural order (not AWQ's) and
    a shuffled GPTQ weight read without its row order do not."""
    import torch

    from xpufakes.proof.xpu import quantize_convert_standin as convert
    from xpufakes.proof.xpu import reference as reference_kernels

    reference = reference_kernels.reference()
    k, n, group = 64, 32, 16
    q = _int4_values(k, n, 1)
    zeros = _int4_values(k // group, n, 2)
    scales = torch.rand(k // group, n) + 0.5
    weight = (q - zeros.repeat_interleave(group, 0)) * scales.repeat_interleave(
        group, 0
    )

    def awq_weight(order):
        layer = torch.nn.Module()
        qweight, qzeros = convert.AWQUtils.repack(
            _pack_columns(q, order), _pack_columns(zeros, order)
        )
        layer.qweight = torch.nn.Parameter(qweight, requires_grad=False)
        layer.qzeros = torch.nn.Parameter(qzeros, requires_grad=False)
        layer.scales = torch.nn.Parameter(scales.t().contiguous().t(), False)
        convert.transpose_onednn_woq_format(layer, "awq", False)
        assert layer.qweight.shape == (k // 8, n) and layer.qweight.stride(0) == 1
        assert layer.scales.is_contiguous()
        return reference.dequantize_int4(
            layer.qweight, layer.scales, layer.qzeros, group
        )

    assert torch.equal(awq_weight((0, 2, 4, 6, 1, 3, 5, 7)), weight)
    assert not torch.equal(awq_weight(range(8)), weight)

    # act order: row i of the weight belongs to group g_idx[i]
    g_idx = torch.randperm(k, generator=torch.Generator().manual_seed(3)) // group
    gptq = _pack_columns(q.t().contiguous(), range(8)).t().contiguous()  # [K/8, N]
    shuffled, order = convert.GPTQUtils(4, group).shuffle(gptq, g_idx)
    layer = torch.nn.Module()
    layer.qweight = torch.nn.Parameter(shuffled, requires_grad=False)
    layer.qzeros = torch.nn.Parameter(torch.zeros(1, dtype=torch.int32), False)
    layer.scales = torch.nn.Parameter(scales, requires_grad=False)
    convert.transpose_onednn_woq_format(layer, "gptq", True)
    assert layer.qzeros.dtype == torch.int8 and layer.qzeros.tolist() == [8]
    read = reference.dequantize_int4(layer.qweight, layer.scales, layer.qzeros, group)
    act = torch.randn(3, k)
    want = act @ ((q - 8) * scales[g_idx])
    assert torch.allclose(act[:, order.long()] @ read, want, atol=1e-3)
    assert not torch.allclose(act @ read, want, atol=1e-3)


def test_transformers_release_refused_in_one_line():
    from xpufakes.proof.model import transformers_pin

    with pytest.raises(Refusal, match="TRANSFORMERS='4.57; rm' is not a release"):
        transformers_pin.overlay("4.57; rm", sys.executable)


def test_transformers_release_installed_beside_the_venv():
    """TRANSFORMERS=4.57.0 (the 0.10.2-based images' pin): the overlay holds
    that transformers with the huggingface-hub and tokenizers it requires,
    importable in .venv-tree ahead of the venv's own (transformers 5 there:
    the negative control), and the venv is left as it was."""
    from xpufakes.proof.model import transformers_pin

    def versions(pythonpath: str) -> list[str]:
        code = (
            "import huggingface_hub, tokenizers, transformers;"
            "print(transformers.__version__, huggingface_hub.__version__,"
            " tokenizers.__version__)"
        )
        env = dict(os.environ, PYTHONPATH=pythonpath)
        done = subprocess.run(
            [str(TREE_PYTHON), "-c", code], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()

    own = versions("")
    overlay = transformers_pin.overlay("4.57.0", str(TREE_PYTHON))
    pinned = versions(str(overlay))
    assert pinned[0] == "4.57.0" and own[0] != "4.57.0", (own, pinned)
    # huggingface-hub 1.x is transformers 5's; 4.57 requires < 1.0
    assert pinned[1].startswith("0."), pinned
    assert versions("") == own


# The fault (issue 43): a regression in our own fix must fail the
# proof. On pinned 0.14.1 after `make apply`, one line of the IPEX AWQ
# forward that the series edits, `layer.ipex_qlinear(reshaped_x)`, made
# `layer.ipex_qlinear_opaque(reshaped_x)`: before, `make audit
# MODEL=qwen3_awq` exited 0, both cells "the tree's limit" (a classifier
# excused any AttributeError raised in a quantization module).
WOQ_CALL = "        out = layer.ipex_qlinear(reshaped_x)\n"


def test_a_fault_in_a_line_of_our_fix_fails_the_audit(tmp_path):
    """`make audit MODEL=qwen3_awq` (--static: the model proof decides)
    on the patched tree exits 0, both cells traced (the control); with the
    fault injected it exits 1, both cells failing at the changed line; and
    even listed, word for word, as a limit of 0.14.1 the error is not
    excused: it passed through a line of ipex_quant.py that is neither the
    release's nor the series' (changed since apply).
    Costs ~30 s (two model processes of one model)."""
    root = releases.copy_of(PLAIN, tmp_path / "tree")
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr

    def audit_awq() -> tuple[int, list[dict]]:
        done = subprocess.run(
            [str(TREE_PYTHON), "-m", "xpufakes", "audit", str(root), "--static"]
            + ["--model", AWQ, "--json"],
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS)),
        )
        assert done.stdout.strip(), done.stderr[-3000:]
        report = json.loads(done.stdout[done.stdout.index("{\n") :])
        return done.returncode, report["model"]["configurations"]

    status, cells = audit_awq()
    assert status == 0, cells
    assert [c["result"] for c in cells] == ["traced", "traced"], cells

    quant = root / "vllm/model_executor/layers/quantization/ipex_quant.py"
    text = quant.read_text()
    awq = text.index("class IPEXAWQLinearMethod(")
    at = text.index(WOQ_CALL, awq)
    broken = WOQ_CALL.replace("ipex_qlinear(", "ipex_qlinear_opaque(")
    quant.write_text(text[:at] + broken + text[at + len(WOQ_CALL) :])
    status, cells = audit_awq()
    assert status == 1, cells
    for cell in cells:
        assert cell["result"] in model_report.ERRORS, cell
        assert "ipex_qlinear_opaque" in cell["error"], cell
        assert quant.relative_to(root).as_posix() in cell["files"], cell
    # listed exactly as the tree's limit, it is still not excused: the
    # changed file is neither the pristine release's nor the series' (no
    # line of it is the tree's own)
    listed = [
        limits.Limit("0.14.1", AWQ, c["configuration"], c["error"], "listed")
        for c in cells
    ]
    relative = quant.relative_to(root).as_posix()
    ours = ourlines.ours(root, live.edited_by_us(tree.python_sources(root)))
    assert ours[relative] is None
    found = limits.classify(
        [{"model": AWQ, "configurations": cells}], limits.tree_name(root), ours, listed
    )
    for cell in found[0]["configurations"]:
        assert cell["result"] in model_report.ERRORS, cell
        assert "ipex_quant.py" in cell["not_excused"], cell
    # the control of that: the same listing excuses it where no line of
    # ours is on its way
    excused = limits.classify(
        [{"model": AWQ, "configurations": [dict(c, lines=[]) for c in cells]}],
        "0.14.1",
        ours,
        listed,
    )
    assert {c["result"] for c in excused[0]["configurations"]} == {
        model_report.TREE_LIMIT
    }
    # the fault taken out, the file is the series' again: the lines the
    # series wrote are ours, the release's own (the WOQ call among them) are
    # not; the injected fault changed one of those, which is why the whole
    # file counted as ours above
    quant.write_text(text)
    ours = ourlines.ours(root, live.edited_by_us(tree.python_sources(root)))[relative]
    numbered = text.splitlines()
    wrapped = [
        n
        for n, line in enumerate(numbered, 1)
        if "layer.ipex_qlinear = opaque_ipex_woq_linear(" in line
    ]
    assert ours is not None and wrapped and set(wrapped) <= ours
    assert text[:at].count("\n") + 1 not in ours
