# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The patch series' fix, made in memory in each vLLM process.

=========================================  =====================================
the series (files edited once)             the plugin (register(), each process)
=========================================  =====================================
0001: the fakes of _xpu_gemm_fakes.py      vLLM's registering module is imported
registered where vLLM registers its own    first (vllm/_xpu_ops.py; in the IPEX
(vllm/_xpu_ops.py, vllm/_ipex_ops.py),     era vllm/_ipex_ops.py, which imports
and vllm::xpu_fp8_bmm's fake made          IPEX), then the same fakes are
fp8_bmm's                                  registered with allow_override: the
                                           newest registration wins
0002: each IPEX WOQ linear module wrapped  IPEXWeightOnlyQuantizedLinear
in vllm::ipex_woq_linear where vLLM        .from_weight wrapped: each module it
makes it                                   makes comes back wrapped
0003: each call Dynamo cannot trace        each callee of the contracts (a
rewritten to call torch.ops.vllm.<op>      module attribute) rebound to a
(_xpu_opaque_calls.py)                     function that calls the op, whose
                                           implementation calls the original;
                                           copies of it in the globals of the
                                           loaded modules and in classes are
                                           rebound too
=========================================  =====================================

What the plugin decides from is what the live vLLM has (its modules, the
ops and their schemas, the callees and their parameters), never its version
string: downstream builds say `0.10.3.dev0+g01efc7ef7...xpu`. Where what it
finds differs from what it knows (an op's schema, a callee's parameters) it
logs one warning and leaves that part as vLLM has it. It does nothing on a
platform that is not XPU (``VLLM_XPU_FAKES_ANY_PLATFORM=1``: any platform,
for tests on CPU stand-ins), nor on a tree ``make apply`` has patched.

Each step is idempotent, so register() may run more than once in a process
(vLLM calls it from several places); the second call does only what the
first could not (e.g. the kernels' package was not importable yet).
"""

import ast
import gc
import importlib
import importlib.util
import inspect
import os
import re
import sys
import time
import types
from collections.abc import Callable

from vllm_xpu_fakes import logger

ANY_PLATFORM = "VLLM_XPU_FAKES_ANY_PLATFORM"

# vLLM's modules that register its own fakes of the XPU GEMMs (and define
# ipex_ops / xpu_ops), each with the kernel package it needs.
REGISTERING_MODULES = (
    ("vllm._xpu_ops", "vllm_xpu_kernels"),
    ("vllm._ipex_ops", "intel_extension_for_pytorch"),
)
# A tree patched by the series has this module (make apply).
PATCHED_MODULE = "vllm._xpu_gemm_fakes"

# vLLM's own ops that return an XPU GEMM's output as it is, so their fake
# must be that GEMM's: op -> (its schema, the fake of _xpu_gemm_fakes.py).
# Written by `make ops` (scripts/xpufakes/changes/opfacts.py) from
# scripts/xpufakes/common/ops.py WRAPPERS and data/op_schemas.toml [vllm]:
# edit those, not this copy; tests/test_op_facts.py fails where it differs.
WRAPPER_FAKES = {
    "vllm::xpu_fp8_bmm": (
        "vllm::xpu_fp8_bmm(Tensor a, Tensor b, ScalarType out_dtype, Tensor a_scale, "
        "Tensor b_scale, Tensor? bias) -> Tensor",
        "fp8_bmm_fake",
    ),
}

# IPEX's weight-only-quantized linear module class, whose from_weight()
# vLLM's IPEX AWQ / GPTQ / wNa16 methods call.
IPEX_WOQ = (
    "intel_extension_for_pytorch.llm.quantization.woq_linear",
    "IPEXWeightOnlyQuantizedLinear",
)
# from_weight(qweight, scales, zero_points, in_features, out_features, ...)
WOQ_OUT_FEATURES = ("out_features", 4)

MARK = "__vllm_xpu_fakes_original__"  # on what the plugin put in place

_STATE: dict = {
    "calls": 0,
    "callers": [],  # the functions that called register()
    "registered": [],  # ops whose fake is ours
    "differs": [],  # what differs from what the plugin knows (left as is)
    "woq": "",  # how IPEX's WOQ modules are wrapped
    "rebound": [],  # callees now calling their op
    "copies": [],  # copies of a callee rebound (module.name, Class.name)
    "not_reached": [],  # copies the plugin could not rebind
    "skipped": "",  # why the plugin did nothing
    "said": "",  # the last line logged
    "seconds": 0.0,
}


def state() -> dict:
    """What register() did in this process (JSON-able)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in _STATE.items()}


def register(caller: str = "") -> dict:
    """Make the fix in this process (see the module's docstring); returns
    state(). `caller`: who called (vLLM's load_general_plugins, ...)."""
    start = time.perf_counter()
    _STATE["calls"] += 1
    if caller and caller not in _STATE["callers"]:
        _STATE["callers"].append(caller)
    before = {k: len(v) for k, v in _STATE.items() if isinstance(v, list)}
    why_not = _why_not()
    if why_not:
        if why_not != _STATE["skipped"]:
            _STATE["skipped"] = why_not
            logger.info("vllm-xpu-fakes: %s: nothing to do", why_not)
        return state()
    _STATE["skipped"] = ""
    kernels = _import_registering_modules()
    _register_fakes()
    if "intel_extension_for_pytorch" in kernels:
        _wrap_ipex_woq()
    _rebind_untraceable_calls()
    _STATE["seconds"] = round(_STATE["seconds"] + time.perf_counter() - start, 4)
    said = summary(kernels)
    changed = any(len(_STATE[k]) != n for k, n in before.items())
    if changed or _STATE["said"] != said.rpartition(" (")[0]:
        _STATE["said"] = said.rpartition(" (")[0]
        logger.info("vllm-xpu-fakes: %s", said)
    return state()


def summary(kernels: list[str] | None = None) -> str:
    """One line: what the plugin registered, rebound, and could not reach."""
    s = _STATE
    said = []
    if kernels is not None and not kernels:
        said.append(
            "no XPU kernel package (vllm_xpu_kernels, intel_extension_for_pytorch) "
            "is importable"
        )
    said.append(f"fakes registered: {', '.join(s['registered']) or 'none'}")
    if s["woq"]:
        said.append(s["woq"])
    said.append(
        "calls rebound to custom ops: "
        + (", ".join(s["rebound"]) or "none")
        + (f" (+{len(s['copies'])} copies)" if s["copies"] else "")
    )
    said.append(f"could not reach: {'; '.join(s['not_reached']) or 'none'}")
    if s["differs"]:
        said.append(f"left as vLLM has it: {'; '.join(s['differs'])}")
    return "; ".join(said) + f" ({s['seconds']:.3f} s)"


# ---------------------------------------------------------------------------
# Where the plugin acts
# ---------------------------------------------------------------------------


def _why_not() -> str:
    """Why the plugin does nothing in this process, or ''."""
    if importlib.util.find_spec(PATCHED_MODULE.rpartition(".")[0]) is None:
        return "vLLM is not importable"
    if importlib.util.find_spec(PATCHED_MODULE) is not None:
        return (
            "this vLLM is patched by make apply (vllm/_xpu_gemm_fakes.py): "
            "the series' fix is in its files"
        )
    if os.environ.get(ANY_PLATFORM) == "1":
        return ""
    try:
        from vllm.platforms import current_platform

        if current_platform.is_xpu():
            return ""
        return f"the platform is not XPU ({type(current_platform).__name__})"
    except Exception as e:  # noqa: BLE001 - no platform, nothing to fix
        return f"vLLM's platform is unknown ({type(e).__name__}: {e})"


def _present(package: str) -> bool:
    if package in sys.modules:
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _import_registering_modules() -> list[str]:
    """Import vLLM's modules that register its own fakes (as vLLM does on an
    XPU) before ours are registered: on torch <= 2.12 a fake registered
    before vLLM's makes vLLM's import raise, on 2.13+ vLLM's would win.
    Returns the kernel packages present."""
    present = []
    for module, package in REGISTERING_MODULES:
        if importlib.util.find_spec(module) is None or not _present(package):
            continue
        try:
            importlib.import_module(module)
            present.append(package)
        except Exception as e:  # noqa: BLE001 - said, the rest goes on
            _differs(f"{module} cannot be imported ({type(e).__name__}: {e})")
    return present


def _differs(what: str) -> None:
    if what not in _STATE["differs"]:
        _STATE["differs"].append(what)
        logger.warning("vllm-xpu-fakes: %s; left as vLLM has it", what)


# ---------------------------------------------------------------------------
# 0001: the fakes
# ---------------------------------------------------------------------------


def _register_fakes() -> None:
    from vllm_xpu_fakes import _xpu_gemm_fakes as fakes

    registered = fakes.register_xpu_gemm_fakes() + fakes.register_ipex_gemm_fakes()
    for qualname, (schema, name) in WRAPPER_FAKES.items():
        exists = fakes._find_overload(qualname) is not None
        if exists and fakes._register(qualname, schema, getattr(fakes, name)):
            registered.append(qualname)
    for table in (fakes.XPU_GEMM_FAKES, fakes.IPEX_GEMM_FAKES, WRAPPER_FAKES):
        for qualname in table:
            op = fakes._find_overload(qualname)
            if op is not None and qualname not in registered:
                _differs(f"{qualname}: its schema is {str(op._schema)!r}")
    for qualname in registered:
        if qualname not in _STATE["registered"]:
            _STATE["registered"].append(qualname)


# ---------------------------------------------------------------------------
# 0002: IPEX's WOQ linear module as one op
# ---------------------------------------------------------------------------


def _wrap_ipex_woq() -> None:
    module = sys.modules.get(IPEX_WOQ[0])
    cls = getattr(module, IPEX_WOQ[1], None)
    if cls is None or _STATE["woq"]:
        return
    raw = inspect.getattr_static(cls, "from_weight", None)
    if raw is None:
        _differs(f"{IPEX_WOQ[1]} has no from_weight")
        return
    if getattr(raw, MARK, None) is not None:
        return
    from vllm_xpu_fakes._ipex_woq_linear import opaque_ipex_woq_linear

    made = cls.from_weight  # bound to the class if a classmethod

    def from_weight(*args, **kwargs):
        module = made(*args, **kwargs)
        name, index = WOQ_OUT_FEATURES
        out = kwargs.get(name, args[index] if len(args) > index else None)
        out = getattr(module, "out_features", None) if out is None else out
        if not isinstance(out, int):
            _differs(f"{IPEX_WOQ[1]}.from_weight: no out_features in its call")
            return module
        return opaque_ipex_woq_linear(module, out)

    setattr(from_weight, MARK, raw)
    cls.from_weight = staticmethod(from_weight)
    _STATE["woq"] = (
        f"IPEX WOQ linear modules wrapped as vllm::ipex_woq_linear "
        f"({IPEX_WOQ[1]}.from_weight)"
    )


# ---------------------------------------------------------------------------
# 0003: the calls Dynamo cannot trace, as custom ops
# ---------------------------------------------------------------------------


def _contracts() -> dict[str, tuple]:
    """The contracts of _xpu_opaque_calls.py, read without importing it:
    importing it registers its ops, which only a process that has one of
    the callees needs."""
    spec = importlib.util.find_spec("vllm_xpu_fakes._xpu_opaque_calls")
    for node in ast.parse(spec.loader.get_source(spec.name)).body:
        if getattr(getattr(node, "target", None), "id", None) == "CONTRACTS":
            return ast.literal_eval(node.value)
    raise LookupError("no CONTRACTS in _xpu_opaque_calls.py")


def _live(name: str) -> tuple[object, str, object] | None:
    """(owner, attribute, value) of a dotted callee name, found through what
    is already imported (nothing is imported here), or None."""
    parts = name.split(".")
    if parts[:2] == ["torch", "ops"]:
        import torch

        owner = getattr(torch.ops, parts[2])
        try:
            return owner, parts[3], getattr(owner, parts[3])
        except (AttributeError, RuntimeError):
            return None
    owner = sys.modules.get(parts[0])
    for i in range(1, len(parts) - 1):
        owner = getattr(owner, parts[i], None) or sys.modules.get(
            ".".join(parts[: i + 1])
        )
        if owner is None:
            return None
    value = getattr(owner, parts[-1], None)
    return None if value is None else (owner, parts[-1], value)


def _arity(callee) -> tuple[int, int] | None:
    """(required, most) positional parameters of a live callee, or None if
    it cannot be told (a C function without a signature)."""
    schemas = []
    if hasattr(callee, "overloads"):  # a torch op
        schemas = [getattr(callee, o)._schema for o in callee.overloads()]
    if schemas:
        counts = [
            (sum(not a.has_default_value() and not a.kwarg_only for a in s.arguments),
             len(s.arguments))
            for s in schemas
        ]  # fmt: skip
        return min(c[0] for c in counts), max(c[1] for c in counts)
    try:
        parameters = inspect.signature(callee).parameters.values()
    except (TypeError, ValueError):
        return _pybind11_arity(callee)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in parameters if p.kind in kinds]
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return 0, 1 << 30
    required = sum(p.default is p.empty for p in positional)
    return required, len(positional)


