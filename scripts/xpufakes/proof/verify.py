"""`make verify-xpu`: the opcheck grid of every registered XPU GEMM fake
against the real kernels on the device, as a pass/fail table.

On an XPU host it imports the installed vLLM (or the tree given), which
registers the fakes and loads the real kernels, and runs on device "xpu".
Elsewhere it stops with NOT_HERE (77). With --standins it runs the same logic
on the CPU against the stand-in kernels of a kernel release instead.
"""

import json
import re
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xpufakes.common.errors import NOT_HERE, Refusal
from xpufakes.common.ops import WRAPPER_OPS
from xpufakes.proof import plugin as installed_plugin

TEST_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic")


@dataclass
class OpResult:
    op: str
    fake: str  # "registered", "none"
    passed: int = 0
    failed: int = 0
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.fake == "registered" and self.failed == 0 and self.passed > 0


def run(
    vllm: Path | None,
    standins: str | None,
    full: bool = True,
    select: Callable[[], Collection[str]] | None = None,
    plugin: Path | None = None,
    plugin_state: dict | None = None,
    schema: "SchemaTruth | None" = None,
) -> list[OpResult]:
    """The opcheck grid of every registered fake: against the real kernels
    on the XPU, or (standins) the stand-ins of that kernel release on the
    CPU. With `select`, only the ops it names (asked once the tree is
    loaded; an overload counts as its op). With `plugin` (the directory
    this project's vLLM plugin is installed in), the plugin registers once
    the tree is loaded, and what it did goes into `plugin_state`. With
    `schema`, then schema truth on the device (schema_truth()) into it. A
    Python without torch cannot run it (NOT_HERE)."""
    import sys

    try:
        return _run(vllm, standins, full, select, plugin, plugin_state, schema)
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] != "torch":
            raise
        raise Refusal(
            f"{sys.executable} cannot import torch; run verify-xpu with the "
            "Python that has vLLM and torch (PYTHON=...)",
            status=NOT_HERE,
        ) from None


def _run(
    vllm: Path | None,
    standins: str | None,
    full: bool,
    select: Callable[[], Collection[str]] | None,
    plugin: Path | None,
    plugin_state: dict | None,
    schema: "SchemaTruth | None" = None,
) -> list[OpResult]:
    import torch

    from xpufakes.proof.xpu import extensions, ipex, reference, registering, xpu_kernels

    libraries = []
    if standins:
        device = "cpu"
        libraries = reference.define_standins(standins)
        xpu_kernels.stub_xpu_kernel_package()
        extensions.stub_vllm_extensions(vllm)
    else:
        device = "xpu"
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            raise Refusal(
                "no Intel GPU here (torch.xpu.is_available() is False): verify-xpu "
                "needs an XPU host; use --standins to check its logic on a CPU",
                status=NOT_HERE,
            )
    if plugin is not None and standins and "intel-extension-for-pytorch" in standins:
        # what the plugin finds of IPEX on an XPU host: its Python APIs
        # (calling torch_ipex ops registered for the XPU key only) and its
        # WOQ linear class, before vLLM imports it
        libraries.append(ipex.define_torch_ipex_ops())
        ipex.install_ipex()
    registering.import_registering_module(vllm)
    if plugin is not None:
        state = registering.load_plugin(plugin, any_platform=bool(standins))
        if plugin_state is not None:
            plugin_state.update(state)
    wanted = None if select is None else {op.split(".")[0] for op in select()}
    results = grid(device, full, wanted)
    if schema is not None:
        schema_truth(schema, bool(standins), full)
    del libraries
    return results


def grid(
    device: str, full: bool, wanted: Collection[str] | None = None
) -> list[OpResult]:
    """The opcheck grid of the ops that exist in this process, with the
    fakes registered now, on `device` (the ops `wanted` only: their names
    without overload). The vLLM plugin's self-check runs the same grid
    (plugin/vllm_xpu_fakes/opcheck.py; tests/test_plugin_selfcheck.py
    checks that the two agree)."""
    import torch

    from xpufakes.proof.xpu import reference, registering

    results: dict[str, OpResult] = {}
    for case in reference.reference().opcheck_cases(full=full):
        qualname = f"{case.namespace}::{case.name}"
        if not case.available() or (wanted is not None and qualname not in wanted):
            continue
        overload = "default" if case.overload == "batched" else case.overload
        key = qualname if overload == "default" else f"{qualname}.{overload}"
        if key not in results:
            fake = registering.fake_of(key)
            results[key] = OpResult(key, "registered" if fake else "none")
        result = results[key]
        try:
            torch.library.opcheck(case.op(), case.args(device), test_utils=TEST_UTILS)
            result.passed += 1
        except Exception as e:  # noqa: BLE001 - every failure is a result
            result.failed += 1
            result.failures[case.id] = reason(e)
    # vLLM's own ops that return a GEMM's output unchanged are checked over
    # the GEMM's cases (those their schema accepts)
    for wrapper, gemm in WRAPPER_OPS.items():
        if wanted is None or wrapper in wanted:
            _check_wrapper(results, wrapper, gemm, device, full)
    return list(results.values())


