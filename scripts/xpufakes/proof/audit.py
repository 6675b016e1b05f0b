"""`make audit`: which XPU custom ops a vLLM tree calls in code that
torch.compile traces (the static scan, scan.py), and whether each has a
conformant fake.

Dynamic part: the tree's own registering module is imported in a separate
process against the stand-in kernels (`verify-xpu --standins`), which says
for each GEMM whether a fake is registered and whether it passes the opcheck
grid. Ops without a reference kernel are reported by whether the tree
registers a fake for them at all (`register_fake("<ns>::<op>")`); ops whose
schema is not in data/op_schemas.toml are reported as unknown. vLLM's own ops
that return a GEMM's output unchanged (ops.WRAPPER_OPS) are found and checked
like the GEMMs; calls into other op namespaces from XPU code (a file or
function that names XPU) are reported as "unknown namespace".

Then every call on the traced path that Dynamo cannot trace at all (reach.py:
a C extension's function, a ctypes call, an IPEX Python API, a torch_ipex op
that cannot have a fake), with the configurations that reach it and a chain
of calls, file:line each: any one fails the audit.
"""

import importlib.util
import json
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xpufakes.changes import base, kernels, recipes
from xpufakes.common import isolated, opschema, paths
from xpufakes.common.errors import Refusal
from xpufakes.common.ops import IPEX_WOQ, NAMESPACES, WRAPPER_OPS, exact_schemas
from xpufakes.proof import plugin as installed_plugin
from xpufakes.proof.model import report as model_report
from xpufakes.proof.model import runner as model_runner
from xpufakes.proof.static import reach, scan, schematruth
from xpufakes.proof.static.scan import IF_ENABLED, TRACED, CallSite
from xpufakes.trees import images, pins, tree

UNKNOWN_NAMESPACE = "unknown namespace"
SCHEMAS = paths.DATA / "op_schemas.toml"


@dataclass
class OpReport:
    op: str
    schema: str | None
    returns_tensor: bool | None  # None: unknown schema
    sites: list[CallSite] = field(default_factory=list)
    fake: str = "none"  # "registered", "declared in source", "none"
    conforms: bool | None = None  # None: not checked (no reference kernel)
    detail: str = ""

    @property
    def traced(self) -> bool:
        return any(s.context == TRACED for s in self.sites)

    @property
    def verdict(self) -> str:
        if not self.sites or not any(
            s.context in (TRACED, IF_ENABLED) for s in self.sites
        ):
            return "not traced"
        if self.op.split("::")[0] not in NAMESPACES and self.op not in WRAPPER_OPS:
            return UNKNOWN_NAMESPACE
        if self.returns_tensor is None:
            return "unknown schema"
        if not self.returns_tensor:
            if not opschema.parse(self.schema).marked and "(" in self.schema:
                return "lies: returns nothing and marks nothing (see schema truth)"
            return "ok (no tensor returned)"
        if self.fake == "none":
            return "FAIL: no fake" if self.traced else "warn: no fake"
        if self.conforms is False:
            return (
                "FAIL: fake does not conform"
                if self.traced
                else "warn: fake does not conform"
            )
        if self.conforms is None:
            return "unverified fake"
        return "ok"

    @property
    def failing(self) -> bool:
        return self.verdict.startswith("FAIL")


def _schemas() -> dict[str, str]:
    """op -> schema; an op is also found by its name without the overload
    (IPEX's ops have only the "xpu" one, which a call without it resolves to)."""
    data = tomllib.loads(SCHEMAS.read_text())
    schemas = {}
    for ns, ops in data.items():
        for name, schema in ops.items():
            schemas[f"{ns}::{name}"] = schema
            schemas.setdefault(f"{ns}::{name.split('.')[0]}", schema)
    return schemas


def _returns_tensor(schema: str) -> bool:
    returns = schema.rsplit("->", 1)[1]
    return "Tensor" in returns


# ---------------------------------------------------------------------------
# Dynamic part and report
# ---------------------------------------------------------------------------


def kernels_of(found: tree.Tree) -> str:
    """The stand-in kernels for a tree (kernels.of_tree), its pin found by
    the version it says it is."""
    try:
        version, _ = tree.detect_version(found)
        pin = pins.load().releases.get(version)
    except Refusal:
        pin = None
    return kernels.of_tree(found.root, pin)


