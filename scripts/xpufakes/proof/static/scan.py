"""The static part of the audit: every call of `torch.ops._xpu_C.<op>` and
`torch.ops.torch_ipex.<op>` in a tree's vllm/, and every call of a helper
function or method that wraps one (e.g. `ops.fp8_gemm_w8a16(...)` through
`vllm._ipex_ops.ipex_ops`), with the context it is in:

* traced -- a quantized linear method's `apply*`, a model's `forward`, or
  another function of the forward pass;
* traced if the custom op is enabled -- a `CustomOp.forward_xpu` body (off by
  default under Inductor, where vLLM uses `forward_native`);
* opaque -- inside a function vLLM registers as its own custom op
  (`direct_register_custom_op(op_func=...)`, `@custom_op`): Dynamo sees the
  wrapper op, not the body; also code that such an op runs through a layer
  it looks up at run time (reach.opaque_regions: fused-MoE code inside
  `vllm::moe_forward`), reported "via" that op;
* not traced -- weight loading and set-up (`process_weights_after_loading`,
  `create_weights`, `__init__`, weight loaders, module level).

It reads source text only (no import, no torch): `scan` takes the files'
texts, so the proof scans a tree edited in memory.
"""

import ast
import collections
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from xpufakes.common.ops import IPEX_WOQ, IPEX_WOQ_WRAPPER, NAMESPACES, WRAPPER_OPS
from xpufakes.proof.static import reach
from xpufakes.trees import names, pysource, tree

# Namespaces that are not XPU kernels' and not reported: torch's own.
_TORCH_NAMESPACES = ("aten", "prims", "higher_order", "quantized", "vllm")
TRACED, IF_ENABLED, OPAQUE, NOT_TRACED, OTHER_PLATFORM, HELPER = (
    "traced",
    "traced if the custom op is enabled",
    "opaque",
    "not traced",
    "another platform's path",
    "helper: see its callers",
)
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
    opaque: bool = False


class _ModuleScan(ast.NodeVisitor):
    """Functions, op calls, helper calls and imports of one module. (It
    walks the tree as ast.NodeVisitor does, but dispatches by type and
    skips the leaves: the scan of a vLLM tree parses and walks hundreds of
    modules.)"""

    def visit(self, node):
        return self._dispatch.get(type(node), _ModuleScan.generic_visit)(self, node)

    def generic_visit(self, node):
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST) and not isinstance(
                        item, pysource.LEAVES
                    ):
                        self.visit(item)
            elif isinstance(value, ast.AST) and not isinstance(value, pysource.LEAVES):
                self.visit(value)

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
        is_package = self.path.endswith("__init__.py")
        self.imports.update(names.bindings(node, self.module, is_package))

    visit_ImportFrom = visit_Import

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
        decorators = [
            names.dotted(d.func if isinstance(d, ast.Call) else d)
            for d in node.decorator_list
        ]
        opaque = any("custom_op" in n or "register_fake" in n for n in decorators)
        self.functions[qualname] = _Function(self.module, qualname, opaque)
        for decorator in node.decorator_list:
            # @register_fake("ns::op"), and a decorator that enters its
            # function as the fake of the op a schema names (the overlay's
            # @_fake_of(TABLE, "ns::op(...) -> Tensor"))
            if isinstance(decorator, ast.Call) and "fake" in names.dotted(
                decorator.func
            ):
                for arg in decorator.args[:2]:
                    if (
                        isinstance(arg, ast.Constant)
                        and isinstance(arg.value, str)
                        and "::" in arg.value
                    ):
                        self.fakes_declared.add(arg.value.partition("(")[0])
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function

    def visit_Call(self, node):
        op = _op_of(node.func)
        func = names.dotted(node.func)
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
            keywords = {k.arg: k.value for k in node.keywords}
            op_name = keywords.get("op_name")
            if "fake_impl" in keywords and isinstance(op_name, ast.Constant):
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


_ModuleScan._dispatch = {
    ast.Import: _ModuleScan.visit_Import,
    ast.ImportFrom: _ModuleScan.visit_ImportFrom,
    ast.ClassDef: _ModuleScan.visit_ClassDef,
    ast.FunctionDef: _ModuleScan._visit_function,
    ast.AsyncFunctionDef: _ModuleScan._visit_function,
    ast.Call: _ModuleScan.visit_Call,
}


def _inside_opaque_op(scan: _ModuleScan, function: str, regions: list) -> str | None:
    """The vLLM op (reach.opaque_regions: the ops the tree registers) whose
    implementation runs `function`, if the function is in its region."""
    parts = function.split(".")
    bases = [
        b.rsplit(".", 1)[-1]
        for i in range(1, len(parts))
        for b in scan.bases.get(".".join(parts[:i]), [])
    ]
    for modules, classes, op in regions:
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
    if name in reach.OTHER_PLATFORMS:
        return OTHER_PLATFORM
    if name == "forward_xpu":
        return IF_ENABLED
    return TRACED


def scan_tree(root: Path) -> tuple[dict[str, list[CallSite]], set[str]]:
    """scan() of the tree's files as they are."""
    return scan(tree.python_sources(root))


# What a module's text must hold for it to give the scan anything but
# helper calls: an op call (the namespaces, vLLM's wrapper ops, or another
# namespace's op in XPU code), a fake declared by name, a wrapped IPEX WOQ
# module. A module without any is parsed only if it may call a helper.
_OTHER_OP = re.compile(
    r"\btorch(?:\s|\\|#[^\n]*)*\.(?:\s|\\|#[^\n]*)*ops(?:\s|\\|#[^\n]*)*\."
    r"(?:\s|\\|#[^\n]*)*(\w+)"
)
_DECLARES = ("register_fake", "impl_abstract", "register_custom_op", IPEX_WOQ_WRAPPER)
_WRAPPER_NAMES = tuple(op.split("::")[1] for op in WRAPPER_OPS)


