"""Compiled = eager, in numbers: one model of the catalog built once as
vLLM's loader makes it (build.py: random weights, seed 0, vLLM's own
processing after loading), run eagerly and compiled as vLLM compiles it
(its own `@support_torch_compile`: fullgraph, its dynamic-shape marking,
guards dropped), with the same weights and the same inputs, at each token
count vLLM may trace at (max_num_batched_tokens): the start-up's (2048) and
those that take the other branches of the tree (1, 2, 16, 64). Each
compiled run is a fresh trace at that count, by two of torch's backends on
the graph Dynamo captured: aot_eager (functionalization, then the graph as
it is) and Inductor (functionalization, then code generated and compiled).

Each cell's result is the largest absolute difference of the forward's
output from the eager one, and the largest absolute eager value beside it;
over the tolerance (TOLERANCE, relative to the largest eager value, as the
dtype's rounding over two layers allows), or not finite where eager is, the
cell fails. A crash is a failure, never "not run": a compiled run that
raises fails its cell (limits.py may excuse it: data/limits.toml naming its
error for the tree, model and configuration, with no frame of ours on its
way), and an eager run that raises, or whose output is NaN or all zeros,
fails the count's cells (nothing compared). Uninitialized memory reads
as NaN (_UninitializedIsNaN: torch's deterministic fill in eager and
aot_eager's graph; the buffers Inductor's generated code allocates filled,
its reuse of freed buffers off): a buffer a kernel should have written
and the compiled graph left empty is NaN, never stale data that happens to
be nearly right. The runs
are ordered so that memory left behind cannot hold the right values
either: the token counts fewest first, at each count the compiled runs
before the eager one (the cells are reported in the order asked). A
tensor of the model the build left not finite (a layer quantized layer by
layer while loading, with no checkpoint tensor) is filled at random before
the runs (random_where_uninitialized). The tolerance is for the compiled
graphs' rounding in bf16 / fp16 (decomposed and fused ops: up to 1.1% of
the largest value seen, qwen3_w4a16 on b18beee); a dropped write is caught
by its NaN, not by it.

What is not vLLM's: the backends are torch's own, not VllmBackend (which
splits the graph at attention and runs its own passes: it needs the
device); and the attention backend's kernel (XPU flash attention, which a
CPU cannot run) is stood in: the forward runs with no attention metadata,
as the start-up's profile run does, where the backend would write zeros,
and each attention layer's backend instead computes causal attention over
the batch as one sequence (attention_that_computes), in float32, the same
code eager and compiled (it runs inside vLLM's opaque attention op). So
what a layer computes for the keys and values reaches the output, as it
does in a real forward. A GatedDeltaNet layer's core (Qwen3-Next's linear
attention, vLLM's `vllm::gdn_attention_core_xpu`, which writes nothing
without metadata) computes the gated delta rule over the batch as one
sequence the same way (gdn_that_computes, proof/xpu/gdn_core.py)."""

import math
import time

from xpufakes.proof.model import build as building
from xpufakes.proof.model import models as model_data
from xpufakes.proof.model.report import (
    NUMBERS_DIFFERENT,
    NUMBERS_EAGER_FAILED,
    NUMBERS_EQUAL,
    NUMBERS_NOT_BUILT,
    NUMBERS_NOT_RUN,
    NUMBERS_RAISED,
    numbers_outcome,
)
from xpufakes.proof.model.trace import (
    error_of,
    files_of,
    lines_of,
    not_built,
    ours_outside,
    tree_frames,
)
from xpufakes.proof.xpu import uncomputed

TOKENS = model_data.NUMBERS_TOKENS
BACKENDS = ("aot_eager", "inductor")
# largest |compiled - eager| over largest |eager|: a few bf16 roundings
TOLERANCE = 0.02

# the results (report.py, no torch): equal; the failures: compiled !=
# eager, the compiled run raised (a backend's own error, which the trace
# does not meet: Inductor's lowering, torch's aliasing checks), the eager
# run raised or gave nothing to compare (NaN, all zeros), the model not
# built for the numbers where the trace built it. A compiled run that
# raised is the tree's limit only where data/limits.toml names its error
# for its tree, model and configuration and it passed through no code of
# ours (limits.py); the others never are
EQUAL, DIFFERENT, NOT_RUN = NUMBERS_EQUAL, NUMBERS_DIFFERENT, NUMBERS_NOT_RUN
RAISED, EAGER_FAILED, NOT_BUILT = (
    NUMBERS_RAISED,
    NUMBERS_EAGER_FAILED,
    NUMBERS_NOT_BUILT,
)
# where the tree's model modules are (an eager failure is said from there in)
MODELS_DIR = "vllm/model_executor/models/"