def check_fakes(
    root: Path, kernels: str, plugin: Path | None = None
) -> tuple[dict[str, dict], dict | None]:
    """(op -> verify-xpu's result for it, the plugin's state), from a
    separate process; with `plugin`, the plugin registers once the tree is
    loaded, as vLLM loads it."""
    args = ["verify-xpu", "--vllm", str(root), "--standins", kernels, "--quick"]
    done, result = isolated.run_verb(
        args + (["--plugin", str(plugin)] if plugin else []), "--json-out"
    )
    if done.returncode not in (0, 1) or result is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        tail = tail.removeprefix("error: ")
        raise Refusal(f"cannot load the tree's fakes against the stand-ins: {tail}")
    ops, state = (result, None) if plugin is None else (result["ops"], result["plugin"])
    return {entry["op"]: entry for entry in ops}, state


@dataclass
class PluginReport:
    """This project's vLLM plugin, installed with the tree: where, and what
    its register() did in the audit's process (the tree loaded against the
    stand-ins, as vLLM loads it on an XPU)."""

    installed: installed_plugin.Installed
    state: dict
    cautions: list[str] = field(default_factory=list)  # VLLM_PLUGINS, the cache

    def lines(self) -> list[str]:
        s = self.state
        said = [f"The vLLM plugin: {self.installed.describe()}"]
        if s.get("skipped"):
            said.append(f"  does nothing here: {s['skipped']}")
            return said + [f"  CAUTION: {c}" for c in self.cautions]
        if not s:  # --static: its register() did not run
            return said + [f"  CAUTION: {c}" for c in self.cautions]
        said.append(f"  fakes it registers: {', '.join(s['registered']) or 'none'}")
        if s.get("woq"):
            said.append(f"  {s['woq']}")
        said.append(
            "  calls it rebinds to custom ops: " + (", ".join(s["rebound"]) or "none")
        )
        if s.get("copies"):
            said.append(f"  copies it rebinds: {', '.join(s['copies'])}")
        said.append(
            "  what it cannot reach: "
            + ("; ".join(s["not_reached"]) or "nothing (in the modules loaded here)")
        )
        if s.get("differs"):
            said.append(f"  left as vLLM has it: {'; '.join(s['differs'])}")
        return said + [f"  CAUTION: {c}" for c in self.cautions]


@dataclass
class Result:
    """What the audit found: the stand-in kernels it loaded the fakes
    against, the report of each op the tree calls, and the calls Dynamo
    cannot trace (reach.find; those reached count)."""

    kernels: str
    reports: list[OpReport]
    untraceable: list[reach.Finding]
    image: "images.Recognition | None" = None  # the image it is (trees/images.py)
    models: list[dict] | None = None  # MODEL=: each model proof's result
    plugin: "PluginReport | None" = None  # the installed vLLM plugin
    truth: "schematruth.Truth | None" = None  # schema truth (schematruth.py)
    # ops whose fake in vllm/_xpu_ops.py is the tree's own, no release's
    # (recipes.kept_tree_fakes: apply keeps it)
    own_fakes: list[str] = field(default_factory=list)

    @property
    def own_fakes_unknown(self) -> list[str]:
        """The tree's own fakes of ops whose schema in the tree's image is
        none we know: the image is not recognised, or its kernels patch
        does not change the op as far as the data knows."""
        image = self.image.image if self.image is not None else None
        covered = set(kernels.image_builds(image)) if image else set()
        return [op for op in self.own_fakes if op not in covered]

    @property
    def reached(self) -> list[reach.Finding]:
        """The reached calls Dynamo cannot trace that nothing fixes (the
        installed plugin rebinds the callees it reports)."""
        covered = set(self.plugin.state.get("rebound", [])) if self.plugin else set()
        return [f for f in self.untraceable if f.reached and f.callee not in covered]

    @property
    def failing(self) -> bool:
        model_fails = any(model_report.failing(m) for m in self.models or [])
        lies = bool(self.truth and (self.truth.failing or self.truth.unfaked))
        return (
            any(r.failing for r in self.reports)
            or bool(self.reached)
            or model_fails
            or lies
        )

    @property
    def warnings(self) -> list[str]:
        """What the audit could not check or only partly: no summary says OK
        above one."""
        said = [
            f"{r.op}: {r.verdict}"
            for r in self.reports
            if r.verdict.startswith(("warn", "unknown", "unverified", "lies"))
        ]
        said += [own_fake_warning(op) for op in self.own_fakes_unknown]
        if self.truth is not None:
            said += [f"{c.op}: schema unknown" for c in self.truth.unknown]
            said += [
                f"{c.op}: returns an alias, refused by functionalization"
                for c in self.truth.refused
            ]
            said += self.truth.warnings
            said += [
                f"{o.op}: its schema lies on the traced path, compiled may differ "
                f"from eager (known, {o.known_fix}: {o.known})"
                for o in self.truth.known
            ]
        if self.plugin is not None:
            said += [f"the vLLM plugin: {c}" for c in self.plugin.cautions]
        return said


