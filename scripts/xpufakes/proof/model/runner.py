"""`make audit VLLM=... MODEL=<name>`: the whole-model proof of a tree
(cli.py: the model of data/models.toml built from the tree's own module at
a tiny size and traced as vLLM compiles it, on the XPU platform's paths)
run from the tool, in a fresh Python; report.py says its results."""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xpufakes.common import isolated, paths
from xpufakes.common.errors import Refusal
from xpufakes.proof.model import limits, models, report, transformers_pin

# `make audit MODEL=all`: every model of data/models.toml
ALL = "all"
# The venv `make audit MODEL=...` traces with (the Makefile's TREE_VENV):
# vLLM's dependencies
TREE_PYTHON = paths.REPO / ".venv-tree" / "bin" / "python"


def check_name(name: str) -> models.Model:
    """The model of that name; a Refusal naming the known ones."""
    known = models.load()
    if name not in known:
        raise Refusal(
            f"unknown model {name!r} (known: {', '.join(known)}; "
            f"scripts/xpufakes/data/models.toml)"
        )
    return known[name]


def names(text: str) -> list[str]:
    """MODEL=: a model's name, several separated by commas, or "all" (every
    model of data/models.toml); a Refusal naming an unknown one."""
    if text.strip() == ALL:
        return list(models.load())
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    for name in chosen or [text]:
        check_name(name)
    return list(dict.fromkeys(chosen))


def run(
    root: Path,
    name: str,
    standins: str,
    configurations: str,
    python: str = "",
    plugin: Path | None = None,
) -> dict:
    """The model proof's result for one model of the tree (run_all)."""
    return run_all(root, [name], standins, configurations, python, plugin)[0]


def run_all(
    root: Path,
    chosen: list[str],
    standins: str,
    configurations: str,
    python: str = "",
    plugin: Path | None = None,
    transformers: str = "",
    tensor_parallel: int = 2,
    numbers: str = "",
    esimd_truthful: bool = False,
) -> list[dict]:
    """The model proof's result for each of the models (its JSON), traced in one
    process with `python` (this one if not given) that sets up once (an
    entry with `own_process` in one of its own: processes()), each
    cell classified by the tree's listed limits (limits.py). A
    model that could not be built is in it, each configuration "not built"
    with the error; if the process wrote nothing, each is "not built" with
    the end of what it said. `plugin`: the directory this project's vLLM
    plugin is installed in, whose register() runs before the models are
    built. `tensor_parallel` > 1: the cells the one process could not run
    (the proof's limit: sequence parallelism, which the tree turns off at
    TP=1) traced again in that many processes (in_tensor_parallel).
    `numbers`: the token counts at which each traced configuration's
    compiled forward is compared with its eager one (proof/model/numbers.py;
    "" none); `esimd_truthful`: the control in which the ESIMD ops whose
    schemas lie declare their writes (proof/xpu/esimd.py)."""
    models.configurations(configurations)
    models.token_counts(numbers)
    python = python or sys.executable
    base = isolated.env()  # nothing written to the tree
    if transformers:
        pinned = transformers_pin.overlay(transformers, python)
        base["PYTHONPATH"] = f"{base['PYTHONPATH']}{os.pathsep}{pinned}"
    found: list[dict] = []
    for group, extra in processes(root, chosen):
        env = base | extra
        found += _one_process(
            root, group, standins, configurations, python, plugin, numbers,
            esimd_truthful, env, tensor_parallel,
        )  # fmt: skip
    order = {name: i for i, name in enumerate(chosen)}
    found.sort(key=lambda m: order[m["model"]])
    for model in found:
        said = venv_missing(model, python)
        if said:
            model["venv"] = said
    return limits.classify_tree(found, root)


def processes(root: Path, chosen: list[str]) -> list[tuple[list[str], dict]]:
    """The model processes of a run: the models together, with none of
    their environments at the start (each is set while its model is built:
    build.environment_of), but each entry with `own_process` that may be
    for this tree (applies_to a module the tree's source has) in a process
    of its own, its environment set from the start: a tree may read it
    once, at import (llm-scaler's esimd_utils.py)."""
    known = models.load()
    alone = []
    for name in chosen:
        model = known[name]
        module = model.applies_to.get("module", "")
        here = not module or any(
            (root / Path(*module.split("."))).with_suffix(s).exists()
            for s in (".py", "")
        )
        if model.own_process and here:
            alone.append(name)
    together = [n for n in chosen if n not in alone]
    groups = [(together, {})] if together else []
    groups += [([n], {k: str(v) for k, v in known[n].env.items()}) for n in alone]
    return groups


def _one_process(
    root: Path,
    chosen: list[str],
    standins: str,
    configurations: str,
    python: str,
    plugin: Path | None,
    numbers: str,
    esimd_truthful: bool,
    env: dict[str, str],
    tensor_parallel: int,
) -> list[dict]:
    """run_all's models in one process (and its tensor-parallel ones)."""
    with tempfile.TemporaryDirectory(prefix="xpufakes-model-") as work:
        out = Path(work) / "model.json"
        done = subprocess.run(
            [python, "-m", "xpufakes.proof.model.cli", str(root), ",".join(chosen)]
            + [str(out), "--standins", standins, "--configurations", configurations]
            + (["--plugin", str(plugin)] if plugin else [])
            + (["--numbers", numbers] if numbers else [])
            + (["--esimd-truthful"] if esimd_truthful else []),
            capture_output=True,
            text=True,
            env=env,
        )
        if out.is_file():
            found = json.loads(out.read_text())["models"]
        else:
            tail = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            error = {
                "result": "not built",
                "error": f"the model proof's Python ({python}) exited with "
                f"status {done.returncode}: {tail}",
                "where": [],
                "graphs": 0,
                "graph_breaks": 0,
                "ops": [],
            }
            missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", tail)
            if missing:
                error["missing"] = missing.group(1)
            known = models.load()
            found = [
                {
                    "tree": str(root),
                    "model": name,
                    "what": known[name].what,
                    "standins": standins,
                    "configurations": [
                        {"configuration": c} | error
                        for c in models.configurations(configurations)
                    ],
                }
                for name in chosen
            ]
    if tensor_parallel > 1:
        again = [
            m["model"]
            for m in found
            if any(c["result"] == report.PROOF_LIMIT for c in m["configurations"])
        ]
        if again:
            at = in_tensor_parallel(
                root, again, standins, python, env, tensor_parallel, plugin
            )
            for model in found:
                model["configurations"] = [
                    # what one process said of it, kept
                    at[key] | {"one_process": c["error"]}
                    if (key := (model["model"], c["configuration"])) in at
                    else c
                    for c in model["configurations"]
                ]
    return found


