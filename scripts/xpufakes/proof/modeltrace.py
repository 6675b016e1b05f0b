"""The whole-model proof: build a model from a vLLM tree's own model module
at a tiny size (data/models.toml) and trace its forward as vLLM compiles it,
on the XPU platform's code paths, in one Python with torch:

    python -m xpufakes.proof.modeltrace TREE MODEL[,MODEL...] OUT.json
        --standins KERNELS [--configurations default,sp]

What runs as released (or as patched): the tree's model classes, layers,
quantization methods (chosen by the tree for the XPU platform: online fp8 is
XPUFp8LinearMethod / XPUFp8MoEMethod in the IPEX era), CustomOp dispatch,
attention and MoE layers (which call vLLM's opaque ops, as on XPU), its
weight processing after loading (vLLM's own process_weights_after_loading),
its ModelConfig and VllmConfig (which resolve the custom ops and passes of
each configuration), its `@support_torch_compile` decorator (dynamic-shape
marking, fullgraph as vLLM sets it, the compiled-code dispatch) and vLLM's
forward context, as a warm-up (dummy) run sets it.

What does not run: vLLM's own backend (VllmBackend splits the graph and runs
Inductor on each piece, which on a CPU with XPU-only kernels cannot run).
The compilation config's backend is ours: it takes the graph Dynamo
captured, runs AOT autograd's functionalization on it with fake tensors
(every op's fake runs, mutations become explicit) and stops; nothing is
compiled or run. Dynamo's trace is the same whatever the backend. The engine,
the scheduler and the workers do not run; the forward is called once, as the
warm-up calls it, with no attention metadata and max_num_batched_tokens
tokens (a profile run's).

What is stood in (standins.py, loading.py): what only an XPU host has. IPEX
(its Python APIs call torch_ipex ops registered for the XPU key only; its
MoE and attention modules are made, never run); the torch_ipex GEMMs with
CPU reference kernels and no fake (IPEX's XPU build has none: the tree's
fakes are what is tested); IPEX's weight-quantization op with a CPU kernel
(it runs while loading, not traced); what processes int4 weights while
loading (intel/llm-scaler's sym_int4 quantizer library, vllm-xpu-kernels'
int4 layout helpers: named in the report's stand-ins); a build's native
modules (vllm._C, as pybind11 builtins Dynamo refuses as it refuses the real
ones); torchvision
where it cannot be imported (a multimodal model's module imports an image
processor at module level; the vision path is not run); the device: tensors
are on the CPU (DeviceConfig "cpu") while vLLM's current platform is its
XPUPlatform. The distributed groups are one process on gloo (TP=1).

Writes a JSON object: the tree, the stand-ins, the set-up's seconds and
`models`, one entry per model (model, what, configurations: one result per
configuration, see trace_one). The models share the process and its set-up.
A model that cannot be built under a configuration (vLLM refuses its
configuration, a stand-in is missing, the set-up failed) is "not built",
with the first line of the error and where it was raised. What the tree
itself cannot run on XPU is "tree limit", with the reason (a configuration
it does not have or turns off, a model class it does not have, a `_C` op
its vllm-xpu-kernels release lacks, MLA without an MLA backend); an entry
for other trees only (models.toml applies_to) is "not for this tree".
"""

import argparse
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

from xpufakes.proof import loading
from xpufakes.proof import models as model_data

# vLLM's compile cache and AOT compile: off, so that nothing is written to
# the cache directory or read from it (the trace is made here, every time).
os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
# Weights made on the CPU while loading, where a tree asks: intel/llm-scaler
# 0a85564's streaming loader otherwise leaves them on the meta device until a
# checkpoint's tensors arrive (none do here: the weights are random).
os.environ["VLLM_OFFLOAD_WEIGHTS_BEFORE_QUANT"] = "1"


class Traced(Exception):
    """Our backend's stop: the graph is captured and functionalized."""


# the stand-ins _setup made beside the kernels' (the report names them)
HELPERS: list[str] = []
# the directories _setup made (os._exit at the end skips atexit)
TEMPORARY: list[Path] = []


