"""The trees' features the model proof adapts to (proof/model/features.py):
each detected in the tree itself, in one place, named with the tree that
needed it. Cheap: source text and a few imports, no model is built.

Negative controls: a tree without the text has none of the features; a
feature recorded under a name FEATURES does not have is refused; the
one-place check flags a module that reads a tree's envs.py itself."""

import ast
import dataclasses
import re

import pytest

from support import releases, tool
from xpufakes.proof.model import features

MODEL = tool.SCRIPTS / "xpufakes" / "proof" / "model"


@pytest.fixture(autouse=True)
def _fresh():
    features.MET.clear()
    yield
    features.MET.clear()


def _tree(tmp_path, envs: str = "", platform: str = ""):
    (tmp_path / "vllm" / "platforms").mkdir(parents=True)
    (tmp_path / "vllm" / "envs.py").write_text(envs)
    (tmp_path / "vllm" / "platforms" / "xpu.py").write_text(platform)
    return tmp_path


def test_the_source_text_features_are_the_trees(tmp_path):
    """intel/llm-scaler's environment variables and the XPU platform's
    import of vllm_xpu_kernels, each from the tree's own text; a tree
    without them (the negative control) has none, and nothing is met."""
    bare = _tree(tmp_path / "bare", envs='"VLLM_USE_V1": lambda: 1,\n')
    assert not features.streaming_loader(bare)
    assert not features.sym_int4_library(bare)
    assert not features.xpu_kernels_at_start_up(bare)
    assert features.MET == []
    scaler = _tree(
        tmp_path / "scaler",
        envs='"VLLM_OFFLOAD_WEIGHTS_BEFORE_QUANT": lambda: 0,\n'
        '"VLLM_QUANTIZE_Q40_LIB": lambda: "",\n',
        platform="import vllm_xpu_kernels._C  # noqa\n",
    )
    assert features.streaming_loader(scaler)
    assert features.sym_int4_library(scaler)
    assert features.xpu_kernels_at_start_up(scaler)
    assert features.MET == [
        "streaming loader",
        "sym_int4 library",
        "vllm_xpu_kernels at start-up",
    ]


def test_the_inline_call_of_torch_28_is_0102s_decorator():
    """0.10.2's decorator replaces inline_call with torch 2.8's signature
    (this torch passes allow_nested_graph_breaks); 0.14.1's does not (the
    negative control)."""
    assert features.inline_call_of_torch_28(releases.pristine("0.10.2"))
    assert not features.inline_call_of_torch_28(releases.pristine("0.14.1"))
    assert features.MET == ["inline_call of torch 2.8"]


def test_the_imported_vllms_features():
    class Platform:
        @classmethod
        def num_compute_units(cls, device_id=0):
            return 1

    assert features.compute_units(Platform)
    assert not features.compute_units(object)

    def pass_config(*names):
        fields = [(name, bool, dataclasses.field(default=True)) for name in names]
        return dataclasses.make_dataclass("PassConfig", fields)()

    assert features.sp_field(pass_config("enable_sp")) == "enable_sp"
    assert features.sp_field(pass_config("enable_sequence_parallelism")) == (
        "enable_sequence_parallelism"
    )
    assert features.sp_field(pass_config("enable_fusion")) == ""

    class Config:
        rope_parameters = {"rope_theta": 5e6}

    assert features.rope_theta_in_parameters_only(Config())
    Config.rope_theta = 5e6
    assert not features.rope_theta_in_parameters_only(Config())


def test_every_feature_met_is_named_with_its_tree():
    """Every name features.py records is in FEATURES, which says the tree
    that needed it, and every entry of FEATURES is met somewhere (no
    entry outlives its detection); a name FEATURES lacks is refused."""
    source = (MODEL / "features.py").read_text()
    recorded = {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "met"
        and isinstance(node.args[0], ast.Constant)
    }
    assert recorded == set(features.FEATURES)
    for name, said in features.FEATURES.items():
        assert re.search(r"\d+\.\d+|llm-scaler", said), (name, said)
    with pytest.raises(AssertionError):
        features.met("a feature nobody named")


# what only features.py may do: read a tree's files by name, or ask the
# imported vLLM what it has
TREE_LOOKS = re.compile(
    r'"vllm/(envs|platforms/xpu|compilation/decorators)\.py"|inspect\.getsource'
    r'|hasattr\(XPUPlatform|__dataclass_fields__|"VLLM_[A-Z0-9_]+"'
)


def _looks(text: str) -> list[str]:
    allowed = {'"VLLM_DISABLE_COMPILE_CACHE"'}  # every tree's, not a feature
    return [m.group(0) for m in TREE_LOOKS.finditer(text) if m.group(0) not in allowed]


def test_no_other_module_of_the_model_proof_looks_at_the_tree():
    found = {
        path.name: _looks(path.read_text())
        for path in MODEL.glob("*.py")
        if path.name != "features.py"
    }
    assert {name: said for name, said in found.items() if said} == {}
    # the negative control: a module that reads envs.py itself is flagged
    assert _looks('envs = tree / "vllm/envs.py"') == ['"vllm/envs.py"']


def test_the_current_device_where_the_model_code_asks_for_it(tmp_path):
    """0.21.0's GatedDeltaNet makes its gated norm on
    current_platform.current_device() (torch.xpu.current_device(), which a
    torch without XPU refuses): found in the tree's model code; a tree
    without the call (the negative control) has no such feature. The index
    it answers names the XPU, which XPUOnCPU takes as the CPU; without it
    this torch refuses a device index (the control)."""
    import torch

    from xpufakes.proof.xpu import device

    bare = tmp_path / "bare"
    (bare / "vllm" / "model_executor" / "layers").mkdir(parents=True)
    (bare / "vllm" / "model_executor" / "layers" / "gdn.py").write_text(
        "device = current_platform.device_type\n"
    )
    assert not features.current_device(bare)
    assert features.MET == []
    asking = tmp_path / "asking"
    (asking / "vllm" / "model_executor" / "layers").mkdir(parents=True)
    (asking / "vllm" / "model_executor" / "layers" / "gdn.py").write_text(
        "norm = RMSNormGated(8, device=current_platform.current_device())\n"
    )
    assert features.current_device(asking)
    assert features.MET == ["current device"]
    index = device.current_device()
    assert index == 0
    with pytest.raises(RuntimeError):
        torch.zeros(2, device=index)
    with device.XPUOnCPU():
        assert torch.zeros(2, device=index).device.type == "cpu"
        assert torch.zeros(2, device="xpu").device.type == "cpu"