def run(
    found: tree.Tree,
    dynamic: bool = True,
    standins: str | None = None,
    prefer: str = "",
    model: str = "",
    configurations: str = "default,sp",
    plugin: str = "",
    transformers: str = "",
    numbers: str = "",
) -> "Result | str":
    """`make audit`: the audit of a tree (with `model`, that model traced
    whole too, or several: "a,b" or "all", after one audit and in one
    process: proof/model; built with the `transformers` release, if
    given; `numbers`: the token counts at which each traced configuration
    is compared, compiled with eager), or what makes it not affected (a release in
    which nothing on XPU is traced). Refused if the fakes are to be loaded
    (`dynamic`) or a model traced and this Python has no torch."""
    unaffected = base.not_affected(found)
    if unaffected:
        return f"{unaffected}: nothing on XPU is traced, so no op needs a fake"
    chosen = model_runner.names(model) if model else []
    if (dynamic or model) and importlib.util.find_spec("torch") is None:
        raise Refusal(
            "audit loads the tree's fakes with torch (--model traces a model "
            f"with it), and {sys.executable} has none: run `make audit "
            "VLLM=...` (it uses this repository's .venv, which has torch), or "
            "`PYTHON=<a Python with torch> bin/xpufakes audit ...`; --static "
            "scans the call sites without torch"
        )
    installed = installed_plugin.find(found.root, plugin)
    result = audit(found, dynamic, standins, prefer, installed)
    if chosen:
        result.models = model_runner.run_all(
            found.root,
            chosen,
            result.kernels,
            configurations,
            plugin=installed.directory if installed else None,
            transformers=transformers,
            numbers=numbers,
        )
    return result


def audit(
    found: tree.Tree,
    dynamic: bool = True,
    standins: str | None = None,
    prefer: str = "",
    installed: installed_plugin.Installed | None = None,
) -> Result:
    """The audit of a tree (`prefer`: a model whose forward the chains of
    untraceable calls should start from, where they can; `installed`: the
    vLLM plugin installed with it, which registers in the dynamic part)."""
    sources = tree.python_sources(found.root)
    parsed: dict = {}  # each file parsed once: the scan, reach, schema truth
    sites, declared = scan.scan(sources, parsed=parsed)
    standins = standins or kernels_of(found)
    standins = kernels.standins(standins, kernels.is_mixed(standins, sources))
    directory = installed.directory if installed else None
    checked, state = (
        check_fakes(found.root, standins, directory) if dynamic else ({}, None)
    )
    ipex = kernels.IPEX in standins
    untraceable = reach.find(sources, declared, prefer=prefer, ipex=ipex, parsed=parsed)
    result = Result(standins, reports(sites, declared, checked, state), untraceable)
    result.own_fakes = recipes.own_tree_fake_ops(sources.get(recipes.XPU_OPS, ""))
    routing = None
    if installed is not None:  # the plugin's contracts, read from its files
        module = installed.directory / installed_plugin.PACKAGE / "_xpu_opaque_calls.py"
        if module.is_file():
            by = (
                f"the vLLM plugin, {installed.describe()}, which rebinds the "
                "callee at start-up (its contracts read from its files"
                + (", not run: --static)" if state is None else ")")
            )
            text = module.read_text()
            routing = schematruth.Routing(
                schematruth.contracts_of(text),
                by,
                False,
                schematruth.kernel_fakes_of(text),
            )
    result.image = images.recognise(found.root)
    result.truth = schematruth.check(
        sources, _version(found), parsed, plugin=routing, image=result.image
    )
    if installed is not None:
        cautions = [
            c
            for c in (
                installed_plugin.loaded_by_vllm(),
                installed_plugin.stale_cache(installed),
            )
            if c
        ]
        if state is None:
            cautions.append("not loaded (--static): what it does is not checked")
        result.plugin = PluginReport(installed, state or {}, cautions)
    return result


def _version(found: tree.Tree) -> str:
    try:
        return tree.detect_version(found)[0]
    except Refusal:
        return ""


