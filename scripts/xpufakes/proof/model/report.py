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
# tolerance; the failures: compiled != eager, the compiled run raised, the
# eager run raised or gave nothing to compare (NaN, all zeros), the model
# not built for the numbers; TREE_LIMIT: a compiled run that raised with an
# error data/limits.toml names (limits.py). "not run": an entry for other
# trees only
NUMBERS_EQUAL, NUMBERS_DIFFERENT, NUMBERS_NOT_RUN = "equal", "different", "not run"
NUMBERS_RAISED = "compiled raised"
NUMBERS_EAGER_FAILED = "eager failed"
NUMBERS_NOT_BUILT = "not built"
# a run that reached a stand-in with no CPU reference (proof/xpu/
# uncomputed.py): nothing compared there, the proof's own limit; a failure
NOT_COMPUTED = (
    "a stand-in without a CPU reference: the proof's limit, not the tree's; "
    "a failure until it has one"
)
NUMBERS_FAILURES = (
    NUMBERS_DIFFERENT,
    NUMBERS_RAISED,
    NUMBERS_EAGER_FAILED,
    NUMBERS_NOT_BUILT,
)


def numbers_outcome(cells: list[dict]) -> str:
    """A configuration's numbers from its cells: its first failure (in
    NUMBERS_FAILURES' order), else TREE_LIMIT where a cell was excused,
    else equal."""
    results = {c["result"] for c in cells}
    failure = next((r for r in NUMBERS_FAILURES if r in results), "")
    return failure or (TREE_LIMIT if TREE_LIMIT in results else NUMBERS_EQUAL)


def numbers_fail(c: dict) -> bool:
    """Whether a configuration's numbers fail it."""
    return c.get("numbers", {}).get("result") in NUMBERS_FAILURES


def failing(found: dict) -> bool:
    return any(
        c["result"] not in ("traced", TREE_LIMIT, PROOF_LIMIT, NOT_FOR_THIS_TREE)
        or numbers_fail(c)
        for c in found["configurations"]
    )


def _difference(value: float) -> str:
    return "nan" if value != value else f"{value:.3g}"


def _at_counts(cells: list[dict]) -> str:
    return ", ".join(sorted({f"{c['tokens']}" for c in cells}, key=int))


def numbers_brief(n: dict) -> str:
    """A configuration's numbers in a few words: compiled = eager (the
    largest difference of any cell), or where it is not, where a run raised
    or what was excused as the tree's limit."""
    cells = n.get("cells", [])
    if not cells:
        if n.get("result") == NUMBERS_NOT_BUILT:
            return f"numbers FAIL, not built: {n.get('error', '')}"
        return f"numbers not run: {n.get('error', 'no cell')}"
    said = []
    uncomputed = [c for c in cells if c.get("not_computed")]
    if uncomputed:
        said.append(
            f"not computed here at {_at_counts(uncomputed)} tokens (a stand-in "
            "without a CPU reference: the proof's limit, a failure)"
        )
        cells = [c for c in cells if not c.get("not_computed")]
    for kind, words in (
        (NUMBERS_DIFFERENT, "compiled != eager"),
        (NUMBERS_RAISED, "the compiled run raised"),
        (NUMBERS_EAGER_FAILED, "eager failed or compared nothing"),
    ):
        found = [c for c in cells if c["result"] == kind]
        if found:
            said.append(f"{words} at {_at_counts(found)} tokens")
    if said:
        return "; ".join(said)
    ran = [c for c in cells if c["result"] == NUMBERS_EQUAL]
    if ran:
        worst = max(c["difference"] for c in ran)
        said.append(f"compiled = eager (largest difference {_difference(worst)})")
    excused = [c for c in cells if c["result"] == TREE_LIMIT]
    if excused:
        said.append(f"the tree's limit at {_at_counts(excused)} tokens (not compared)")
    return "; ".join(said)


