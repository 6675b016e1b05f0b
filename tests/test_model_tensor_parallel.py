"""Sequence parallelism where the tree turns it off at TP=1 (0.16.0 to
0.31: its VllmConfig does so, with "Sequence Parallelism requires TP>1"),
traced at TP=2 as vLLM's workers run it (proof/model/runner.py
in_tensor_parallel): two processes of the model proof, ranks 0 and 1 of a
tensor-parallel group on gloo (vLLM's init_distributed_environment,
initialize_model_parallel(2), ParallelConfig(tensor_parallel_size=2)), each
building its shard of the model and tracing it. What one process could not
run (the proof's limit) is then a result of the tree's: traced whole, or
its failure (a listed limit of data/limits.toml, or a failure).

* 0.16.0, qwen3_moe (fp8 MoE) and qwen3_w4a16 (int4): one process gives
  the proof's limit for sp; two give a trace with +rms_norm on (RMSNorm's
  forward_cuda -> vllm-xpu-kernels' _C::rms_norm) and the tensor-parallel
  all-reduce in the graph, 1 graph, 0 breaks, both ranks alike;
* the negative control: the same tree without vLLM's GEMM fakes fails at
  TP=2 at the GEMM (the two processes really trace the model);
* at TP=2 a tree may still turn it off itself (0.17.0 to 0.31 on XPU,
  whatever the size: their SP threshold heuristic knows CUDA devices only):
  that is the tree's, "not built" with vLLM's warning (data/limits.toml
  lists it; met on intel/llm-scaler's b18beee, 0.21.0), never the proof's;
* the ranks' results are compared: a rank that disagrees, or a rank that
  writes nothing, is a failure (a stand-in Python plays the ranks: no
  torch).

Cost: about 1 min on 2 cores (each rank imports vLLM; the two run at once).
"""

import json
import os
import stat
import sys

import pytest
from test_model_trace import NO_FAKE, TREE_PYTHON
from test_model_trace_kernels import without_fakes

from support import releases
from xpufakes.proof import audit
from xpufakes.proof.model import report as modelproof
from xpufakes.proof.model import runner
from xpufakes.trees import tree

KERNELS_ERA = "0.16.0"  # sp off at TP=1 (0.16.0 to 0.31)
MODELS = ["qwen3_moe", "qwen3_w4a16"]


def run(root, models, tensor_parallel=2) -> dict[str, dict]:
    kernels = audit.kernels_of(tree.locate(str(root)))
    found = runner.run_all(
        root,
        models,
        kernels,
        "default,sp",
        python=str(TREE_PYTHON),
        tensor_parallel=tensor_parallel,
    )
    return {
        m["model"]: {c["configuration"]: c for c in m["configurations"]} for m in found
    }


@pytest.mark.skipif(not TREE_PYTHON.exists(), reason="no .venv-tree")
def test_sp_turned_off_at_tp1_is_traced_at_tp2(tmp_path):
    found = run(releases.pristine(KERNELS_ERA), MODELS)
    for model in MODELS:
        default, sp = found[model]["default"], found[model]["sp"]
        assert default["result"] == "traced", default
        assert default.get("tensor_parallel") == 1, default
        assert "_c10d_functional.all_reduce" not in default["collectives"]
        # the control, in the same run: one process (the run before the
        # two) could not trace it, the tree turned sp off
        assert sp["one_process"].startswith("the tree's VllmConfig turned "), sp
        assert sp["result"] == "traced", sp
        assert sp["tensor_parallel"] == 2, sp
        assert sp["graphs"] == 1 and sp["graph_breaks"] == 0, sp
        assert "+rms_norm" in sp["custom_ops"], sp["custom_ops"]
        assert sp["forwards"]["RMSNorm"] != "forward_native", sp["forwards"]
        assert "_C::rms_norm (writes carried)" in sp["ops"], sp["ops"]
        assert "_c10d_functional.all_reduce" in sp["collectives"], sp
        assert modelproof.cell(sp).endswith("(TP=2)"), modelproof.cell(sp)

    # the control: without vLLM's GEMM fakes the two ranks fail at the GEMM
    root = without_fakes(KERNELS_ERA, tmp_path / "no-fakes")
    without = run(root, MODELS[1:])[MODELS[1]]["sp"]
    assert without["result"] == "failed", without
    assert without["error"] == NO_FAKE, without
    assert without["tensor_parallel"] == 2, without
    assert "_xpu_C.int4_gemm_w4a16" in modelproof.cell(without), without


