"""The catalog's recorded run and the docs' per-tree tables made from it
(no torch).

tests/test_model_catalog.py traces every model of data/models.toml on the
b6-like tree and on a pinned release of each era, each stage (unpatched,
patched, ...) in one process; with XPUFAKES_CATALOG_RECORD=<dir> it writes
each tree's stage there (record_stage). `make catalog` runs it and then

    python -m xpufakes.proof.model.catalog record DIR --command "make catalog"

which keeps the run, with its date, commit and command, in
data/catalog_run.json and writes the tables into docs/traced-path.md's
`<!-- catalog:KEY -->` places; `... catalog write` writes them again from
the recorded run. tests/test_catalog_tables.py checks that the committed
tables are what the recorded run gives, and the catalog test that the
recorded run is what the trees give today. No table is written by hand.

The real intel/llm-scaler trees are opt-in (tests/test_llm_scaler_trees.py
-k catalog, with XPUFAKES_LLM_SCALER=<git dir>): `make catalog-llm-scaler
GIT=<git dir>` records their run the same way, apart (RUNS: its own file,
data/catalog_run_llm_scaler.json, and its own places,
`<!-- catalog-llm-scaler:KEY -->`), so that a run of one never rewrites the
other's tables.
"""

import argparse
import datetime
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from xpufakes.common import paths
from xpufakes.proof.model import limits, report
from xpufakes.trees import pinfacts

DOCUMENT = "docs/traced-path.md"


@dataclass(frozen=True)
class Run:
    record: Path  # the recorded run
    kind: str  # its places in DOCUMENT: <!-- KIND:KEY -->
    command: str  # the command that records it (its start, with arguments)


RUNS = {
    "catalog": Run(paths.DATA / "catalog_run.json", "catalog", "make catalog"),
    "llm-scaler": Run(
        paths.DATA / "catalog_run_llm_scaler.json",
        "catalog-llm-scaler",
        "make catalog-llm-scaler",
    ),
}
RECORD = RUNS["catalog"].record
KIND = RUNS["catalog"].kind
# the stages of a tree, in the tables' order
STAGES = ("unpatched", "patched", "without vLLM's GEMM fakes")
# a failure's call, as report.cell says it: "(the call) at"
_CALL = re.compile(r"\(([^()]+)\) at ")


def word(cell: dict) -> str:
    """A cell in a few words: what the table shows."""
    result = cell["result"]
    if cell.get("tensor_parallel", 1) > 1:
        return f"{word(dict(cell, tensor_parallel=1))} (TP={cell['tensor_parallel']})"
    if result == "traced":
        if cell.get("graphs") == 1 and cell.get("graph_breaks") == 0:
            return "traced whole"
        return f"traced, {cell.get('graphs')} graphs, {cell.get('graph_breaks')} breaks"
    if result == "failed":
        found = _CALL.search(report.cell(cell, short=True))
        return f"fails at `{found.group(1)}`" if found else f"fails: {cell['error']}"
    if result == report.TREE_LIMIT:
        return "the tree's limit"
    if result == report.PROOF_LIMIT:
        return "the proof's limit (TP=1)"
    if result == report.NOT_FOR_THIS_TREE:
        return "not for this tree"
    if result == "not built":
        return f"not built: {cell['error']}"
    if result == "writes lost":
        return "writes lost"
    return "not compiled"


# what a recorded failure keeps, to be judged again (rejudged): its error,
# the lines of the tree it passed through (those of ours apart) and the
# frames of ours outside the tree
_KEPT = ("error", "lines", "through_ours", "ours")


def _kept(failure: dict) -> dict:
    return {key: failure[key] for key in _KEPT if failure.get(key) is not None}


def cells(found: list[dict]) -> dict[str, dict[str, dict]]:
    """The model proof's classified result (runner.run_all, limits.py):
    model -> configuration -> {result, word, seconds}, and of a failure
    or a limit (the configuration's, the numbers' compiled runs that
    raised: `raised`) what judging it takes (_KEPT)."""
    recorded: dict[str, dict[str, dict]] = {}
    for model in found:
        for c in model["configurations"]:
            cell = {
                "result": c["result"],
                "word": word(c),
                "seconds": c.get("seconds", 0),
            }
            if c["result"] in (*report.ERRORS, report.TREE_LIMIT):
                cell |= _kept(c)
            numbers = (c.get("numbers") or {}).get("cells", [])
            raised = [
                {"tokens": n["tokens"], "backend": n["backend"], "result": n["result"]}
                | _kept(n)
                for n in numbers
                if n["result"] in (report.NUMBERS_RAISED, report.TREE_LIMIT)
            ]
            if raised:
                cell["raised"] = raised
            recorded.setdefault(model["model"], {})[c["configuration"]] = cell
    return recorded