def reports(
    sites: dict[str, list[CallSite]],
    declared: set[str],
    checked: dict[str, dict],
    plugin: dict | None = None,
) -> list[OpReport]:
    """The report of each op: its call sites (scan.scan), the fakes the
    source declares, verify-xpu's result for each op (check_fakes), what
    the installed plugin did (its state)."""
    schemas = _schemas()
    found = []
    for op in sorted(sites):
        schema = schemas.get(op) or (
            "(a module, not an op) -> Tensor" if op == IPEX_WOQ else None
        )
        key = (
            op
            if op in checked
            else next((k for k in checked if k.split(".")[0] == op.split(".")[0]), None)
        )
        report = OpReport(op, schema, _returns_tensor(schema) if schema else None)
        report.sites = sorted(sites[op], key=lambda s: (s.file, s.line))
        if key is not None:
            result = checked[key]
            report.fake = result["fake"]
            report.conforms = result["ok"]
            if result["failures"]:
                case, why = next(iter(result["failures"].items()))
                total = result["passed"] + result["failed"]
                report.detail = (
                    f"{result['failed']} of {total} cases fail, e.g. {case}: {why}"
                )
        elif op == IPEX_WOQ:
            if plugin and plugin.get("woq"):
                report.fake = "wrapped by the plugin in the vllm::ipex_woq_linear op"
                report.conforms = True
                report.detail = plugin["woq"]
            elif op in declared:
                report.fake = "wrapped in the vllm::ipex_woq_linear op"
                report.conforms = True
                report.detail = "its fake is tested by tests/test_ipex_woq.py"
            else:
                report.detail = (
                    "its torch_ipex ops are CompositeImplicitAutograd kernels: "
                    "no fake can be registered; wrap the module in one op"
                )
        elif any(d.split(".")[0] == op.split(".")[0] for d in declared):
            report.fake = "declared in source"
        found.append(report)
    return found


def table(found: tree.Tree, result: Result) -> str:
    kernels, reports = result.kernels, result.reports
    lines = [f"vLLM tree {found.root} ({found.shape}); stand-in kernels: {kernels}"]
    lines += [image_line(result.image, _version(found)), ""]
    for r in reports:
        returns = {
            True: "returns a tensor",
            False: "returns no tensor",
            None: "schema unknown",
        }
        lines.append(f"{r.op}: {r.verdict}")
        lines.append(
            f"  {returns[r.returns_tensor]}; fake: {r.fake}"
            + (
                ""
                if r.conforms is None
                else f"; conforms: {'yes' if r.conforms else 'no'}"
            )
        )
        if r.detail:
            lines.append(f"  {r.detail[:200]}")
        for s in r.sites:
            via = f" via {s.via}" if s.via else ""
            lines.append(f"    {s.file}:{s.line} {s.function}{via} [{s.context}]")
    covered = set(result.plugin.state.get("rebound", [])) if result.plugin else set()
    if result.own_fakes:
        unknown = result.own_fakes_unknown
        lines.append("")
        for op in result.own_fakes:
            if op in unknown:
                lines.append(f"warn: {own_fake_warning(op)}")
            else:
                lines.append(f"{op}: {own_fake_covered(op, result.image)}")
    lines += ["", *untraceable_lines(result.untraceable, covered)]
    if result.plugin is not None:
        lines += ["", *result.plugin.lines()]
    if result.truth is not None:
        lines += ["", *schematruth.lines(result.truth)]
    failing = [r.op for r in reports if r.failing]
    reached = result.reached
    lies = result.truth.failing if result.truth is not None else []
    unfaked = result.truth.unfaked if result.truth is not None else []
    lines.append("")
    if unfaked:
        ops = ", ".join(dict.fromkeys(c.op for c, _ in unfaked))
        lines.append(
            f"FAIL: {len(unfaked)} traced call(s) of kernel ops without a fake "
            f"(compiling stops there): {ops}"
        )
    if lies:
        lines.append(
            f"FAIL: {len(lies)} op(s) whose schema lies about what the kernel "
            "writes or returns, on the traced path: " + ", ".join(o.op for o in lies)
        )
    if failing:
        lines.append(
            f"FAIL: {len(failing)} traced op(s) without a conformant fake: "
            + ", ".join(failing)
        )
    if reached:
        callees = ", ".join(dict.fromkeys(f.callee for f in reached))
        lines.append(
            f"FAIL: {len(reached)} call(s) on the traced path that Dynamo cannot "
            f"trace: {callees}"
        )
    warnings = result.warnings
    if not failing and not reached and not lies and not unfaked and warnings:
        lines.append(
            f"WARN: nothing on the traced path fails, but {len(warnings)} "
            "thing(s) were not checked or lie elsewhere: " + "; ".join(warnings)
        )
    elif not failing and not reached and not lies and not unfaked:
        rebound = [f for f in result.untraceable if f.reached and f.callee in covered]
        truth = result.truth
        elsewhere = len(truth.ops) if truth is not None else 0
        lines.append(
            "OK: every traced tensor-returning op has a conformant fake "
            f"({len(reports)} ops seen), and no call on the traced path is one "
            f"Dynamo cannot trace ({len(result.untraceable)} such calls in the "
            + (
                f"tree; the {len(rebound)} reached are rebound by the plugin)"
                if rebound
                else "tree, none reached)"
            )
            + (
                f", and no op's schema lies on the traced path ({truth.checked} "
                "ops checked"
                + (f"; {elsewhere} lie off it, listed above)" if elsewhere else ")")
                if truth is not None
                else ""
            )
        )
    for model in result.models or []:
        lines += ["", model_report.table(model)]
    if result.models:
        lines += ["", model_report.matrix(result.models)]
    return "\n".join(lines)