RANK_PYTHON = """#!{python}
# a stand-in of the model proof's Python for runner.in_tensor_parallel: it
# writes each rank's cell as told by RANK_RESULTS (rank -> result or "none")
import json, os, sys
args = sys.argv[3:]  # -m xpufakes.proof.model.cli TREE MODELS OUT ...
models, out = args[1].split(","), args[2]
rank = args[args.index("--rank") + 1]
result = json.loads(os.environ["RANK_RESULTS"])[rank]
if result == "none":  # after the other rank wrote its result
    import time; time.sleep(1)
    sys.exit("rank " + rank + " died")
cell = {{"configuration": "sp", "result": result, "graphs": 1,
        "graph_breaks": 0, "ops": [], "where": [], "tensor_parallel": 2}}
json.dump({{"models": [{{"model": m, "configurations": [cell]}} for m in models]}},
          open(out, "w"))
"""


@pytest.mark.parametrize(
    "results, expected",
    [
        ({"0": "traced", "1": "traced"}, "traced"),
        # the controls: the ranks disagree; a rank writes nothing
        ({"0": "traced", "1": "failed"}, "failed"),
        ({"0": "traced", "1": "none"}, "failed"),
        ({"0": "none", "1": "traced"}, "not built"),
    ],
)
def test_the_ranks_must_agree(results, expected, tmp_path, monkeypatch):
    python = tmp_path / "python"
    python.write_text(RANK_PYTHON.format(python=sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, RANK_RESULTS=json.dumps(results))
    cells = runner.in_tensor_parallel(tmp_path, ["m"], "k", str(python), env, 2)
    cell = cells[("m", "sp")]
    assert cell["result"] == expected, cell
    if expected == "failed":
        assert cell["error"].startswith("the ranks disagree: rank 0: traced; rank 1:")
    if expected == "not built":
        assert "rank 0 died" in cell["error"], cell


def _config(enable_sp: bool, size: int):
    """A VllmConfig as sp_turned_off reads it: its PassConfig (a dataclass
    with vLLM's switch) and its tensor parallelism."""
    import dataclasses
    from types import SimpleNamespace

    PassConfig = dataclasses.make_dataclass("PassConfig", [("enable_sp", bool)])
    return SimpleNamespace(
        compilation_config=SimpleNamespace(pass_config=PassConfig(enable_sp)),
        parallel_config=SimpleNamespace(tensor_parallel_size=size),
    )


def test_sp_turned_off_at_tp1_is_the_proofs_and_at_tp2_the_trees(monkeypatch):
    """One process: the proof's limit (never the tree's). Two: the tree
    turned it off itself (0.17.0+ on XPU: the SP threshold heuristic has
    no threshold for a non-CUDA device; 0.20.0-0.23.0's XPU platform
    disables it), "not built" with vLLM's own warning, which
    data/limits.toml lists like any other limit."""
    from xpufakes.proof.model import build, trace

    kind, reason = trace.sp_turned_off(_config(False, 1), "sp")
    assert kind == modelproof.PROOF_LIMIT and "(TP=1)" in reason
    said = "Feature 'Sequence parallelism' is not yet supported on XPU and will be"
    monkeypatch.setattr(build, "CONFIG_WARNINGS", ["Unrelated: x", said])
    kind, reason = trace.sp_turned_off(_config(False, 2), "sp")
    assert (kind, reason) == ("not built", f"Warning: {said}")
    # the controls: sp on at TP=2, and the default configuration
    assert trace.sp_turned_off(_config(True, 2), "sp") == ("", "")
    assert trace.sp_turned_off(_config(False, 2), "default") == ("", "")
    monkeypatch.setattr(build, "CONFIG_WARNINGS", [])  # no words: ours, saying so
    assert trace.sp_turned_off(_config(False, 2), "sp")[1] == (
        "Warning: the tree's VllmConfig turned enable_sp off at TP=2"
    )
