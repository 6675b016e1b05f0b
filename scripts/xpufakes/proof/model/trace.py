"""One configuration of a model built and traced as vLLM compiles it:
vLLM's own `@support_torch_compile` (fullgraph) with our backend, which
takes the graph Dynamo captured, runs AOT autograd's functionalization on it
with fake tensors (every op's fake runs, mutations become explicit) and
stops; the result, or why there is none: the error as vLLM (or Dynamo)
raised it, exactly, with every file of the tree it passed through. Whether
an error is a limit of the tree is not decided here (limits.py, in the
tool, from data)."""

import re
import time
import traceback
from pathlib import Path

from xpufakes.common import paths
from xpufakes.proof.model import build as building
from xpufakes.proof.model import features
from xpufakes.proof.model import models as model_data
from xpufakes.proof.model.report import NOT_FOR_THIS_TREE, PROOF_LIMIT


class Traced(Exception):
    """Our backend's stop: the graph is captured and functionalized."""


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


def where(error: BaseException, tree: Path) -> list[str]:
    """The user frames of a Dynamo error, outermost first: 'file:line name'."""
    stack = getattr(error, "real_stack", None) or []
    frames = []
    for frame in stack:
        path = Path(frame.filename)
        shown = path.relative_to(tree) if path.is_relative_to(tree) else path
        frames.append(f"{shown}:{frame.lineno} {frame.name}")
    return frames


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


def tree_frames(error: BaseException, tree: Path) -> list[str]:
    """The tree's frames of an error's traceback, innermost last."""
    frames = []
    for frame in traceback.extract_tb(error.__traceback__):
        path = Path(frame.filename)
        if path.is_relative_to(tree):
            frames.append(f"{path.relative_to(tree)}:{frame.lineno} {frame.name}")
    return frames


def _tree_frames_of(error: BaseException, tree: Path) -> set[tuple[str, int]]:
    """Every frame of the tree an error passed through (tree-relative path,
    line): the frames of its traceback and of the errors it was raised from
    or while handling (cause, context), and Dynamo's user frames of each."""
    found, seen = set(), set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frames = list(traceback.extract_tb(error.__traceback__))
        frames += list(getattr(error, "real_stack", None) or [])
        for frame in frames:
            path = Path(frame.filename)
            if path.is_relative_to(tree):
                found.add((path.relative_to(tree).as_posix(), frame.lineno or 0))
        inner = getattr(error, "inner_exception", None)
        error = inner or error.__cause__ or error.__context__
    return found


# Our code outside the tree, where a fault of ours is never the tree's limit
# (limits.py): the stand-ins (proof/xpu/, the native modules' builtins),
# the overlay (the reference kernels, the fakes), and this project's vLLM
# plugin, wherever it is installed
OURS_OUTSIDE = (
    "scripts/xpufakes/proof/xpu/",
    "scripts/xpufakes/trees/natives.py",
    "vllm_overlay/",
    "plugin/",
)
PLUGIN_PACKAGE = "vllm_xpu_fakes"
# the proof's own modules: ours where the tree calls them (numbers.py's
# attention, a feature's stand-in), not where they call the tree; nor the
# compile backends torch calls, which every error of Dynamo, AOT autograd
# or Inductor passes through
HARNESS = "scripts/xpufakes/proof/"
BACKENDS = {
    ("scripts/xpufakes/proof/model/trace.py", "backend"),
    ("scripts/xpufakes/proof/model/trace.py", "keep"),
    ("scripts/xpufakes/proof/model/numbers.py", "backend"),
}


def _ours(filename: str, name: str, called_by_tree: bool) -> str:
    """The frame's file as ours ("" if it is not ours): relative to this
    repository, or from the plugin's package on."""
    path = Path(filename)
    parts = path.parts
    if PLUGIN_PACKAGE in parts[:-1]:
        return Path(*parts[parts.index(PLUGIN_PACKAGE) :]).as_posix()
    if not path.is_relative_to(paths.REPO):
        return ""
    shown = path.relative_to(paths.REPO).as_posix()
    if shown.startswith(OURS_OUTSIDE):
        return shown
    if called_by_tree and shown.startswith(HARNESS) and (shown, name) not in BACKENDS:
        return shown
    return ""


