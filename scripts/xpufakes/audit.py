"""`make audit`: which XPU custom ops a vLLM tree calls in code that
torch.compile traces, and whether each has a conformant fake.

Static part (any tree, pinned or not): every call of `torch.ops._xpu_C.<op>`
and `torch.ops.torch_ipex.<op>` in vllm/, and every call of a helper
function or method that wraps one (e.g. `ops.fp8_gemm_w8a16(...)` through
`vllm._ipex_ops.ipex_ops`), with the context it is in:

* traced -- a quantized linear method's `apply*`, a model's `forward`, or
  another function of the forward pass;
* traced if the custom op is enabled -- a `CustomOp.forward_xpu` body (off by
  default under Inductor, where vLLM uses `forward_native`);
* opaque -- inside a function vLLM registers as its own custom op
  (`direct_register_custom_op(op_func=...)`, `@custom_op`): Dynamo sees the
  wrapper op, not the body; also code that such an op runs through a layer
  it looks up at run time (OPAQUE_REGIONS: fused-MoE code inside
  `vllm::moe_forward`), reported "via" that op;
* not traced -- weight loading and set-up (`process_weights_after_loading`,
  `create_weights`, `__init__`, weight loaders, module level).

Dynamic part: the tree's own registering module is imported in a separate
process against the stand-in kernels (`verify-xpu --standins`), which says
for each GEMM whether a fake is registered and whether it passes the opcheck
grid. Ops without a reference kernel are reported by whether the tree
registers a fake for them at all (`register_fake("<ns>::<op>")`); ops whose
schema is not in data/op_schemas.toml are reported as unknown. vLLM's own ops
that return a GEMM's output unchanged (WRAPPER_OPS) are found and checked
like the GEMMs; calls into other op namespaces from XPU code (a file or
function that names XPU) are reported as "unknown namespace".
"""

import ast
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

from . import isolated, pins, tree
from .errors import Refusal

NAMESPACES = ("_xpu_C", "torch_ipex")
# vLLM's own ops that return one of the XPU GEMMs' outputs unchanged: their
# fake is the one traced, and verify-xpu checks it against the GEMM's
# stand-in (verify.WRAPPER_OPS).
WRAPPER_OPS = {"vllm::xpu_fp8_bmm": "_xpu_C::fp8_bmm"}
# Namespaces that are not XPU kernels' and not reported: torch's own.
_TORCH_NAMESPACES = ("aten", "prims", "higher_order", "quantized", "vllm")
# vLLM ops whose implementation runs code the static scan cannot follow
# (it looks the layer up at run time): when the tree registers the op, code
# in these modules, and methods of classes with these bases, run inside it.
OPAQUE_REGIONS = {
    "moe_forward": (
        ("vllm.model_executor.layers.fused_moe.",),
        ("FusedMoEMethodBase", "FusedMoEPermuteExpertsUnpermute", "FusedMoEExperts"),
    ),
}
UNKNOWN_NAMESPACE = "unknown namespace"
# IPEX's weight-only-quantized linear module, called as layer.ipex_qlinear(x)
# by the IPEX era's AWQ / GPTQ / wNa16 methods. Its forward reaches
# torch_ipex ops registered as CompositeImplicitAutograd kernels, which
# cannot take a fake; vllm/_ipex_woq_linear.py wraps the module in one op.
IPEX_WOQ = "torch_ipex::WeightOnlyQuantizedLinear.forward"
IPEX_WOQ_WRAPPER = "opaque_ipex_woq_linear"
SCHEMAS = Path(__file__).with_name("data") / "op_schemas.toml"

TRACED, IF_ENABLED, OPAQUE, NOT_TRACED, OTHER_PLATFORM, HELPER = (
    "traced",
    "traced if the custom op is enabled",
    "opaque",
    "not traced",
    "another platform's path",
    "helper: see its callers",
)
_OTHER_PLATFORMS = {
    "forward_cuda",
    "forward_hip",
    "forward_cpu",
    "forward_tpu",
    "forward_hpu",
    "forward_oot",
    "forward_neuron",
}
_SETUP_NAMES = re.compile(
    r"^(__init__|process_weights_after_loading|_?process_weights.*|create_weights"
    r"|load_weights|.*weight_loader.*)$"
)