def _pybind11_arity(callee) -> tuple[int, int] | None:
    """pybind11 puts the signature first in the docstring:
    `rms_norm(arg0: torch.Tensor, arg1: ..., arg3: float) -> None`."""
    doc = (getattr(callee, "__doc__", None) or "").strip()
    match = re.match(r"\w+\((.*?)\)\s*->", doc)
    if not match:
        return None
    args = [a for a in match.group(1).split(",") if a.strip()]
    return sum("=" not in a for a in args), len(args)


def _fits(callee, params: tuple[str, ...]) -> bool:
    """Whether the live callee takes the contract's parameters."""
    arity = _arity(callee)
    if arity is None:
        return True
    required = sum("=" not in p for p in params)
    return arity[0] <= len(params) and required <= arity[1]


def _wrapper(op_name: str, original, params: tuple[str, ...]) -> Callable:
    """What the callee becomes: a call of the op with the same arguments
    (traced by Dynamo as one op with an exact fake); a call the contract
    does not describe (more arguments, another keyword) goes to the
    original, as before."""
    import torch

    op = getattr(torch.ops.vllm, op_name)
    names = frozenset(p.split()[1].partition("=")[0] for p in params)
    most = len(params)

    def call(*args, **kwargs):
        if len(args) + len(kwargs) > most:
            return original(*args, **kwargs)
        for name in kwargs:
            if name not in names:
                return original(*args, **kwargs)
        return op(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(original, "__name__", op_name)
    call.__doc__ = f"{call.__name__} as torch.ops.vllm.{op_name} (vllm-xpu-fakes)"
    setattr(call, MARK, original)
    if isinstance(original, torch._ops.OpOverloadPacket):
        return _ReboundOp(call, original)
    return call


class _ReboundOp:
    """A torch op's packet as the plugin rebinds it in its namespace: a call
    is the wrapper's, everything else the original packet's (torch iterates
    the packets of a namespace: its overloads, its schemas)."""

    def __init__(self, call: Callable, original) -> None:
        self.__dict__.update(_call=call, **{MARK: original})

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.__dict__[MARK], name)