def record_stage(
    directory: Path,
    tree: str,
    stage: str,
    found: list[dict],
    seconds: float,
    order: int = 0,
    keys: tuple[str, str] = ("", ""),
) -> Path:
    """One tree's stage of a run, written for `record` to gather (`order`:
    the tree's place in the tables; `keys`: what the tree's limits are
    keyed by, limits.keys_of: its release and llm-scaler image)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (known: {', '.join(STAGES)})")
    directory.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^\w.-]+", "-", f"{tree}-{stage}")
    path = directory / f"{name}.json"
    path.write_text(
        json.dumps(
            {
                "tree": tree,
                "order": order,
                "stage": stage,
                "seconds": round(seconds, 1),
                "release": keys[0],
                "image": keys[1],
                "cells": cells(found),
            },
            indent=1,
        )
    )
    return path


def gather(directory: Path, command: str, date: str, commit: str) -> dict:
    """The run: its date, commit and command, and each tree's stages (the
    trees in their recorded order, each tree's stages in STAGES' order)."""
    stages = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    if not stages:
        raise ValueError(f"{directory}: no stage was recorded")
    trees: dict[str, dict] = {}
    for stage in sorted(
        stages, key=lambda s: (s.get("order", 0), s["tree"], STAGES.index(s["stage"]))
    ):
        trees.setdefault(stage["tree"], {})[stage["stage"]] = {
            "seconds": stage["seconds"],
            "release": stage["release"],
            "image": stage["image"],
            "cells": stage["cells"],
        }
    return {"date": date, "commit": commit, "command": command, "trees": trees}


def disagreements(live: dict[str, dict], recorded: dict[str, dict]) -> list[str]:
    """Where a tree's run today (stage -> cells()) is not its recorded run
    (stage -> {seconds, cells}): each cell whose result or words differ, and
    each stage, model or configuration only one of them has (the seconds
    are the run's, never compared)."""
    differ = []
    for stage in sorted(set(live) | set(recorded)):
        if stage not in live or stage not in recorded:
            differ.append(f"{stage}: {'not recorded' if stage in live else 'not run'}")
            continue
        now, then = live[stage], recorded[stage]["cells"]
        for model in sorted(set(now) | set(then)):
            mine, kept = now.get(model, {}), then.get(model, {})
            for configuration in sorted(set(mine) | set(kept)):
                a, b = mine.get(configuration), kept.get(configuration)
                if a is None or b is None:
                    differ.append(
                        f"{stage} {model} {configuration}: "
                        f"{'not recorded' if b is None else 'not run'}"
                    )
                elif (a["result"], a["word"]) != (b["result"], b["word"]):
                    differ.append(
                        f"{stage} {model} {configuration}: {a['word']} "
                        f"(recorded: {b['word']})"
                    )
    return differ


def _failures(recorded: dict):
    """(tree, stage, model, configuration, where, failure, release, image)
    of each recorded failure or limit: a configuration's, and each numbers
    cell whose compiled run raised (`where`: "" or "<n> tokens <backend>")."""
    for tree, stages in recorded["trees"].items():
        for stage, found in stages.items():
            for model, configurations in found["cells"].items():
                for configuration, cell in configurations.items():
                    keys = (found.get("release"), found.get("image"))
                    if cell["result"] in (*report.ERRORS, report.TREE_LIMIT):
                        yield tree, stage, model, configuration, "", cell, *keys
                    for n in cell.get("raised", []):
                        where = f"{n['tokens']} tokens {n['backend']}"
                        yield tree, stage, model, configuration, where, n, *keys


def rejudged(recorded: dict, listed: list) -> list[str]:
    """Each recorded failure or limit that today's limits (`listed`,
    limits.load()) judge otherwise than the run did: a limit no longer
    listed, or a failure a limit now excuses (limits.excusing, from what
    the run kept of it). A stage recorded without its keys, or a failure
    without its error, cannot be judged again: said too."""
    differ = []
    for tree, stage, model, configuration, where, failure, release, image in _failures(
        recorded
    ):
        at = " ".join(x for x in (tree, stage, model, configuration, where) if x)
        if release is None or "error" not in failure:
            differ.append(f"{at}: recorded without what judging it takes")
            continue
        limit = limits.excusing(listed, release, model, configuration, image, failure)
        if (limit is not None) != (failure["result"] == report.TREE_LIMIT):
            differ.append(
                f"{at}: recorded {failure['result']!r}, today "
                + (
                    "excused by data/limits.toml"
                    if limit
                    else "no listed limit excuses it"
                )
                + f" ({failure['error']})"
            )
    return differ


def met(records: dict[str, dict], listed: list) -> dict:
    """limit -> the recorded runs (RUNS' names) with a failure it excuses."""
    found: dict = {limit: [] for limit in listed}
    for run, recorded in records.items():
        for _, _, model, configuration, _, failure, release, image in _failures(
            recorded
        ):
            if release is None or "error" not in failure:
                continue
            limit = limits.excusing(
                listed, release, model, configuration, image, failure
            )
            if limit is not None and run not in found[limit]:
                found[limit].append(run)
    return found


def _counts(stage: dict) -> str:
    every = [c for model in stage["cells"].values() for c in model.values()]
    kinds = (
        ("traced", "traced whole"),
        (report.TREE_LIMIT, "excused as the tree's limit"),
        (report.PROOF_LIMIT, "the proof's limit (TP=1)"),
        (report.NOT_FOR_THIS_TREE, "not for this tree"),
    )
    said = []
    for kind, name in kinds:
        n = sum(c["result"] == kind for c in every)
        if n or kind in ("traced", report.TREE_LIMIT):
            said.append(f"{n} {name}")
    failed = len(every) - sum(c["result"] in dict(kinds) for c in every)
    said.append(f"{failed} fail")
    return f"{len(every)} cells: " + ", ".join(said)


def tree_table(name: str, stages: dict) -> str:
    """One tree's table: a row per model, a column per stage and
    configuration; then each stage's counts and time."""
    columns = [
        (stage, configuration)
        for stage in stages
        for configuration in next(iter(stages[stage]["cells"].values()))
    ]
    models = list(next(iter(stages.values()))["cells"])
    head = [f"{stage}, {configuration}" for stage, configuration in columns]
    rows = [
        f"| model ({name}) | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for model in models:
        said = [stages[s]["cells"][model][c]["word"] for s, c in columns]
        rows.append(f"| `{model}` | " + " | ".join(said) + " |")
    lines = ["", *rows, ""]
    for stage, found in stages.items():
        slowest = max(
            c["seconds"] for model in found["cells"].values() for c in model.values()
        )
        lines.append(
            f"* {stage}: {_counts(found)}; one process, {found['seconds']} s "
            f"(the slowest cell {slowest} s)"
        )
    return "\n".join(lines) + "\n"


def reaching(models: list[dict], op: str) -> dict[str, float | None]:
    """model -> the worst difference from eager (relative to eager's
    largest value; NaN the worst of all; None: no numbers) of the numbers
    cells whose compiled graph calls `op` (numbers.custom_ops), in a
    `make audit MODEL=... --json` report's models."""
    seen: dict[str, list[float]] = {}
    for model in models:
        for configuration in model["configurations"]:
            for n in (configuration.get("numbers") or {}).get("cells", []):
                # a compile that stopped at the op (no fake) names it
                unsupported = f"unsupported operator: {op.replace('::', '.')}."
                if unsupported in n.get("message", ""):
                    seen.setdefault(model["model"], []).append(RAISED)
                    continue
                if op not in n.get("ops", []):
                    continue
                found = seen.setdefault(model["model"], [])
                if n.get("largest") and n.get("difference") is not None:
                    found.append(n["difference"] / n["largest"])
    return {model: _worst(values) for model, values in seen.items()}


RAISED = float("inf")  # compiling stopped at the op: worse than any number


def _worst(values: list[float]) -> float | None:
    if not values:
        return None
    if RAISED in values:
        return RAISED
    nan = [v for v in values if v != v]
    return nan[0] if nan else max(values)


def _said_worst(worst: float | None) -> str:
    if worst is None:
        return "no numbers"
    if worst == RAISED:
        return "compiling stops at it"
    return "NaN" if worst != worst else f"{worst:.2%}"


def routed_table(unpatched: list[dict], patched: list[dict], routed: dict) -> str:
    """For each kernel op the fix routes (kernel op -> the vLLM op that
    runs it), the models whose compiled graphs call it unpatched (the
    kernel op) or patched (the vLLM op), each with its worst difference
    from eager: from two `make audit MODEL=... --json` reports' models."""
    rows = [
        "| op | models whose compiled graph calls it | unpatched | patched |",
        "|---|---|---|---|",
    ]
    for kernel, vllm_op in sorted(routed.items()):
        before, after = reaching(unpatched, kernel), reaching(patched, vllm_op)
        models = sorted(set(before) | set(after))
        said = ", ".join(f"`{m}`" for m in models) or "none of these"
        was = "; ".join(f"{m} {_said_worst(before[m])}" for m in models if m in before)
        now = "; ".join(f"{m} {_said_worst(after[m])}" for m in models if m in after)
        rows.append(f"| `{kernel}` | {said} | {was or '-'} | {now or '-'} |")
    return "\n".join(rows) + "\n"


def routed_ops() -> dict[str, str]:
    """kernel op -> the vLLM op the fix runs it as (schema_contracts.toml)."""
    import tomllib

    contracts = tomllib.loads((paths.DATA / "schema_contracts.toml").read_text())
    return {c["kernel_op"]: f"vllm::{c['op']}" for c in contracts.values()}


def facts(recorded: dict) -> dict[str, str]:
    """KEY -> the text of each `<!-- catalog:KEY -->` place."""
    tables = "".join(
        tree_table(name, stages) for name, stages in recorded["trees"].items()
    )
    return {
        "source": f"{recorded['date']}, commit {recorded['commit']}, "
        f"`{recorded['command']}`",
        "tables": tables,
    }


def load(path: Path = RECORD) -> dict:
    return json.loads(path.read_text())


def rewrite(text: str, recorded: dict, kind: str = KIND) -> str:
    return pinfacts.rewrite(text, facts(recorded), kind)


def write(
    repo: Path = paths.REPO, recorded: dict | None = None, run: str = "catalog"
) -> bool:
    """The document's tables of a run from its recorded run; whether it
    changed."""
    path = repo / DOCUMENT
    text = path.read_text()
    new = rewrite(text, recorded or load(RUNS[run].record), RUNS[run].kind)
    if new != text:
        path.write_text(new)
    return new != text


def _commit(repo: Path) -> str:
    """The commit the run was made at, "+changes" if tracked files differ."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short=9", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no")
    return head + ("+changes" if changed else "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufakes.proof.model.catalog")
    sub = parser.add_subparsers(dest="verb", required=True)
    record = sub.add_parser("record", help="keep a run, then write its tables")
    record.add_argument("directory", type=Path)
    record.add_argument("--command", required=True)
    record.add_argument("--run", choices=list(RUNS), default="catalog")
    sub.add_parser("write", help="write every run's tables from its recorded run")
    routed = sub.add_parser(
        "routed",
        help="which model's compiled graphs call which op the fix routes, "
        "from two `make audit MODEL=... ARGS=--json` reports",
    )
    routed.add_argument("unpatched", type=Path)
    routed.add_argument("patched", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "routed":
        reports = [
            json.loads(p.read_text())["models"] for p in (args.unpatched, args.patched)
        ]
        print(routed_table(*reports, routed_ops()), end="")
        return 0
    if args.verb == "record":
        run = RUNS[args.run]
        if not args.command.startswith(run.command):
            parser.error(f"--run {args.run} is recorded by `{run.command}`")
        date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        kept = gather(args.directory, args.command, date, _commit(paths.REPO))
        run.record.write_text(json.dumps(kept, indent=1) + "\n")
        print(f"catalog: the run kept in {run.record.relative_to(paths.REPO)}")
        names = [args.run]
    else:
        names = [name for name, run in RUNS.items() if run.record.is_file()]
    for name in names:
        changed = write(run=name)
        said = "written" if changed else "unchanged"
        print(f"catalog: {DOCUMENT}'s {name} tables {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
