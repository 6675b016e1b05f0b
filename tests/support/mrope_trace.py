"""Compile a tree's own MRoPE for Qwen3-VL's text config as vLLM compiles
the language model (torch.compile with fullgraph=True; Dynamo, then AOT
autograd's functionalization, then nothing: the backend stops there), on the
XPU platform's code path, with the stand-ins for what only an XPU host has
(proof/xpu: IPEX's APIs and torch_ipex ops XPU-only, a build's native
modules as pybind11-style builtins).

    python mrope_trace.py TREE OUT.json

Run with a Python that has the tree's dependencies (.venv-tree). Writes
{"rope": <class>, "forward": <method vLLM dispatches to>, "result": "traced"
or the error, "nodes": <graph nodes>}.
"""

import inspect
import json
import sys
from pathlib import Path

TREE, OUT = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(TREE))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import torch  # noqa: E402

from xpufakes.proof.xpu import extensions, ipex  # noqa: E402

LIBRARIES = [ipex.define_torch_ipex_ops()]  # XPU key only
ipex.install_ipex()
extensions.stub_vllm_extensions(TREE)

import vllm.platforms  # noqa: E402
from vllm.platforms.xpu import XPUPlatform  # noqa: E402

vllm.platforms._current_platform = XPUPlatform()

from vllm.model_executor.layers.rotary_embedding import get_rope  # noqa: E402

# Qwen3-VL-30B-A3B's text config: head 128, rope_theta 5e6, interleaved MRoPE
MROPE = {"mrope_section": [24, 20, 20], "mrope_interleaved": True}
kwargs = {
    "head_size": 128,
    "rotary_dim": 128,
    "max_position": 4096,
    "is_neox_style": True,
    "dtype": torch.bfloat16,
}
parameters = inspect.signature(get_rope).parameters
if "rotary_dim" not in parameters:  # 0.14: rotary_dim is in rope_parameters
    del kwargs["rotary_dim"]
if "rope_parameters" in parameters:
    kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6, **MROPE}
else:
    kwargs |= {"base": 5e6, "rope_scaling": {"rope_type": "default", **MROPE}}
# vLLM's default for a compiled model: Inductor, custom ops off ("none", as
# VllmConfig appends it for the Inductor backend), so the rope's forward is
# its forward_native (which in the b6 tree calls its forward_xpu)
from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config  # noqa: E402

try:
    compilation = CompilationConfig(
        mode=3, custom_ops=["none"]
    )  # VLLM_COMPILE (0.11.1+)
except Exception:  # noqa: BLE001 - older releases name it `level`
    compilation = CompilationConfig(level=3, custom_ops=["none"])
with set_current_vllm_config(VllmConfig(compilation_config=compilation)):
    rope = get_rope(**kwargs)


class Traced(Exception):
    pass


def backend(gm, example_inputs):
    from torch._functorch.aot_autograd import aot_module_simplified

    aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, i: g)
    raise Traced(len(gm.graph.nodes))


tokens = 7
positions = torch.arange(tokens).expand(3, tokens).contiguous()
query = torch.randn(tokens, 4 * 128, dtype=torch.bfloat16)
key = torch.randn(tokens, 2 * 128, dtype=torch.bfloat16)
result = {"rope": type(rope).__name__, "forward": rope._forward_method.__name__}
try:
    torch.compile(rope, fullgraph=True, backend=backend, dynamic=True)(
        positions, query, key
    )
    result["result"] = "the backend was not called"
except Exception as e:  # noqa: BLE001 - the result
    inner = getattr(e, "inner_exception", None)
    if isinstance(inner, Traced):
        result |= {"result": "traced", "nodes": inner.args[0]}
    else:
        result["result"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
OUT.write_text(json.dumps(result))
