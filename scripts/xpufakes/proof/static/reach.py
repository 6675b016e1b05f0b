"""Calls that Dynamo cannot trace, and whether the traced path reaches them:
the second half of the audit and of the proof (the first, scan.py, is the
custom ops and their fakes). Source text only, no import, no torch.

What Dynamo cannot trace (a *sink*):

* a function of a C extension: a vLLM build's native modules (natives.py:
  a downstream's pybind11 `vllm._C.ops.rotary_embedding`) or another
  extension module the tool's Python can find;
* a `ctypes` call (`ctypes.*`, or a function of a library `ctypes.CDLL`
  loaded);
* an IPEX Python API (`intel_extension_for_pytorch.llm.functional.*`,
  `.llm.modules.*`): they run torch_ipex ops registered for the XPU key only;
* a `torch.ops.torch_ipex.*` op: IPEX's XPU build registers no Meta or fake
  kernel for any (its `_meta_registrations.py` is loaded only with a CPU
  build), some are CompositeImplicitAutograd (data/untraceable.toml); an op
  the tree gives a fake that can take one is traceable. The torch_ipex GEMM
  of this project (ops.IPEX_GEMM) and IPEX's WOQ module are the audit's
  (scan.py), not reported twice.

Whether the traced path reaches one is computed backwards, lazily: from each
sink to the functions that call it (any file: a caller is looked for in the
modules whose text names the callee), until an *entry*:

* a `forward` (an nn.Module's), a CustomOp's `forward_native` (what vLLM
  runs with Inductor, by default), a quantization method's `apply` /
  `apply_weights`: traced by default;
* a CustomOp's `forward_xpu`: traced when the op is enabled, by a user's
  `custom_ops` or by vLLM itself (`custom_ops.append("+rms_norm")` under
  sequence parallelism: the configuration code is found and named);
* set-up and weight loading, other platforms' methods (unless an XPU method
  calls them), code inside a vLLM custom op (its body is opaque: MoE, and on
  XPU attention) are not traced: the search stops there.

Calls are resolved through imports, `self` / `cls` / `super()` methods
(through the class hierarchy, across modules, and to overrides: a base
class's `self.forward_xpu()` reaches a subclass's), attributes a class sets
in any method (`self.op = ipex_ops.silu_and_mul`, `self.rotary_emb =
get_rope(...)`: the classes a factory makes), module-level aliases, and
calling a module (its `forward`; a CustomOp's `forward_native` and
`forward_xpu`). A call through anything else (an object whose class the
source does not say) is not followed: a sink whose function nothing calls
that the search can follow is reported as *unresolved*, and counts as
reached if its code is XPU code (its file or function names XPU or IPEX).

The chain of each finding runs from its entry down to the sink, file:line
at each step, and on upwards from the entry through the modules that hold
it (`self.rotary_emb(...)` in an attention's forward, ...) as far as the
source says, to a model's forward where it can.
"""

import ast
import functools
import importlib.machinery
import importlib.util
import re
import sys
import tomllib
from collections import deque
from dataclasses import dataclass, field

from xpufakes.common import paths
from xpufakes.common.ops import IPEX_GEMM, is_ours
from xpufakes.trees import logonce, names, natives
from xpufakes.trees.pysource import Func as _Func
from xpufakes.trees.pysource import Module as _Module
from xpufakes.trees.pysource import SourceTree as _Tree
from xpufakes.trees.pysource import nested_calls
from xpufakes.trees.pysource import walk as _walk

DATA = tomllib.loads((paths.DATA / "untraceable.toml").read_text())

NATIVE, CTYPES, IPEX_API, TORCH_IPEX, LOGGER_ONCE = (
    "a C extension's function",
    "a ctypes call",
    "an IPEX Python API (XPU-only kernels)",
    "a torch_ipex op without a fake",
    "vLLM's logger.*_once (a logging.Logger method)",
)
DEFAULT = "default"
UNRESOLVED = "unresolved"

_SETUP = logonce.SETUP  # set-up the compiled forward never runs
OTHER_PLATFORMS = frozenset(
    {
        "forward_cuda",
        "forward_hip",
        "forward_cpu",
        "forward_tpu",
        "forward_hpu",
        "forward_oot",
        "forward_neuron",
    }
)
_APPLY = frozenset({"apply", "apply_weights"})
# what calling a module runs (a CustomOp dispatches to the last two)
_MODULE_CALLED = frozenset({"forward", "forward_native", "forward_xpu"})
_IPEX = "intel_extension_for_pytorch"
# Other platforms' files: their configuration code is not the XPU's.
_OTHER_PLATFORM_FILES = re.compile(
    r"vllm/platforms/(cuda|rocm|tpu|cpu|neuron|hpu|interface)\.py$"
)


