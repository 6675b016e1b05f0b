"""A model of the catalog built as vLLM's loader makes it, under one
configuration: its ModelConfig and VllmConfig (which resolve the custom ops
and passes of the configuration), the distributed groups (on gloo: one
process, TP=1, or one of TENSOR_PARALLEL's processes), the model class the
tree names, random weights, vLLM's own processing after loading; and the
inputs of the forward the start-up compiles."""

import contextlib
import importlib
import json
import logging
import os
from pathlib import Path

from xpufakes.proof.model import features
from xpufakes.proof.model import models as model_data
from xpufakes.proof.model.features import SP_FIELDS


@contextlib.contextmanager
def environment_of(model: model_data.Model):
    """The model's environment (models.toml `env`) set while it is built,
    traced and run; as it was, after."""
    before = {name: os.environ.get(name) for name in model.env}
    os.environ.update({name: str(value) for name, value in model.env.items()})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def config_dir(model: model_data.Model, work: Path) -> Path:
    path = work / model.name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config, indent=2))
    return path


# This process's place in the tensor-parallel group the proof runs (cli.py
# --tensor-parallel-size, --rank, --distributed-init): size 1, or one of the
# processes of a group on gloo, each building its shard of the model as
# vLLM's workers do (a tree that turns sequence parallelism off at TP=1)
TENSOR_PARALLEL = {"size": 1, "rank": 0, "init": ""}


def compilation_config(configuration: str):
    from vllm.config import CompilationConfig

    if configuration == "default":
        return CompilationConfig()
    # a tree without the switch is asked for its newest name: vLLM itself
    # refuses it, in its own words (limits.py lists them where that is the
    # tree's limit)
    field = features.sp_field(CompilationConfig().pass_config) or SP_FIELDS[0]
    return CompilationConfig(pass_config={field: True})


def model_class(model: model_data.Model):
    """The model's class: the entry's module and class, or the one the
    tree's own registry names for its architecture (the tree's code path:
    MistralForCausalLM is llama.py's class in 0.14, mistral.py's in 0.16).
    LookupError where the tree has none (a cell not built, unless
    data/limits.toml lists it for the tree)."""
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
        raise LookupError(f"the tree has no model for {architecture}{since}")
    module, name = registry._VLLM_MODELS[architecture]
    return getattr(
        importlib.import_module(f"vllm.model_executor.models.{module}"), name
    )


def not_for_this_tree(model: model_data.Model) -> str:
    """ "" or why the entry is not for this tree (its applies_to)."""
    if model.applies_to.get("kernels") == "vllm-xpu-kernels":
        import importlib.util

        if importlib.util.find_spec("vllm._xpu_ops") is None:
            return (
                "only for trees whose XPU kernels are vllm-xpu-kernels' "
                "(vllm/_xpu_ops.py); this one runs IPEX's, whose fp8 method "
                "has no block-fp8 path"
            )
    module = model.applies_to.get("module")
    if module:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            return f"only for trees that have {module} (this one has none)"
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

    cls = model_class(model)
    for architecture in model.config["architectures"]:
        ModelRegistry.register_model(architecture, cls)


def configure(model: model_data.Model, directory: Path, configuration: str):
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, VllmConfig

    _register(model)
    # IPEX's int4 (AWQ, GPTQ) is the deprecated method "ipex" where vLLM has
    # deprecated methods: a user allows it to run such a checkpoint
    allow = features.deprecated_quantization(ModelConfig)
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
    size = TENSOR_PARALLEL["size"]
    CONFIG_WARNINGS.clear()
    kept = _Kept()
    logger = logging.getLogger("vllm")
    logger.addHandler(kept)
    try:
        return VllmConfig(
            model_config=model_config,
            device_config=DeviceConfig(device="cpu"),
            compilation_config=compilation_config(configuration),
            **(
                {"parallel_config": ParallelConfig(tensor_parallel_size=size)}
                if size > 1
                else {}
            ),
        )
    finally:
        logger.removeHandler(kept)


# What vLLM warned of while it made the last VllmConfig (configure): its own
# words where it turns a setting off (sequence parallelism at TP=2: trace.py)
CONFIG_WARNINGS: list[str] = []


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        CONFIG_WARNINGS.append(record.getMessage())


def _rope_theta_as_an_attribute(model_config) -> None:
    """transformers 5 keeps rope_theta in rope_parameters only; vLLM
    releases made for transformers 4 read config.rope_theta (and fall back
    to 10000 without it)."""
    hf = model_config.hf_config
    for config in {id(c): c for c in (hf, hf.get_text_config())}.values():
        if features.rope_theta_in_parameters_only(config):
            config.rope_theta = config.rope_parameters["rope_theta"]


_DISTRIBUTED = []


def distributed(vllm_config, work: Path) -> None:
    """On gloo, one process (TP=1) or this one's place in TENSOR_PARALLEL:
    the environment once per process, the model-parallel groups for each
    model (0.16.0+ makes the expert-parallel group only for a model with
    experts, as the current config says)."""
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.distributed.parallel_state import destroy_model_parallel

    size, rank = TENSOR_PARALLEL["size"], TENSOR_PARALLEL["rank"]
    if not _DISTRIBUTED:
        init_distributed_environment(
            world_size=size,
            rank=rank,
            local_rank=rank,
            distributed_init_method=TENSOR_PARALLEL["init"]
            or f"file://{work / 'distributed'}",
            backend="gloo",
        )
        _DISTRIBUTED.append(True)
    else:
        destroy_model_parallel()
    initialize_model_parallel(size, 1)


def build(model: model_data.Model, vllm_config):
    """The model as vLLM's loader makes it (its class for the architecture,
    built under the model's dtype on the device), weights random, then
    vLLM's own processing after loading (online fp8 quantizes here). Where
    the tree names the XPU device while doing so, the CPU (XPUOnCPU)."""
    import torch
    from vllm.model_executor.model_loader.utils import (
        process_weights_after_loading,
    )

    from xpufakes.proof.xpu.device import XPUOnCPU

    cls = model_class(model)
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
    found = features.layerwise_online_quantization()
    if found is None:
        return
    has_online_quant, finalize_layerwise_processing = found
    if has_online_quant(built):
        finalize_layerwise_processing(built, model_config)


def described(built) -> dict:
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


def warm_up_tokens(vllm_config) -> int:
    """The tokens of the forward vLLM compiles at start-up: the profile
    run's dummy batch, max_num_batched_tokens (the scheduler config's
    value; its own default where the config leaves it unset). A branch on
    the batch size (a decode fast path for a few tokens) is traced as the
    start-up traces it."""
    scheduler = getattr(vllm_config, "scheduler_config", None)
    tokens = getattr(scheduler, "max_num_batched_tokens", None)
    return int(tokens) if tokens else WARM_UP_TOKENS


def inputs(model: model_data.Model, built, tokens: int):
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


def unquantized(model: model_data.Model, methods: dict) -> str:
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
