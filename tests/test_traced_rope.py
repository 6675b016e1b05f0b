"""The report's call, compiled: Qwen3-VL-MoE's MRoPE (head 128, rope_theta
5e6, mrope_section [24, 20, 20], interleaved), made by the tree's own
get_rope under vLLM's default compile configuration (Inductor, custom ops
off) on the XPU platform's path, traced with fullgraph (Dynamo, then AOT
autograd's functionalization: support/mrope_trace.py), with the stand-ins
for a build's pybind11 vllm._C and IPEX.

On a b6-like tree (support/downstream.py; the real intel/llm-scaler trees
are tests/test_llm_scaler_trees.py): patched the old way (the GEMM fakes
only) the trace fails with the report's error, and `make audit` exits 1
naming vllm._C.ops.rotary_embedding with its chain; after `make apply` the
trace passes."""

import json
import subprocess

import pytest

from support import downstream, tool
from xpufakes.common import paths

TREE_PYTHON = paths.REPO / ".venv-tree" / "bin" / "python"
SCRIPT = paths.REPO / "tests" / "support" / "mrope_trace.py"

pytestmark = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)


def trace(tree, tmp_path) -> dict:
    out = tmp_path / "rope.json"
    done = subprocess.run(
        [str(TREE_PYTHON), str(SCRIPT), str(tree), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.is_file(), done.stderr[-3000:]
    return json.loads(out.read_text())


REPORT_ERROR = (
    "Unsupported: Attempted to call function marked as skipped Explanation: "
    "Dynamo does not know how to trace the builtin "
    "`vllm._C.ops.PyCapsule.rotary_embedding.`"
)


def test_b6_like_tree_the_old_fix_fails_at_the_rotary_call_the_full_fix_traces(
    tmp_path,
):
    old = downstream.b6_like(tmp_path / "old")
    applied = tool.run("apply", str(old), "--patches", "0001 0002", "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    result = trace(old, tmp_path)
    assert result["forward"] == "forward_native"  # custom op off, as compiled
    assert result["result"].startswith(REPORT_ERROR), result
    audit = tool.run("audit", str(old), "--static")
    assert audit.returncode == 1
    assert (
        "vllm._C.ops.rotary_embedding: FAIL: a C extension's function" in audit.stdout
    )
    assert (
        "rotary_embedding/mrope.py:" in audit.stdout
        and "MRotaryEmbedding.forward_native" in audit.stdout
    )

    full = downstream.b6_like(tmp_path / "full")
    applied = tool.run("apply", str(full))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "reaches no call Dynamo cannot trace" in applied.stdout
    result = trace(full, tmp_path)
    assert result["result"] == "traced", result
