"""Command line: python -m xpufakes <verb> ... (the Makefile's verbs call it)."""

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from . import engine, live, lock, pins, recipes, record, series, transaction, tree
from .errors import (
    INTERRUPTED,
    INTERRUPTED_AFTER_COMMIT,
    NOT_HERE,
    OK,
    REFUSED,
    STRANDED,
    USAGE,
    Refusal,
)


def _locate(path: str | None) -> tree.Tree:
    """The tree given, else the vLLM this Python imports (said aloud)."""
    if path:
        return tree.locate(path)
    found = tree.installed()
    print(f"no VLLM= given: the vLLM that {sys.executable} imports, {found.root}")
    return found


def _plan(
    path: str | None, found: tree.Tree | None = None, base=None
) -> tuple[engine.Plan, str]:
    found = found or _locate(path)
    base = base or tree.detect_base(found)
    pin = base.pin
    plan = engine.Plan(found, pin, series.load(pin.series), overlay_root=None)
    where = f"{base.reason}, {found.shape} at {found.root}"
    return plan, where


def _describe(plan: engine.Plan, patch: series.Patch) -> str:
    parts = list(patch.targets)
    added = plan.overlay_paths(patch)
    if added:
        parts.append("new: " + ", ".join(added))
    return "; ".join(parts)


def cmd_apply(args) -> int:
    found = _locate(args.vllm)
    with lock.tree_lock(found.root, exclusive=not args.dry_run):
        state_file = live.read_state(found)
        if state_file is not None:
            return _apply_on_recipe_state(found, state_file, args)
        base = tree.detect_base(found)
        if base.by_recipe:
            return _apply_by_recipe(found, base, args)
        plan, where = _plan(args.vllm, found, base)
        print(f"{where} -> series {plan.series.name}")
        if not args.dry_run:
            _sweep(plan)
        state = engine.inspect(plan)
        engine.refuse_if_modified(plan, state)
        if args.patches:
            return _apply_selected(plan, state, args)
        summary = state.summary
        if summary == engine.PATCHED:
            print("already applied; nothing changed")
            return OK
        if summary == engine.OUTDATED:
            return _upgrade(plan, state, args.dry_run)
        if summary != engine.PRISTINE:
            raise Refusal(_partial_message(state))
        changes = engine.changes_to_apply(plan, state)  # the dry run
        if args.dry_run:
            for patch in plan.series.patches:
                print(f"  {patch.name}: would apply cleanly ({_describe(plan, patch)})")
            print(f"would apply {len(plan.series.patches)} patch(es); nothing changed")
            return OK
        _commit(changes, plan, "applied", "the tree was fully patched")
    for patch in plan.series.patches:
        print(f"  {patch.name}: applied ({_describe(plan, patch)})")
    added = sum(1 for c in changes if c.mode is not None)
    print(
        f"applied {len(plan.series.patches)} patch(es): "
        f"{len(changes) - added} file(s) changed, {added} added"
    )
    return OK


def _upgrade(plan: engine.Plan, state: engine.TreeState, dry_run: bool) -> int:
    """A tree patched by an earlier version of this tool: its overlay files
    become this version's."""
    changes = engine.changes_to_upgrade(plan, state)
    if dry_run:
        for change in changes:
            print(f"  {change.path.relative_to(plan.tree.root)}: would be upgraded")
        print("patched by an earlier version; would upgrade; nothing changed")
        return OK
    _commit(changes, plan, "upgraded", "the tree was fully patched")
    for change in changes:
        print(f"  {change.path.relative_to(plan.tree.root)}: upgraded")
    print(f"upgraded {len(changes)} file(s) written by an earlier version")
    return OK


class _Committed:
    """What the last commit did, for a signal held until after it."""

    verb: str | None = None
    state: str = ""


def _commit(
    changes: list[transaction.Change],
    plan: engine.Plan,
    verb: str,
    state: str,
    rows: dict | None = None,
) -> None:
    changes = record.with_record(plan.tree.root, changes, rows)
    transaction.writable_or_refuse(changes, plan.tree.root)
    try:
        leftovers = transaction.commit(changes, plan.tree.root)
    except transaction.Stranded as e:
        raise Refusal(
            f"{e}; every other file is as before; {_finish(changes, plan)}",
            status=STRANDED,
        ) from None
    except OSError as e:
        raise Refusal(
            f"{transaction._reason(e)}; nothing changed (every file is as it was)"
        ) from None
    _Committed.verb, _Committed.state = verb, state
    for path in leftovers:
        print(
            f"note: could not remove the backup {path}; the next apply or "
            "revert removes it",
            file=sys.stderr,
        )