def image_line(image: "images.Recognition | None", version: str) -> str:
    """The image the tree is, or what the audit takes it for."""
    if image is not None and image.modified:
        return f"Image: {image.describe()}; taken as that image"
    if image is not None and image.image is not None:
        return f"Image: {image.describe()}"
    said = image.describe() if image is not None else "not recognised"
    return (
        f"Image: {said}; assumed: vLLM {version or '(release unknown)'}'s kernels, "
        "an ESIMD package's facts (if it loads one) chosen by that release"
    )


def untraceable_lines(
    findings: list[reach.Finding], covered: set[str] = frozenset()
) -> list[str]:
    """The calls Dynamo cannot trace that the traced path reaches: each with
    its configurations, its entry and its chain of calls; then a count of
    the others. `covered`: the callees the installed plugin rebinds."""
    lines = [
        "Calls Dynamo cannot trace (a C extension's function, ctypes, an "
        "IPEX Python API, a torch_ipex op without a fake, vLLM's logger.*_once):"
    ]
    reached = [f for f in findings if f.reached]
    for f in reached:
        if f.callee in covered:
            verdict = "ok: the plugin rebinds it to a custom op at start-up"
        else:
            verdict = "FAIL"
        lines.append(f"{f.callee}: {verdict}: {f.kind}; {f.site}")
        lines.append("  reached: " + "; ".join(f.configurations))
        lines.append(f"  entry: {f.entry}" + (f" ({f.note})" if f.note else ""))
        for i, step in enumerate(f.chain):
            arrow = f" -> {f.callee}" if i == len(f.chain) - 1 else ""
            lines.append(f"    {step}{arrow}")
    others = len(findings) - len(reached)
    if not reached:
        lines.append("  none on the traced path")
    if others:
        lines.append(
            f"  ({others} other such call(s) in the tree are not on the traced "
            "path: set-up, inside vLLM's own opaque ops, a multimodal encoder, "
            "another platform's code or code nothing calls; --json lists them)"
        )
    return lines


def own_fake_covered(op: str, image: "images.Recognition | None") -> str:
    """What the audit says of a tree's own fake of an op whose schema in the
    tree's image ours is exact for."""
    return (
        f"the tree registers a fake of its own in {recipes.XPU_OPS} for its "
        f"image's kernels ({image.name if image else '?'}); ours is exact for "
        "the image's schema and replaces it at start-up once the fix is "
        "applied (the stand-ins carry that schema)"
    )


def own_fake_warning(op: str) -> str:
    """What the audit says of a tree's own fake of one of our ops."""
    schemas = exact_schemas(op)
    return (
        f"{op}: the tree registers a fake of its own in {recipes.XPU_OPS}, no "
        "release of vLLM's (its image's kernels may have another schema); "
        "apply keeps it, and ours replaces it at start-up only where the live "
        f"schema is one ours is exact for: {' | '.join(schemas)}"
    )


def to_json(found: tree.Tree, result: Result) -> str:
    return json.dumps(
        {
            "tree": str(found.root),
            "shape": found.shape,
            "kernels": result.kernels,
            "own_fakes": result.own_fakes,
            "ops": [
                asdict(r) | {"verdict": r.verdict, "traced": r.traced}
                for r in result.reports
            ],
            "untraceable": [
                asdict(f) | {"reached": f.reached} for f in result.untraceable
            ],
            **({"models": result.models} if result.models is not None else {}),
            **({"model": result.models[0]} if len(result.models or []) == 1 else {}),
            **(
                {
                    "plugin": {
                        "directory": str(result.plugin.installed.directory),
                        "version": result.plugin.installed.version,
                        "state": result.plugin.state,
                        "cautions": result.plugin.cautions,
                    }
                }
                if result.plugin is not None
                else {}
            ),
            **(
                {"schema_truth": schematruth.to_json(result.truth)}
                if result.truth is not None
                else {}
            ),
            "image": result.image.to_json() if result.image else None,
            "warnings": result.warnings,
            "ok": not result.failing,
        },
        indent=2,
    )