@dataclass(frozen=True)
class Step:
    """One call on a chain: the call at file:line, inside `function`."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


@dataclass
class Finding:
    callee: str  # "vllm._C.ops.rotary_embedding", "torch_ipex::rms_norm_vllm"
    kind: str
    site: Step  # the call itself
    configurations: list[str] = field(default_factory=list)
    chain: list[Step] = field(default_factory=list)  # entry first, the site last
    entry: str = ""  # e.g. "MRotaryEmbedding.forward_native (custom op off)"
    note: str = ""

    @property
    def reached(self) -> bool:
        return bool(self.configurations)

    def at(self, callee: str, kind: str, site: Step) -> "Finding":
        """This function's verdict for one of its sinks."""
        chain = [*self.chain[:-1], site] if self.chain else []
        return Finding(
            callee, kind, site, list(self.configurations), chain, self.entry, self.note
        )


# ---------------------------------------------------------------------------
# Sinks
# ---------------------------------------------------------------------------

# A module may hold a sink only if its text has one of these (a native
# module of vLLM's is named in vLLM's style, natives.NATIVE_STYLE; torch._C
# is not one), or imports a top-level module that is an extension:
#   `._<word>C` (not `torch._C`), `import _<word>C`, a word beginning with
#   `_` and ending in `C` before a `.` (not `._C.<word>Tensor`), or a name.
# Each is searched on its own, from a literal: the word before a `.` from
# the `C.` that ends it (one pattern of them all, which no literal begins,
# took seconds on a kernels-era tree).
_DOTTED_NATIVE = re.compile(r"\._\w*C\b")
_IMPORTED_NATIVE = re.compile(r"import _\w*C\b")
_C_DOT = re.compile(r"C\.(?!\w*Tensor)")
_NAMED = (
    "ctypes",
    "intel_extension_for_pytorch",
    "torch_ipex",
    "cumem_allocator",
    "fs_io_C",
    "spinloop",
)
_TOP_IMPORTS = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.M)


def _may_hold_sinks(text: str) -> bool:
    if logonce.may_trace(text):
        return True
    if any(name in text for name in _NAMED):
        return True
    if _IMPORTED_NATIVE.search(text):
        return True
    for found in _DOTTED_NATIVE.finditer(text):
        if not text.endswith("torch", 0, found.start()):
            return True
    for found in _C_DOT.finditer(text):
        start = found.start()  # back to the first character of C's word
        while start and _is_word(text[start - 1]):
            start -= 1
        if text[start] == "_":
            return True
    return any(_extension_module(top) for top in set(_TOP_IMPORTS.findall(text)))


def _is_word(character: str) -> bool:
    """What `\\w` matches (re: alphanumeric in Unicode, or `_`)."""
    return character.isalnum() or character == "_"


@functools.cache
def _extension_module(top: str) -> bool:
    """Whether a top-level module the tool's Python can find is a C
    extension (found without importing it)."""
    if top in sys.stdlib_module_names or top in ("vllm", "torch", "triton"):
        return False
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    return spec is not None and isinstance(
        spec.loader, importlib.machinery.ExtensionFileLoader
    )


def _sink_of(qualified: str, declared: set[str]) -> tuple[str, str] | None:
    """(callee, kind) if a fully qualified callee is one Dynamo cannot trace."""
    if not qualified:
        return None
    parts = qualified.split(".")
    if parts[:3] == ["torch", "ops", "torch_ipex"] and len(parts) >= 4:
        op = f"torch_ipex::{parts[3]}"
        if is_ours(op) or op == IPEX_GEMM:
            return None
        info = DATA["torch_ipex"].get(parts[3], {})
        can_take_fake = info.get("registration") != "CompositeImplicitAutograd"
        if can_take_fake and any(d.split(".")[0] == op for d in declared):
            return None
        return op, TORCH_IPEX
    ipex_api = parts[0] == _IPEX and parts[1:2] == ["llm"] and len(parts) > 3
    if ipex_api and parts[2] in ("functional", "modules"):
        return qualified, IPEX_API
    if parts[0] == "ctypes":
        return qualified, CTYPES
    if natives.native_root(".".join(parts[:-1])):
        return qualified, NATIVE
    if len(parts) > 1 and _extension_module(parts[0]):
        return qualified, NATIVE
    return None


# ---------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------


_OUTSIDE_FORWARD = tuple(DATA["outside_forward"]["modules"])
_APPLY_NOT_TRACED = logonce.APPLY_NOT_TRACED
_ENCODER_CLASSES = re.compile(DATA["multimodal_encoders"]["class_pattern"])
_ENCODER_ONLY = frozenset(DATA["multimodal_encoders"]["classes"])
ENCODER = "multimodal encoder"