def _tensors(value) -> list:
    """The tensors of a forward's output, in order (a tensor, a tuple of
    them, IntermediateTensors)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    tensors = getattr(value, "tensors", None)
    if isinstance(tensors, dict):
        return [t for k in sorted(tensors) for t in _tensors(tensors[k])]
    return []


def difference(eager: list, compiled: list) -> tuple[float, float]:
    """(largest |compiled - eager|, largest |eager|) over the outputs; nan
    where a compiled value is not finite and the eager one is, or the
    outputs differ in shape."""
    import torch

    if len(eager) != len(compiled):
        return math.nan, math.nan
    worst, scale = 0.0, 0.0
    for e, c in zip(eager, compiled, strict=True):
        if e.shape != c.shape:
            return math.nan, math.nan
        e, c = e.float(), c.float()
        if bool((torch.isfinite(e) & ~torch.isfinite(c)).any()):
            return math.nan, float(e.abs().max()) if e.numel() else 0.0
        if e.numel():
            worst = max(worst, float((e - c).abs().nan_to_num(0.0).max()))
            scale = max(scale, float(e.abs().nan_to_num(0.0).max()))
    return worst, scale


def verdict(worst: float, scale: float, tolerance: float = TOLERANCE) -> str:
    """EQUAL within the tolerance (relative to the largest eager value), or
    DIFFERENT (nan: not finite where eager is, or another shape)."""
    if math.isnan(worst) or math.isnan(scale):
        return DIFFERENT
    return EQUAL if worst <= tolerance * max(scale, 1e-6) else DIFFERENT


def _backend(choice: list):
    """The compile backend vLLM's decorator is given: torch's backend named
    by choice[0] at the moment Dynamo hands it a graph; the custom ops the
    graph calls are added to choice[1] (a set, when there is one)."""

    def backend(gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        if len(choice) > 1:
            choice[1].update(custom_ops(gm))
        return lookup_backend(choice[0])(gm, example_inputs)

    return backend


# torch's own namespaces: the rest of a graph's ops are the kernels' and vLLM's
TORCH_NAMESPACES = ("aten", "prims", "_c10d_functional", "higher_order")


def custom_ops(gm) -> set[str]:
    """The "ns::op" of each op of the graph that is not torch's own."""
    found = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        schema = getattr(node.target, "_schema", None)
        name = schema.name if schema is not None else ""
        name = name or getattr(node.target, "_qualified_op_name", "")
        if "::" in name and name.split("::")[0] not in TORCH_NAMESPACES:
            found.add(name)
    return found


