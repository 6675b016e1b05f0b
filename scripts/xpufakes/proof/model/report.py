"""The model proof's results in words (no torch): a configuration's cell,
a model's lines, the table of model x configuration, and whether a model
fails."""

import re

# The results a configuration can have besides "traced" and the failures
# ("failed", "not built", "writes lost", "not compiled"):
# what the tree itself cannot run on XPU: a failure whose error a limit of
# data/limits.toml names exactly (limits.py), excused, not a failure
TREE_LIMIT = "tree limit"
# what the proof cannot run (one process: tensor parallelism 1; runner.py
# traces such a cell again at TP=2, two processes): not a
# failure, and not proven either; never the tree's
PROOF_LIMIT = "the proof's limit"
# an entry for other trees only (models.toml applies_to: llm-scaler's
# sym_int4): its reason, not a failure
NOT_FOR_THIS_TREE = "not for this tree"
# the failures whose error a listed limit can name
ERRORS = ("failed", "not built")
# what the table counts
KINDS = ("traced", TREE_LIMIT, PROOF_LIMIT, NOT_FOR_THIS_TREE)


# numbers.py's results (no torch here): a cell compiled = eager within
# tolerance, compiled != eager, or not run (eager or the compile raised)
NUMBERS_DIFFERENT, NUMBERS_NOT_RUN = "different", "not run"


def failing(found: dict) -> bool:
    return any(
        c["result"] not in ("traced", TREE_LIMIT, PROOF_LIMIT, NOT_FOR_THIS_TREE)
        or c.get("numbers", {}).get("result") == NUMBERS_DIFFERENT
        for c in found["configurations"]
    )


def _difference(value: float) -> str:
    return "nan" if value != value else f"{value:.3g}"


def numbers_brief(n: dict) -> str:
    """A configuration's numbers in a few words: compiled = eager (the
    largest difference of any cell), or where it is not."""
    cells = n.get("cells", [])
    if not cells:
        return f"numbers not run: {n.get('error', 'no cell')}"
    different = [c for c in cells if c["result"] == NUMBERS_DIFFERENT]
    not_run = [c for c in cells if c["result"] == NUMBERS_NOT_RUN]
    if different:
        where = sorted({f"{c['tokens']}" for c in different}, key=int)
        return f"compiled != eager at {', '.join(where)} tokens"
    ran = [c for c in cells if c["result"] not in (NUMBERS_DIFFERENT, NUMBERS_NOT_RUN)]
    said = ""
    if ran:
        worst = max(c["difference"] for c in ran)
        said = f"compiled = eager (largest difference {_difference(worst)})"
    if not_run:
        where = sorted({f"{c['tokens']}" for c in not_run}, key=int)
        said += ("; " if said else "") + f"numbers not run at {', '.join(where)}"
    return said