def ours_outside(error: BaseException, tree: Path) -> list[str]:
    """Every frame of our code outside the tree an error passed through
    ("path:line name"; OURS_OUTSIDE, the plugin's package, and the proof's
    own code where the tree called it): in its traceback and its chained
    errors' (cause, context), and Dynamo's user frames of each. The files
    our fix writes into the tree are judged by their lines (lines_of)."""
    found, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frames = list(traceback.extract_tb(error.__traceback__))
        inside = [Path(f.filename).is_relative_to(tree) for f in frames]
        first = inside.index(True) if True in inside else len(frames)
        user = list(getattr(error, "real_stack", None) or [])
        for i, frame in enumerate([*frames, *user]):
            path = Path(frame.filename)
            # the plugin is ours even installed beside vllm/ in the tree (a
            # site-packages): every other frame in the tree is the tree's
            if path.is_relative_to(tree) and PLUGIN_PACKAGE not in path.parts[:-1]:
                continue
            # the traced code's frames (Dynamo's) are all called by the tree
            shown = _ours(frame.filename, frame.name, i > first or i >= len(frames))
            said = f"{shown}:{frame.lineno} {frame.name}"
            if shown and said not in found:
                found.append(said)
        inner = getattr(error, "inner_exception", None)
        error = inner or error.__cause__ or error.__context__
    return found


def files_of(error: BaseException, tree: Path) -> list[str]:
    """Every file of the tree an error passed through, tree-relative."""
    return sorted({path for path, _ in _tree_frames_of(error, tree)})