@dataclass
class CallSite:
    file: str
    line: int
    function: str  # dotted: Class.method, or <module>
    context: str
    via: str = ""  # the helper called, for indirect calls
    module: str = ""


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
# Static scan
# ---------------------------------------------------------------------------


def _dotted(node: ast.expr) -> str:
    """'a.b.c' for a Name/Attribute chain, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


def _op_of(node: ast.expr) -> str | None:
    """'ns::op' (or 'ns::op.overload') for torch.ops.<ns>.<op>[.<overload>]."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    parts.reverse()
    if parts[:2] != ["torch", "ops"] or len(parts) < 4:
        return None
    op = f"{parts[2]}::{parts[3]}"
    if parts[2] in _TORCH_NAMESPACES and op not in WRAPPER_OPS:
        return None
    if len(parts) == 5 and parts[4] != "default":
        op += f".{parts[4]}"
    return op


@dataclass
class _Function:
    module: str  # dotted module name
    qualname: str  # Class.method or function
    node: ast.AST
    opaque: bool = False


class _ModuleScan(ast.NodeVisitor):
    """Functions, op calls, helper calls and imports of one module."""

    def __init__(self, module: str, path: str):
        self.module = module
        self.path = path
        self.stack: list[str] = []
        self.class_bases: list[list[str]] = []
        self.functions: dict[str, _Function] = {}
        self.op_calls: list[tuple[str, int, str]] = []  # (op, line, function)
        self.calls: list[tuple[ast.Call, int, str]] = []  # every call, for helpers
        self.imports: dict[str, str] = {}  # local name -> dotted target
        self.opaque_names: set[str] = set()
        self.fakes_declared: set[str] = set()
        self.wraps_ipex_woq = False
        self.bases: dict[str, list[str]] = {}  # class qualname -> base names

    def _where(self) -> str:
        return ".".join(self.stack) or "<module>"

    def _xpu_code(self) -> bool:
        """Code for XPU: its file or function (or class) names XPU."""
        return "xpu" in f"{self.path} {'.'.join(self.stack)}".lower()

    def visit_Import(self, node):
        for alias in node.names:
            self.imports[alias.asname or alias.name.split(".")[0]] = alias.name

    def visit_ImportFrom(self, node):
        base = node.module or ""
        if node.level:
            package = self.module.rsplit(".", node.level)[0]
            base = f"{package}.{base}" if base else package
        for alias in node.names:
            self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"

    def visit_ClassDef(self, node):
        self.stack.append(node.name)
        self.class_bases.append([ast.unparse(b) for b in node.bases])
        self.bases[".".join(self.stack)] = self.class_bases[-1]
        self.generic_visit(node)
        self.class_bases.pop()
        self.stack.pop()

    def _visit_function(self, node):
        self.stack.append(node.name)
        qualname = ".".join(self.stack)
        names = [
            _dotted(d.func if isinstance(d, ast.Call) else d)
            for d in node.decorator_list
        ]
        opaque = any("custom_op" in n or "register_fake" in n for n in names)
        self.functions[qualname] = _Function(self.module, qualname, node, opaque)
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and "register_fake" in _dotted(
                decorator.func
            ):
                for arg in decorator.args[:1]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        self.fakes_declared.add(arg.value)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function

    def visit_Call(self, node):
        op = _op_of(node.func)
        func = _dotted(node.func)
        if op:
            # another namespace counts in XPU code only
            if op.split("::")[0] in NAMESPACES or op in WRAPPER_OPS or self._xpu_code():
                self.op_calls.append((op, node.lineno, self._where()))
        elif func.endswith(".ipex_qlinear"):
            self.op_calls.append((IPEX_WOQ, node.lineno, self._where()))
        else:
            self.calls.append((node, node.lineno, self._where()))
        if func.endswith(IPEX_WOQ_WRAPPER):
            self.wraps_ipex_woq = True
        if func.endswith("direct_register_custom_op") or func.endswith(
            "register_custom_op"
        ):
            names = {k.arg: k.value for k in node.keywords}
            op_name = names.get("op_name")
            if "fake_impl" in names and isinstance(op_name, ast.Constant):
                self.fakes_declared.add(f"vllm::{op_name.value}")
            for keyword in node.keywords:
                if keyword.arg in ("op_func", "fake_impl") and isinstance(
                    keyword.value, ast.Name
                ):
                    self.opaque_names.add(keyword.value.id)
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Name):
                self.opaque_names.add(node.args[1].id)
        if func.endswith("register_fake") or func.endswith("impl_abstract"):
            for arg in node.args[:1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    self.fakes_declared.add(arg.value)
        self.generic_visit(node)


def _inside_opaque_op(
    scan: _ModuleScan, function: str, registered: set[str]
) -> str | None:
    """The vLLM op (OPAQUE_REGIONS) whose implementation runs `function`, if
    the tree registers that op and the function is in its region."""
    parts = function.split(".")
    bases = [
        b.rsplit(".", 1)[-1]
        for i in range(1, len(parts))
        for b in scan.bases.get(".".join(parts[:i]), [])
    ]
    for op, (modules, classes) in OPAQUE_REGIONS.items():
        if op not in registered:
            continue
        if scan.module.startswith(modules) or any(b.startswith(classes) for b in bases):
            return f"vllm::{op}"
    return None


def _context(scan: _ModuleScan, function: str) -> str:
    """The context of code in `function` (dotted) of a module."""
    if function == "<module>":
        return NOT_TRACED
    parts = function.split(".")
    for i in range(len(parts), 0, -1):
        qualname = ".".join(parts[:i])
        f = scan.functions.get(qualname)
        if f is not None and (f.opaque or parts[i - 1] in scan.opaque_names):
            return OPAQUE
    name = parts[-1]
    if _SETUP_NAMES.match(name):
        return NOT_TRACED
    if name in _OTHER_PLATFORMS:
        return OTHER_PLATFORM
    if name == "forward_xpu":
        return IF_ENABLED
    return TRACED


def _module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def scan_tree(root: Path) -> tuple[dict[str, list[CallSite]], set[str]]:
    """op -> call sites in vllm/, and the ops the source registers fakes for
    with a literal name."""
    texts: dict[Path, str] = {}
    for path in sorted((root / "vllm").rglob("*.py")):
        try:
            texts[path] = path.read_text(errors="replace")
        except OSError:
            continue
    scans: dict[str, _ModuleScan] = {}

    def scan(path: Path) -> None:
        module = _module_name(root, path)
        if module in scans:
            return
        result = _ModuleScan(module, str(path.relative_to(root)))
        try:
            result.visit(ast.parse(texts[path]))
        except SyntaxError:
            return
        scans[module] = result

    # Modules that name an op namespace, then (a few levels) the modules that
    # mention a module defining a helper.
    for path, text in texts.items():
        if any(ns in text for ns in NAMESPACES) or "ipex_qlinear" in text:
            scan(path)
    for _ in range(3):
        names = {m.rsplit(".", 1)[-1] for m, s in scans.items() if s.op_calls}
        for path, text in texts.items():
            if any(name in text for name in names):
                scan(path)

    # vLLM ops the tree registers (OPAQUE_REGIONS), found in any module
    registered = {
        name
        for text in texts.values()
        if "direct_register_custom_op" in text
        for name in re.findall(r"""op_name\s*=\s*["'](\w+)["']""", text)
    }
    sites: dict[str, list[CallSite]] = {}
    helpers: dict[tuple[str, str], set[str]] = {}  # (module, qualname) -> ops
    for scan in scans.values():
        for op, line, function in scan.op_calls:
            context = _context(scan, function)
            inside = ""
            if context in (TRACED, IF_ENABLED):
                inside = _inside_opaque_op(scan, function, registered) or ""
                context = OPAQUE if inside else context
            sites.setdefault(op, []).append(
                CallSite(scan.path, line, function, context, inside, scan.module)
            )
            if context in (TRACED, IF_ENABLED) and function != "<module>":
                helpers.setdefault((scan.module, function), set()).add(op)

    # Calls of helpers (functions and methods that call an op), followed
    # through imports, a few levels deep.
    seen: set[tuple[str, str]] = set()
    for _ in range(3):
        new: dict[tuple[str, str], set[str]] = {}
        for scan in scans.values():
            for call, line, function in scan.calls:
                target = _resolve(scan, call.func, scans)
                if (
                    target is None
                    or target not in helpers
                    or target
                    == (
                        scan.module,
                        function,
                    )
                ):
                    continue
                key = (scan.module, function, line, target)
                if key in seen:  # (module, function, line, target)
                    continue
                seen.add(key)
                context = _context(scan, function)
                if context in (TRACED, IF_ENABLED) and _inside_opaque_op(
                    scan, function, registered
                ):
                    context = OPAQUE
                via = f"{target[0]}.{target[1]}"
                for op in helpers[target]:
                    sites.setdefault(op, []).append(
                        CallSite(scan.path, line, function, context, via, scan.module)
                    )
                    if context in (TRACED, IF_ENABLED) and function != "<module>":
                        new.setdefault((scan.module, function), set()).add(op)
        for key, ops in new.items():
            helpers.setdefault(key, set()).update(ops)
    # A helper's own call of an op (or of another helper) is traced only if
    # its callers are: label it, and let the callers' contexts count.
    called = {target for (_, _, _, target) in seen}
    for op_sites in sites.values():
        for site in op_sites:
            if (site.module, site.function) in called:
                site.context = HELPER
    declared = set().union(*(s.fakes_declared for s in scans.values()))
    wrapped = {s.path for s in scans.values() if s.wraps_ipex_woq}
    woq_sites = [
        x for x in sites.get(IPEX_WOQ, []) if x.context in (TRACED, IF_ENABLED)
    ]
    if woq_sites and all(x.file in wrapped for x in woq_sites):
        declared.add(IPEX_WOQ)
    return sites, declared


def _resolve(
    scan: _ModuleScan, func: ast.expr, scans: dict[str, "_ModuleScan"]
) -> tuple[str, str] | None:
    """(module, qualname) of the function a call expression names, when it
    can be told from the module's imports and definitions."""
    if isinstance(func, ast.Name):
        if func.id in scan.functions:
            return scan.module, func.id
        target = scan.imports.get(func.id)
        return _split(target, scans) if target else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        base = func.value.id
        if base in scan.functions or f"{base}.{func.attr}" in scan.functions:
            return scan.module, f"{base}.{func.attr}"
        target = scan.imports.get(base)
        if target:
            return _split(f"{target}.{func.attr}", scans)
    return None


def _split(dotted: str, scans: dict[str, "_ModuleScan"]) -> tuple[str, str] | None:
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        if module in scans:
            return module, ".".join(parts[i:])
    return None


# ---------------------------------------------------------------------------
# Dynamic part and report
# ---------------------------------------------------------------------------


def kernels_of(found: tree.Tree) -> str:
    """The stand-in kernels for a tree: its requirements/xpu.txt, else its
    pin, else the newest release of the kernel package its era uses."""
    requirements = found.root / "requirements" / "xpu.txt"
    if requirements.is_file():
        text = requirements.read_text()
        match = re.search(r"vllm[_-]xpu[_-]kernels(?:==|.*?-)(\d+(?:\.\d+)+)", text)
        if match:
            return f"vllm-xpu-kernels {match.group(1)}"
        if "intel-extension-for-pytorch" in text or "intel_extension" in text:
            return "intel-extension-for-pytorch xpu"
    try:
        version, _ = tree.detect_version(found)
        return pins.load().get(version).kernels
    except Refusal:
        pass
    if (found.root / "vllm" / "_xpu_ops.py").is_file():
        from .loading import newest_xpu_kernels

        return f"vllm-xpu-kernels {newest_xpu_kernels()}"
    return "intel-extension-for-pytorch xpu"


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
    path: str, dynamic: bool = True, kernels: str | None = None
) -> tuple[tree.Tree, str, list[OpReport]]:
    found = tree.locate(path)
    sites, declared = scan_tree(found.root)
    schemas = _schemas()
    kernels = kernels or kernels_of(found)
    if "vllm-xpu-kernels" not in kernels and any(
        o.startswith("_xpu_C::") for o in sites
    ):
        # a mixed tree: IPEX era, but some code calls the _xpu_C ops
        from .loading import newest_xpu_kernels

        kernels += f"; vllm-xpu-kernels {newest_xpu_kernels()}"
    checked = check_fakes(found.root, kernels) if dynamic else {}
    reports = []
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
        reports.append(report)
    return found, kernels, reports


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
