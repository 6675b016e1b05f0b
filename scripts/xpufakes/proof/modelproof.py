"""`make audit VLLM=... MODEL=<name>`: the whole-model proof of a tree
(modeltrace.py: the model of data/models.toml built from the tree's own
module at a tiny size and traced as vLLM compiles it, on the XPU platform's
paths) in a fresh Python, and its report."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from xpufakes.common import isolated, paths
from xpufakes.common.errors import Refusal
from xpufakes.proof import models, transformers_pin

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
    """modeltrace's result for one model of the tree (run_all)."""
    return run_all(root, [name], standins, configurations, python, plugin)[0]


def run_all(
    root: Path,
    chosen: list[str],
    standins: str,
    configurations: str,
    python: str = "",
    plugin: Path | None = None,
    transformers: str = "",
) -> list[dict]:
    """modeltrace's result for each of the models (its JSON), traced in one
    process with `python` (this one if not given) that sets up once. A
    model that could not be built is in it, each configuration "not built"
    with the error; if the process wrote nothing, each is "not built" with
    the end of what it said. `plugin`: the directory this project's vLLM
    plugin is installed in, whose register() runs before the models are
    built."""
    models.configurations(configurations)
    python = python or sys.executable
    env = isolated.env()  # nothing written to the tree
    if transformers:
        pinned = transformers_pin.overlay(transformers, python)
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{pinned}"
    with tempfile.TemporaryDirectory(prefix="xpufakes-model-") as work:
        out = Path(work) / "model.json"
        done = subprocess.run(
            [python, "-m", "xpufakes.proof.modeltrace", str(root), ",".join(chosen)]
            + [str(out), "--standins", standins, "--configurations", configurations]
            + (["--plugin", str(plugin)] if plugin else []),
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
    for model in found:
        said = venv_missing(model, python)
        if said:
            model["venv"] = said
    return found


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


# A configuration the tree itself cannot run on XPU (a setting it does not
# have, a model its XPU platform has no path for): its reason, not a failure
TREE_LIMIT = "tree limit"
# An entry for other trees only (models.toml applies_to: llm-scaler's
# sym_int4): its reason, not a failure
NOT_FOR_THIS_TREE = "not for this tree"


def failing(found: dict) -> bool:
    return any(
        c["result"] not in ("traced", TREE_LIMIT, NOT_FOR_THIS_TREE)
        for c in found["configurations"]
    )


def _what(result: dict) -> str:
    """The call a failed trace stopped at, as Dynamo names it."""
    message = result.get("message", "")
    for pattern in (
        r"unsupported operator: (\S+)",
        r"trace the builtin `([^`]+?)\.?`",
        r"fake tensors: call_function (\S+?)\(",
    ):
        match = re.search(pattern, message)
        if match:
            return f"{result['error']} ({match.group(1)})"
    return result.get("error", "")


def summary(found: dict) -> str:
    """One line: each configuration's result."""
    return "; ".join(
        f"{c['configuration']}: {cell(c)}" for c in found["configurations"]
    )


def cell(c: dict, short: bool = False) -> str:
    """A configuration's result in a few words: traced whole (graphs,
    graph breaks), fails (the error, where), not built (the error's first
    line); `short`: where as the file's name and line, and a limit's reason
    without its parenthesised details (vLLM's reasons, a kernel each, are
    in the model's lines)."""

    def at(frames: list[str]) -> str:
        where = (frames or ["?"])[-1]
        return where.rsplit("/", 1)[-1] if short else where

    if c["result"] == "traced":
        return (
            f"traced whole, {c['graphs']} graph(s), {c['graph_breaks']} graph break(s)"
        )
    if c["result"] == "failed":
        return f"fails, {_what(c)} at {at(c['where'])}"
    if c["result"] == "writes lost":
        return f"fails, writes lost: {', '.join(c['dropped'])}"
    if c["result"] == "not built":
        where = f" ({at(c['where'])})" if c.get("where") else ""
        return f"not built: {c['error']}{where}"
    reason = c.get("error", "")
    if short:
        reason = reason.split(" (", 1)[0]
    if c["result"] == TREE_LIMIT:
        return f"the tree's limit: {reason}"
    if c["result"] == NOT_FOR_THIS_TREE:
        return f"not for this tree: {reason}"
    return "fails, the forward was not compiled"


def matrix(found: list[dict]) -> str:
    """The models traced (`make audit MODEL=all`): a table of model x
    configuration, each cell traced whole, fails, not built or the tree's
    limit (what the tree itself cannot run on XPU, with its reason)."""
    configurations = list(
        dict.fromkeys(c["configuration"] for m in found for c in m["configurations"])
    )
    rows = [["model", *configurations]]
    for m in found:
        by = {c["configuration"]: cell(c, short=True) for c in m["configurations"]}
        rows.append([m["model"], *(by.get(c, "-") for c in configurations)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    built_with = sorted({m["transformers"] for m in found if m.get("transformers")})
    with_ = f"; built with transformers {', '.join(built_with)}" if built_with else ""
    lines = [f"Models traced whole (model x configuration{with_}):"]
    for row in rows:
        cells = (v.ljust(w) for v, w in zip(row, widths, strict=True))
        lines.append("  " + " | ".join(cells).rstrip())
    traced = sum(c["result"] == "traced" for m in found for c in m["configurations"])
    total = sum(len(m["configurations"]) for m in found)
    limits = sum(c["result"] == TREE_LIMIT for m in found for c in m["configurations"])
    limited = f"; {limits} the tree's limit (not run on XPU by the tree)"
    others = sum(
        c["result"] == NOT_FOR_THIS_TREE for m in found for c in m["configurations"]
    )
    elsewhere = f"; {others} not for this tree"
    lines.append(
        f"  {traced} of {total} traced whole"
        + (limited if limits else "")
        + (elsewhere if others else "")
    )
    return "\n".join(lines)


def table(found: dict) -> str:
    lines = [
        f"model {found['model']}: {' '.join(found['what'].split())}",
        "  traced as vLLM compiles it: the tree's own model module and "
        "@support_torch_compile (fullgraph), the XPU platform's paths, "
        "Dynamo + AOT functionalization with fake tensors (nothing is run); "
        f"stand-ins: {found['standins']}",
    ]
    for c in found["configurations"]:
        if c["result"] == "not built":
            lines.append(f"  {c['configuration']}: FAIL: not built: {c['error']}")
            lines.extend(f"      {where}" for where in c["where"])
            continue
        if c["result"] in (TREE_LIMIT, NOT_FOR_THIS_TREE):
            lines.append(f"  {c['configuration']}: {cell(c)}")
            continue
        custom_ops = ", ".join(dict.fromkeys(c["custom_ops"]))
        tokens = f"; {c['tokens']} tokens" if c.get("tokens") else ""
        said = f"  {c['configuration']} (custom ops: {custom_ops}{tokens}): "
        if c["result"] == "traced":
            lines.append(
                said + f"ok: traced whole, {c['graphs']} graph(s), "
                f"{c['graph_breaks']} graph break(s)"
            )
            lines.append(f"      ops in the graph: {', '.join(c['ops'])}")
        elif c["result"] == "writes lost":
            lines.append(said + f"FAIL: {c['error']}")
        elif c["result"] == "failed":
            lines.append(said + f"FAIL: {_what(c)}")
            lines.extend(f"      {where}" for where in c["where"])
        else:
            lines.append(said + "FAIL: the forward was not compiled")
    if found.get("venv"):
        lines.append(f"  {found['venv']}")
    return "\n".join(lines)
