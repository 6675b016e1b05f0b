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
"""

import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import isolated, kernels, pins, scan, tree
from .errors import Refusal
from .ops import IPEX_WOQ, NAMESPACES, WRAPPER_OPS
from .scan import IF_ENABLED, TRACED, CallSite

UNKNOWN_NAMESPACE = "unknown namespace"
SCHEMAS = Path(__file__).with_name("data") / "op_schemas.toml"


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


def check_fakes(root: Path, kernels: str) -> dict[str, dict]:
    """op -> verify-xpu's result for it, from a separate process."""
    done, result = isolated.run_verb(
        ["verify-xpu", "--vllm", str(root), "--standins", kernels, "--quick"],
        "--json-out",
    )
    if done.returncode not in (0, 1) or result is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        tail = tail.removeprefix("error: ")
        raise Refusal(f"cannot load the tree's fakes against the stand-ins: {tail}")
    return {entry["op"]: entry for entry in result}


def audit(
    found: tree.Tree, dynamic: bool = True, standins: str | None = None
) -> tuple[str, list[OpReport]]:
    """(the stand-in kernels, the report of each op the tree calls)."""
    sources = tree.python_sources(found.root)
    sites, declared = scan.scan(sources)
    standins = standins or kernels_of(found)
    standins = kernels.standins(standins, kernels.is_mixed(standins, sources))
    checked = check_fakes(found.root, standins) if dynamic else {}
    return standins, reports(sites, declared, checked)


def reports(
    sites: dict[str, list[CallSite]], declared: set[str], checked: dict[str, dict]
) -> list[OpReport]:
    """The report of each op: its call sites (scan.scan), the fakes the
    source declares, verify-xpu's result for each op (check_fakes)."""
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
            if op in declared:
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


def table(found: tree.Tree, kernels: str, reports: list[OpReport]) -> str:
    lines = [f"vLLM tree {found.root} ({found.shape}); stand-in kernels: {kernels}", ""]
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
    failing = [r.op for r in reports if r.failing]
    lines.append("")
    if failing:
        lines.append(
            f"FAIL: {len(failing)} traced op(s) without a conformant fake: "
            + ", ".join(failing)
        )
    else:
        lines.append(
            "OK: every traced tensor-returning op has a conformant fake "
            f"({len(reports)} ops seen)"
        )
    return "\n".join(lines)


def to_json(found: tree.Tree, kernels: str, reports: list[OpReport]) -> str:
    return json.dumps(
        {
            "tree": str(found.root),
            "shape": found.shape,
            "kernels": kernels,
            "ops": [
                asdict(r) | {"verdict": r.verdict, "traced": r.traced} for r in reports
            ],
            "ok": not any(r.failing for r in reports),
        },
        indent=2,
    )
