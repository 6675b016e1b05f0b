"""Command line: python -m xpufakes <verb> ... (the Makefile's verbs call it).

It parses the arguments, locates the tree, calls the verb (a module named
for it) and prints what the verb returns; verbs/outcome.py makes the
outcome the exit status. Nothing else."""

import argparse
import json
import shlex
import sys
from pathlib import Path

from xpufakes.changes import (
    authoring,
    esimdfacts,
    export,
    history,
    imagefacts,
    opfacts,
    selection,
)
from xpufakes.common import errors, streams
from xpufakes.common.errors import Refusal
from xpufakes.proof import audit, schemacontracts, verify
from xpufakes.proof.model.models import NUMBERS_TOKENS
from xpufakes.trees import fetch, pins, tree
from xpufakes.verbs import apply, outcome, revert, status, treeexport, treetest
from xpufakes.verbs.pipeline import Committed


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
    if args.vllm and args.pin:
        raise Refusal("give VLLM= or PIN=, not both", status=errors.USAGE)
    if args.vllm:
        written = treeexport.export_tree(tree.locate(args.vllm), Path(args.out))
        for path in written:
            print(f"  {path.name}")
        print(
            f"exported {len(written)} patch(es) to {args.out}: apply them to "
            f"{args.vllm} in order with `patch -p1 -F0`, quilt or `git am`"
        )
        return errors.OK
    for name, files in export.export(Path(args.out), args.pin or None).items():
        print(f"{name}: {len(files)} patch(es)")
    print(f"exported to {args.out}")
    return errors.OK


def cmd_stage(args) -> int:
    from xpufakes.staging import stage, treechecks

    branch, commits, description, results = stage.stage(
        args.vllm,
        args.branch,
        args.python,
        shlex.split(args.test_args or ""),
        full=args.full,
        pr=args.pr,
    )
    print("the tree's own checks on the staged files:")
    print(treechecks.report(results))
    print(f"branch {branch}: {len(commits)} commit(s), {commits[-1][:12]}\n")
    print(description)
    return errors.OK


def cmd_verify_xpu(args) -> int:
    vllm = tree.locate(args.vllm).root if args.vllm else None
    plugin = Path(args.plugin) if args.plugin else None
    state: dict | None = {} if plugin else None
    schema = verify.SchemaTruth()
    results = verify.run(
        vllm, args.standins, not args.quick, None, plugin, state, schema
    )
    if args.json_out:
        Path(args.json_out).write_text(verify.to_json(results, state))
    if not args.json:  # schema truth on the device, then the grid's verdict
        print(f"{verify.schema_table(schema)}\n")
    print(verify.to_json(results, state) if args.json else verify.table(results))
    passed = results and all(r.ok for r in results) and schema.ok
    return errors.OK if passed else errors.REFUSED


def cmd_audit(args) -> int:
    found = tree.locate(args.vllm)
    result = audit.run(
        found,
        not args.static,
        args.standins,
        args.chains_from,
        args.model,
        args.configurations,
        args.plugin,
        args.transformers,
        args.numbers,
    )
    if isinstance(result, str):  # not affected
        print(
            json.dumps(
                {
                    "tree": str(found.root),
                    "ok": True,
                    "ops": [],
                    "not_affected": result,
                },
                indent=2,
            )
            if args.json
            else result
        )
        return errors.OK
    if args.json:
        print(audit.to_json(found, result))
    else:
        print(audit.table(found, result))
    return errors.REFUSED if result.failing else errors.OK


def cmd_overlay_history(args) -> int:
    for path in history.write():
        print(f"wrote {path}")
    return errors.OK


def cmd_ops(args) -> int:
    changed = opfacts.write()
    for name in changed:
        print(f"wrote {name}")
    if not changed:
        print("every copy of the op facts is up to date")
    return errors.OK


def cmd_esimd_schemas(args) -> int:
    path, commits = esimdfacts.write(Path(args.git_dir), args.commits)
    print(f"wrote {path}: {', '.join(commits)}")
    return errors.OK


def cmd_images(args) -> int:
    path, read, kept = imagefacts.write(Path(args.git_dir), args.commits)
    print(f"wrote {path}: {', '.join(read)}")
    if kept:
        print(f"kept as they were (not in {args.git_dir}): {', '.join(kept)}")
    return errors.OK