def _encoder_class(owner: str | None) -> bool:
    """A class of a multimodal encoder (not compiled by these releases)."""
    name = (owner or "").rsplit(".", 1)[-1]
    return name in _ENCODER_ONLY or bool(_ENCODER_CLASSES.search(name))


_OTHER_PLATFORM_PARTS = frozenset(DATA["other_platforms"]["name_parts"])


def _outside_forward(module: str) -> bool:
    """Code the compiled forward never runs on XPU (data/untraceable.toml):
    outside the forward, or another platform's."""
    if f"{module}.".startswith(_OUTSIDE_FORWARD):
        return True
    lowered = module.lower()
    if "xpu" in lowered or "ipex" in lowered:
        return False
    words = set(re.split(r"[._]", lowered)) | set(lowered.split("."))
    return bool(words & _OTHER_PLATFORM_PARTS)


def opaque_regions(texts: dict[str, str]) -> list[tuple[tuple, tuple, str]]:
    """(module prefixes, base classes, op) of the code that runs inside a
    vLLM custom op the tree registers (data/untraceable.toml): fused MoE in
    vllm::moe_forward; attention backends in vllm::unified_attention(_with_
    output) when the XPU platform says its attention op is opaque."""
    registered = set()
    for text in texts.values():
        if "register_custom_op" in text:
            registered |= set(re.findall(r"""op_name\s*=\s*["'](\w+)["']""", text))
    xpu = texts.get("vllm/platforms/xpu.py", "")
    match = re.search(r"def opaque_attention_op\(.*?\n((?:\s+.*\n){1,4})", xpu)
    opaque_attention = bool(match) and "return True" in match.group(1)
    regions = []
    for op, region in DATA["opaque_regions"].items():
        if op in registered and (
            opaque_attention or not region.get("if_xpu_opaque_attention")
        ):
            regions.append((tuple(region["modules"]), tuple(region["classes"]), op))
    return regions


def _is_xpu_code(path: str, function: str) -> bool:
    text = f"{path} {function}".lower()
    return "xpu" in text or "ipex" in text