def attention_that_computes(built) -> int:
    """Each attention layer's backend (its `impl`) made to compute causal
    attention where the forward has no attention metadata (the profile
    run's case, where the backend writes zeros): softmax(q k^T * scale) v
    over the batch as one sequence, the kv heads repeated for grouped
    queries, into the layer's output buffer. Returns how many layers."""
    import torch

    count = 0
    for module in built.modules():
        impl = getattr(module, "impl", None)
        if impl is None or not hasattr(impl, "num_heads") or not hasattr(impl, "scale"):
            continue
        original = impl.forward

        def forward(
            layer,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            *args,
            _impl=impl,
            _original=original,
            **kwargs,
        ):
            output = kwargs.get("output", args[0] if args else None)
            if attn_metadata is not None or output is None:
                return _original(
                    layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs
                )
            heads, kv_heads = _impl.num_heads, _impl.num_kv_heads
            tokens = query.shape[0]
            q = query.reshape(tokens, heads, -1).float().transpose(0, 1)
            k = key.reshape(tokens, kv_heads, -1).float().transpose(0, 1)
            v = value.reshape(tokens, kv_heads, -1).float().transpose(0, 1)
            k = k.repeat_interleave(heads // kv_heads, 0)
            v = v.repeat_interleave(heads // kv_heads, 0)
            scores = (q @ k.transpose(1, 2)) * _impl.scale
            mask = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
            attended = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
            result = attended.transpose(0, 1).reshape(tokens, -1)
            output.view(tokens, -1).copy_(result[:, : output.view(tokens, -1).shape[1]])
            return output

        impl.forward = forward
        count += 1
    return count


# vLLM's op that runs a GatedDeltaNet layer's core on XPU (0.21.0's
# vllm/_xpu_ops.py: it calls _xpu_C::gdn_attention with the attention
# metadata, and writes nothing without)
GDN_CORE_OP = "vllm::gdn_attention_core_xpu"


def gdn_that_computes(built) -> int:
    """Each GatedDeltaNet layer's core made to compute where the forward has
    no attention metadata (the profile run's case, where vLLM's op writes
    nothing: core_attn_out stays zero, z unwritten): the gated delta rule
    over the batch as one sequence from its start (proof/xpu/gdn_core.py),
    into the op's core_attn_out and z, the same code eager and compiled (it
    runs inside vLLM's op). Returns how many layers."""
    from xpufakes.proof.xpu import device, gdn_core

    layers = [
        m
        for m in built.modules()
        if all(hasattr(m, a) for a in ("A_log", "dt_bias", "conv1d", "head_v_dim"))
    ]
    if not layers:
        return 0

    def instead(kernel, *args, **kwargs):
        from vllm.forward_context import get_forward_context

        names = ("core_attn_out", "z", "projected_states_qkvz", "projected_states_ba")
        given = dict(zip((*names, "layer_name"), args, strict=False)) | kwargs
        context = get_forward_context()
        if context.attn_metadata is not None:
            return kernel(*args, **kwargs)
        layer = context.no_compile_layers[given["layer_name"]]
        qkvz, ba = given["projected_states_qkvz"], given["projected_states_ba"]
        out, z = gdn_core.gdn_core(
            qkvz,
            ba,
            layer.conv1d.weight.reshape(layer.conv1d.weight.shape[0], -1),
            layer.A_log,
            layer.dt_bias,
            layer.num_k_heads // layer.tp_size,
            layer.num_v_heads // layer.tp_size,
            layer.head_k_dim,
            layer.head_v_dim,
            layer.activation,
            bool(getattr(layer, "gqa_interleaved_layout", False)),
        )
        tokens = qkvz.shape[0]
        given["core_attn_out"][:tokens].copy_(out)
        given["z"][:tokens].copy_(z)
        return None

    device.INSTEAD_ON_CPU[GDN_CORE_OP] = instead
    return len(layers)


def random_where_uninitialized(built) -> list[str]:
    """The model's tensors (parameters, buffers) the build left with
    values that are not finite, filled at random like the others (seed
    0): a layer quantized layer by layer while loading (0.21.0+'s online
    fp8, `uses_meta_device`) that got no checkpoint tensor is quantized
    from uninitialized memory. Scales get positive values. Returns their
    names."""
    import torch

    generator = torch.Generator().manual_seed(0)
    filled = []
    with torch.no_grad():
        for name, tensor in [*built.named_parameters(), *built.named_buffers()]:
            if not tensor.is_floating_point() or tensor.device.type == "meta":
                continue
            if bool(torch.isfinite(tensor.float()).all()):
                continue
            values = torch.randn(tensor.shape, generator=generator) * 0.02
            if "scale" in name.rpartition(".")[2]:
                values = values.abs() + 1e-3
            tensor.copy_(values.to(tensor.dtype))
            filled.append(name)
    return filled


def _compiled_modules(built) -> list:
    """The modules vLLM's @support_torch_compile decorated (do_not_compile)."""
    return [m for m in built.modules() if hasattr(m, "do_not_compile")]


def _run(built, inputs: dict, vllm_config) -> list:
    import torch
    from vllm.forward_context import set_forward_context

    given = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in inputs.items()}
    with set_forward_context(None, vllm_config), torch.inference_mode():
        return [t.detach().clone() for t in _tensors(built(**given))]


def _eager(built, inputs: dict, vllm_config) -> list:
    """The forward run eagerly: the decorated modules told not to compile
    (the decorator's own switch), then told again as they were."""
    modules = _compiled_modules(built)
    before = [m.do_not_compile for m in modules]
    for m in modules:
        m.do_not_compile = True
    try:
        return _run(built, inputs, vllm_config)
    finally:
        for m, was in zip(modules, before, strict=True):
            m.do_not_compile = was


def _compiled(built, inputs: dict, vllm_config, choice: list, name: str) -> list:
    """The forward compiled afresh (traced at this token count) by backend
    `name`; the decorated modules' state as it was before, after: their
    attributes, and the lists and dicts among them as they held (vLLM's
    wrapper up to 0.11 appends the code Dynamo compiled to its own list,
    `compiled_codes`, and once that holds one runs it directly: restoring
    the list object alone kept the previous backend's code, so the next
    "Inductor" run was aot_eager's graph, compiled in 0.0 s, 0 from eager,
    on 0.10.2)."""
    import torch

    modules = _compiled_modules(built)
    saved = [_state(m) for m in modules]
    torch._dynamo.reset()
    choice[0] = name
    try:
        return _run(built, inputs, vllm_config)
    finally:
        for m, state in zip(modules, saved, strict=True):
            for key in set(vars(m)) - set(state):
                delattr(m, key)
            vars(m).update(_copied(state))
        torch._dynamo.reset()


def _copied(state: dict) -> dict:
    """A module's attributes, each public list and dict among them a copy
    (torch's own, `_parameters`, `_modules`..., left as they are)."""
    return {
        key: type(value)(value)
        if type(value) in (list, dict) and not key.startswith("_")
        else value
        for key, value in state.items()
    }


def _state(module) -> dict:
    return _copied(vars(module))


class _UninitializedIsNaN:
    """Uninitialized memory reads as NaN: torch.empty (torch's deterministic
    fill of uninitialized memory) in eager and in the aot_eager graph, and
    the buffers Inductor's generated code allocates (its
    `empty_strided_cpu`, filled), with Inductor's reuse of freed buffers
    off, so that a buffer no kernel wrote is NaN in any backend."""

    def __enter__(self):
        import torch
        import torch._inductor.config as inductor_config

        guards = torch._C._dynamo.guards
        self.before = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory,
            guards._empty_strided_cpu,
            inductor_config.allow_buffer_reuse,
        )
        allocate = guards._empty_strided_cpu

        def empty_strided_cpu(*args, **kwargs):
            made = allocate(*args, **kwargs)
            if made.is_floating_point():
                made.fill_(float("nan"))
            return made

        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        guards._empty_strided_cpu = empty_strided_cpu
        inductor_config.allow_buffer_reuse = False

    def __exit__(self, *exc):
        import torch
        import torch._inductor.config as inductor_config

        enabled, warn_only, fill, allocate, reuse = self.before
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch._C._dynamo.guards._empty_strided_cpu = allocate
        inductor_config.allow_buffer_reuse = reuse