def _setup(tree: Path, standins: str) -> list:
    """The stand-ins, then vLLM's XPU platform as its current platform.
    Returns what must stay referenced (the ops' libraries)."""
    sys.path.insert(0, str(tree))
    import torch  # noqa: F401

    from xpufakes.proof import loading
    from xpufakes.proof import standins as made

    made.install_torchvision()
    made.install_downstream_packages()
    kept = [made.define_torch_ipex_ops(), made.define_loading_ops("torch_ipex")]
    # IPEX's WOQ linear module (int4 AWQ / GPTQ: IPEXAWQLinearMethod,
    # IPEXGPTQLinearMethod make it while loading): the reference one, whose
    # forward calls the torch_ipex WOQ ops as IPEX's XPU forward does
    reference = loading.reference()
    kept.append(reference.define_torch_ipex_woq_kernels())
    made.install_ipex(woq_from_weight=reference.ReferenceWOQLinear.from_weight)
    envs = tree / "vllm" / "envs.py"
    if envs.is_file() and "VLLM_QUANTIZE_Q40_LIB" in envs.read_text():
        # intel/llm-scaler's sym_int4 quantizer, a ctypes library
        library = Path(tempfile.mkdtemp(prefix="xpufakes-q4_0-"))
        TEMPORARY.append(library)  # removed when the process ends
        os.environ["VLLM_QUANTIZE_Q40_LIB"] = str(made.q4_0_library(library))
        HELPERS.append("sym_int4's quantizer library (q4_0_standin.c)")
    loading.stub_vllm_extensions(tree)
    if "vllm-xpu-kernels" in standins or _imports_xpu_kernels(tree):
        loading.stub_xpu_kernel_package()
        HELPERS.append(
            "vllm_xpu_kernels.quantization._quantize_convert "
            "(quantize_convert_standin.py)"
        )
        kept.append(made.define_loading_ops("_C"))  # its _C registers them
        # found by importlib.util.find_spec, as vLLM looks for it
        # (0.21.0's kernels/xpu_ops.py)
        package = sys.modules["vllm_xpu_kernels"]
        if package.__spec__ is None:
            package.__spec__ = importlib.machinery.ModuleSpec(
                "vllm_xpu_kernels", None, is_package=True
            )
        sys.meta_path.append(_XPUKernelModules())
    # before anything of vLLM asks for it (a module that imports
    # current_platform keeps the one it got)
    import vllm.platforms
    from vllm.platforms.xpu import XPUPlatform

    if vllm.platforms._current_platform is not None:
        raise RuntimeError(
            "vLLM chose its platform before the proof: "
            f"{vllm.platforms._current_platform}"
        )
    vllm.platforms._current_platform = XPUPlatform()
    if hasattr(XPUPlatform, "num_compute_units"):
        # the device's compute units (0.33.0's Triton MLA asks while it is
        # made): an Arc B580's, as standins.XPU_DEVICE answers for it
        XPUPlatform.num_compute_units = classmethod(
            lambda cls, device_id=0: made.XPU_COMPUTE_UNITS
        )
    kept += loading.define_standins(standins)
    # vllm-xpu-kernels' _C activations, norms and rotary embedding (the dense
    # path's CustomOps take them in __init__), as the release registers them
    kept += loading.define_xpu_kernels_c(standins)
    loading.import_registering_module(None)  # the tree's own fakes, as on XPU
    _adapt_to_this_torch()
    return kept


def _imports_xpu_kernels(tree: Path) -> bool:
    """Whether the tree's XPU platform imports vllm_xpu_kernels' native
    modules at start-up (intel/llm-scaler 0a85564, an IPEX-era tree,
    imports vllm_xpu_kernels._C and _xpu_C in vllm/platforms/xpu.py)."""
    platform = tree / "vllm" / "platforms" / "xpu.py"
    return platform.is_file() and "vllm_xpu_kernels" in platform.read_text()


