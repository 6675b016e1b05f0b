"""Command line: python -m xpufakes <verb> ... (the Makefile's verbs call it)."""

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from . import engine, pins, recipes, series, transaction, tree
from .errors import INTERRUPTED, OK, REFUSED, USAGE, Refusal


def _plan(path: str) -> tuple[engine.Plan, str]:
    found = tree.locate(path)
    version, source = tree.detect_version(found)
    pin = pins.load().get(version)
    plan = engine.Plan(found, pin, series.load(pin.series), overlay_root=None)
    where = f"vLLM {version} ({source}), {found.shape} at {found.root}"
    return plan, where


def _describe(plan: engine.Plan, patch: series.Patch) -> str:
    parts = list(patch.targets)
    added = plan.overlay_paths(patch)
    if added:
        parts.append("new: " + ", ".join(added))
    return "; ".join(parts)


def cmd_apply(args) -> int:
    plan, where = _plan(args.vllm)
    print(f"{where} -> series {plan.series.name}")
    state = engine.inspect(plan)
    engine.refuse_if_modified(plan, state)
    summary = state.summary
    if summary == engine.PATCHED:
        print("already applied; nothing changed")
        return OK
    if summary != engine.PRISTINE:
        raise Refusal(_partial_message(state))
    changes = engine.changes_to_apply(plan, state)  # the dry run
    if args.dry_run:
        for patch in plan.series.patches:
            print(f"  {patch.name}: would apply cleanly ({_describe(plan, patch)})")
        print(f"would apply {len(plan.series.patches)} patch(es); nothing changed")
        return OK
    _commit(changes, plan)
    for patch in plan.series.patches:
        print(f"  {patch.name}: applied ({_describe(plan, patch)})")
    added = sum(1 for c in changes if c.mode is not None)
    print(
        f"applied {len(plan.series.patches)} patch(es): "
        f"{len(changes) - added} file(s) changed, {added} added"
    )
    return OK


def _commit(changes: list[transaction.Change], plan: engine.Plan) -> None:
    transaction.writable_or_refuse(changes, plan.tree.root)
    try:
        transaction.commit(changes)
    except OSError as e:
        raise Refusal(f"{e}; every file was put back as it was") from None


_APPLIED = {True: "applied", False: "not applied", None: "partly applied"}


def _partial_message(state: engine.TreeState) -> str:
    parts = [f"{name} {_APPLIED[applied]}" for name, applied in state.applied.items()]
    return (
        "tree is partially patched (" + ", ".join(parts) + "); "
        "run `make revert` to restore the pristine release first; nothing changed"
    )


def cmd_revert(args) -> int:
    plan, where = _plan(args.vllm)
    print(f"{where} -> series {plan.series.name}")
    state = engine.inspect(plan)
    engine.refuse_if_modified(plan, state)
    changes = engine.changes_to_revert(plan, state)
    if not changes:
        print("not applied; nothing changed")
        return OK
    _commit(changes, plan)
    for change in changes:
        rel = change.path.relative_to(plan.tree.root)
        print(f"  {rel}: {'removed' if change.data is None else 'restored'}")
    print(f"reverted: the tree is the pristine vLLM {plan.pin.version} again")
    return OK


def cmd_status(args) -> int:
    plan, where = _plan(args.vllm)
    state = engine.inspect(plan)
    print(where)
    print(f"series {plan.series.name} ({len(plan.series.patches)} patch(es))")
    for name, applied in state.applied.items():
        print(f"  {name}: {_APPLIED[applied]}")
    for f in state.files:
        extra = (
            f" ({f.stage} of {f.stages} diffs)" if f.status == engine.PARTIAL else ""
        )
        print(f"  {f.path}: {f.status}{extra}")
    for o in state.overlay:
        print(f"  {o.path}: {o.status}")
    print(f"state: {state.summary}")
    return OK


