"""`make audit VLLM=... MODEL=<name>`: the whole-model proof of a tree
(modeltrace.py: the model of data/models.toml built from the tree's own
module at a tiny size and traced as vLLM compiles it, on the XPU platform's
paths) in a fresh Python, and its report."""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from xpufakes.common import isolated
from xpufakes.common.errors import Refusal
from xpufakes.proof import models


def check_name(name: str) -> models.Model:
    """The model of that name; a Refusal naming the known ones."""
    known = models.load()
    if name not in known:
        raise Refusal(
            f"unknown model {name!r} (known: {', '.join(known)}; "
            f"scripts/xpufakes/data/models.toml)"
        )
    return known[name]


def run(
    root: Path,
    name: str,
    standins: str,
    configurations: str,
    python: str = "",
    plugin: Path | None = None,
) -> dict:
    """modeltrace's result for the tree (its JSON), run with `python` (this
    one if not given), or a Refusal with the end of what the child said if
    it wrote none. `plugin`: the directory this project's vLLM plugin is
    installed in, whose register() runs before the model is built."""
    models.configurations(configurations)
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="xpufakes-model-") as work:
        out = Path(work) / "model.json"
        done = subprocess.run(
            [python, "-m", "xpufakes.proof.modeltrace", str(root), name, str(out)]
            + ["--standins", standins, "--configurations", configurations]
            + (["--plugin", str(plugin)] if plugin else []),
            capture_output=True,
            text=True,
            env=isolated.env(),  # nothing written to the tree
        )
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            raise Refusal(
                f"the model proof of {name} did not finish in {python} "
                f"({tail}): it needs the tree's dependencies (`make audit "
                "MODEL=...` uses .venv-tree, made by `make venv-tree`)"
            )
        return json.loads(out.read_text())


def failing(found: dict) -> bool:
    return any(c["result"] != "traced" for c in found["configurations"])


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
    said = []
    for c in found["configurations"]:
        if c["result"] == "traced":
            said.append(
                f"{c['configuration']}: traced whole, {c['graphs']} graph(s), "
                f"{c['graph_breaks']} graph break(s)"
            )
        elif c["result"] == "failed":
            where = (c["where"] or ["?"])[-1]
            said.append(f"{c['configuration']}: fails, {_what(c)} at {where}")
        else:
            said.append(f"{c['configuration']}: {c['result']}")
    return "; ".join(said)


def table(found: dict) -> str:
    lines = [
        f"model {found['model']}: {' '.join(found['what'].split())}",
        "  traced as vLLM compiles it: the tree's own model module and "
        "@support_torch_compile (fullgraph), the XPU platform's paths, "
        "Dynamo + AOT functionalization with fake tensors (nothing is run); "
        f"stand-ins: {found['standins']}",
    ]
    for c in found["configurations"]:
        custom_ops = ", ".join(dict.fromkeys(c["custom_ops"]))
        said = f"  {c['configuration']} (custom ops: {custom_ops}): "
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
    return "\n".join(lines)
