"""The trees' features the model proof adapts to, in one place.

Trees differ in ways the proof has to meet: a downstream image's own
environment variables and loader, a method of the XPU platform, a
decorator written for an older torch, a config field. Each is detected
here in the tree itself -- its source text before vLLM is imported, or what
the imported vLLM has -- never by its version string (downstream builds say
`0.10.3.dev0+g01efc7ef7...xpu`), and each is named with the tree that
needed it (FEATURES). environment.py and build.py ask here and do what each
needs; the proof's result lists the features it met (`features`).
"""

import inspect
from pathlib import Path

# name -> the tree that needed it: what the proof does where a tree has it
FEATURES: dict[str, str] = {
    "streaming loader": "intel/llm-scaler 0a85564 (0.14.0): its loader leaves "
    "the weights on the meta device until a checkpoint's tensors arrive; "
    "VLLM_OFFLOAD_WEIGHTS_BEFORE_QUANT=1 makes them on the CPU (none arrive "
    "here: the weights are random)",
    "sym_int4 library": "intel/llm-scaler's online int4 (sym_int4): it "
    "quantizes with a ctypes library named by VLLM_QUANTIZE_Q40_LIB, built "
    "here from q4_0_standin.c",
    "vllm_xpu_kernels at start-up": "intel/llm-scaler 0a85564, an IPEX-era "
    "tree, imports vllm_xpu_kernels._C and _xpu_C in vllm/platforms/xpu.py "
    "(the kernels era's releases do too): the package is stood in, found by "
    "importlib.util.find_spec as 0.21.0's kernels/xpu_ops.py looks for it",
    "compute units": "0.33.0's Triton MLA asks XPUPlatform.num_compute_units "
    "while it is made: an Arc B580's (device.XPU_COMPUTE_UNITS)",
    "inline_call of torch 2.8": "vLLM 0.10.2's decorator replaces Dynamo's "
    "InliningInstructionTranslator.inline_call with a function of torch "
    "2.8's signature; torch 2.9+ passes allow_nested_graph_breaks, which the "
    "replacement is given",
    "sequence parallelism switch": "PassConfig.enable_sp (0.13 - 0.31), "
    "enable_sequence_parallelism before it; 0.32.0 removed both",
    "deprecated quantization": "0.14's IPEX int4 (AWQ, GPTQ) is the "
    'deprecated method "ipex": allowed, as a user allows it on 0.14',
    "rope_theta attribute": "trees made for transformers 4 (0.10.2 - 0.11.x: "
    "their models read config.rope_theta, and fall back to 10000 without "
    "it; 0.13.0 reads rope_parameters); transformers 5 keeps it in "
    "rope_parameters only: it is set as an attribute",
    "current device": "0.21.0's GatedDeltaNet (Qwen3-Next; llm-scaler "
    "0.21.0-b3.1's too) makes its gated norm on "
    "current_platform.current_device(), torch.xpu.current_device(): the "
    "device's index, 0 (device.XPU_DEVICE_INDEX), which names the XPU where "
    "a tensor is made (the CPU here: device.XPUOnCPU)",
    "layerwise online quantization": "0.21.0's online fp8 makes its weights on "
    "the meta device and quantizes each layer as its tensors arrive: a layer "
    "none arrive for is finished by vLLM's finalize_layerwise_processing, as "
    "its loader calls it after loading",
}

# The environment variables of FEATURES, as the trees' vllm/envs.py name them
OFFLOAD_WEIGHTS = "VLLM_OFFLOAD_WEIGHTS_BEFORE_QUANT"
Q40_LIBRARY = "VLLM_QUANTIZE_Q40_LIB"
# The text 0.10.2's vllm/compilation/decorators.py calls Dynamo's
# inline_call with (its replacement's torch 2.8 signature)
INLINE_CALL_28 = "patched_inline_call(parent, func, args, kwargs)"
# the call the tree makes for the XPU's index (features "current device")
CURRENT_DEVICE = "current_platform.current_device()"
# sequence parallelism's switch, newest name first
SP_FIELDS = ("enable_sp", "enable_sequence_parallelism")

# the features met in this process, in the order met (the result's `features`)
MET: list[str] = []


def met(name: str) -> bool:
    """Record that the tree has feature `name` (of FEATURES); True."""
    assert name in FEATURES, name
    if name not in MET:
        MET.append(name)
    return True


def _text(tree: Path, path: str) -> str:
    file = tree / path
    return file.read_text(errors="replace") if file.is_file() else ""


# -- in the tree's source text, before vLLM is imported -----------------------


def streaming_loader(tree: Path) -> bool:
    return OFFLOAD_WEIGHTS in _text(tree, "vllm/envs.py") and met("streaming loader")


def sym_int4_library(tree: Path) -> bool:
    return Q40_LIBRARY in _text(tree, "vllm/envs.py") and met("sym_int4 library")


def xpu_kernels_at_start_up(tree: Path) -> bool:
    platform = _text(tree, "vllm/platforms/xpu.py")
    return "vllm_xpu_kernels" in platform and met("vllm_xpu_kernels at start-up")


def current_device(tree: Path) -> bool:
    """The tree's model code asks the platform for the current device
    (torch.xpu.current_device(), which a torch without XPU refuses)."""
    return any(
        CURRENT_DEVICE in p.read_text(errors="replace")
        for p in (tree / "vllm/model_executor").rglob("*.py")
    ) and met("current device")


def inline_call_of_torch_28(tree: Path) -> bool:
    """The tree's decorator replaces inline_call with torch 2.8's signature,
    and this torch passes one more argument."""
    from torch._dynamo.symbolic_convert import InliningInstructionTranslator

    parameters = inspect.signature(InliningInstructionTranslator.inline_call)
    return (
        "allow_nested_graph_breaks" in parameters.parameters
        and INLINE_CALL_28 in _text(tree, "vllm/compilation/decorators.py")
        and met("inline_call of torch 2.8")
    )


# -- in what the imported vLLM has ---------------------------------------------


def compute_units(platform_class) -> bool:
    return hasattr(platform_class, "num_compute_units") and met("compute units")


def sp_field(pass_config) -> str:
    """The name of the switch of sequence parallelism of the tree's
    PassConfig (an instance); "" if it has none."""
    fields = getattr(type(pass_config), "__dataclass_fields__", {})
    names = [name for name in SP_FIELDS if name in fields]
    return names[0] if names and met("sequence parallelism switch") else ""


def deprecated_quantization(model_config_class) -> bool:
    fields = getattr(model_config_class, "__dataclass_fields__", {})
    return "allow_deprecated_quantization" in fields and met("deprecated quantization")


def rope_theta_in_parameters_only(config) -> bool:
    parameters = getattr(config, "rope_parameters", None) or {}
    return (
        "rope_theta" in parameters
        and not hasattr(config, "rope_theta")
        and met("rope_theta attribute")
    )


def layerwise_online_quantization():
    """(_has_online_quant, finalize_layerwise_processing) of the tree's
    loader, or None where it has neither."""
    try:
        from vllm.model_executor.model_loader.base_loader import _has_online_quant
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_processing,
        )
    except ImportError:
        return None
    met("layerwise online quantization")
    return _has_online_quant, finalize_layerwise_processing
