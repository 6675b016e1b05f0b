"""Command line: python -m xpufakes <verb> ... (the Makefile's verbs call it).

It parses the arguments, locates the tree, calls the verb (a module named
for it), prints what the verb returns and maps the outcome to the exit
status (errors.py); nothing else."""

import argparse
import json
import shlex
import signal
import sys
from contextlib import nullcontext
from pathlib import Path

from . import (
    apply,
    audit,
    authoring,
    errors,
    export,
    fetch,
    history,
    lock,
    pins,
    revert,
    selection,
    status,
    streams,
    transaction,
    tree,
    treetest,
    verify,
)
from .errors import Refusal
from .pipeline import Committed


def _located(path: str | None) -> tree.Tree:
    """The tree given, else the vLLM this Python imports (said aloud)."""
    if path:
        return tree.locate(path)
    found = tree.installed()
    print(f"no VLLM= given: the vLLM that {sys.executable} imports, {found.root}")
    return found


# Each verb's handler returns its exit status; those that change a tree
# return what they committed (pipeline.Committed, or None: nothing).


def cmd_apply(args) -> Committed | None:
    found = _located(args.vllm)
    return apply.apply(found, args.patches, args.dry_run, args.no_proof)


def cmd_revert(args) -> Committed | None:
    return revert.revert(_located(args.vllm), args.patches)


def cmd_status(args) -> int:
    status.status(_located(args.vllm))
    return errors.OK


def cmd_fetch(args) -> int:
    all_pins = pins.load()
    versions = list(all_pins.releases) if args.all else args.versions
    if not versions:
        raise Refusal("no release given (PIN=<release>)", status=errors.USAGE)
    for pin, path in fetch.fetch_all([all_pins.get(v) for v in versions]):
        print(path if args.path else f"vLLM {pin.version}: {path}")
    return errors.OK


def cmd_pins(args) -> int:
    for pin in pins.load().releases.values():
        print(f"{pin.version}\t{pin.series}\t{pin.kernels}")
    return errors.OK


def cmd_test_tree(args) -> int:
    return treetest.test_tree(tree.locate(args.vllm), args.pytest_args)


def cmd_export(args) -> int:
    for name, files in export.export(Path(args.out), args.pin or None).items():
        print(f"{name}: {len(files)} patch(es)")
    print(f"exported to {args.out}")
    return errors.OK


def cmd_stage(args) -> int:
    from . import stage, treechecks

    with lock.tree_lock(tree.locate(args.vllm).root):
        branch, commits, description, results = stage.stage(
            args.vllm,
            args.branch,
            args.python,
            shlex.split(args.test_args or ""),
            full=args.full,
        )
    print("the tree's own checks on the staged files:")
    print(treechecks.report(results))
    print(f"branch {branch}: {len(commits)} commit(s), {commits[-1][:12]}\n")
    print(description)
    return errors.OK


def cmd_verify_xpu(args) -> int:
    vllm = tree.locate(args.vllm).root if args.vllm else None
    results = verify.run(vllm, args.standins, full=not args.quick)
    if args.json_out:
        Path(args.json_out).write_text(verify.to_json(results))
    print(verify.to_json(results) if args.json else verify.table(results))
    return errors.OK if results and all(r.ok for r in results) else errors.REFUSED


def cmd_audit(args) -> int:
    found = tree.locate(args.vllm)
    kernels, reports = audit.audit(found, not args.static, args.standins)
    print((audit.to_json if args.json else audit.table)(found, kernels, reports))
    return errors.REFUSED if any(r.failing for r in reports) else errors.OK


def cmd_bench(args) -> int:
    from . import bench

    text = bench.report(device=args.device, repeats=args.repeats)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return errors.OK


def cmd_bench_worker(args) -> int:
    from . import bench

    result = bench.worker(args.variant, args.device, args.repeats)
    Path(args.out).write_text(json.dumps(result))
    return errors.OK


def cmd_overlay_history(args) -> int:
    for path in history.write():
        print(f"wrote {path}")
    return errors.OK