def numbers_lines(n: dict) -> list[str]:
    """A configuration's numbers, a line per token count: each backend's
    largest difference from eager and its verdict."""
    lines = [
        "      compiled vs eager, same weights and inputs, traced afresh at "
        "each count (numbers.py; tolerance: 2% of the largest eager value):"
    ]
    if not n.get("cells"):
        lines.append(f"        not run: {n.get('error', '')}")
    by_count: dict[int, list[dict]] = {}
    for c in n.get("cells", []):
        by_count.setdefault(c["tokens"], []).append(c)
    for count, cells in by_count.items():
        said = []
        for c in cells:
            if c["result"] == NUMBERS_NOT_RUN:
                said.append(f"{c['backend']} not run ({c['error']})")
            else:
                verdict = "FAIL" if c["result"] == NUMBERS_DIFFERENT else "ok"
                said.append(
                    f"{c['backend']} {_difference(c['difference'])} {verdict} "
                    f"({c['seconds']} s)"
                )
        largest = next((c["largest"] for c in cells if "largest" in c), None)
        beside = f"; largest eager value {_difference(largest)}" if largest else ""
        lines.append(f"        {count} tokens: {', '.join(said)}{beside}")
    return lines


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

    tp = f" (TP={c['tensor_parallel']})" if c.get("tensor_parallel", 1) > 1 else ""
    if c["result"] == "traced":
        said = (
            f"traced whole, {c['graphs']} graph(s), "
            f"{c['graph_breaks']} graph break(s){tp}"
        )
        if c.get("numbers"):
            brief = numbers_brief(c["numbers"])
            failed = c["numbers"].get("result") == NUMBERS_DIFFERENT
            said = (
                f"{'fails' if failed else said}; {brief}"
                if short
                else f"{said}; {brief}"
            )
        return said
    if c["result"] == "failed":
        return f"fails, {_what(c)} at {at(c['where'])}{tp}"
    if c["result"] == "writes lost":
        return f"fails, writes lost: {', '.join(c['dropped'])}"
    if c["result"] == "not built":
        where = f" ({at(c['where'])})" if c.get("where") else ""
        return f"not built: {c['error']}{where}"
    if c["result"] == TREE_LIMIT:  # listed: what it means, then vLLM's words
        said = f"the tree's limit: {c.get('limit', '')}"
        return said if short else f"{said} ({c['error']})"
    reason = c.get("error", "")
    if short:
        reason = reason.split(":", 1)[0].split(" (", 1)[0]
    if c["result"] == PROOF_LIMIT:
        return f"the proof's limit (TP=1): {reason}"
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
    cells = [c for m in found for c in m["configurations"]]
    counts = {kind: sum(c["result"] == kind for c in cells) for kind in KINDS}
    said = [f"{counts['traced']} of {len(cells)} traced whole"]
    compared = [c["numbers"].get("result") for c in cells if c.get("numbers")]
    if compared:
        said.append(
            f"numbers of {len(compared)}: "
            f"{compared.count('equal')} compiled = eager, "
            f"{compared.count(NUMBERS_DIFFERENT)} compiled != eager, "
            f"{compared.count(NUMBERS_NOT_RUN)} not run"
        )
    # the excused cells, always counted: what the tree cannot run on XPU
    said.append(f"{counts[TREE_LIMIT]} excused as the tree's limit (data/limits.toml)")
    if counts[PROOF_LIMIT]:
        said.append(f"{counts[PROOF_LIMIT]} the proof's limit (TP=1: not proven)")
    if counts[NOT_FOR_THIS_TREE]:
        said.append(f"{counts[NOT_FOR_THIS_TREE]} not for this tree")
    failed = len(cells) - sum(counts.values())
    failed += sum(
        c["result"] == "traced"
        and c.get("numbers", {}).get("result") == NUMBERS_DIFFERENT
        for c in cells
    )
    if failed:
        said.append(f"{failed} FAIL")
    lines.append("  " + "; ".join(said))
    gone = [c for c in cells if c.get("limit_gone")]
    if gone:
        lines.append(
            f"  {len(gone)} listed limit(s) no longer happen (data/limits.toml): "
            "see the models' lines"
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
        lines.extend(_cell_lines(c))
    if found.get("features"):
        lines.append(
            "  the tree's features the proof met (proof/model/features.py): "
            + ", ".join(found["features"])
        )
    if found.get("venv"):
        lines.append(f"  {found['venv']}")
    return "\n".join(lines)


def _cell_lines(c: dict) -> list[str]:
    """A configuration's lines in a model's table: its result, where it
    failed, why a listed limit was not excused or no longer happens."""
    if c["result"] == "not built":
        lines = [f"  {c['configuration']}: FAIL: not built: {c['error']}"]
        lines.extend(f"      {where}" for where in c["where"])
    elif c["result"] in (TREE_LIMIT, PROOF_LIMIT, NOT_FOR_THIS_TREE):
        lines = [f"  {c['configuration']}: {cell(c)}"]
    else:
        custom_ops = ", ".join(dict.fromkeys(c["custom_ops"]))
        tokens = f"; {c['tokens']} tokens" if c.get("tokens") else ""
        if c.get("tensor_parallel", 1) > 1:  # runner.in_tensor_parallel
            tokens += f"; TP={c['tensor_parallel']}, {c['tensor_parallel']} processes"
        said = f"  {c['configuration']} (custom ops: {custom_ops}{tokens}): "
        if c["result"] == "traced":
            numbers = c.get("numbers")
            failed = bool(numbers) and numbers.get("result") == NUMBERS_DIFFERENT
            lines = [
                said + f"{'FAIL' if failed else 'ok'}: traced whole, "
                f"{c['graphs']} graph(s), {c['graph_breaks']} graph break(s)"
                + (f"; {numbers_brief(numbers)}" if numbers else ""),
                f"      ops in the graph: {', '.join(c['ops'])}",
            ]
            if numbers:
                lines += numbers_lines(numbers)
        elif c["result"] == "writes lost":
            lines = [said + f"FAIL: {c['error']}"]
            if c.get("numbers"):
                lines += numbers_lines(c["numbers"])
        elif c["result"] == "failed":
            lines = [said + f"FAIL: {_what(c)}"]
            lines.extend(f"      {where}" for where in c["where"])
        else:
            lines = [said + "FAIL: the forward was not compiled"]
    if c.get("not_excused"):
        lines.append(f"      not excused: {c['not_excused']}")
    for reason in c.get("limit_gone", []):
        lines.append(
            f"      a listed limit no longer happens (data/limits.toml): {reason}"
        )
    return lines