# a tensor-parallel trace's processes, at most (each imports vLLM, builds
# and traces its shard: seconds each on 2 cores)
TENSOR_PARALLEL_SECONDS = 600


def in_tensor_parallel(
    root: Path,
    chosen: list[str],
    standins: str,
    python: str,
    env: dict[str, str],
    size: int,
    plugin: Path | None = None,
) -> dict[tuple[str, str], dict]:
    """The cells the proof could not run in one process (report.PROOF_LIMIT:
    sequence parallelism, which the tree turns off at TP=1) traced as
    vLLM's workers run them: `size` processes of a tensor-parallel group on
    gloo, each building its shard of each model and tracing it. (model,
    configuration) -> rank 0's cell, "failed" where another rank's result
    differs, "not built" where a process wrote nothing."""
    configuration = "sp"
    with tempfile.TemporaryDirectory(prefix="xpufakes-tp-") as work:
        outs = [Path(work) / f"rank{rank}.json" for rank in range(size)]
        errs = [(Path(work) / f"rank{rank}.err").open("w") for rank in range(size)]
        command = [python, "-m", "xpufakes.proof.model.cli", str(root)]
        command += [",".join(chosen)]
        started = [
            subprocess.Popen(
                [*command, str(out), "--standins", standins]
                + ["--configurations", configuration]
                + ["--tensor-parallel-size", str(size), "--rank", str(rank)]
                + ["--distributed-init", f"file://{work}/distributed"]
                + (["--plugin", str(plugin)] if plugin else []),
                stdout=subprocess.DEVNULL,
                # a file: a pipe nobody reads while the ranks run fills up
                stderr=err,
                env=env,
            )
            for rank, (out, err) in enumerate(zip(outs, errs, strict=True))
        ]
        for err in errs:
            err.close()  # the children have theirs
        said = _wait_all(started, [Path(err.name) for err in errs])
        found = [
            {
                m["model"]: m["configurations"][0]
                for m in json.loads(o.read_text())["models"]
            }
            if o.is_file()
            else None
            for o in outs
        ]
    cells = {}
    for name in chosen:
        first = found[0] and found[0].get(name)
        if first is None:
            cells[(name, configuration)] = {
                "configuration": configuration,
                "result": "not built",
                "error": f"the tensor-parallel trace (TP={size}) wrote nothing: "
                + said[0],
                "where": [],
                "graphs": 0,
                "graph_breaks": 0,
                "ops": [],
                "tensor_parallel": size,
            }
            continue
        others = [f.get(name) if f else None for f in found[1:]]
        differ = [
            f"rank {rank}: {(other or {}).get('result', 'no result')}"
            for rank, other in enumerate(others, 1)
            if other is None or other["result"] != first["result"]
        ]
        if differ:
            first = first | {
                "result": "failed",
                "error": f"the ranks disagree: rank 0: {first['result']}; "
                + "; ".join(differ),
                "where": first.get("where", []),
            }
        cells[(name, configuration)] = {"tensor_parallel": size} | first
    return cells


def _wait_all(started: list[subprocess.Popen], errs: list[Path]) -> list[str]:
    """Wait for every process; one that fails leaves the others waiting for
    it at a collective, so they are stopped then (and all of them after
    TENSOR_PARALLEL_SECONDS). The end of what each said."""
    deadline = time.monotonic() + TENSOR_PARALLEL_SECONDS
    while time.monotonic() < deadline:
        codes = [process.poll() for process in started]
        if all(code is not None for code in codes) or any(codes):
            break
        time.sleep(0.2)
    tails = []
    for process, err in zip(started, errs, strict=True):
        if process.poll() is None:
            process.kill()
        process.wait()
        lines = err.read_text(errors="replace").strip().splitlines()
        lines = lines or ["(nothing on stderr)"]
        tails.append(f"exit status {process.returncode}: {lines[-1]}")
    return tails


def venv_missing(found: dict, python: str) -> str:
    """What to say when a model was not built for a module its Python does
    not have: that it needs `make venv-tree` only where that venv is really
    missing; "" otherwise (the error itself says what failed)."""
    missing = [c["missing"] for c in found["configurations"] if c.get("missing")]
    venv = Path(python).absolute().parent.parent
    if not missing or venv.resolve() == TREE_PYTHON.parent.parent.resolve():
        return ""
    if TREE_PYTHON.exists():
        return (
            f"{python} has no module {missing[0]!r}: `make audit MODEL=...` "
            f"traces with {TREE_PYTHON}, which has the tree's dependencies"
        )
    return (
        f"the model proof of {found['model']} did not finish in {python} "
        f"(No module named {missing[0]!r}): it needs the tree's dependencies "
        "(`make audit MODEL=...` uses .venv-tree, made by `make venv-tree`)"
    )
