"""The search for calls Dynamo cannot trace (scripts/xpufakes/proof/static/reach.py) and
the audit's verdicts on them: on small trees that hold one kind of call
each (and, as negative controls, the same call where the traced path does
not reach it), and on the pinned sdists and a b6-like downstream tree
(tests/support/downstream.py) with `make audit`."""

import ast
import json
import re
import textwrap

import pytest

from support import downstream, releases, tool
from xpufakes.proof.static import reach, scan
from xpufakes.proof.static.reach import CTYPES
from xpufakes.trees import logonce, pysource, tree

CUSTOM_OP = """
import torch.nn as nn


class CustomOp(nn.Module):
    @classmethod
    def register(cls, name):
        def decorator(op_cls):
            op_cls.name = name
            return op_cls

        return decorator

    def forward(self, *args, **kwargs):
        return self._forward_method(*args, **kwargs)
"""

CONFIG = """
class VllmConfig:
    def __post_init__(self):
        if self.compilation_config.pass_config.enable_sequence_parallelism:
            self.compilation_config.custom_ops.append("+rms_norm")
"""


def _tree(**files: str) -> dict[str, str]:
    """vllm/ texts: the CustomOp base, a config that turns +rms_norm on under
    sequence parallelism, and the files given (name -> source)."""
    texts = {
        "vllm/__init__.py": "",
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/custom_op.py": CUSTOM_OP,
        "vllm/config/__init__.py": CONFIG,
    }
    for name, text in files.items():
        texts[f"vllm/{name.replace('__', '/')}.py"] = textwrap.dedent(text)
    return texts


NORM = """
import torch

from vllm.model_executor.custom_op import CustomOp


@CustomOp.register("rms_norm")
class RMSNorm(CustomOp):
    def forward_native(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))

    def forward_xpu(self, x):
        from vllm.downstream_ops import ops

        return ops.rms_norm(x, self.weight)
"""

OPS = """
import torch

import vllm._C.ops


class ops:
    @staticmethod
    def rms_norm(x, weight):
        out = torch.empty_like(x)
        vllm._C.ops.rms_norm(out, x, weight, 1e-6)
        return out
"""

MODEL = """
from torch import nn

from vllm.layers import RMSNorm


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm()

    def forward(self, x):
        return self.norm(x)
"""


def _one(findings, callee: str) -> reach.Finding:
    found = [f for f in findings if f.callee == callee]
    assert len(found) == 1, [(f.callee, str(f.site)) for f in findings]
    return found[0]


def test_a_custom_op_on_under_sequence_parallelism_reaches_a_pybind_call():
    texts = _tree(layers=NORM, downstream_ops=OPS, model_executor__models__tiny=MODEL)
    finding = _one(reach.find(texts), "vllm._C.ops.rms_norm")
    assert finding.kind == reach.NATIVE
    assert finding.configurations[0] == "custom_ops '+rms_norm' or 'all' (a user's)"
    assert finding.configurations[1] == (
        "vLLM itself: vllm/config/__init__.py:5 appends '+rms_norm' (if "
        "self.compilation_config.pass_config.enable_sequence_parallelism)"
    )
    assert [str(s) for s in finding.chain] == [
        "vllm/model_executor/models/tiny.py:13 TinyModel.forward",
        "vllm/layers.py:15 RMSNorm.forward_xpu",
        "vllm/downstream_ops.py:11 ops.rms_norm",
    ]
    assert reach.DEFAULT not in finding.configurations


def test_forward_native_that_calls_forward_xpu_reaches_it_by_default():
    rerouted = NORM.replace(
        "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))",
        "return self.forward_xpu(x)",
    )
    texts = _tree(layers=rerouted, downstream_ops=OPS)
    finding = _one(reach.find(texts), "vllm._C.ops.rms_norm")
    assert finding.configurations[0] == reach.DEFAULT
    assert finding.entry.startswith("RMSNorm.forward_native (custom op off")
    assert [s.function for s in finding.chain] == [
        "RMSNorm.forward_native",
        "RMSNorm.forward_xpu",
        "ops.rms_norm",
    ]