def _finish(changes: list[transaction.Change], plan: engine.Plan) -> str:
    """The command that finishes a change that could not be undone."""
    root = plan.tree.root
    command = f"run `make revert VLLM={root}`"
    if all(c.path != root / live.STATE_FILE for c in changes):
        return f"{command} to restore the pristine release"
    if (root / live.STATE_FILE).is_file():
        return f"{command} to restore every file as it was before apply"
    return (
        "put each original back from where it is kept (named above): "
        "nothing in the tree records the apply, so `make revert` cannot"
    )


def _sweep(plan: engine.Plan, changes: list[transaction.Change] = ()) -> None:
    """Remove what a killed run left in the directories we write in (the
    series' and, on the recipe path, those of the files it changes)."""
    dirs = engine.directories(plan) | {
        c.path.parent for c in changes if c.path.parent.is_dir()
    }
    for path in transaction.sweep(dirs):
        rel = transaction._rel(path, plan.tree.root)
        print(f"  {rel}: removed (left by an interrupted run)")


def _selection(plan: engine.Plan, state: engine.TreeState, args) -> list[str]:
    """The patches PATCHES= names; refuses a partly applied one."""
    names = [p.name for p in plan.series.patches]
    chosen = live.select(names, args.patches, f"series {plan.series.name}")
    unclear = [n for n, applied in state.applied.items() if applied is None]
    if unclear:
        raise Refusal(_partial_message(state))
    return chosen


def _reach(
    plan: engine.Plan,
    state: engine.TreeState,
    keep: set[str],
    changing: list[str],
    verb: str,
    dry_run: bool,
) -> None:
    """Leave exactly the patches in `keep` applied (PATCHES=): `changing`
    are the ones applied (verb "apply") or reverted ("revert") to get there."""
    live.check_depends({p.name: p.depends for p in plan.series.patches}, keep)
    changes = engine.changes_to_reach(plan, state, keep)
    if dry_run:
        print(f"would {verb} {', '.join(changing)}; nothing changed")
        return
    _commit(changes, plan, f"{verb} {', '.join(changing)}", "the selection")
    for name in changing:
        print(f"  {name}: {'reverted' if verb == 'revert' else 'applied'}")
    print(f"now applied: {', '.join(sorted(keep)) or 'none'}")


def _apply_selected(plan: engine.Plan, state: engine.TreeState, args) -> int:
    chosen = _selection(plan, state, args)
    applied = {n for n, a in state.applied.items() if a}
    if set(chosen) <= applied:
        print(f"already applied: {', '.join(chosen)}; nothing changed")
        return OK
    chosen = [n for n in chosen if n not in applied]
    _reach(plan, state, applied | set(chosen), chosen, "apply", args.dry_run)
    return OK


def _apply_by_recipe(found: tree.Tree, base, args) -> int:
    from . import proof

    print(f"{base.reason}; {found.shape} at {found.root}")
    result = live.by_recipe(found, base, args.patches)
    if result.mixed:
        print(
            "mixed tree: IPEX era, and its code calls the _xpu_C GEMMs: "
            "registering the fakes of both"
        )
    kernels = proof.standins(base, result.mixed)
    if args.no_proof:
        print("WARNING: --no-proof: the edited tree is NOT proven (no fake checked)")
    else:
        python = proof.torch_python()
        if python is None:
            raise Refusal(
                "the recipe path proves its result with torch, and there is none "
                f"here ({sys.executable}, $VLLM_XPU_FAKES_PROOF_PYTHON, .venv); "
                "install torch, run `make venv`, or pass --no-proof (NO_PROOF=1); "
                "nothing changed"
            )
        failures = proof.prove(found.root, result.changes, kernels, python)
        if failures:
            raise Refusal(
                "the edited tree fails the proof: "
                + "; ".join(failures)
                + "; nothing changed"
            )
        print(
            "proof: every op of ours the edited tree calls from traced code has "
            f"a conformant fake (stand-ins: {kernels})"
        )
    verb = "would change" if args.dry_run else "changed"
    for path in result.edited:
        print(f"  {path}: {verb} by recipe")
    for path in result.added:
        print(f"  {path}: {'would be added' if args.dry_run else 'added'}")
    if args.dry_run:
        print(f"would apply {', '.join(result.patches)} by recipe; nothing changed")
        return OK
    plan = engine.Plan(found, base.pin, series.load(base.pin.series))
    _sweep(plan, result.changes)
    _commit(result.changes, plan, "applied by recipe", "the tree was fully patched")
    print(
        f"applied {len(result.patches)} patch(es) by recipe: "
        f"{len(result.edited)} file(s) changed, {len(result.added)} added; "
        f"what was done is in {live.STATE_FILE}"
    )
    return OK