class _XPUKernelModule(types.ModuleType):
    """A module below vllm_xpu_kernels the tree imports (its native `_C`,
    `_xpu_C`, `_moe_C`): every name is a function that raises when called
    (vLLM calls them inside its own opaque ops, or not at all here)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{name} is a stand-in")

        setattr(self, name, unavailable)
        return unavailable


class _XPUKernelModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any module below the vllm_xpu_kernels stand-in package that
    loading.stub_xpu_kernel_package does not make."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("vllm_xpu_kernels."):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return _XPUKernelModule(spec.name)

    def exec_module(self, module):
        pass


def _adapt_to_this_torch() -> None:
    """vLLM 0.10.2's decorator replaces Dynamo's
    InliningInstructionTranslator.inline_call (to record the files it
    traces) with a function of the torch 2.8 signature; torch 2.9+ passes
    one more argument, allow_nested_graph_breaks, which matters only when
    torch._dynamo.config.nested_graph_breaks is on (off by default, and a
    fullgraph trace has no graph breaks to nest). The replacement is given
    that argument and called without it while it does not matter."""
    import torch
    from torch._dynamo.symbolic_convert import InliningInstructionTranslator

    decorators = importlib.import_module("vllm.compilation.decorators")
    inline_call = inspect.signature(InliningInstructionTranslator.inline_call)
    if "allow_nested_graph_breaks" not in inline_call.parameters:
        return
    if "patched_inline_call(parent, func, args, kwargs)" not in inspect.getsource(
        decorators
    ):
        return
    from unittest import mock

    class Patch:
        def object(self, target, name, new, *args, **kwargs):
            if target is InliningInstructionTranslator and name == "inline_call":
                old = new

                def new(parent, func, args_, kwargs_, allow_nested_graph_breaks=False):
                    if torch._dynamo.config.nested_graph_breaks:
                        raise RuntimeError(
                            "vLLM's inline_call replacement cannot pass "
                            "allow_nested_graph_breaks"
                        )
                    return old(parent, func, args_, kwargs_)

            return mock.patch.object(target, name, new, *args, **kwargs)

    decorators.patch = Patch()


def _backend(captured: list):
    """Our compile backend: AOT autograd's functionalization of the graph
    Dynamo captured (fake tensors), its graph kept, then stop."""

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(graph, inputs):
            captured.append((gm, graph))
            return graph

        aot_module_simplified(gm, example_inputs, fw_compiler=keep)
        raise Traced(len(gm.graph.nodes))

    return backend


TORCH_NAMESPACES = ("aten", "prims", "_c10d_functional", "higher_order")


def _ops(graph) -> dict[str, str]:
    """The ops of a graph that are not torch's own: 'ns::op' -> "" or
    "writes carried" where functionalization carries its writes
    (auto_functionalized)."""
    import torch

    found = {}
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        target, note = node.target, ""
        if target in (
            torch.ops.higher_order.auto_functionalized,
            getattr(torch.ops.higher_order, "auto_functionalized_v2", None),
        ):
            target, note = node.args[0], "writes carried"
        if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            qualified = (
                getattr(target, "_qualified_op_name", None) or target._schema.name
            )
            namespace, _, name = qualified.partition("::")
            if namespace not in TORCH_NAMESPACES:
                key = f"{namespace}::{name}"
                found[key] = note or found.get(key, "")
    return found


def _where(error: BaseException, tree: Path) -> list[str]:
    """The user frames of a Dynamo error, outermost first: 'file:line name'."""
    stack = getattr(error, "real_stack", None) or []
    frames = []
    for frame in stack:
        path = Path(frame.filename)
        shown = path.relative_to(tree) if path.is_relative_to(tree) else path
        frames.append(f"{shown}:{frame.lineno} {frame.name}")
    return frames


def _config_dir(model: model_data.Model, work: Path) -> Path:
    path = work / model.name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config, indent=2))
    return path


class TreeLimit(Exception):
    """What the tree itself cannot do on XPU (a configuration it does not
    have, a model its XPU platform cannot run): the reason."""


# sequence parallelism's switch, as each tree names it: PassConfig.enable_sp
# (0.13 - 0.31), enable_sequence_parallelism before; 0.32.0 removed it
SP_FIELDS = ("enable_sp", "enable_sequence_parallelism")


def _compilation_config(configuration: str):
    from vllm.config import CompilationConfig

    if configuration == "default":
        return CompilationConfig()
    fields = CompilationConfig().pass_config.__dataclass_fields__
    names = [name for name in SP_FIELDS if name in fields]
    if not names:
        raise TreeLimit(
            "the tree has no sequence parallelism (its PassConfig has none "
            f"of {', '.join(SP_FIELDS)})"
        )
    return CompilationConfig(pass_config={names[0]: True})


def _model_class(model: model_data.Model):
    """The model's class: the entry's module and class, or the one the
    tree's own registry names for its architecture (the tree's code path:
    MistralForCausalLM is llama.py's class in 0.14, mistral.py's in 0.16).
    TreeLimit where the tree has none."""
    if model.module:
        return getattr(importlib.import_module(model.module), model.cls)
    from vllm.model_executor.models import registry

    architecture = model.config["architectures"][0]
    if architecture not in registry._VLLM_MODELS:
        removed = getattr(registry, "_PREVIOUSLY_SUPPORTED_MODELS", {})
        since = (
            f" (vLLM removed it in {removed[architecture]})"
            if (architecture in removed)
            else ""
        )
        raise TreeLimit(f"the tree has no model for {architecture}{since}")
    module, name = registry._VLLM_MODELS[architecture]
    return getattr(
        importlib.import_module(f"vllm.model_executor.models.{module}"), name
    )


def _not_for_this_tree(model: model_data.Model) -> str:
    """ "" or why the entry is not for this tree (its applies_to)."""
    method = model.applies_to.get("quantization")
    if not method:
        return ""
    from vllm.model_executor.layers import quantization

    known = getattr(quantization, "QUANTIZATION_METHODS", [])
    if method in known:
        return ""
    return f"only for trees with the quantization method {method} (this one has none)"


def _register(model: model_data.Model) -> None:
    """The model's class, imported here, registered for its architecture
    (vLLM's API for a model class it should not import in a subprocess of
    its own: ModelConfig inspects a lazily registered one in a fresh Python,
    which has none of the stand-ins)."""
    from vllm.model_executor.models import ModelRegistry

    cls = _model_class(model)
    for architecture in model.config["architectures"]:
        ModelRegistry.register_model(architecture, cls)


def _vllm_config(model: model_data.Model, directory: Path, configuration: str):
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig

    _register(model)
    # IPEX's int4 (AWQ, GPTQ) is the deprecated method "ipex" where vLLM has
    # deprecated methods (0.14): a user allows it to run such a checkpoint
    fields = getattr(ModelConfig, "__dataclass_fields__", {})
    allow = "allow_deprecated_quantization" in fields
    model_config = ModelConfig(
        model=str(directory),
        tokenizer=str(directory),
        skip_tokenizer_init=True,
        quantization=model.quantization,
        dtype=model.dtype,
        max_model_len=4096,
        **({"allow_deprecated_quantization": True} if allow else {}),
    )
    _rope_theta_as_an_attribute(model_config)
    return VllmConfig(
        model_config=model_config,
        device_config=DeviceConfig(device="cpu"),
        compilation_config=_compilation_config(configuration),
    )


def _rope_theta_as_an_attribute(model_config) -> None:
    """transformers 5 keeps rope_theta in rope_parameters only; vLLM
    releases made for transformers 4 read config.rope_theta (and fall back
    to 10000 without it)."""
    hf = model_config.hf_config
    for config in {id(c): c for c in (hf, hf.get_text_config())}.values():
        parameters = getattr(config, "rope_parameters", None) or {}
        if "rope_theta" in parameters and not hasattr(config, "rope_theta"):
            config.rope_theta = parameters["rope_theta"]


_DISTRIBUTED = []


def _distributed(vllm_config, work: Path) -> None:
    """One process, TP=1, on gloo: the environment once per process, the
    model-parallel groups for each model (0.16.0+ makes the expert-parallel
    group only for a model with experts, as the current config says)."""
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.distributed.parallel_state import destroy_model_parallel

    if not _DISTRIBUTED:
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{work / 'distributed'}",
            backend="gloo",
        )
        _DISTRIBUTED.append(True)
    else:
        destroy_model_parallel()
    initialize_model_parallel(1, 1)


def _build(model: model_data.Model, vllm_config):
    """The model as vLLM's loader makes it (its class for the architecture,
    built under the model's dtype on the device), weights random, then
    vLLM's own processing after loading (online fp8 quantizes here). Where
    the tree names the XPU device while doing so, the CPU (XPUOnCPU)."""
    import torch
    from vllm.model_executor.model_loader.utils import (
        process_weights_after_loading,
    )

    from xpufakes.proof.standins import XPUOnCPU

    cls = _model_class(model)
    default = torch.get_default_dtype()
    torch.set_default_dtype(vllm_config.model_config.dtype)
    try:
        with torch.device("cpu"), XPUOnCPU():
            built = cls(vllm_config=vllm_config, prefix="")
    finally:
        torch.set_default_dtype(default)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in built.parameters():
            if parameter.is_floating_point():
                values = torch.randn(parameter.shape, generator=generator) * 0.02
                parameter.copy_(values.to(parameter.dtype))
    with XPUOnCPU():
        _finish_online_quantization(built, vllm_config.model_config)
        process_weights_after_loading(
            built, vllm_config.model_config, torch.device("cpu")
        )
    return built


def _finish_online_quantization(built, model_config) -> None:
    """Online quantization that makes its weights on the meta device
    (0.21.0's fp8: `uses_meta_device`) quantizes each layer as the
    checkpoint's tensors for it arrive. A layer none arrive for (here: all)
    is materialized and quantized by vLLM's own finalize_layerwise_processing,
    which its loader calls after loading; then, as there, the rest of the
    processing. Trees before it have neither."""
    try:
        from vllm.model_executor.model_loader.base_loader import _has_online_quant
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_processing,
        )
    except ImportError:
        return
    if _has_online_quant(built):
        finalize_layerwise_processing(built, model_config)


def _described(built) -> dict:
    """Which forward each CustomOp class dispatches to, and which
    quantization method each layer has: class -> what, with counts."""
    forwards, methods = {}, {}
    for module in built.modules():
        forward = getattr(module, "_forward_method", None)
        if forward is not None:
            forwards[type(module).__name__] = getattr(forward, "__name__", "?")
        method = getattr(module, "quant_method", None)
        if method is not None:
            name = type(method).__name__
            methods[name] = methods.get(name, 0) + 1
    return {"forwards": forwards, "methods": methods}


# SchedulerConfig's default max_num_batched_tokens (vLLM's
# DEFAULT_MAX_NUM_BATCHED_TOKENS), for a config that has none
WARM_UP_TOKENS = 2048


def _warm_up_tokens(vllm_config) -> int:
    """The tokens of the forward vLLM compiles at start-up: the profile
    run's dummy batch, max_num_batched_tokens (the scheduler config's
    value; its own default where the config leaves it unset). A branch on
    the batch size (a decode fast path for a few tokens) is traced as the
    start-up traces it."""
    scheduler = getattr(vllm_config, "scheduler_config", None)
    tokens = getattr(scheduler, "max_num_batched_tokens", None)
    return int(tokens) if tokens else WARM_UP_TOKENS


def _inputs(model: model_data.Model, built, tokens: int):
    import torch

    ids = torch.arange(tokens) % 100
    if model.positions == "mrope":
        positions = torch.arange(tokens).expand(3, tokens).contiguous()
    else:
        positions = torch.arange(tokens)
    if model.inputs == "embeds":
        embed = getattr(built, "embed_input_ids", None) or built.get_input_embeddings
        return {"input_ids": None, "positions": positions, "inputs_embeds": embed(ids)}
    return {"input_ids": ids, "positions": positions}


def _mode_name(mode) -> str:
    """CompilationMode's name (0.11+), or CompilationLevel's (0.10: ints)."""
    if hasattr(mode, "name"):
        return mode.name
    import vllm.config

    level = getattr(vllm.config, "CompilationLevel", None)
    names = [n for n, v in vars(level or object).items() if v == mode and n.isupper()]
    return f"level {mode}" + (f" ({names[0]})" if names else "")


# pydantic's first line of a ValidationError ("1 validation error for
# ModelConfig"), whose reason is on the lines after it
_SUMMARY = re.compile(r"\d+ validation errors? for \w+")


def _tree_frames(error: BaseException, tree: Path) -> list[str]:
    """The tree's frames of an error's traceback, innermost last."""
    frames = []
    for frame in traceback.extract_tb(error.__traceback__):
        path = Path(frame.filename)
        if path.is_relative_to(tree):
            frames.append(f"{path.relative_to(tree)}:{frame.lineno} {frame.name}")
    return frames


def not_built(error: BaseException, tree: Path, start: float | None = None) -> dict:
    """The result of a model that could not be built: the first line of the
    error (and the reason under it where that line is pydantic's summary),
    the frames of the tree it passed through (innermost last), the
    end of its traceback, and the missing module of a ModuleNotFoundError."""
    lines = str(error).strip().splitlines() or [""]
    first = lines[0].strip()
    if _SUMMARY.fullmatch(first):  # pydantic's: the reason is below it
        below = [line.strip() for line in lines[1:3] if line.strip()]
        below = [line for line in below if not line.startswith("For further")]
        first = f"{first}: " + " ".join(b.split(" [type=")[0] for b in below)
    frames = _tree_frames(error, tree)
    said = {
        "result": "not built",
        "error": f"{type(error).__name__}: {first}",
        "where": frames,
        "traceback": "".join(traceback.format_exception(error))[-3000:],
        "graphs": 0,
        "graph_breaks": 0,
        "ops": [],
    }
    if isinstance(error, ModuleNotFoundError):
        said["missing"] = error.name
    if start is not None:
        said["seconds"] = round(time.monotonic() - start, 1)
    return said


NOT_FOR_THIS_TREE = "not for this tree"


def tree_limit(reason: TreeLimit, start: float, kind: str = "tree limit") -> dict:
    """The result of a configuration or model the tree cannot run on XPU
    (or, `kind` NOT_FOR_THIS_TREE, an entry that is for other trees)."""
    return {
        "result": kind,
        "error": str(reason),
        "where": [],
        "graphs": 0,
        "graph_breaks": 0,
        "ops": [],
        "seconds": round(time.monotonic() - start, 1),
    }


def _sp_turned_off(vllm_config, configuration: str) -> None:
    """TreeLimit if sequence parallelism was asked for and the tree's
    VllmConfig turned it off again (0.16.0+: it needs TP > 1, and the proof
    runs one process)."""
    if configuration != "sp":
        return
    pass_config = vllm_config.compilation_config.pass_config
    names = [n for n in SP_FIELDS if n in type(pass_config).__dataclass_fields__]
    if names and not getattr(pass_config, names[0]):
        raise TreeLimit(
            f"the tree's VllmConfig turned {names[0]} off (it needs tensor "
            "parallelism > 1; the proof runs one process)"
        )


def _unquantized(model: model_data.Model, methods: dict) -> str:
    """ "" or why the model's quantization reached no layer (a checkpoint
    config the tree reads differently than the model's entry means)."""
    if not model.quantization:
        return ""
    quantized = [m for m in methods if not m.startswith("Unquantized")]
    quantized = [m for m in quantized if "KVCache" not in m]
    if quantized:
        return ""
    return (
        f"--quantization {model.quantization} quantized no layer "
        f"(methods: {', '.join(methods) or 'none'})"
    )


_MISSING_OP = re.compile(r"'_OpNamespace' '_C' object has no attribute '(\w+)'")


def _missing_kernel(error: BaseException, kernels: str) -> str:
    """ "" or the tree's limit: the model's path (its build, weight
    processing or traced forward) calls a `_C` op the tree's
    vllm-xpu-kernels release does not define (on XPU it fails the same)."""
    text = "".join(traceback.format_exception(error))
    for op in dict.fromkeys(_MISSING_OP.findall(text)):
        if loading.xpu_kernels_c_has(kernels, op) is False:
            return (
                f"the tree calls torch.ops._C.{op}, which "
                f"{kernels.strip()} does not define (no XPU kernel)"
            )
    return ""


_NO_LINEAR_KERNEL = "Failed to find a kernel that can implement the"
_KERNEL_REASON = re.compile(r"^\s*(\w+Kernel) (?:cannot implement due to: )?(.*)$")


def _no_linear_kernel(error: BaseException) -> str:
    """ "" or the tree's limit: vLLM's choice of a mixed-precision linear
    kernel (compressed-tensors / GPTQ int4, `choose_mp_linear_kernel`)
    found none for the platform (0.10.2 has none for XPU: every kernel it
    knows is for CUDA, ROCm or the CPU), so the tree cannot run the layer
    on XPU. The reasons, a line per kernel, are vLLM's own."""
    if not isinstance(error, ValueError) or not str(error).startswith(
        _NO_LINEAR_KERNEL
    ):
        return ""
    lines = str(error).splitlines()
    reasons = [m.groups() for m in map(_KERNEL_REASON.match, lines[1:]) if m]
    said = "; ".join(f"{name}: {why.strip()}" for name, why in reasons)
    first = lines[0].strip()
    return f"the tree has no linear kernel for this layer on XPU ({first} {said})"


# an AttributeError's text, raised in the tree or seen by Dynamo
_NO_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(\w+)'")


def _never_made(error: BaseException, frames: list[str], built) -> str:
    """ "" or the tree's limit: the tree's own quantization method reads a
    layer's attribute (its weight or scale) that the method never made for
    this checkpoint, so the layer cannot run on XPU, compiled or eager (the
    0.14.0 llm-scaler tree's XPUFp8LinearMethod makes no weight for an fp8
    checkpoint; 0.10.2's reads weight_scale, which a block-quantized fp8
    layer does not have). Only where the error was raised in the tree's
    quantization/ module (its innermost frame) and no layer of that class
    in the built model has the attribute."""
    found = _NO_ATTRIBUTE.search(str(error))
    raised_there = frames and "/layers/quantization/" in frames[-1]
    if not found or not raised_there or built is None:
        return ""
    kind, name = found.groups()
    layers = [m for m in built.modules() if type(m).__name__ == kind]
    if not layers or any(hasattr(m, name) for m in layers):
        return ""
    method = type(getattr(layers[0], "quant_method", None)).__name__
    return (
        f"the tree's {method} never makes {kind}.{name}, which it reads "
        f"({frames[-1]}: the layer cannot run on XPU, compiled or not)"
    )


# what an MLA layer gives its attention backend and only an MLA backend takes
MLA_ARGUMENTS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "kv_b_proj")


