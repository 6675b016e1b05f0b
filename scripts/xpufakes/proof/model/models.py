"""The models and the configurations of the whole-model proof
(`make audit MODEL=...`): data (data/models.toml), no torch."""

import tomllib
from dataclasses import dataclass, field

from xpufakes.common import paths

MODELS = paths.DATA / "models.toml"

# name -> what it is. "default": the compile configuration vLLM makes for a
# model when nothing is asked (its compile mode with Inductor, which turns
# every custom op off); "sp": sequence parallelism asked for
# (compilation_config.pass_config), which makes vLLM turn +rms_norm on.
CONFIGURATIONS = {
    "default": "vLLM's default compile configuration",
    "sp": "sequence parallelism on (vLLM turns +rms_norm on)",
}

# The token counts (max_num_batched_tokens) at which `make audit MODEL=`
# compares a traced model's compiled forward with its eager one
# (numbers.py): the start-up's, then those that take the trees' other
# branches (a decode GEMV at 1, batched ESIMD GEMMs and norms at 2..64, the
# block-fp8 GEMV below 16)
NUMBERS_TOKENS = (2048, 1, 2, 16, 64)


@dataclass(frozen=True)
class Model:
    name: str
    what: str
    module: str  # "": the one the tree's ModelRegistry names for the architecture
    cls: str
    inputs: str  # "embeds" or "ids"
    positions: str  # "mrope" or "1d"
    quantization: str
    dtype: str  # the model's dtype (`--dtype`): what its quantization takes
    config: dict
    # the trees the entry is for: {"quantization": "<method>"} only those
    # whose vLLM knows that quantization method (llm-scaler's sym_int4);
    # {"kernels": "vllm-xpu-kernels"} only those of the vllm-xpu-kernels era
    # (vllm/_xpu_ops.py: the IPEX era's fp8 has no block-fp8 path);
    # {"module": "<dotted name>"} only those whose vLLM has that module
    # (vllm.model_executor.layers.esimd_utils: intel/llm-scaler's images of
    # the kernels era, whose model code routes into its ESIMD ops); {} all
    applies_to: dict = field(default_factory=dict)
    # the environment a user sets to run it (llm-scaler's README: DeepSeek-V2
    # with VLLM_MLA_DISABLE=1), set while it is built and run
    env: dict = field(default_factory=dict)
    # its environment from the start of a process of its own (runner.py):
    # for a setting the tree reads once, at import (llm-scaler's
    # esimd_utils.py: its DISABLE_ESIMD_* switches)
    own_process: bool = False


def load() -> dict[str, Model]:
    data = tomllib.loads(MODELS.read_text())
    return {
        name: Model(
            name,
            entry["what"],
            entry.get("module", ""),
            entry.get("class", ""),
            entry["inputs"],
            entry["positions"],
            entry["quantization"],
            entry["dtype"],
            entry["config"],
            entry.get("applies_to", {}),
            entry.get("env", {}),
            entry.get("own_process", False),
        )
        for name, entry in data.items()
    }


def configurations(text: str) -> list[str]:
    """ "default,sp" -> ["default", "sp"]; ValueError naming an unknown one."""
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CONFIGURATIONS]
    if unknown or not chosen:
        raise ValueError(
            f"unknown configuration {', '.join(unknown) or repr(text)} "
            f"(known: {', '.join(CONFIGURATIONS)})"
        )
    return chosen


def token_counts(text: str) -> tuple[int, ...]:
    """ "2048,1" -> (2048, 1); "none" or "" -> (); ValueError otherwise."""
    if text.strip() in ("", "none", "0"):
        return ()
    counts = tuple(int(t) for t in text.split(",") if t.strip())
    if any(c < 1 for c in counts):
        raise ValueError(f"token counts are positive: {text!r}")
    return counts