def _recipe_header(found: tree.Tree, state: dict) -> None:
    print(
        f"applied by recipe on base {state['base']} (vLLM {state['version']}), "
        f"{found.shape} at {found.root}"
    )


def _apply_on_recipe_state(found: tree.Tree, state: dict, args) -> int:
    _recipe_header(found, state)
    live.refuse_unless_applied(found, state)
    wanted = live.select(live.recipe_names(state), args.patches, "the recipes")
    missing = [n for n in wanted if n not in state["patches"]]
    if missing:
        raise Refusal(
            f"{', '.join(state['patches'])} applied by recipe; to add "
            f"{', '.join(missing)}, run `make revert` and apply them together; "
            "nothing changed"
        )
    print("already applied; nothing changed")
    return OK


_APPLIED = {True: "applied", False: "not applied", None: "partly applied"}


def _partial_message(state: engine.TreeState) -> str:
    parts = [f"{name} {_APPLIED[applied]}" for name, applied in state.applied.items()]
    return (
        "tree is partially patched (" + ", ".join(parts) + "); "
        "run `make revert` to restore the pristine release first; nothing changed"
    )


def _revert_by_recipe(found: tree.Tree, state_file: dict, patches) -> int:
    _recipe_header(found, state_file)
    if not live.reverts_all(state_file, patches):
        print("not applied; nothing changed")
        return OK
    changes = live.changes_to_revert(found, state_file)
    pin = pins.load().get(state_file["base"])
    plan = engine.Plan(found, pin, series.load(pin.series))
    _sweep(plan, changes)
    _commit(
        changes,
        plan,
        "reverted",
        "the tree was as it was before apply",
        state_file.get("record"),
    )
    for change in changes:
        rel = change.path.relative_to(found.root)
        print(f"  {rel}: {'removed' if change.data is None else 'restored'}")
    print("reverted: every file is as it was before apply")
    return OK


def cmd_revert(args) -> int:
    found = _locate(args.vllm)
    with lock.tree_lock(found.root):
        state_file = live.read_state(found)
        if state_file is not None:
            return _revert_by_recipe(found, state_file, args.patches)
        plan, where = _plan(args.vllm, found)
        print(f"{where} -> series {plan.series.name}")
        _sweep(plan)
        state = engine.inspect(plan)
        engine.refuse_if_modified(plan, state, reverting=True)
        if args.patches:
            applied = {n for n, a in state.applied.items() if a}
            chosen = [n for n in _selection(plan, state, args) if n in applied]
            if not chosen:
                print("not applied; nothing changed")
                return OK
            _reach(plan, state, applied - set(chosen), chosen, "revert", False)
            return OK
        changes = engine.changes_to_revert(plan, state)
        if not changes:
            print("not applied; nothing changed")
            return OK
        _commit(changes, plan, "reverted", "the tree was the pristine release")
    for change in changes:
        rel = change.path.relative_to(plan.tree.root)
        print(f"  {rel}: {'removed' if change.data is None else 'restored'}")
    print(f"reverted: the tree is the pristine vLLM {plan.pin.version} again")
    return OK


def cmd_status(args) -> int:
    found = _locate(args.vllm)
    with lock.tree_lock(found.root, exclusive=False):
        state_file = live.read_state(found)
        if state_file is not None:
            return _status_by_recipe(found, state_file)
        plan, where = _plan(args.vllm, found)
        state = engine.inspect(plan)
        strays = transaction.strays(engine.directories(plan))
    print(where)
    print(f"series {plan.series.name} ({len(plan.series.patches)} patch(es))")
    for name, applied in state.applied.items():
        print(f"  {name}: {_APPLIED[applied]}")
    for f in state.files:
        extra = (
            f" ({f.stage} of {f.stages} diffs)" if f.status == engine.PARTIAL else ""
        )
        status = f.status
        if status == engine.MODIFIED and not f.carries_ours:
            status = "modified, not applied"
        print(f"  {f.path}: {status}{extra}")
    for o in state.overlay:
        print(f"  {o.path}: {o.status}")
    for stray in strays:
        rel = transaction._rel(stray.path, plan.tree.root)
        if stray.dead:
            print(
                f"  {rel}: left by an interrupted run "
                "(the next apply or revert removes it)"
            )
        else:
            print(f"  {rel}: being written by the running process {stray.pid}")
    summary = state.summary
    if summary == engine.MODIFIED and not any(
        f.carries_ours or f.status == engine.MISSING for f in state.files
    ):
        summary = "modified, not applied (apply runs the recipes on it)"
    print(f"state: {summary}")
    return OK