def _check_wrapper(
    results: dict[str, "OpResult"], wrapper: str, gemm: str, device: str, full: bool
) -> None:
    import torch

    from xpufakes.proof.xpu import reference, registering

    namespace, name = wrapper.split("::")
    packet = getattr(getattr(torch.ops, namespace), name, None)
    if packet is None:
        return
    result = results[wrapper] = OpResult(
        wrapper, "registered" if registering.fake_of(wrapper) else "none"
    )
    for case in reference.reference().opcheck_cases(full=full):
        if f"{case.namespace}::{case.name}" != gemm or case.overload != "default":
            continue
        if not case.available() or case.params.get("out_dtype", 0) is None:
            continue  # the wrapper's out_dtype is not optional
        try:
            torch.library.opcheck(
                packet.default, case.args(device), test_utils=TEST_UTILS
            )
            result.passed += 1
        except Exception as e:  # noqa: BLE001 - every failure is a result
            result.failed += 1
            result.failures[case.id] = reason(e)


# One line saying why opcheck failed, as the plugin's self-check says it.
reason = installed_plugin.shipped_module("opcheck").reason


def table(results: list[OpResult]) -> str:
    width = max([len(r.op) for r in results] + [2])
    lines = [f"{'op':<{width}}  fake        passed  failed  first failure"]
    for r in results:
        first = next(iter(r.failures.items()), ("", ""))
        detail = f"{first[0]}: {first[1]}" if first[0] else ""
        counts = f"{r.passed:>6}  {r.failed:>6}"
        lines.append(f"{r.op:<{width}}  {r.fake:<10}  {counts}  {detail[:140]}")
    verdict = "PASS" if results and all(r.ok for r in results) else "FAIL"
    lines.append(
        f"{verdict}: {sum(r.ok for r in results)} of {len(results)} ops conform"
    )
    return "\n".join(lines)


def to_json(results: list[OpResult], plugin: dict | None = None) -> str:
    """The results (a list); with the plugin's state, {"ops": ..., "plugin": ...}."""
    ops = [asdict(r) | {"ok": r.ok} for r in results]
    return json.dumps(
        ops if plugin is None else {"ops": ops, "plugin": plugin}, indent=2
    )


# ---------------------------------------------------------------------------
# Schema truth on the device: the image's own ops (issue 42, item 4)
# ---------------------------------------------------------------------------

# the plugin's check and its cases, one source for both ways of running it
# (python -m vllm_xpu_fakes --verify ships them)
schemacheck = installed_plugin.shipped_module("schemacheck")
schemacases = installed_plugin.shipped_module("schemacases")
STANDINS = "xpufakes_schema_standins"  # the CPU stand-ins' namespace
NO_STANDIN = "no stand-in: its schema is the tree's, not in the data"
NOT_TESTED_HERE = (
    "CPU stand-ins, not the image's kernels: each carries the op's schema "
    "(the data's) and does the write the finding names; the real kernels "
    "need an Intel GPU (make verify-xpu there)"
)


@dataclass
class SchemaTruth:
    """Schema truth on the device: the results on the image's ops (on the
    XPU), or (stand-ins) on the lying stand-ins and their truthful controls."""

    results: list = field(default_factory=list)
    controls: list = field(default_factory=list)  # stand-ins only
    packages: list[str] = field(default_factory=list)
    standins: bool = False
    skipped: str = ""  # why it did not run

    @property
    def ok(self) -> bool:
        """On stand-ins: every lying one confirmed, every truthful control
        declared and not failed by test_schema. On the XPU: no verdict (the
        findings are the image's, the report says which it confirms)."""
        if not self.standins or self.skipped:
            return True
        checked = [r for r in self.results if r.status not in ("no case", "not here")]
        return (
            bool(checked)
            and all(r.confirmed for r in checked)
            and all(
                c.status == "declared here" and not c.test_schema.startswith("fails")
                for c in self.controls
            )
        )


def schema_truth(into: SchemaTruth, standins: bool, full: bool = True) -> SchemaTruth:
    """Schema truth over the ops of the findings this process has: the
    image's (the ESIMD package imported where installed, the _xpu_C ops
    vLLM loaded) on the XPU, or the CPU stand-ins and their truthful
    controls (not with --quick: ~3 s of CPU, torch's SchemaCheckMode
    comparing half tensors on a CPU)."""
    findings, cases = schemacases.FINDINGS, schemacases.CASES
    no_case, cited = schemacases.NO_CASE, schemacases.CITED
    into.standins = standins
    if standins and not full:
        into.skipped = (
            "--quick: the stand-ins' check is not run (without --quick, or "
            "tests/test_schema_check.py)"
        )
        return into
    if not standins:
        into.packages = schemacheck.load_image_packages()
        into.results = schemacheck.run(
            findings, cases, no_case, "xpu", schemacheck.loaded, cited=cited
        )
        return into
    library, names = define_schema_standins()
    lying = {op: schemacheck.loaded(f"{STANDINS}::{n}") for op, n in names.items()}
    truthful = {
        op: schemacheck.loaded(f"{STANDINS}::{n}_truthful") for op, n in names.items()
    }
    into.results = schemacheck.run(
        findings, cases, no_case, "cpu", lying.get, absent=NO_STANDIN, cited=cited
    )
    into.controls = [
        schemacheck.check(op, truthful[op], findings[op], cases[op], "cpu")
        for op in names
    ]
    del library
    return into