def cmd_schema_contracts(args) -> int:
    path, count = schemacontracts.write(args.trees)
    print(f"wrote {path}: {count} contract(s)")
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
    tree_of = ("--vllm", {"metavar": "VLLM", "help": "the change to this tree"})
    verb(
        "export",
        cmd_export,
        "write a plain series for quilt / git am",
        out,
        pin,
        tree_of,
    )
    options = [(name, {}) for name in ("--branch", "--python", "--test-args")]
    full = ("--full", "the whole overlay, not the fix in place")
    pr = (
        "--pr",
        {
            "default": "xpu-fakes",
            "help": "which pull request: xpu-fakes (default), or indexer "
            "(vllm::sparse_attn_indexer registered to return nothing)",
        },
    )
    verb(
        "stage",
        cmd_stage,
        "the fix as a branch of a checkout",
        vllm,
        *options,
        full,
        pr,
    )
    quick, json_out = ("--quick", "a subset of cases"), ("--json-out", {})
    plugin = (
        "--plugin",
        {
            "metavar": "DIR",
            "default": "",
            "help": "the directory this project's vLLM plugin is installed in "
            "(a site-packages): its register() runs once the tree is loaded",
        },
    )
    grid = (("--vllm", {}), kernels, quick, as_json, json_out, plugin)
    verb("verify-xpu", cmd_verify_xpu, "opcheck the registered fakes", *grid)
    static = ("--static", "skip loading the fakes")
    chains = (
        "--chains-from",
        {
            "metavar": "MODEL",
            "default": "",
            "help": "a model module (qwen3_vl_moe) "
            "the chains of untraceable calls should start from where they can",
        },
    )
    model = (
        "--model",
        {
            "metavar": "NAME",
            "default": "",
            "help": "also trace that model of data/models.toml (qwen3_vl_moe, "
            "qwen3_moe) whole, as vLLM compiles it; several: a,b; every "
            "one: all",
        },
    )
    configurations = (
        "--configurations",
        {"default": "default,sp", "help": "of --model: default, sp"},
    )
    transformers = (
        "--transformers",
        {
            "metavar": "VERSION",
            "default": "",
            "help": "of --model: build the models with this transformers "
            "release (the one the tree's image pins, e.g. 4.57.0), installed "
            "once into the tool's cache",
        },
    )
    numbers = (
        "--numbers",
        {
            "metavar": "TOKENS",
            "default": "",
            "help": "of --model: the token counts at which each traced "
            "configuration is run eager and compiled (aot_eager, Inductor) "
            "with the same weights and inputs and compared, e.g. "
            f"{','.join(map(str, NUMBERS_TOKENS))} (`make audit MODEL=`'s "
            "default); none by default",
        },
    )
    verb(
        "audit",
        cmd_audit,
        "XPU ops in traced code",
        vllm,
        as_json,
        static,
        kernels,
        chains,
        model,
        configurations,
        transformers,
        numbers,
        plugin,
    )
    rest = ("pytest_args", {"nargs": argparse.REMAINDER})
    verb("test-tree", cmd_test_tree, "run the fakes' in-tree tests", vllm, rest)
    verb("overlay-history", cmd_overlay_history, "record the overlay's versions")
    verb("ops", cmd_ops, "write the op facts' copies from the registry")
    verb(
        "esimd-schemas",
        cmd_esimd_schemas,
        "write data/esimd_schemas.toml from an intel/llm-scaler git dir",
        ("git_dir", {"metavar": "GIT_DIR"}),
        ("commits", {"nargs": "*", "metavar": "COMMIT"}),
    )
    verb(
        "images",
        cmd_images,
        "write data/images.toml from an intel/llm-scaler git dir",
        ("git_dir", {"metavar": "GIT_DIR"}),
        ("commits", {"nargs": "*", "metavar": "COMMIT[=TAG]"}),
    )
    verb(
        "schema-contracts",
        cmd_schema_contracts,
        "write data/schema_contracts.toml from schema truth on the trees given",
        ("trees", {"nargs": "+", "metavar": "VLLM"}),
    )
    verb("refresh", cmd_refresh, "rewrite patches/ and pins.toml from the sdists")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        with streams.lossy():
            return outcome.run(lambda: args.func(args), args.verb in _HOLDING)
    except KeyboardInterrupt:  # before outcome.run holds or handles it
        print("error: interrupted; nothing changed", file=sys.stderr)
        return errors.INTERRUPTED


# Verbs that change a tree hold signals from start to exit (verbs/outcome.py).
_HOLDING = {"apply", "revert"}


if __name__ == "__main__":
    sys.exit(main())