def _status_by_recipe(found: tree.Tree, state: dict) -> int:
    pin = pins.load().get(state["base"])
    _recipe_header(found, state)
    print(f"patches: {', '.join(state['patches'])} ({live.STATE_FILE})")
    files = live.file_states(found, state, pin.files)
    for path, status in files.items():
        print(f"  {path}: {status}")
    print(f"state: {live.summary(files)}")
    return OK


def cmd_fetch(args) -> int:
    all_pins = pins.load()
    versions = list(all_pins.releases) if args.all else args.versions
    if not versions:
        raise Refusal("no release given (PIN=<release>)", status=USAGE)
    from . import fetch

    for pin, path in fetch.fetch_all([all_pins.get(v) for v in versions]):
        print(path if args.path else f"vLLM {pin.version}: {path}")
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

    with lock.tree_lock(tree.locate(args.vllm).root):
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
    vllm = Path(args.vllm) if args.vllm else None
    if vllm is not None:
        vllm = tree.locate(str(vllm)).root
    try:
        from . import verify

        results = verify.run(vllm, args.standins, full=not args.quick)
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] != "torch":
            raise
        raise Refusal(
            f"{sys.executable} cannot import torch; run verify-xpu with the "
            "Python that has vLLM and torch (PYTHON=...)",
            status=NOT_HERE,
        ) from None
    if args.json_out:
        Path(args.json_out).write_text(verify.to_json(results))
    print(verify.to_json(results) if args.json else verify.table(results))
    return OK if results and all(r.ok for r in results) else REFUSED


def cmd_audit(args) -> int:
    from . import audit

    found, kernels, reports = audit.audit(
        args.vllm, dynamic=not args.static, kernels=args.standins
    )
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


def cmd_overlay_history(args) -> int:
    from . import history

    for path in history.write():
        print(f"wrote {path}")
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
        sub.add_argument(
            "vllm",
            metavar="VLLM",
            nargs="?",
            help="path to the vLLM tree (default: the vLLM this Python imports)",
        )
        sub.add_argument(
            "--patches",
            type=lambda text: text.replace(",", " ").split(),
            metavar="NUMBERS",
            help='part of the series, e.g. "0001" (dependencies are checked)',
        )
        sub.add_argument(
            "--no-proof",
            action="store_true",
            help="recipe path: commit without the proof (no torch here)",
        )
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
    sub.add_argument(
        "--standins",
        metavar="KERNELS",
        help="the stand-in kernels (default: the tree's); several joined by ;",
    )
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
        "overlay-history",
        help="record the sha256 of every committed overlay version (git history)",
    )
    sub.set_defaults(func=cmd_overlay_history)

    sub = verbs.add_parser(
        "refresh", help="rewrite patches/ and pins.toml from the recipes and sdists"
    )
    sub.set_defaults(func=cmd_refresh)

    args = parser.parse_args(argv)
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Lossy(stdout), _Lossy(stderr)
    try:
        return _run(args)
    finally:
        sys.stdout.flush()  # what is buffered for a reader that left is dropped
        sys.stderr.flush()
        sys.stdout, sys.stderr = stdout, stderr


# Verbs that change a tree hold signals from start to exit (see transaction).
_HOLDING = {"apply", "revert"}


def _run(args) -> int:
    _Committed.verb = None
    holding = transaction.held_signals() if args.verb in _HOLDING else _no_hold()
    try:
        with holding as pending:
            try:
                status = args.func(args)
            except Refusal as e:
                if pending and not _Committed.verb and e.status != STRANDED:
                    # the signal stopped it (e.g. the proof's subprocess got
                    # the same Ctrl-C), and nothing was changed
                    raise transaction.Interrupted(pending[0]) from None
                raise
            sys.stdout.flush()
            if pending and _Committed.verb:
                name = signal.Signals(pending[0]).name
                done, state = _Committed.verb, _Committed.state
                print(
                    f"{done}; interrupted by {name} after {state}",
                    file=sys.stderr,
                )
                return INTERRUPTED_AFTER_COMMIT
            if pending:
                name = signal.Signals(pending[0]).name
                print(f"error: interrupted by {name}; nothing changed", file=sys.stderr)
                return 128 + pending[0]
            return status
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    except transaction.Interrupted as e:
        print(f"error: {e}; nothing changed (every file is as it was)", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("error: interrupted; nothing changed", file=sys.stderr)
        return INTERRUPTED


@contextlib.contextmanager
def _no_hold():
    yield []


class _Lossy:
    """stdout or stderr whose reader may go away (`| head`, `| true`):
    output to a closed pipe is dropped and the verb goes on, so the exit
    status always says what was done to the tree, never that a pipe closed."""

    def __init__(self, stream):
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        # the interpreter flushes stdout at exit: point it at /dev/null
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)


if __name__ == "__main__":
    sys.exit(main())