class _Search:
    def __init__(
        self, texts: dict[str, str], declared: set[str], parsed: dict | None = None
    ):
        self.tree = _Tree(texts, parsed)
        self.texts = texts
        # the modules a caller may be in
        self._in_scope = {
            p: t for p, t in texts.items() if not _outside_forward(names.module_name(p))
        }
        self.declared = declared
        self.opaque_regions = opaque_regions(texts)
        self._configs: dict[str, list[str]] = {}
        self._words: dict[str, list[str]] = {}
        self._call_lists: dict = {}
        self._callers: dict = {}
        self._bound: dict = {}
        self._closures: dict = {}

    def traced_closure(self, module: _Module) -> dict:
        """logonce.traced_closure of a module, found once."""
        if module.name not in self._closures:
            self._closures[module.name] = logonce.traced_closure(module.functions)
        return self._closures[module.name]

    # -- what runs inside vLLM's own opaque ops --------------------------------

    def _inside_opaque(self, func: _Func) -> str | None:
        parsed = self.tree.module(func.module)
        if parsed is None:
            return None
        if any(part in parsed.opaque for part in func.qualname.split(".")):
            return "its body is a vLLM custom op's"
        bases = set()
        if func.owner:
            bases = {c for _, c in self.tree.mro(func.module, func.owner)}
        for modules, classes, op in self.opaque_regions:
            if func.module.startswith(modules) or bases & set(classes):
                return f"runs inside vllm::{op}"
        return None

    # -- configurations --------------------------------------------------------

    def configurations(self, op_name: str | None) -> list[str]:
        """The configurations that turn a CustomOp on, by its name."""
        if op_name is None:
            return [
                "custom_ops 'all' (a user's, or any compilation backend but Inductor)"
            ]
        if op_name not in self._configs:
            found = [f"custom_ops '+{op_name}' or 'all' (a user's)"]
            needle = re.compile(rf"""["']\+{re.escape(op_name)}["']""")
            for path, text in sorted(self.texts.items()):
                if _OTHER_PLATFORM_FILES.search(path) or not needle.search(text):
                    continue
                found += [
                    f"vLLM itself: {path}:{line} appends '+{op_name}'"
                    + (f" (if {condition})" if condition else "")
                    for line, condition in _appends(text, needle)
                ]
            self._configs[op_name] = found
        return self._configs[op_name]

    # -- callers ---------------------------------------------------------------

    def entry(self, func: _Func) -> tuple[str, list[str]] | None:
        """(what the entry is, its configurations) if code in this function
        is traced from here on; ("", []) if it is not traced; None if only
        its callers can tell."""
        name = func.name
        if func.qualname == "<module>" or _SETUP.match(name):
            return "", []
        if _outside_forward(func.module):
            return "", []
        if self._inside_opaque(func):
            return "", []
        owner = func.owner
        if _encoder_class(owner):
            return ENCODER, []
        custom = owner is not None and self.tree.is_custom_op(func.module, owner)
        if name == "forward_xpu" and custom:
            op = self.tree.custom_op_name(func.module, owner)
            return f"{func.qualname} (custom op '{op}' on)", self.configurations(op)
        if name == "forward_native" and custom:
            return f"{func.qualname} (custom op off: vLLM's default with Inductor)", [
                DEFAULT
            ]
        if name == "forward" and owner is not None:
            return f"{func.qualname}", [DEFAULT]
        if name in _APPLY and owner is not None:
            if _APPLY_NOT_TRACED.search(owner.rsplit(".", 1)[-1]):
                return "", []
            return f"{func.qualname} (a quantization method's)", [DEFAULT]
        return None

    def _candidates(self, word: str, called: bool = True) -> list[str]:
        """The modules whose text may call `word` (`word(`, or a function
        of that name stored: `= ....word` at the end of a line); with
        called=False, every module that names it."""
        key = (word, called)
        if key not in self._words:
            if called:
                pattern = re.compile(
                    rf"\b{re.escape(word)}\s*\(|=\s*[\w.]*\b{re.escape(word)}\s*$",
                    re.M,
                )
            else:
                pattern = re.compile(rf"\b{re.escape(word)}\b")
            self._words[key] = [
                names.module_name(p)
                for p, text in self._in_scope.items()
                if word in text and pattern.search(text)
            ]
        return self._words[key]

    def called_somewhere(self, func: _Func) -> bool:
        """Whether any module calls something by this function's name (not
        its definition, not a torch op of that name)."""
        pattern = re.compile(rf"\b{re.escape(func.name)}\s*\(")
        own = self.tree.module(func.module)
        node = own.functions.get(func.qualname) if own else None
        inside = range(node.lineno, node.end_lineno + 1) if node else range(0)
        for name in self._candidates(func.name):
            lines = self.texts[self.tree.paths[name]].splitlines()
            for number, line in enumerate(lines, 1):
                if name == func.module and number in inside:
                    continue  # its own body (a callee of the same name)
                stripped = line.strip()
                if (
                    pattern.search(line)
                    and not stripped.startswith(("def ", "async def "))
                    and "torch.ops." not in line
                ):
                    return True
        return False

    def _function_calls(self, module: _Module, qual: str) -> list[ast.Call]:
        key = (module.name, qual)
        if key not in self._call_lists:
            self._call_lists[key] = _calls(module.functions[qual])
        return self._call_lists[key]

    def callers(self, func: _Func) -> list[tuple[_Func, int]]:
        """Every call of `func` the search can resolve, by name (not by
        calling a module: the entries are where that happens): (caller,
        line)."""
        if func not in self._callers:
            self._callers[func] = list(self._find_callers(func, [func.name], False))
        return self._callers[func]

    def holders(self, func: _Func, prefer: str):
        """The calls of the module whose forward (a CustomOp's forward_native
        or forward_xpu) `func` is, from a `forward` of another module,
        language models first (`prefer` first of all): (caller, line),
        lazily. A module is found where it is made: `K(...)`, or a factory
        that makes it (`get_rope(...)`)."""
        cls = (func.owner or "").rsplit(".", 1)[-1]
        words = [cls, *self._factories(func)]
        yield from self._find_callers(func, words, True, prefer)

    def _factories(self, func: _Func) -> list[str]:
        """The functions that make instances of func's class (or a subclass
        whose method it is)."""
        cls = (func.owner or "").rsplit(".", 1)[-1]
        found = []
        for name in self._candidates(cls, called=False):
            module = self.tree.module(name)
            if module is None:
                continue
            for qual in module.functions:
                if "." in qual:
                    continue
                for m, c in self.tree.made_by(name, qual):
                    if self._dispatches_to(m, c, func):
                        found.append(qual)
                        break
        return found

    def _find_callers(self, func: _Func, words, module_call: bool, prefer: str = ""):
        names = set().union(*(self._candidates(w, not module_call) for w in words))
        order = sorted(
            names,
            key=lambda n: (
                not (prefer and prefer in n),
                not n.startswith("vllm.model_executor.models."),
                "ForCausalLM" not in self.texts[self.tree.paths[n]],
                n,
            ),
        )
        for name in order:
            module = self.tree.module(name)
            if module is None:
                continue
            for qual in module.functions:
                if module_call and not qual.endswith(".forward"):
                    continue
                for call in self._function_calls(module, qual):
                    if self._calls(module, qual, call, func, module_call):
                        yield _Func(name, qual), call.lineno

    def _calls(
        self,
        module: _Module,
        scope: str,
        call: ast.Call,
        func: _Func,
        module_call: bool,
    ) -> bool:
        """Whether a call in `scope` of `module` may call `func`."""
        expr = call.func
        owner = scope.rpartition(".")[0] or None
        last = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")
        if last == func.name:
            if isinstance(expr, ast.Attribute):
                base = expr.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls") and owner:
                    if self._self_call(module.name, owner, func):
                        return True
                elif (
                    isinstance(base, ast.Call)
                    and names.dotted(base.func) == "super"
                    and owner
                ):
                    for m, c in self.tree.mro(module.name, owner)[1:]:
                        found = self.tree.method(m, c, func.name)
                        if found is not None:
                            return found == func
                    return False
                elif self._attr_call(module, scope, owner, base, func):
                    return True
            if (
                isinstance(expr, ast.Name)
                and func.module == module.name
                and func.qualname == f"{scope}.{expr.id}"
            ):  # a function defined in this one, called by its name here
                return True
            name = names.dotted(expr)
            if name and name.split(".")[0] not in ("self", "cls"):
                for target in self.tree.resolve_all(module, scope, name):
                    if target[0] == "function" and _Func(target[1], target[2]) == func:
                        return True
        if owner is None:
            return False
        # a function held in an attribute: self.op = ipex_ops.silu_and_mul
        if (
            isinstance(expr, ast.Attribute)
            and isinstance(expr.value, ast.Name)
            and expr.value.id == "self"
            and func in self.tree.function_refs(module.name, owner, expr.attr)
        ):
            return True
        # calling a module: its forward (a CustomOp's dispatch)
        if module_call and isinstance(expr, ast.Attribute | ast.Name | ast.Subscript):
            instances = self._instances_called(module, scope, owner, expr)
            return any(self._dispatches_to(m, c, func) for m, c in instances)
        return False

    def _self_call(self, module: str, owner: str, func: _Func) -> bool:
        """self.<name>() in a method of `owner`: the MRO's method, or an
        override of a subclass (func's class has owner in its MRO)."""
        if self.tree.method(module, owner, func.name) == func:
            return True
        if func.owner is None:
            return False
        mro = self.tree.mro(func.module, func.owner)
        return (module, owner) in mro[1:] and self.tree.method(
            func.module, func.owner, func.name
        ) == func

    def _attr_call(self, module, scope, owner, base, func) -> bool:
        """<x>.<name>() where x is self.<attr> or a name it holds."""
        for m, c in self._instances_called(module, scope, owner, base):
            if self.tree.method(m, c, func.name) == func:
                return True
        return False

    def _instances_called(self, module, scope, owner, expr) -> set:
        """The classes the object of an expression may be an instance of:
        self.<attr>(.<attr>...), or a local name bound from one."""
        if isinstance(expr, ast.Subscript):
            return self._instances_called(module, scope, owner, expr.value)
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id == "self":
                if owner is None:
                    return set()
                return self.tree.instances(module.name, owner, expr.attr)
            found = set()
            for m, c in self._instances_called(module, scope, owner, expr.value):
                found |= self.tree.instances(m, c, expr.attr)
            return found
        if isinstance(expr, ast.Name) and owner is not None:
            found = set()
            for attr in self._bound_attrs(module, scope).get(expr.id, ()):
                found |= self.tree.instances(module.name, owner, attr)
            return found
        return set()

    def _bound_attrs(self, module: _Module, scope: str) -> dict[str, set[str]]:
        """local name -> the self.<attr>s of the expressions it is bound to
        (assignments, for-loop targets) in a function."""
        key = (module.name, scope)
        if key not in self._bound:
            found: dict[str, set[str]] = {}
            for name, value in _bindings(module.functions.get(scope)):
                for inner in _walk(value):
                    if (
                        isinstance(inner, ast.Attribute)
                        and isinstance(inner.value, ast.Name)
                        and inner.value.id == "self"
                    ):
                        found.setdefault(name, set()).add(inner.attr)
            self._bound[key] = found
        return self._bound[key]

    def _dispatches_to(self, module: str, cls: str, func: _Func) -> bool:
        """Whether calling an instance of the class runs func: its forward,
        or for a CustomOp its forward_native or forward_xpu."""
        names = ["forward"]
        forward = self.tree.method(module, cls, "forward")
        if self.tree.is_custom_op(module, cls) and (
            forward is None or forward.qualname.endswith("CustomOp.forward")
        ):
            names = ["forward_native", "forward_xpu"]
        return any(self.tree.method(module, cls, n) == func for n in names)