@pytest.mark.parametrize(
    ("body", "callee", "kind"),
    [
        (
            "from vllm._C.ops import fused_add_rms_norm\n"
            "fused_add_rms_norm(x, x, w, 1e-6)",
            "vllm._C.ops.fused_add_rms_norm",
            reach.NATIVE,
        ),
        (
            "import intel_extension_for_pytorch as ipex\n"
            "ipex.llm.functional.silu_and_mul(x, w)",
            "intel_extension_for_pytorch.llm.functional.silu_and_mul",
            reach.IPEX_API,
        ),
        (
            "torch.ops.torch_ipex.rms_norm_vllm(w, x, w, 1e-6)",
            "torch_ipex::rms_norm_vllm",
            reach.TORCH_IPEX,
        ),
        ("_LIB.xpu_norm(x.data_ptr())", "_LIB.xpu_norm", CTYPES),
        ("ctypes.memmove(x.data_ptr(), w.data_ptr(), 4)", "ctypes.memmove", CTYPES),
    ],
    ids=["from-import", "ipex-api", "torch-ipex-cia", "ctypes-lib", "ctypes"],
)
def test_each_kind_is_found_in_a_helper_of_any_file(body, callee, kind):
    helper = (
        "import ctypes\n\nimport torch\n\n_LIB = ctypes.CDLL('libxpu.so')\n\n\n"
        "def helper(x, w):\n" + textwrap.indent(body, "    ") + "\n"
    )
    layer = """
    from torch import nn

    from vllm.kernels.helpers import helper


    class Layer(nn.Module):
        def forward(self, x):
            return helper(x, self.weight)

        def process_weights_after_loading(self, layer):
            helper(layer.weight, layer.weight)
    """
    texts = _tree(kernels__helpers=helper, kernels__layer=layer)
    finding = _one(reach.find(texts), callee)
    assert finding.kind == kind and finding.configurations == [reach.DEFAULT]
    assert [s.function for s in finding.chain] == ["Layer.forward", "helper"]
    # negative control: called only while loading weights, it is not traced
    texts["vllm/kernels/layer.py"] = texts["vllm/kernels/layer.py"].replace(
        "return helper(x, self.weight)", "return x"
    )
    finding = _one(reach.find(texts), callee)
    assert not finding.reached and "process_weights_after_loading" in finding.note


def test_a_function_stored_on_the_layer_and_called_through_it():
    layer = """
    from vllm.model_executor.custom_op import CustomOp


    @CustomOp.register("silu_and_mul")
    class SiluAndMul(CustomOp):
        def __init__(self):
            from vllm.downstream_ops import ops

            self.op = ops.silu_and_mul

        def forward_native(self, x):
            return x

        def forward_xpu(self, x):
            self.op(x, x)
            return x
    """
    ops = "import vllm._C.ops\n\n\nclass ops:\n    @staticmethod\n"
    ops += "    def silu_and_mul(out, x):\n        vllm._C.ops.silu_and_mul(out, x)\n"
    finding = _one(
        reach.find(_tree(act=layer, downstream_ops=ops)), "vllm._C.ops.silu_and_mul"
    )
    assert finding.configurations == ["custom_ops '+silu_and_mul' or 'all' (a user's)"]
    assert [s.function for s in finding.chain][:1] == ["SiluAndMul.forward_xpu"]


def test_inside_a_vllm_op_or_a_multimodal_encoder_is_not_traced():
    attention = """
    import torch
    from torch import nn

    from vllm.downstream_ops import ops
    from vllm.utils import direct_register_custom_op


    def unified(x):
        return ops.rms_norm(x, x)


    direct_register_custom_op(op_name="unified", op_func=unified, mutates_args=[])


    class VisionAttention(nn.Module):
        def forward(self, x):
            return ops.rms_norm(x, x)


    class Attention(nn.Module):
        def forward(self, x):
            return torch.ops.vllm.unified(x)
    """
    finding = _one(
        reach.find(_tree(attention=attention, downstream_ops=OPS)),
        "vllm._C.ops.rms_norm",
    )
    assert not finding.reached
    assert "VisionAttention.forward (a multimodal encoder's" in finding.note
    # negative control: the same layer, not an encoder's, is traced
    texts = _tree(
        attention=attention.replace("VisionAttention", "TextAttention"),
        downstream_ops=OPS,
    )
    finding = _one(reach.find(texts), "vllm._C.ops.rms_norm")
    assert finding.chain[0].function == "TextAttention.forward"


ROUTED_MOE = """
import torch
from torch import nn

import vllm._C.ops


class TinyMoE(nn.Module):
    def __init__(self):
        super().__init__()

        def route(logits, top_k):
            return vllm._C.ops.topk_softmax(logits, top_k)

        self._route = route

    def forward(self, x):
        return self._route(x, 2)
"""