def _no_mla_backend(error: BaseException, vllm_config) -> str:
    """ "" or the tree's limit: an MLA model (DeepSeek-V2) whose attention
    backend on the tree's XPU platform has no MLA (0.14's
    XPUPlatform.get_attn_backend_cls returns FLASH_ATTN whatever use_mla
    says, and FlashAttentionImpl refuses the MLA layer's arguments), whose
    platform refuses MLA (llm-scaler b18beee), or whose MLA backend needs
    what an XPU build has not (0.16.0)."""
    if not getattr(vllm_config.model_config, "use_mla", False):
        return ""
    text = " ".join(str(error).split())
    if isinstance(error, RuntimeError) and text.startswith(
        "MLA attention requires FlashAttention"
    ):
        # 0.16.0's MLA prefill imports vllm.vllm_flash_attn, which vLLM's
        # setup.py builds for CUDA and ROCm only
        return (
            "the tree's MLA backend needs vllm.vllm_flash_attn, which vLLM "
            f"builds for CUDA and ROCm only ({text})"
        )
    if isinstance(error, ValueError) and "use_mla: True" in text:
        # intel/llm-scaler b18beee (0.21.0): its XPUPlatform refuses MLA
        return f"the tree's XPU platform refuses MLA ({text})"
    if not isinstance(error, TypeError) or "unexpected keyword argument" not in text:
        return ""
    if not any(f"'{name}'" in text for name in MLA_ARGUMENTS):
        return ""
    return (
        "the tree's XPU platform gives an MLA model an attention backend "
        f"without MLA ({text})"
    )


