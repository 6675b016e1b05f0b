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
from pathlib import Path

from xpufakes.common import isolated, paths
from xpufakes.common.errors import Refusal
from xpufakes.proof.model import limits, models, transformers_pin

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
    numbers: str = "",
    esimd_truthful: bool = False,
) -> list[dict]:
    """The model proof's result for each of the models (its JSON), traced in one
    process with `python` (this one if not given) that sets up once, each
    cell classified by the tree's listed limits (limits.py). A
    model that could not be built is in it, each configuration "not built"
    with the error; if the process wrote nothing, each is "not built" with
    the end of what it said. `plugin`: the directory this project's vLLM
    plugin is installed in, whose register() runs before the models are
    built. `numbers`: the token counts at which each traced configuration's
    compiled forward is compared with its eager one (proof/model/numbers.py;
    "" none); `esimd_truthful`: the control in which the ESIMD ops whose
    schemas lie declare their writes (proof/xpu/esimd.py)."""
    models.configurations(configurations)
    models.token_counts(numbers)
    python = python or sys.executable
    env = isolated.env()  # nothing written to the tree
    if transformers:
        pinned = transformers_pin.overlay(transformers, python)
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{pinned}"
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
    for model in found:
        said = venv_missing(model, python)
        if said:
            model["venv"] = said
    return limits.classify_tree(found, root)


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