def test_a_function_defined_in_init_stored_and_called_in_forward_is_traced():
    """Gemma 4's MoE routing in llm-scaler's image: a function defined in
    __init__, kept as self._esimd_routing_fn, called in forward. Its calls
    run where it is called, not in __init__. Negative control: never
    called, it is not traced."""
    finding = _one(
        reach.find(_tree(model_executor__models__tiny=ROUTED_MOE)),
        "vllm._C.ops.topk_softmax",
    )
    assert finding.configurations == [reach.DEFAULT], finding.note
    assert [s.function for s in finding.chain] == [
        "TinyMoE.forward",
        "TinyMoE.__init__.route",
    ]
    # schema truth's question, of the function by its nested name
    texts = _tree(model_executor__models__tiny=ROUTED_MOE)
    key = ("vllm.model_executor.models.tiny", "TinyMoE.__init__.route")
    assert reach.explain(texts, [key])[key].configurations == [reach.DEFAULT]
    unused = ROUTED_MOE.replace("return self._route(x, 2)", "return x")
    finding = _one(
        reach.find(_tree(model_executor__models__tiny=unused)),
        "vllm._C.ops.topk_softmax",
    )
    assert not finding.reached and "TinyMoE.__init__" in finding.note


def test_a_function_defined_in_forward_runs_where_forward_calls_or_passes_it():
    """Defined in forward and called there by its name: traced, through
    it. Passed on as a value the search cannot follow: counted where the
    function that defines it is, and said (never less reached than the
    call was when it counted as forward's own)."""
    called = ROUTED_MOE.replace(
        "    def forward(self, x):\n        return self._route(x, 2)\n",
        "    def forward(self, x):\n"
        "        def inner(y):\n"
        "            return vllm._C.ops.topk_softmax(y, 2)\n\n"
        "        return inner(x)\n",
    )
    findings = reach.find(_tree(model_executor__models__tiny=called))
    inner = [f for f in findings if f.site.function == "TinyMoE.forward.inner"]
    assert len(inner) == 1 and inner[0].configurations == [reach.DEFAULT]
    assert [s.function for s in inner[0].chain] == [
        "TinyMoE.forward",
        "TinyMoE.forward.inner",
    ]
    passed = called.replace("return inner(x)", "return torch.vmap(inner)(x)")
    findings = reach.find(_tree(model_executor__models__tiny=passed))
    inner = [f for f in findings if f.site.function == "TinyMoE.forward.inner"]
    assert len(inner) == 1 and inner[0].configurations == [reach.DEFAULT]
    assert "defined in TinyMoE.forward, which the traced path reaches" in (
        inner[0].note
    )


def test_xpu_code_nothing_can_be_followed_to_counts_as_traced():
    """Called through an object whose class the source does not say, a sink
    in XPU code counts (conservative, and says so); a dead one does not."""
    wrapper = """
    import intel_extension_for_pytorch as ipex


    class PunicaWrapperXPU:
        def add_shrink(self, y, x):
            ipex.llm.functional.bgmv_shrink(x, y, y, y, 1.0)

        def never_called_anywhere(self, y, x):
            ipex.llm.functional.bgmv_expand(x, y, y, y, True)
    """
    lora = """
    from torch import nn


    class LoRALayer(nn.Module):
        def forward(self, x):
            self.punica_wrapper.add_shrink(x, x)
    """
    findings = reach.find(_tree(punica_xpu=wrapper, lora=lora))
    shrink = _one(findings, "intel_extension_for_pytorch.llm.functional.bgmv_shrink")
    assert shrink.configurations == [reach.UNRESOLVED]
    assert "no caller of PunicaWrapperXPU.add_shrink the scan can follow" in shrink.note
    expand = _one(findings, "intel_extension_for_pytorch.llm.functional.bgmv_expand")
    assert not expand.reached and "not called by its name anywhere" in expand.note


def _audit(tree) -> tuple[int, dict]:
    result = tool.run("audit", str(tree), "--json", "--static")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def _reached(report: dict) -> dict[str, dict]:
    return {f["callee"]: f for f in report["untraceable"] if f["reached"]}


def test_audit_of_a_b6_like_tree_names_the_rotary_call_and_its_chain(tmp_path):
    root = downstream.b6_like(tmp_path / "b6")
    status, report = _audit(root)
    assert status == 1 and not report["ok"]
    rope = _reached(report)["vllm._C.ops.rotary_embedding"]
    assert rope["configurations"][0] == reach.DEFAULT
    chain = [f"{s['file']} {s['function']}" for s in rope["chain"]]
    assert chain[-3:] == [
        "vllm/model_executor/layers/rotary_embedding/mrope.py "
        "MRotaryEmbedding.forward_native",
        "vllm/model_executor/layers/rotary_embedding/mrope.py "
        "MRotaryEmbedding.forward_xpu",
        "vllm/_ipex_ops.py ipex_ops.rotary_embedding",
    ]
    assert chain[0].startswith("vllm/model_executor/models/")  # a model's forward
    table = tool.run("audit", str(root), "--static").stdout
    assert "vllm._C.ops.rotary_embedding: FAIL: a C extension's function" in table
    # negative control: without the reroute (b5's MRoPE) the call is reached
    # only when a user turns the rotary custom op on
    status, report = _audit(downstream.b6_like(tmp_path / "b5", reroute=False))
    rope = _reached(report)["vllm._C.ops.rotary_embedding"]
    assert reach.DEFAULT not in rope["configurations"]