def cmd_refresh(args) -> int:
    for variant in authoring.refresh():
        print(f"{variant.series}: {', '.join(variant.releases)}")
    return errors.OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xpufakes", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    def verb(name, func, helptext, *arguments, **defaults):
        """A verb and its arguments, each (name, help of a flag or options)."""
        sub = verbs.add_parser(name, **({"help": helptext} if helptext else {}))
        for argument, options in arguments:
            if isinstance(options, str):
                options = {"help": options, "action": "store_true"}
            sub.add_argument(argument, **options)
        sub.set_defaults(func=func, **defaults)

    vllm = ("vllm", {"metavar": "VLLM", "help": "path to the vLLM tree"})
    vllm_or_none = ("vllm", {"metavar": "VLLM", "nargs": "?"})
    patches = ("--patches", {"type": selection.parse, "metavar": "NUMBERS"})
    no_proof = ("--no-proof", "recipe path: commit without the proof")
    as_json = ("--json", "the report as JSON")
    kernels = ("--standins", {"metavar": "KERNELS"})
    change = (vllm_or_none, patches, no_proof)
    verb("apply", cmd_apply, "apply the fix to a vLLM tree", *change, dry_run=False)
    verb("check", cmd_apply, "what apply would do (no change)", *change, dry_run=True)
    verb(
        "revert", cmd_revert, "restore the tree as before apply", vllm_or_none, patches
    )
    verb("status", cmd_status, "release, series, what is applied", vllm_or_none)
    releases = ("versions", {"nargs": "*", "metavar": "RELEASE"})
    every = ("--all", "every pinned release")
    verb("fetch", cmd_fetch, "fetch releases", releases, every, ("--path", "paths"))
    verb("pins", cmd_pins, "list the supported releases")
    out, pin = ("out", {"metavar": "OUT"}), ("--pin", {"metavar": "RELEASE"})
    verb("export", cmd_export, "write a plain series for quilt / git am", out, pin)
    options = [(name, {}) for name in ("--branch", "--python", "--test-args")]
    full = ("--full", "the whole overlay, not the fix in place")
    verb("stage", cmd_stage, "the fix as a branch of a checkout", vllm, *options, full)
    quick, json_out = ("--quick", "a subset of cases"), ("--json-out", {})
    grid = (("--vllm", {}), kernels, quick, as_json, json_out)
    verb("verify-xpu", cmd_verify_xpu, "opcheck the registered fakes", *grid)
    static = ("--static", "skip loading the fakes")
    verb("audit", cmd_audit, "XPU ops in traced code", vllm, as_json, static, kernels)
    device = ("--device", {"default": "cpu", "choices": ["cpu", "xpu"]})
    repeats = ("--repeats", {"type": int, "default": 7})
    verb("bench", cmd_bench, "eager vs compiled", device, repeats, ("--out", {}))
    variant = ("variant", {"choices": ["ours", "upstream", "none"]})
    once = (variant, ("--device", {}), ("--repeats", {"type": int, "default": 5}))
    verb("bench-worker", cmd_bench_worker, None, *once, ("--out", {"required": True}))
    rest = ("pytest_args", {"nargs": argparse.REMAINDER})
    verb("test-tree", cmd_test_tree, "run the fakes' in-tree tests", vllm, rest)
    verb("overlay-history", cmd_overlay_history, "record the overlay's versions")
    verb("refresh", cmd_refresh, "rewrite patches/ and pins.toml from the sdists")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with streams.lossy():
        return _run(args)


# Verbs that change a tree hold signals from start to exit (see transaction).
_HOLDING = {"apply", "revert"}


def _run(args) -> int:
    holding = transaction.held_signals() if args.verb in _HOLDING else nullcontext([])
    try:
        with holding as pending:
            try:
                outcome = args.func(args)
            except Refusal as e:
                if pending and e.status != errors.STRANDED:
                    # the signal stopped it (e.g. the proof's subprocess got
                    # the same Ctrl-C), and nothing was changed
                    raise transaction.Interrupted(pending[0]) from None
                raise
            committed = outcome if isinstance(outcome, Committed) else None
            sys.stdout.flush()
            if pending:
                name = signal.Signals(pending[0]).name
                if committed:
                    print(
                        f"{committed.done}; interrupted by {name} after "
                        f"{committed.leaves}",
                        file=sys.stderr,
                    )
                    return errors.INTERRUPTED_AFTER_COMMIT
                print(f"error: interrupted by {name}; nothing changed", file=sys.stderr)
                return 128 + pending[0]
            return outcome if isinstance(outcome, int) else errors.OK
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    except transaction.Interrupted as e:
        print(f"error: {e}; nothing changed (every file is as it was)", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("error: interrupted; nothing changed", file=sys.stderr)
        return errors.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
