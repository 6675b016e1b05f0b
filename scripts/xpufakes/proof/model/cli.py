"""The whole-model proof: build a model from a vLLM tree's own model module
at a tiny size (data/models.toml) and trace its forward as vLLM compiles it,
on the XPU platform's code paths, in one Python with torch:

    python -m xpufakes.proof.model.cli TREE MODEL[,MODEL...] OUT.json
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

What is stood in (proof/xpu, environment.py): what only an XPU host has. IPEX
(its Python APIs call torch_ipex ops registered for the XPU key only; its
MoE module computes on the CPU, 16-bit and fp8 experts: ipex_moe.py; its
attention module is made, never run); the torch_ipex GEMMs with
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
XPUPlatform. The distributed groups are on gloo: one process (TP=1), or
one of the processes of a tensor-parallel group (--tensor-parallel-size,
--rank, --distributed-init: runner.in_tensor_parallel starts them).

Writes a JSON object: the tree, the stand-ins, the set-up's seconds and
`models`, one entry per model (model, what, configurations: one result per
configuration, see trace.trace_one). The models share the process and its set-up.
A model that cannot be built under a configuration (vLLM refuses its
configuration, a stand-in is missing, the set-up failed) is "not built",
with the first line of the error (vLLM's own words), where it was raised
and every file of the tree it passed through. Whether that is a limit of
the tree is not decided here: the tool decides it from data (limits.py,
data/limits.toml). What the proof cannot run in one process (sequence
parallelism, which a tree turns off at TP=1) is "the proof's limit" here
(runner.py traces it again at TP=2); an
entry for other trees only (models.toml applies_to) is "not for this tree".
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from xpufakes.proof.model import build as building
from xpufakes.proof.model import environment, features, numbers
from xpufakes.proof.model import models as model_data
from xpufakes.proof.model.trace import not_built, trace_one
from xpufakes.proof.xpu import registering


def _transformers_version() -> str:
    """The transformers release the models were built with (the venv's, or
    the one `make audit TRANSFORMERS=` put first on the path)."""
    try:
        import transformers
    except Exception:  # noqa: BLE001 - the result says it
        return "none"
    return transformers.__version__


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufakes.proof.model.cli")
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
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="build and trace as one of this many processes of a "
        "tensor-parallel group on gloo (each started with its --rank and the "
        "same --distributed-init), as vLLM's workers run it",
    )
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--distributed-init", default="")
    parser.add_argument(
        "--numbers",
        default="",
        help="the token counts at which each traced configuration is also "
        "run eager and compiled (aot_eager, Inductor) and compared "
        "(numbers.py), e.g. 2048,1,2,16,64; none by default",
    )
    parser.add_argument(
        "--esimd-truthful",
        action="store_true",
        help="a control: the ESIMD ops whose schemas lie declare what they "
        "write (data/schema_contracts.toml) instead of the image's schemas",
    )
    args = parser.parse_args(argv)
    building.TENSOR_PARALLEL.update(
        size=args.tensor_parallel_size, rank=args.rank, init=args.distributed_init
    )
    tree = Path(args.tree).resolve()
    counts = model_data.token_counts(args.numbers)
    known = model_data.load()
    chosen_models = [known[name] for name in args.model.split(",")]
    chosen = model_data.configurations(args.configurations)
    start = time.monotonic()
    kept, failed = [], None
    try:
        kept = environment.setup(tree, args.standins, args.esimd_truthful)
    except Exception as e:  # noqa: BLE001 - every model is not built
        failed = not_built(e, tree)
    imported = time.monotonic() - start

    def each(model, work: Path) -> list[dict]:
        if failed is not None:
            return [{"configuration": c} | failed for c in chosen]
        with building.environment_of(model):
            cells = [trace_one(model, c, work, tree) for c in chosen]
            for cell in cells:
                if counts and cell["result"] in ("traced", "writes lost"):
                    cell["numbers"] = numbers.compare(
                        model, cell["configuration"], work, tree, counts
                    )
        return cells

    found = {
        m.name: {"tree": str(tree), "model": m.name, "what": m.what}
        for m in chosen_models
    }
    with tempfile.TemporaryDirectory(prefix="xpufakes-model-") as work:
        if args.plugin and args.without_plugin_first:
            for m in chosen_models:
                found[m.name]["without_plugin"] = each(m, Path(work))
        if args.plugin and failed is None:
            plugin = registering.load_plugin(Path(args.plugin))
            for m in chosen_models:
                found[m.name]["plugin"] = plugin
        for m in chosen_models:
            found[m.name]["configurations"] = each(m, Path(work))
    del kept
    shared = {
        "standins": "; ".join([args.standins, *environment.HELPERS]),
        "setup_seconds": round(imported, 1),
        "transformers": _transformers_version(),
        "features": list(features.MET),  # features.py: the tree's, met
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
    for made in environment.TEMPORARY:
        shutil.rmtree(made, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