def test_audit_of_pinned_0141_reaches_ipex_norms_under_sequence_parallelism():
    status, report = _audit(releases.pristine("0.14.1"))
    assert status == 1
    norm = _reached(report)["torch_ipex::rms_norm_vllm"]
    assert norm["kind"] == reach.TORCH_IPEX
    assert any(
        c.startswith("vLLM itself: vllm/config/vllm.py:")
        and "appends '+rms_norm'" in c
        and "enable_sp" in c
        for c in norm["configurations"]
    ), norm["configurations"]
    # triton attention runs inside the opaque attention op on XPU
    sites = [
        s
        for op in report["ops"]
        for s in op["sites"]
        if "v1/attention/backends/" in s["file"]
    ]
    assert all(s["context"] != "traced" for s in sites), sites


# ---------------------------------------------------------------------------
# The proof's faster search proves no less (issue 23 item 5)
# ---------------------------------------------------------------------------

# reach.py's prefilter before it was split into literal tests (the old code:
# the negative control of the split)
_OLD_MARKERS = re.compile(
    r"(?<!torch)\._\w*C\b|\b_\w*C\.(?!\w*Tensor)|import _\w*C\b|ctypes|"
    r"intel_extension_for_pytorch|torch_ipex|cumem_allocator|fs_io_C|spinloop"
)
_EDGES = [
    "torch._C._foo()",
    "x = torch._C\n",
    "vllm._C.ops.rms_norm(x)",
    "ops._moe_C.topk(x)",
    "import _fooC\n",
    "_fooC.thing()",
    "a_fooC.thing()",
    "_fooC.Tensor",
    "_fooC.xTensor + _barC.ok",
    "é_fooC.x",
    "_éC.x",
    "C.x",
    "_C.x",
    "torch_ipex.ops",
    "nothing to see",
]


@pytest.mark.parametrize("version", ["0.10.2", "0.33.0"])
def test_the_sink_prefilter_selects_what_the_one_pattern_selected(version):
    """reach._may_hold_sinks tests the markers one by one from literals; on
    every file of a release of each era and on edge cases it selects the
    same modules as the one pattern it replaced (a module it dropped would
    hide its sinks from the proof)."""
    texts = tree.python_sources(releases.pristine(version))
    texts.update({f"edge{i}.py": text for i, text in enumerate(_EDGES)})
    for path, text in texts.items():
        old = bool(_OLD_MARKERS.search(text)) or any(
            reach._extension_module(top)
            for top in set(reach._TOP_IMPORTS.findall(text))
        )
        old = old or logonce.may_trace(text)  # and vLLM's logger.*_once
        assert reach._may_hold_sinks(text) == old, path
    assert any(reach._may_hold_sinks(t) for t in _EDGES)
    assert not all(reach._may_hold_sinks(t) for t in _EDGES)


def _verdicts(findings):
    return [(f.callee, f.kind, f.site, f.configurations, f.chain) for f in findings]


def test_the_proofs_search_finds_what_the_full_walk_finds(tmp_path, monkeypatch):
    """The proof's search shares the scan's syntax trees and walks only the
    nodes it looks for (pysource.walk, pysource.statements, no walk of a
    function without `import`); on a b6-like tree it gives the findings
    that a search walking every node of fresh parses gives, the rotary call
    the tree reaches among them (what makes the proof refuse it)."""
    texts = tree.python_sources(downstream.b6_like(tmp_path / "b6"))
    parsed: dict = {}
    _, declared = scan.scan(texts, parsed=parsed)
    fast = reach.find(texts, declared, upwards=False, ipex=True, parsed=parsed)
    assert "vllm._C.ops.rotary_embedding" in {f.callee for f in fast if f.reached}
    monkeypatch.setattr(reach, "_walk", ast.walk)
    monkeypatch.setattr(pysource, "walk", ast.walk)
    monkeypatch.setattr(pysource, "statements", ast.walk)
    monkeypatch.setattr(
        pysource.Module,
        "_function_imports",
        lambda self, f: pysource.local_imports(self.name, f, self.is_package),
    )
    full = reach.find(texts, declared, upwards=False, ipex=True)
    assert _verdicts(fast) == _verdicts(full)