class _CachesOff:
    """torch.compile's caches off while the numbers run (torch.compiler's
    force_disable_caches: Inductor's FX-graph cache, AOT autograd's): their
    keys do not cover a custom op's fake (make e2e measured a hit reusing
    code compiled with another fake), and a hit skips the lowering, so a
    cell would not prove what this tree compiles to."""

    def __enter__(self):
        import torch.compiler.config as compiler_config

        self.before = compiler_config.force_disable_caches
        compiler_config.force_disable_caches = True

    def __exit__(self, *exc):
        import torch.compiler.config as compiler_config

        compiler_config.force_disable_caches = self.before


def compare(
    model: model_data.Model,
    configuration: str,
    work,
    tree,
    tokens: tuple = TOKENS,
    backends: tuple = BACKENDS,
) -> dict:
    """{configuration, cells: [{tokens, backend, result (equal, different,
    not run), difference, largest, seconds | error}], seconds} for one model
    under one configuration (models.CONFIGURATIONS)."""
    import torch
    from vllm.config import CompilationConfig, set_current_vllm_config

    start = time.monotonic()
    result: dict = {"configuration": configuration, "cells": []}
    elsewhere = building.not_for_this_tree(model)
    if elsewhere:
        return result | {"result": NOT_RUN, "error": elsewhere, "seconds": 0.0}
    choice = [BACKENDS[0]]
    CompilationConfig.init_backend = lambda self, *a, **k: _backend(choice)
    torch._dynamo.reset()
    try:
        directory = building.config_dir(model, work)
        vllm_config = building.configure(model, directory, configuration)
    except Exception as e:  # noqa: BLE001 - the result
        return result | not_built(e, tree, start) | {"result": NOT_BUILT}
    with set_current_vllm_config(vllm_config), _UninitializedIsNaN(), _CachesOff():
        try:
            building.distributed(vllm_config, work)
            built = building.build(model, vllm_config)
        except Exception as e:  # noqa: BLE001 - the result
            return result | not_built(e, tree, start) | {"result": NOT_BUILT}
        result["attention_computed"] = attention_that_computes(built)
        gdn = gdn_that_computes(built)
        if gdn:
            result["gdn_computed"] = gdn
        filled = random_where_uninitialized(built)
        if filled:
            result["filled_at_random"] = filled
        # fewest tokens first, each count's compiled runs before its eager
        # one: memory a run leaves behind holds fewer rows than any later
        # run's buffers, so a buffer a compiled graph left unwritten never
        # holds the right values by chance (module docstring)
        for count in sorted(tokens):
            result["cells"] += _cells(
                built, model, vllm_config, choice, count, backends, tree
            )
    order = {count: i for i, count in enumerate(tokens)}
    result["cells"].sort(key=lambda c: order[c["tokens"]])
    result["result"] = numbers_outcome(result["cells"])
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _cells(built, model, vllm_config, choice, count: int, backends, tree) -> list[dict]:
    """The cells of one token count: each backend's compiled run, then the
    eager run, compared. A compiled run that raises fails its cell (RAISED:
    the error as limits.py matches it, and every frame of the tree and of
    ours it passed through); an eager run that raises or gives nothing to
    compare fails every other cell of the count (EAGER_FAILED, with the
    error and the tree's innermost frames it passed through)."""
    inputs = building.inputs(model, built, count)
    compiled, cells = {}, []
    ops: dict[str, list[str]] = {}  # backend -> the custom ops its graph calls
    for name in backends:
        begun = time.monotonic()
        choice[1:] = [set()]
        try:
            compiled[name] = _compiled(built, inputs, vllm_config, choice, name)
        except Exception as e:  # noqa: BLE001 - the cell's result
            cells.append(_failed(count, name, RAISED, e, tree))
        else:
            compiled[name] = (compiled[name], round(time.monotonic() - begun, 1))
        ops[name] = sorted(choice.pop())
    try:
        eager = _eager(built, inputs, vllm_config)
    except Exception as e:  # noqa: BLE001 - the cell's result
        at = _at(tree_frames(e, tree))
        failed = _failed(count, "", EAGER_FAILED, e, tree)
        failed["message"] = (
            f"eager (the tree's forward, not compiled) fails{at}: {_said(e)}"
        )
        cells += [failed | {"backend": name} for name in compiled]
    else:
        vacuous = _vacuous(eager)
        for name, (outputs, seconds) in compiled.items():
            if vacuous:
                cells.append(_eager_vacuous(count, name, vacuous))
                continue
            worst, scale = difference(eager, outputs)
            cells.append(
                {
                    "tokens": count,
                    "backend": name,
                    "result": verdict(worst, scale),
                    "difference": worst,
                    "largest": scale,
                    "seconds": seconds,
                }
            )
    for cell in cells:
        if ops.get(cell["backend"]):
            cell["ops"] = ops[cell["backend"]]
    return sorted(cells, key=lambda c: backends.index(c["backend"]))