def trace_one(
    model: model_data.Model,
    configuration: str,
    work: Path,
    tree: Path,
    kernels: str = "",
) -> dict:
    """Build the model under one configuration and trace it. Returns
    {configuration, mode, custom_ops, forwards, methods, tokens, result ("traced",
    "failed", "not compiled", "writes lost", "not built", "tree limit"), graphs,
    graph_breaks, ops, nodes | error, where, seconds}."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    from vllm.config import CompilationConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context

    start = time.monotonic()
    torch._dynamo.reset()
    counters.clear()
    captured: list = []
    elsewhere = _not_for_this_tree(model)
    if elsewhere:
        return {"configuration": configuration} | tree_limit(
            TreeLimit(elsewhere), start, NOT_FOR_THIS_TREE
        )
    try:
        vllm_config = _vllm_config(model, _config_dir(model, work), configuration)
    except TreeLimit as e:
        return {"configuration": configuration} | tree_limit(e, start)
    except Exception as e:  # noqa: BLE001 - the result
        return {"configuration": configuration} | not_built(e, tree, start)
    try:
        _sp_turned_off(vllm_config, configuration)
    except TreeLimit as e:
        return {"configuration": configuration} | tree_limit(e, start)
    compilation = vllm_config.compilation_config
    mode = getattr(compilation, "mode", None)
    if mode is None:
        mode = getattr(compilation, "level", None)
    result = {
        "configuration": configuration,
        "mode": _mode_name(mode),
        "custom_ops": list(compilation.custom_ops),
    }
    backend = _backend(captured)
    CompilationConfig.init_backend = lambda self, *args, **kwargs: backend
    built = None
    with set_current_vllm_config(vllm_config):
        try:
            _distributed(vllm_config, work)
            built = _build(model, vllm_config)
            result |= _described(built)
            unquantized = _unquantized(model, result["methods"])
            if unquantized:
                raise RuntimeError(unquantized)
            result["tokens"] = _warm_up_tokens(vllm_config)
            inputs = _inputs(model, built, result["tokens"])
        except Exception as e:  # noqa: BLE001 - the result
            limit = (
                _missing_kernel(e, kernels)
                or _no_mla_backend(e, vllm_config)
                or _no_linear_kernel(e)
                or _never_made(e, _tree_frames(e, tree), built)
            )
            if limit:
                return result | tree_limit(TreeLimit(limit), start)
            return result | not_built(e, tree, start)
        try:
            with set_forward_context(None, vllm_config), torch.inference_mode():
                built(**inputs)
            result["result"] = "not compiled"
        except Exception as e:  # noqa: BLE001 - the result
            inner = getattr(e, "inner_exception", None)
            error = inner or e
            if isinstance(inner, Traced):
                result |= {"result": "traced", "nodes": inner.args[0]}
            elif limit := (
                _missing_kernel(error, kernels)
                or _never_made(error, _where(error, tree), built)
            ):
                return result | tree_limit(TreeLimit(limit), start)
            else:
                text = str(error).split("\nfrom user code:")[0].strip()
                lines = text.splitlines() or [""]
                result |= {
                    "result": "failed",
                    "error": f"{type(error).__name__}: {lines[0].strip()}",
                    "message": " ".join(text.split())[:2000],
                    "where": _where(error, tree),
                }
                if not result["where"]:
                    result["traceback"] = traceback.format_exc()[-3000:]
    result["graphs"] = len(captured)
    result["graph_breaks"] = sum(counters["graph_break"].values())
    if captured:
        called, functional = (_ops(graph) for graph in captured[0])
        result["ops"] = sorted(
            f"{op} ({note})" if note else op for op, note in functional.items()
        )
        dropped = sorted(set(called) - set(functional))
        if dropped and result["result"] == "traced":
            # an op that returns nothing and declares no writes is dead
            # code to the compiler: functionalization drops it, and with it
            # what the kernel writes
            result |= {
                "result": "writes lost",
                "error": "called in the traced forward, gone from the "
                "functionalized graph (it returns nothing and declares no "
                "writes, so the compiler drops it and what it writes is "
                "lost): " + ", ".join(dropped),
                "dropped": dropped,
            }
    else:
        result["ops"] = []
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _transformers_version() -> str:
    """The transformers release the models were built with (the venv's, or
    the one `make audit TRANSFORMERS=` put first on the path)."""
    try:
        import transformers
    except Exception:  # noqa: BLE001 - the result says it
        return "none"
    return transformers.__version__


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufakes.proof.modeltrace")
    parser.add_argument("tree")
    parser.add_argument(
        "model", help="a model of data/models.toml, or several, by commas"
    )
    parser.add_argument("out")
    parser.add_argument("--standins", required=True)
    parser.add_argument("--configurations", default=",".join(model_data.CONFIGURATIONS))
    parser.add_argument(
        "--plugin",
        default="",
        help="a directory holding the installed vllm_xpu_fakes plugin: its "
        "register() runs after the stand-ins, as vLLM runs it at start-up",
    )
    parser.add_argument(
        "--without-plugin-first",
        action="store_true",
        help="with --plugin: trace each configuration before the plugin's "
        "register() too (the result's without_plugin)",
    )
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve()
    known = model_data.load()
    chosen_models = [known[name] for name in args.model.split(",")]
    chosen = model_data.configurations(args.configurations)
    start = time.monotonic()
    kept, failed = [], None
    try:
        kept = _setup(tree, args.standins)
    except Exception as e:  # noqa: BLE001 - every model is not built
        failed = not_built(e, tree)
    imported = time.monotonic() - start

    def each(model, work: Path) -> list[dict]:
        if failed is not None:
            return [{"configuration": c} | failed for c in chosen]
        return [trace_one(model, c, work, tree, args.standins) for c in chosen]

    found = {
        m.name: {"tree": str(tree), "model": m.name, "what": m.what}
        for m in chosen_models
    }
    with tempfile.TemporaryDirectory(prefix="xpufakes-model-") as work:
        if args.plugin and args.without_plugin_first:
            for m in chosen_models:
                found[m.name]["without_plugin"] = each(m, Path(work))
        if args.plugin and failed is None:
            plugin = loading.load_plugin(Path(args.plugin))
            for m in chosen_models:
                found[m.name]["plugin"] = plugin
        for m in chosen_models:
            found[m.name]["configurations"] = each(m, Path(work))
    del kept
    shared = {
        "standins": "; ".join([args.standins, *HELPERS]),
        "setup_seconds": round(imported, 1),
        "transformers": _transformers_version(),
    }
    Path(args.out).write_text(
        json.dumps(
            {
                "tree": str(tree),
                **shared,
                **({"setup_error": failed} if failed is not None else {}),
                "models": [found[m.name] | shared for m in chosen_models],
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    for made in TEMPORARY:
        shutil.rmtree(made, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