def _bindings(function: ast.AST | None) -> list[tuple[str, ast.expr]]:
    """(name, expression) of each local binding in a function: assignments
    and for-loop targets."""
    if function is None:
        return []
    found = []
    for node in _walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.append((target.id, node.value))
        elif isinstance(node, ast.For | ast.comprehension):
            targets = [node.target]
            if isinstance(node.target, ast.Tuple):  # for i, layer in enumerate(...)
                targets = node.target.elts
            for target in targets:
                if isinstance(target, ast.Name):
                    found.append((target.id, node.iter))
    return found


def _calls(function: ast.AST) -> list[ast.Call]:
    return [n for n in _walk(function) if isinstance(n, ast.Call)]


def _appends(text: str, needle: re.Pattern) -> list[tuple[int, str]]:
    """(line, the `if` it is under) of each string the needle matches."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    found = []

    def visit(node, conditions):
        for child in ast.iter_child_nodes(node):
            inner = conditions
            if isinstance(node, ast.If) and child in node.body:
                inner = [*conditions, ast.unparse(node.test)]
            elif isinstance(node, ast.If) and child in node.orelse:
                inner = [*conditions, f"not ({ast.unparse(node.test)})"]
            if (
                isinstance(child, ast.Constant)
                and isinstance(child.value, str)
                and needle.fullmatch(repr(child.value))
            ):
                found.append((child.lineno, " and ".join(inner)))
            visit(child, inner)

    visit(tree, [])
    return found


def _sink_calls(module: _Module, search: _Search, declared: set[str]):
    """(function, call, callee, kind) of each sink call in a module."""
    found = []
    ctypes_handles = _ctypes_handles(module)
    loggers = _loggers(module)
    # a `*_once` counts in the functions of the file the forward runs
    # (logonce.traced_closure: what the recipe guards); a helper of another
    # module that logs once is met by the model proof's trace
    traced = search.traced_closure(module) if loggers else {}
    for qual, node in module.functions.items():
        owner = qual.rpartition(".")[0]
        guarded = None
        inner = nested_calls(node, qual)
        for call in _calls(node):
            name = names.dotted(call.func)
            if not name:
                continue
            local = module.local_imports(qual) if qual in traced else {}
            if qual in traced and logonce.logs_once(name, loggers, local):
                if guarded is None:
                    guarded = logonce.guarded_lines(
                        node, lambda n, q=qual: module.qualify_all(n, q)
                    )
                if call.lineno not in guarded:
                    found.append((qual, call, f"{name} (vllm.logger)", LOGGER_ONCE))
                continue
            head = name.split(".")
            if head[0] in ctypes_handles or (
                head[0] == "self"
                and len(head) > 2
                and f"{owner}.{head[1]}" in ctypes_handles
            ):
                found.append((inner.get(id(call), qual), call, name, CTYPES))
                continue
            for qualified in module.qualify_all(name, qual):
                sink = _sink_of(qualified, declared)
                if sink is not None:
                    # a call in a function defined here runs where that
                    # function is called (stored: self._route = route)
                    found.append((inner.get(id(call), qual), call, *sink))
                    break
    return found


def _loggers(module: _Module) -> set[str]:
    """The module-level names bound to a vLLM logger (logonce.py)."""
    return logonce.loggers(module.aliases, module.imports, module.qualify_all)


def _ctypes_handles(module: _Module) -> set[str]:
    """Module-level names and `Class.attr`s bound to a ctypes library."""
    found = set()
    for name, value in module.aliases.items():
        if isinstance(value, ast.Call) and names.qualify(
            names.dotted(value.func), module.imports
        ).startswith("ctypes."):
            found.add(name)
    for key, values in module.attrs.items():
        for value, scope in values:
            if isinstance(value, ast.Call) and names.qualify(
                names.dotted(value.func), module.imports_in(scope)
            ).startswith("ctypes."):
                found.add(key)
    return found


def find(
    texts: dict[str, str],
    declared: set[str] = frozenset(),
    prefer: str = "",
    upwards: bool = True,
    ipex: bool = True,
    parsed: dict | None = None,
) -> list[Finding]:
    """Every sink call in the tree's vllm/ (texts: path -> source), with the
    configurations under which the traced path reaches it and a chain.
    `declared`: the fakes the tree registers (scan.scan); `prefer`: a word
    (a model's module) that chains upwards should end in when they can;
    `upwards`: extend the chains above their entries (the proof, which only
    needs the verdict, does not); `ipex`: whether IPEX is installed with the
    tree (kernels.of_tree: its requirements, else its era) -- without it,
    IPEX's APIs and torch_ipex ops cannot run, and are not on its path.
    `parsed`: the syntax trees, shared with scan.scan (pysource.parse)."""
    search = _Search(texts, declared, parsed)
    findings = []
    explained: dict[_Func, Finding] = {}
    for path, text in sorted(texts.items()):
        name = names.module_name(path)
        if _outside_forward(name) or not _may_hold_sinks(text):
            continue
        module = search.tree.module(name)
        if module is None:
            continue
        for qual, call, callee, kind in _sink_calls(module, search, declared):
            func = _Func(module.name, qual)
            site = Step(path, call.lineno, qual)
            if not ipex and kind in (IPEX_API, TORCH_IPEX):
                finding = Finding(callee, kind, site)
                finding.note = (
                    "not on the tree's path: IPEX is not installed with it "
                    "(its requirements/xpu.txt names vllm-xpu-kernels)"
                )
                findings.append(finding)
                continue
            if kind == LOGGER_ONCE:
                finding = _logged_once(search, module, qual, explained, prefer, upwards)
                finding = finding.at(callee, kind, site)
            else:
                if func not in explained:
                    explained[func] = _explain(search, func, prefer, upwards)
                finding = explained[func].at(callee, kind, site)
            if kind == LOGGER_ONCE and finding.configurations == [UNRESOLVED]:
                # XPU code no chain reaches is counted for a kernel call; a
                # log call there is set-up (the platform's backend choice)
                finding.configurations = []
                finding.note = "not counted: " + finding.note
            env = None
            if kind == LOGGER_ONCE and finding.reached:
                env = logonce.env_condition(module.functions[qual], call.lineno)
            if env:
                # a message logged only under a variable a user sets: said,
                # not counted
                finding.note = (
                    f"reached ({'; '.join(finding.configurations)}) only with "
                    f"{env} set: not counted"
                )
                finding.configurations = []
            findings.append(finding)
    return findings


def _logged_once(
    search: _Search, module: _Module, qual: str, explained: dict, prefer, upwards
) -> Finding:
    """A function of the file's traced closure (logonce.traced_closure):
    its entry's verdict (an entry is found without a search of callers),
    the chain through the file's calls down to the function."""
    links = search.traced_closure(module)
    steps, current = [], qual
    while links[current] is not None:
        caller, line = links[current]
        steps.insert(0, Step(module.path, line, caller))
        current = caller
    entry = _Func(module.name, current)
    if entry not in explained:
        explained[entry] = _explain(search, entry, prefer, upwards)
    found = explained[entry]
    if not steps or not found.chain:
        return found
    chain = [*found.chain[:-1], *steps, Step(module.path, 0, qual)]
    return Finding(
        "", "", found.site, list(found.configurations), chain, found.entry, found.note
    )


def explain(
    texts: dict[str, str], functions: list[tuple[str, str]], parsed: dict | None = None
) -> dict[tuple[str, str], Finding]:
    """(module, qualname) -> whether the traced path reaches code in that
    function, as find's findings say it (configurations, entry, chain from
    the entry down, the function last): schematruth.py asks it of the
    functions that call an op."""
    search = _Search(texts, set(), parsed)
    return {f: _explain(search, _Func(*f), "", False) for f in functions}


def _explain(search: _Search, func: _Func, prefer: str, upwards: bool) -> Finding:
    """Search backwards from a function that holds sinks to the entries: a
    Finding whose callee, kind and site are to be filled in (Finding.at).
    A function defined inside another ("C.__init__.route") is reached where
    it is called: by its name in the function that defines it, or through
    an attribute that stores it (`self._route = route`, called in forward);
    where neither reaches it, it counts as reached where the function that
    defines it is (it may be passed on as a value the search cannot follow),
    so a call in it is never counted as less reached than it was."""
    finding = _search_up(search, func, prefer, upwards)
    outer = _definer(search, func)
    if finding.reached or outer is None:
        return finding
    around = _explain(search, outer, prefer, upwards)
    if not around.reached:
        return finding
    around = Finding(
        "",
        "",
        finding.site,
        list(around.configurations),
        [*around.chain, finding.site] if around.chain else [],
        around.entry,
        around.note,
    )
    around.note = (
        f"{func.qualname} is defined in {outer.qualname}, which the traced path "
        f"reaches; where it is called the search cannot follow"
        + (f" ({finding.note})" if finding.note else "")
    )
    return around


def _definer(search: _Search, func: _Func) -> _Func | None:
    """The function a nested function is defined in, if func is one."""
    module = search.tree.module(func.module)
    head = func.qualname.rpartition(".")[0]
    if module is None or func.qualname in module.functions or not head:
        return None
    while head and head not in module.functions:
        head = head.rpartition(".")[0]
    return _Func(func.module, head) if head else None


def _search_up(search: _Search, func: _Func, prefer: str, upwards: bool) -> Finding:
    """_explain's search, of func itself."""
    site = Step(_path(search, func), 0, func.qualname)
    finding = Finding("", "", site)
    # BFS over callers; parent[f] = (callee it calls, line)
    parent: dict[_Func, tuple[_Func, int] | None] = {func: None}
    queue = deque([func])
    entries: list[tuple[_Func, str, list[str]]] = []
    stopped: list[str] = []
    while queue and len(parent) < 400:
        current = queue.popleft()
        entry = search.entry(current)
        if entry is not None and not entry[1]:
            encoder = entry[0] == ENCODER
            label = " (a multimodal encoder's, not compiled)" if encoder else ""
            stopped.append(current.qualname + label)
            continue
        if entry is not None:
            entries.append((current, *entry))
            # a CustomOp's forward_native can reach its forward_xpu: go on
            # looking for callers of forward_xpu only
            if current.name != "forward_xpu":
                continue
        for caller, line in search.callers(current):
            if caller not in parent:
                parent[caller] = (current, line)
                queue.append(caller)
    if not entries:
        # the functions the search could not go above: nothing it can follow
        # calls them, and they are not entries
        frontier = [
            f for f in parent if search.entry(f) is None and not search.callers(f)
        ]
        called = [f for f in frontier if search.called_somewhere(f)]
        if called:
            top = called[0]
            finding.note = (
                f"no caller of {top.qualname} the scan can follow (it is called "
                "by that name elsewhere, through an object whose class the "
                "source does not say)"
            )
            if any(_is_xpu_code(_path(search, f), f.qualname) for f in [func, *called]):
                finding.configurations = [UNRESOLVED]
                finding.entry = f"{top.qualname} (XPU code: counted as traced)"
                finding.chain = _chain(parent, top, site, search)
        elif frontier:
            finding.note = "not called by its name anywhere in the tree: " + ", ".join(
                f.qualname for f in frontier[:3]
            )
        else:
            finding.note = "not traced: reached only from " + ", ".join(
                sorted(set(stopped))[:3]
            )
        return finding
    # the configurations: the union; the chain: a default entry's if any
    configs: list[str] = []
    for _, _, entry_configs in entries:
        configs += [c for c in entry_configs if c not in configs]
    if DEFAULT in configs:
        configs = [DEFAULT] + [c for c in configs if c != DEFAULT]
    best = next((e for e in entries if DEFAULT in e[2]), entries[0])
    chain = _chain(parent, best[0], site, search)
    finding.configurations = configs
    finding.entry = best[1]
    finding.chain = (_upwards(search, best[0], prefer) if upwards else []) + chain
    return finding


def _chain(parent: dict, top: _Func, site: Step, search=None) -> list[Step]:
    """The calls from `top` down to the sink (parent: the BFS's links)."""
    chain = []
    current = top
    while parent[current] is not None:
        callee, line = parent[current]
        path = _path(search, current) if search else ""
        chain.append(Step(path, line, current.qualname))
        current = callee
    chain.append(site)
    return chain


def _path(search: _Search, func: _Func) -> str:
    parsed = search.tree.module(func.module)
    return parsed.path if parsed else func.module


def _upwards(search: _Search, entry: _Func, prefer: str, depth: int = 6) -> list[Step]:
    """The calls that reach an entry from the modules holding it, as far up
    as the source says (best: to a model's forward), outermost first."""
    chain: list[Step] = []
    current = entry
    seen = {entry}
    for _ in range(depth):
        if _is_model_class(current) and (not prefer or prefer in current.module):
            break
        found = next(
            (
                (f, line)
                for f, line in search.holders(current, prefer)
                if f not in seen and not _encoder_class(f.owner)
            ),
            None,
        )
        if found is None:
            break
        caller, line = found
        chain.insert(0, Step(_path(search, caller), line, caller.qualname))
        seen.add(caller)
        current = caller
    return chain


def _is_model_class(func: _Func) -> bool:
    owner = (func.owner or "").rsplit(".", 1)[-1]
    return func.module.startswith("vllm.model_executor.models.") and owner.endswith(
        ("ForCausalLM", "ForConditionalGeneration", "Model")
    )