def _failed(count: int, backend: str, kind: str, error: BaseException, tree) -> dict:
    """A cell whose run raised: `error` as limits.py matches it ("<Error>:
    <first line>", the backend's own where Dynamo wraps it), `message` a
    few lines of it, and the frames it passed through: the tree's (`files`,
    `lines`) and ours outside it (`ours`); `not_computed` where the run
    reached a stand-in with no CPU reference (proof/xpu/uncomputed.py:
    IPEX's MoE module with int4 experts, say), which no tree's limit
    excuses."""
    said = {
        "tokens": count,
        "backend": backend,
        "result": kind,
        "error": error_of(error),
        "message": _said(getattr(error, "inner_exception", None) or error),
        "files": files_of(error, tree),
        "lines": lines_of(error, tree),
        "ours": ours_outside(error, tree),
    }
    # a stand-in with no CPU reference was run: the proof's limit, said so
    not_computed = uncomputed.found_in(error)
    if not_computed:
        said["not_computed"] = not_computed
    return said


def _eager_vacuous(count: int, backend: str, why: str) -> dict:
    return {
        "tokens": count,
        "backend": backend,
        "result": EAGER_FAILED,
        "error": why,
        "message": why,
    }


def _vacuous(eager: list) -> str:
    """ "" or why the eager output gives nothing to compare: not finite
    (weights left uninitialized: NaN), or all zeros."""
    import torch

    if not eager:
        return "the forward returned no tensor"
    if any(not bool(torch.isfinite(t.float()).all()) for t in eager):
        return (
            "the eager output is not finite (NaN: weights the build left "
            "uninitialized, or a buffer no kernel wrote): nothing compared"
        )
    if all(not bool(t.any()) for t in eager):
        return "the eager output is all zeros: nothing compared"
    return ""


def _at(frames: list[str]) -> str:
    """ " at <frame> > ... > <frame>": the tree's frames from the model
    module's innermost (its line that called what failed) inwards."""
    if not frames:
        return ""
    models = [i for i, f in enumerate(frames) if f.startswith(MODELS_DIR)]
    return " at " + " > ".join(frames[models[-1] if models else -1 :])


def _said(error: BaseException) -> str:
    said = str(error).split("\nfrom user code:")[0].strip()
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    return f"{type(error).__name__}: {' '.join(lines[:4])[:600]}"