def numbers_lines(n: dict) -> list[str]:
    """A configuration's numbers, a line per token count: each backend's
    largest difference from eager and its verdict, or the error it raised."""
    lines = [
        "      compiled vs eager, same weights and inputs, traced afresh at "
        "each count (numbers.py; tolerance: 2% of the largest eager value):"
    ]
    if not n.get("cells"):
        failed = (
            "FAIL, not built" if n.get("result") == NUMBERS_NOT_BUILT else "not run"
        )
        lines.append(f"        {failed}: {n.get('error', '')}")
    by_count: dict[int, list[dict]] = {}
    for c in n.get("cells", []):
        by_count.setdefault(c["tokens"], []).append(c)
    for count, cells in by_count.items():
        said = []
        eager = [c for c in cells if c["result"] == NUMBERS_EAGER_FAILED]
        for c in cells:
            if c in eager:
                continue
            if c["result"] == NUMBERS_RAISED and c.get("not_computed"):
                said.append(
                    f"{c['backend']} FAIL, not computed here: {c['not_computed']}"
                    f" ({NOT_COMPUTED})"
                )
            elif c["result"] == NUMBERS_RAISED:
                said.append(
                    f"{c['backend']} FAIL, raised: {c.get('message', c['error'])}"
                )
            elif c["result"] == TREE_LIMIT:
                said.append(
                    f"{c['backend']} raised, the tree's limit, not compared: "
                    f"{c.get('limit', '')} ({c['error']})"
                )
            elif c["result"] == NUMBERS_NOT_RUN:
                said.append(f"{c['backend']} not run ({c.get('error', '')})")
            else:
                verdict = "FAIL" if c["result"] == NUMBERS_DIFFERENT else "ok"
                said.append(
                    f"{c['backend']} {_difference(c['difference'])} {verdict} "
                    f"({c['seconds']} s)"
                )
        if eager:
            why = eager[0].get("message", eager[0]["error"])
            if eager[0].get("not_computed"):
                why = f"not computed here: {eager[0]['not_computed']} ({NOT_COMPUTED})"
            said.append(
                f"{', '.join(c['backend'] for c in eager)} not compared, FAIL: {why}"
            )
        largest = next((c["largest"] for c in cells if "largest" in c), None)
        beside = f"; largest eager value {_difference(largest)}" if largest else ""
        lines.append(f"        {count} tokens: {', '.join(said)}{beside}")
        for c in cells:
            if c.get("ours"):
                lines.append(
                    f"          {c['backend']}: through our code outside the tree: "
                    + ", ".join(c["ours"])
                )
            if c.get("not_excused"):
                lines.append(
                    f"          {c['backend']}: not excused: {c['not_excused']}"
                )
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
            failed = numbers_fail(c)
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
            f"{compared.count(NUMBERS_EQUAL)} compiled = eager, "
            f"{compared.count(NUMBERS_DIFFERENT)} compiled != eager, "
            f"{compared.count(NUMBERS_RAISED)} compiled raised, "
            f"{compared.count(NUMBERS_EAGER_FAILED)} eager failed, "
            f"{compared.count(NUMBERS_NOT_BUILT)} not built"
            + (
                f", {compared.count(TREE_LIMIT)} with a compiled run excused "
                "as the tree's limit"
                if TREE_LIMIT in compared
                else ""
            )
        )
    # the excused cells, always counted: what the tree cannot run on XPU
    said.append(f"{counts[TREE_LIMIT]} excused as the tree's limit (data/limits.toml)")
    if counts[PROOF_LIMIT]:
        said.append(f"{counts[PROOF_LIMIT]} the proof's limit (TP=1: not proven)")
    if counts[NOT_FOR_THIS_TREE]:
        said.append(f"{counts[NOT_FOR_THIS_TREE]} not for this tree")
    failed = len(cells) - sum(counts.values())
    failed += sum(c["result"] == "traced" and numbers_fail(c) for c in cells)
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
            failed = numbers_fail(c)
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
            if c.get("ours"):
                lines.append(
                    "      through our code outside the tree: " + ", ".join(c["ours"])
                )
        else:
            lines = [said + "FAIL: the forward was not compiled"]
    if c.get("not_excused"):
        lines.append(f"      not excused: {c['not_excused']}")
    for reason in c.get("limit_gone", []):
        lines.append(
            f"      a listed limit no longer happens (data/limits.toml): {reason}"
        )
    return lines