def cmd_fetch(args) -> int:
    all_pins = pins.load()
    versions = list(all_pins.releases) if args.all else args.versions
    if not versions:
        raise Refusal("no release given (PIN=<release>)", status=USAGE)
    from . import fetch

    for version in versions:
        path = fetch.fetch(all_pins.get(version))
        print(path if args.path else f"vLLM {version}: {path}")
    return OK


def cmd_pins(args) -> int:
    all_pins = pins.load()
    for pin in all_pins.releases.values():
        print(f"{pin.version}\t{pin.series}\t{pin.kernels}")
    return OK


def cmd_test_tree(args) -> int:
    """Run the fakes' upstream-style tests inside the tree, with this Python
    (the one that has the tree's vLLM and its dependencies)."""
    plan, where = _plan(args.vllm)
    state = engine.inspect(plan)
    print(f"{where}: {state.summary}")
    if not plan.tree.has_tests:
        raise Refusal(
            "an installed package has no tests/ tree; point VLLM at the vLLM "
            "checkout or sdist it was built from"
        )
    tests = [p for p in plan.series.overlay if p.startswith("tests/") and "/test_" in p]
    missing = [p for p in tests if not (plan.tree.root / p).is_file()]
    if not tests or missing:
        first = (missing or [recipes.TREE_TEST])[0]
        raise Refusal(f"{first} is not in the tree; run make apply first")
    env = dict(os.environ)
    # off XPU, the in-tree tests run only when asked to use the CPU reference
    env.setdefault("VLLM_XPU_FAKES_CPU_REFERENCE", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(plan.tree.root), *filter(None, [env.get("PYTHONPATH")])]
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "-q",
        *tests,
        *args.pytest_args,
    ]
    return subprocess.run(command, cwd=plan.tree.root, env=env).returncode


def cmd_export(args) -> int:
    from . import export

    written = export.export(Path(args.out), args.pin or None)
    for name, files in written.items():
        print(f"{name}: {len(files)} patch(es)")
    print(f"exported to {args.out}")
    return OK


def cmd_stage(args) -> int:
    from . import stage, treechecks

    branch, commits, description, results = stage.stage(
        args.vllm,
        args.branch or None,
        args.python or None,
        shlex.split(args.test_args or ""),
    )
    print("the tree's own checks on the staged files:")
    print(treechecks.report(results))
    print(f"branch {branch}: {len(commits)} commit(s), {commits[-1][:12]}")
    print()
    print(description)
    return OK


def cmd_verify_xpu(args) -> int:
    from . import verify

    vllm = Path(args.vllm) if args.vllm else None
    if vllm is not None:
        vllm = tree.locate(str(vllm)).root
    results = verify.run(vllm, args.standins, full=not args.quick)
    if args.json_out:
        Path(args.json_out).write_text(verify.to_json(results))
    print(verify.to_json(results) if args.json else verify.table(results))
    return OK if results and all(r.ok for r in results) else REFUSED


def cmd_audit(args) -> int:
    from . import audit

    found, kernels, reports = audit.audit(args.vllm, dynamic=not args.static)
    print(
        audit.to_json(found, kernels, reports)
        if args.json
        else audit.table(found, kernels, reports)
    )
    return REFUSED if any(r.failing for r in reports) else OK


def cmd_bench(args) -> int:
    from . import bench

    text = bench.report(device=args.device, repeats=args.repeats)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return OK


def cmd_bench_worker(args) -> int:
    import json

    from . import bench

    result = bench.worker(args.variant, args.device, args.repeats)
    Path(args.out).write_text(json.dumps(result))
    return OK