def _may_give(path: str, text: str) -> bool:
    """Whether a module may have op calls or declarations (see above): a
    necessary condition, from its text."""
    if any(ns in text for ns in NAMESPACES) or "ipex_qlinear" in text:
        return True
    if any(name in text for name in _WRAPPER_NAMES + _DECLARES):
        return True
    if "xpu" in path.lower() or "xpu" in text.lower():
        return any(ns not in _TORCH_NAMESPACES for ns in _OTHER_OP.findall(text))
    return False


@functools.cache
def _word(word: str) -> re.Pattern:
    """`word` as a whole word (searched only in a text that holds it: one
    pattern of every word, which no literal begins, took seconds)."""
    return re.compile(rf"\b{re.escape(word)}\b")


def scan(
    texts: dict[str, str], lazy: bool = True, parsed: dict | None = None
) -> tuple[dict[str, list[CallSite]], set[str]]:
    """op -> call sites in vllm/, and the ops the source registers fakes for
    with a literal name; `texts`: path (relative to the tree) -> source of
    each Python file of vllm/.

    The modules scanned: those that name an op namespace, then (a few
    levels) those that mention a module that calls an op. Of those, a module
    is parsed only if it may give something (_may_give), or may call one of
    the helpers found (every part of the helper's name is a word of its
    text), until no more may: what the others would give is nothing (lazy;
    not lazy, every one is parsed: the same result, slower). `parsed`: the
    syntax trees, shared with reach.find (pysource.parse)."""
    scans: dict[str, _ModuleScan] = {}
    unparsed: set[str] = set()
    selected: dict[str, str] = {}  # module -> path, in the order chosen
    pending: set[str] = set()  # paths selected, not parsed yet
    modules = [names.module_name(p) for p in texts]
    # two files of one module name (a.py and a/__init__.py): parsed, as
    # the first one chosen wins
    twins = {m for m, n in collections.Counter(modules).items() if n > 1}

    def parse(path: str) -> None:
        module = names.module_name(path)
        pending.discard(path)
        if module in scans or path in unparsed:
            return
        tree = pysource.parse(texts, path, parsed)
        if tree is None:
            unparsed.add(path)
            return
        result = _ModuleScan(module, path)
        result.visit(tree)
        scans[module] = result

    def select(path: str) -> None:
        module = names.module_name(path)
        if module in scans or path in unparsed or path in pending:
            return
        selected.setdefault(module, path)
        if not lazy or module in twins or _may_give(path, texts[path]):
            parse(path)
        else:
            pending.add(path)

    for path, text in texts.items():
        if any(ns in text for ns in NAMESPACES) or "ipex_qlinear" in text:
            select(path)
    searched: set[str] = set()  # a text without these was not selected
    for _ in range(3):
        wanted = {m.rsplit(".", 1)[-1] for m, s in scans.items() if s.op_calls}
        wanted -= searched  # a text has not gained them since
        if not wanted:
            break
        searched |= wanted
        for path, text in texts.items():
            if names.module_name(path) not in scans and any(n in text for n in wanted):
                select(path)

    # code that runs inside vLLM ops the tree registers
    registered = reach.opaque_regions(texts)
    while True:
        # where a dotted name resolves to: the modules chosen, parsed or not
        known = set(scans) | {names.module_name(p) for p in pending}
        sites, helpers, seen = _follow(scans, known, registered)
        parts = {p for _, q in helpers for p in q.split(".")}
        maybe = []
        for path in sorted(pending):
            text = texts[path]
            found = {p for p in parts if p in text and _word(p).search(text)}
            if any(set(q.split(".")) <= found for _, q in helpers):
                maybe.append(path)
        if not maybe:
            break
        for path in maybe:
            parse(path)
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


def _follow(
    scans: dict[str, _ModuleScan], known: set[str], registered: list
) -> tuple[dict[str, list[CallSite]], dict, set]:
    """The call sites of the ops, directly and through helpers (functions
    and methods that call an op), followed through imports a few levels
    deep; the helpers; the helper calls seen. `known`: every module chosen
    for the scan, parsed or not (where a dotted name resolves to)."""
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
    seen: set[tuple] = set()
    for _ in range(3):
        new: dict[tuple[str, str], set[str]] = {}
        for scan in scans.values():
            for call, line, function in scan.calls:
                target = _resolve(scan, call.func, known)
                if target is None or target not in helpers:
                    continue
                if target == (scan.module, function):
                    continue
                key = (scan.module, function, line, target)
                if key in seen:
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
    return sites, helpers, seen


def _resolve(
    scan: _ModuleScan, func: ast.expr, known: set[str]
) -> tuple[str, str] | None:
    """(module, qualname) of the function a call expression names, when it
    can be told from the module's imports and definitions."""
    if isinstance(func, ast.Name):
        if func.id in scan.functions:
            return scan.module, func.id
        qualified = names.qualify(func.id, scan.imports)
        return _split(qualified, known) if qualified else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        base = func.value.id
        if base in scan.functions or f"{base}.{func.attr}" in scan.functions:
            return scan.module, f"{base}.{func.attr}"
        qualified = names.qualify(f"{base}.{func.attr}", scan.imports)
        if qualified:
            return _split(qualified, known)
    return None


def _split(dotted: str, known: set[str]) -> tuple[str, str] | None:
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        if module in known:
            return module, ".".join(parts[i:])
    return None