def lines_of(error: BaseException, tree: Path) -> list[str]:
    """Every line of the tree an error passed through: "path:line"."""
    return [f"{path}:{line}" for path, line in sorted(_tree_frames_of(error, tree))]


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
    frames = tree_frames(error, tree)
    said = {
        "result": "not built",
        "error": f"{type(error).__name__}: {first}",
        "where": frames,
        "files": files_of(error, tree),
        "lines": lines_of(error, tree),
        "ours": ours_outside(error, tree),
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


def _first_line(error: BaseException) -> str:
    """ "<Error>: <the first line of its message>"."""
    said = str(error).split("\nfrom user code:")[0].strip()
    return f"{type(error).__name__}: {(said.splitlines() or [''])[0].strip()}"


def _observed(error: BaseException) -> str:
    """The error the traced code itself raised ("<Error>: <message>"),
    where Dynamo says only "Observed exception": the first error chained
    below it that is not Dynamo's (the code's own, raised while it ran), or
    else Dynamo's record of it (Observed<Error>, whose message is a constant
    of the trace); "" otherwise."""
    if not str(error).startswith("Observed exception"):
        return ""
    seen, recorded = set(), ""
    cause = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        name = type(cause).__name__
        if not type(cause).__module__.startswith("torch._dynamo"):
            return _first_line(cause)
        if not recorded and name.startswith("Observed") and cause.args:
            message = " ".join(str(getattr(a, "value", a)) for a in cause.args)
            line = (message.strip().splitlines() or [""])[0].strip()
            if line:
                recorded = f"{name.removeprefix('Observed')}: {line}"
        cause = cause.__cause__ or cause.__context__
    return recorded


def error_of(error: BaseException) -> str:
    """An error of a traced or compiled forward as a listed limit names it:
    the error Dynamo wraps (a backend's: inner_exception), the traced
    code's own where Dynamo only observed it, "<Error>: <first line>"."""
    error = getattr(error, "inner_exception", None) or error
    return _observed(error) or _first_line(error)


def _not_run(kind: str, reason: str, start: float) -> dict:
    """A configuration the proof did not build or trace, and no failure:
    an entry for other trees (NOT_FOR_THIS_TREE), or what the proof itself
    cannot run (PROOF_LIMIT)."""
    return {
        "result": kind,
        "error": reason,
        "where": [],
        "graphs": 0,
        "graph_breaks": 0,
        "ops": [],
        "seconds": round(time.monotonic() - start, 1),
    }


def sp_turned_off(vllm_config, configuration: str) -> tuple[str, str]:
    """(kind, reason), ("", "") if sequence parallelism is on where it was
    asked for. Turned off again at tensor parallelism 1, as 0.16.0+ does:
    the proof's limit (the tool traces it again at TP=2: runner.py); at
    TP > 1: the tree's own choice, "not built" with vLLM's words for it
    (its warning), which data/limits.toml may list."""
    if configuration != "sp":
        return "", ""
    pass_config = vllm_config.compilation_config.pass_config
    field = features.sp_field(pass_config)
    if not field or getattr(pass_config, field):
        return "", ""
    size = vllm_config.parallel_config.tensor_parallel_size
    if size == 1:
        return PROOF_LIMIT, (
            f"the tree's VllmConfig turned {field} off: it needs tensor "
            "parallelism > 1, and the proof runs one process (TP=1)"
        )
    said = [w for w in building.CONFIG_WARNINGS if _ABOUT_SP.search(w)]
    return "not built", "Warning: " + (
        said[0].strip().splitlines()[0]
        if said
        else f"the tree's VllmConfig turned {field} off at TP={size}"
    )


# vLLM's warnings where it turns sequence parallelism off
_ABOUT_SP = re.compile(r"sequence parallelism|\bSP\b", re.I)


def trace_one(
    model: model_data.Model,
    configuration: str,
    work: Path,
    tree: Path,
) -> dict:
    """Build the model under one configuration and trace it. Returns
    {configuration, mode, custom_ops, forwards, methods, tokens, result ("traced",
    "failed", "not compiled", "writes lost", "not built", "the proof's
    limit", "not for this tree"), graphs, graph_breaks, ops, nodes | error,
    where, files, seconds}."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    from vllm.config import CompilationConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context

    start = time.monotonic()
    torch._dynamo.reset()
    counters.clear()
    captured: list = []
    elsewhere = building.not_for_this_tree(model)
    if elsewhere:
        return {"configuration": configuration} | _not_run(
            NOT_FOR_THIS_TREE, elsewhere, start
        )
    try:
        directory = building.config_dir(model, work)
        vllm_config = building.configure(model, directory, configuration)
    except Exception as e:  # noqa: BLE001 - the result
        return {"configuration": configuration} | not_built(e, tree, start)
    kind, turned_off = sp_turned_off(vllm_config, configuration)
    if kind == PROOF_LIMIT:
        return {"configuration": configuration} | _not_run(
            PROOF_LIMIT, turned_off, start
        )
    if kind:  # the tree's: at TP > 1 it runs no sequence parallelism
        return {"configuration": configuration} | _not_run(kind, turned_off, start)
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
            building.distributed(vllm_config, work)
            built = building.build(model, vllm_config)
            result |= building.described(built)
            unquantized = building.unquantized(model, result["methods"])
            if unquantized:
                raise RuntimeError(unquantized)
            result["tokens"] = building.warm_up_tokens(vllm_config)
            inputs = building.inputs(model, built, result["tokens"])
        except Exception as e:  # noqa: BLE001 - the result
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
            else:
                text = str(error).split("\nfrom user code:")[0].strip()
                result |= {
                    "result": "failed",
                    # the traced code's own error, where Dynamo only observed it
                    "error": _observed(error) or _first_line(error),
                    "message": " ".join(text.split())[:2000],
                    "where": where(error, tree),
                    "files": files_of(e, tree),
                    "lines": lines_of(e, tree),
                    "ours": ours_outside(e, tree),
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
        # the collectives of a tensor-parallel trace (torch's own ops)
        result["collectives"] = sorted(
            {
                ".".join(str(node.target).split(".")[:2])
                for node in captured[0][1].graph.nodes
                if str(node.target).startswith("_c10d_functional.")
            }
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
    result["tensor_parallel"] = building.TENSOR_PARALLEL["size"]
    result["seconds"] = round(time.monotonic() - start, 1)
    return result