def cmd_refresh(args) -> int:
    from . import authoring

    for variant in authoring.refresh():
        print(f"{variant.series}: {', '.join(variant.releases)}")
    return OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpufakes", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    for name, func, helptext in (
        ("apply", cmd_apply, "apply the release's series to a vLLM tree"),
        ("check", cmd_apply, "say what apply would do; change nothing"),
        ("revert", cmd_revert, "restore the pristine release"),
        ("status", cmd_status, "release, series, and what is applied"),
    ):
        sub = verbs.add_parser(name, help=helptext)
        sub.add_argument("vllm", metavar="VLLM", help="path to the vLLM tree")
        sub.set_defaults(func=func, dry_run=name == "check")

    sub = verbs.add_parser("fetch", help="download, verify and unpack releases")
    sub.add_argument("versions", nargs="*", metavar="RELEASE")
    sub.add_argument("--all", action="store_true", help="every pinned release")
    sub.add_argument("--path", action="store_true", help="print only the paths")
    sub.set_defaults(func=cmd_fetch)

    sub = verbs.add_parser("pins", help="list the supported releases")
    sub.set_defaults(func=cmd_pins)

    sub = verbs.add_parser("export", help="write a plain series for quilt / git am")
    sub.add_argument("out", metavar="OUT")
    sub.add_argument("--pin", metavar="RELEASE", help="one release (default: all)")
    sub.set_defaults(func=cmd_export)

    sub = verbs.add_parser("stage", help="commit the series on a new branch")
    sub.add_argument("vllm", metavar="VLLM", help="a vLLM git checkout")
    sub.add_argument("--branch", help="branch name (default xpu-gemm-fakes-<release>)")
    sub.add_argument(
        "--python", help="the Python with torch and pytest that validates the change"
    )
    sub.add_argument(
        "--test-args", help="extra pytest arguments for the in-tree tests, e.g. -k"
    )
    sub.set_defaults(func=cmd_stage)

    sub = verbs.add_parser(
        "verify-xpu", help="opcheck the registered fakes against the real kernels"
    )
    sub.add_argument(
        "--vllm", help="a vLLM tree to import (default: the installed one)"
    )
    sub.add_argument(
        "--standins",
        metavar="KERNELS",
        help='run on the CPU against stand-ins, e.g. "vllm-xpu-kernels 0.1.15.4"',
    )
    sub.add_argument("--quick", action="store_true", help="a covering subset of cases")
    sub.add_argument("--json", action="store_true")
    sub.add_argument("--json-out", metavar="FILE", help="also write the JSON here")
    sub.set_defaults(func=cmd_verify_xpu)

    sub = verbs.add_parser("audit", help="XPU ops in traced code and their fakes")
    sub.add_argument("vllm", metavar="VLLM", help="path to the vLLM tree")
    sub.add_argument("--json", action="store_true")
    sub.add_argument("--static", action="store_true", help="skip loading the fakes")
    sub.set_defaults(func=cmd_audit)

    sub = verbs.add_parser("bench", help="eager vs compiled, compile counts, tool time")
    sub.add_argument("--device", default="cpu", choices=["cpu", "xpu"])
    sub.add_argument("--repeats", type=int, default=7)
    sub.add_argument("--out", metavar="FILE", help="also write the report here")
    sub.set_defaults(func=cmd_bench)

    sub = verbs.add_parser("bench-worker")  # one variant, in its own process
    sub.add_argument("variant", choices=["ours", "upstream", "none"])
    sub.add_argument("--device", default="cpu")
    sub.add_argument("--repeats", type=int, default=5)
    sub.add_argument("--out", required=True)
    sub.set_defaults(func=cmd_bench_worker)

    sub = verbs.add_parser(
        "test-tree", help="run the fakes' tests inside a patched vLLM tree"
    )
    sub.add_argument("vllm", metavar="VLLM", help="path to the vLLM tree")
    sub.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed to pytest")
    sub.set_defaults(func=cmd_test_tree)

    sub = verbs.add_parser(
        "refresh", help="rewrite patches/ and pins.toml from the recipes and sdists"
    )
    sub.set_defaults(func=cmd_refresh)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    except transaction.Interrupted as e:
        print(f"error: {e}; every file was put back as it was", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("error: interrupted; nothing changed", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # e.g. piped into head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK


if __name__ == "__main__":
    sys.exit(main())