# the llm-scaler image whose ESIMD package the schema cases are read from
# (schemacases.py; data/esimd_schemas.toml, data/images.toml)
CASES_IMAGE = "b18beee"


def _schema_texts() -> dict[str, str]:
    """The schemas of the findings' ops, as the data has them: llm-scaler's
    at the image commit the cases are read from (b18beee, vLLM 0.21.0),
    vllm-xpu-kernels'."""
    from xpufakes.proof.static import schematruth
    from xpufakes.trees import images

    package = schematruth.ESIMD_PACKAGE
    image = images.as_image(CASES_IMAGE)
    facts, *_ = schematruth.kernel_facts({"": package}, "0.21.0", image=image)
    return {op: f.text for op, f in facts.items()}


def truthful(schema: str, findings: dict[str, list[str]]) -> str:
    """The schema with what the findings say marked: each argument written
    `Tensor(wN!)`, the returned one's alias on the result."""
    name, _, rest = schema.partition("(")
    params, _, returns = rest.rpartition(") ->")
    written = set(findings.get("a", [])) | set(findings.get("b", []))
    returned = findings.get("b", [])
    out, alias = [], ""
    for i, param in enumerate(p.strip() for p in params.split(",")):
        kind, _, arg = param.partition(" ")
        arg_name = arg.partition("=")[0].strip()
        marked = re.fullmatch(r"Tensor\((\w+)!\)\??", kind)
        if arg_name in written and kind in ("Tensor", "Tensor?"):
            kind = kind.replace("Tensor", f"Tensor(w{i}!)")
            marked = re.fullmatch(r"Tensor\((\w+)!\)\??", kind)
        if marked and arg_name in returned:
            alias = f"Tensor({marked.group(1)}!)"
        out.append(f"{kind} {arg}")
    return f"{name}({', '.join(out)}) -> {alias or returns.strip()}"


def define_schema_standins():
    """CPU stand-ins of the ops with a case whose schema the data has: for
    each, `<op>` with the image's schema and `<op>_truthful` with what the
    findings say marked, both the same kernel: it writes the arguments the
    findings name (+1 where it reads them, 1 where NaN) and returns the one
    the C++ returns. (library, op -> the stand-ins' name)."""
    import torch

    texts = _schema_texts()
    library = torch.library.Library(STANDINS, "DEF")
    names = {}
    for op in schemacases.CASES:
        if op not in texts:
            continue  # a tree's own op: its schema is the tree's
        found = schemacases.FINDINGS[op]
        name = op.split("::")[1]
        schema = texts[op].partition("(")
        library.define(f"{name}{schema[1]}{schema[2]}")
        library.define(truthful(f"{name}_truthful({schema[2]}", found))
        kernel = _standin_kernel(texts[op], found)
        library.impl(name, kernel, "CPU")
        library.impl(f"{name}_truthful", kernel, "CPU")
        names[op] = name
    return library, names


def _standin_kernel(schema: str, findings: dict[str, list[str]]):
    import torch

    params = [
        p.strip().partition(" ")[2].partition("=")[0].strip()
        for p in schema.partition("(")[2].rpartition(") ->")[0].split(",")
    ]
    returned = (findings.get("b") or [None])[0]
    written = [params.index(a) for a in findings.get("a", []) + findings.get("b", [])]

    def kernel(*args):
        for i in dict.fromkeys(written):
            t = args[i]
            t.copy_(torch.nan_to_num(t.float(), nan=0.0).add(1).to(t.dtype))
        return args[params.index(returned)] if returned else None

    return kernel


def schema_table(truth: SchemaTruth) -> str:
    if not truth.standins:
        return schemacheck.report(truth.results, truth.packages)
    if truth.skipped:
        return f"schema truth on CPU stand-ins: not run ({truth.skipped})"
    controls = schemacheck.table(truth.controls).splitlines()[:-1]
    ran = [c for c in truth.controls if not c.test_schema.startswith("cannot run")]
    verdict = (
        "PASS: every lying stand-in confirmed; test_schema passes "
        f"{len(ran)} of {len(truth.controls)} truthful controls (the others: "
        "it cannot run on them, above)"
        if truth.ok
        else "FAIL: a lying stand-in is not confirmed, or test_schema fails a "
        "truthful control (above)"
    )
    return "\n".join(
        [
            f"schema truth on {NOT_TESTED_HERE}",
            schemacheck.table(truth.results),
            "truthful controls (the same kernels, the writes marked):",
            *controls,
            f"schema truth logic: {verdict}",
        ]
    )
