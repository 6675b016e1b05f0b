"""The model proof's results in words (no torch): a configuration's cell,
a model's lines, the table of model x configuration, and whether a model
fails."""

import re

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
    if found.get("features"):
        lines.append(
            "  the tree's features the proof met (proof/model/features.py): "
            + ", ".join(found["features"])
        )
    if found.get("venv"):
        lines.append(f"  {found['venv']}")
    return "\n".join(lines)