def _rebind_untraceable_calls() -> None:
    contracts = {
        name: contract
        for name, contract in _contracts().items()
        if _is_new(_live(name))
    }
    if not contracts:
        return
    from vllm_xpu_fakes import _xpu_opaque_calls as opaque

    rebound: dict[int, tuple[object, Callable, str]] = {}
    for name, (op_name, params, _mutates, _returns) in contracts.items():
        owner, attribute, original = _live(name)
        if not _fits(original, params):
            _differs(f"{name} does not take the parameters ({', '.join(params)})")
            continue
        opaque._callees[name] = original  # the op's implementation calls it
        wrapper = _wrapper(op_name, original, params)
        setattr(owner, attribute, wrapper)
        rebound[id(original)] = (original, wrapper, name)
        _STATE["rebound"].append(name)
    del original
    if rebound:
        _sweep(rebound)


def _is_new(live) -> bool:
    """A callee that exists and is not rebound yet."""
    return live is not None and getattr(live[2], MARK, None) is None


def _sweep(rebound: dict[int, tuple[object, Callable, str]]) -> None:
    """Rebind the copies of the callees (`from x import f` taken before the
    plugin ran) in the globals of every loaded module and in their classes;
    then say what still holds an original (a default argument, a closure,
    an instance): those calls stay as they were."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            entry = rebound.get(id(value))
            if entry is not None and entry[0] is value:
                namespace[key] = entry[1]
                _STATE["copies"].append(f"{module.__name__}.{key}")
            elif issubclass(type(value), type) and _defined_in(value, module):
                _sweep_class(value, rebound)
    _find_unreached(rebound)


def _defined_in(cls: type, module) -> bool:
    return type.__getattribute__(cls, "__module__") == module.__name__


def _sweep_class(cls: type, rebound) -> None:
    for key, value in list(vars(cls).items()):
        entry = rebound.get(id(value))
        if entry is not None and entry[0] is value:
            setattr(cls, key, entry[1])
            _STATE["copies"].append(f"{cls.__module__}.{cls.__qualname__}.{key}")


def _find_unreached(rebound) -> None:
    """What still holds an original after the sweep (one pass over the
    objects the garbage collector tracks): each holder vLLM or a downstream
    can call through, said in `not_reached`. torch's own bookkeeping of an
    op (its overloads, a trace's nodes) is not a call site."""
    from vllm_xpu_fakes import _xpu_opaque_calls as opaque

    originals = tuple(entry[0] for entry in rebound.values())
    ours = {id(opaque._callees), id(originals), id(rebound), id(sys._getframe())}
    ours |= {id(entry) for entry in rebound.values()}
    for _, wrapper, _ in rebound.values():
        call = getattr(wrapper, "_call", wrapper)  # a _ReboundOp's function
        ours |= {id(wrapper.__dict__), id(call.__dict__)}
        ours |= {id(cell) for cell in call.__closure__ or ()}
    holders = [
        h
        for h in gc.get_referrers(*originals)
        if id(h) not in ours
        and not isinstance(h, types.FrameType)
        and not _is_torchs(h)
        and not (isinstance(h, dict) and _is_module_dict(h))
    ]
    for holder in holders[:MAX_HOLDERS]:
        where = _where_held(holder)
        if where:
            names = [n for o, _, n in rebound.values() if _holds(holder, o)]
            what = f"{', '.join(names) or '?'} in {where}"
            if what not in _STATE["not_reached"]:
                _STATE["not_reached"].append(what)
    if len(holders) > MAX_HOLDERS:
        _STATE["not_reached"].append(f"{len(holders) - MAX_HOLDERS} more holders")


MAX_HOLDERS = 20  # holders described (each costs a pass over the objects)


def _is_torchs(obj) -> bool:
    return (type(obj).__module__ or "").startswith("torch")


def _is_module_dict(holder: dict) -> bool:
    name = holder.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    return getattr(module, "__dict__", None) is holder


def _where_held(holder) -> str:
    """Where a holder of an original is, as a reader finds it: a default
    argument or a closure of a function, an object's attribute, a container
    in a module's global; '' for what nothing reachable holds (garbage of
    a finished trace) or torch holds."""
    kind = type(holder).__name__
    if kind in ("method", "partial"):
        return f"a {kind}"
    for referrer in gc.get_referrers(holder):
        if isinstance(referrer, types.FunctionType):
            function = f"{referrer.__module__}.{referrer.__qualname__}"
            if referrer.__defaults__ is holder or referrer.__kwdefaults__ is holder:
                return f"a default argument of {function}"
            if holder in (referrer.__closure__ or ()):
                return f"a closure of {function}"
        elif isinstance(referrer, dict) and _is_module_dict(referrer):
            key = next((k for k, v in referrer.items() if v is holder), "?")
            return f"a {kind} in {referrer['__name__']}.{key}"
        elif getattr(referrer, "__dict__", None) is holder and not _is_torchs(referrer):
            return f"an attribute of a {type(referrer).__qualname__} object"
    return ""


def _holds(holder, value) -> bool:
    try:
        if isinstance(holder, dict):
            return any(v is value for v in holder.values())
        if isinstance(holder, list | tuple | set | frozenset):
            return any(v is value for v in holder)
        if type(holder).__name__ == "cell":
            return holder.cell_contents is value
    except Exception:  # noqa: BLE001 - cannot tell
        return False
    return True
