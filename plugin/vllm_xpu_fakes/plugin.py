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
in vllm::ipex_woq_linear where vLLM        .from_weight wrapped for callers in
makes it                                   vLLM's modules; any other caller gets
                                           IPEX's module as before
0003: each call Dynamo cannot trace, or  each callee of the contracts (a
of a kernel op whose schema lies,          module attribute) rebound to a
rewritten to call torch.ops.vllm.<op>      function that, while Dynamo traces,
                                           calls the op (whose implementation
                                           calls the original) and otherwise
                                           calls the original itself; copies of
                                           it in vLLM's modules and classes are
                                           rebound too
=========================================  =====================================

Nothing changes for any other caller: an eager call of a rebound callee is
the original's call (same return, same writes, any call form); a traced call
the contract does not describe (fewer arguments, another keyword) is the
original's too; only vLLM's modules are swept for copies.

What the plugin decides from is what the live vLLM has (its modules, the
ops and their schemas, the callees and their parameters), never its version
string: downstream builds say `0.10.3.dev0+g01efc7ef7...xpu`. Where what it
finds differs from what it knows (an op's schema, a callee's parameters) it
logs one warning and leaves that part as vLLM has it. It does nothing on a
platform that is not XPU (``VLLM_XPU_FAKES_ANY_PLATFORM=1``: any platform,
for tests on CPU stand-ins), nor on a tree ``make apply`` has patched.

register() runs three steps (fakes, woq, rebind). Each is all or nothing: a
step that fails part-way undoes what it changed (the fakes it registered are
each complete and stay; they are the fix) and is tried again at the next
call. register() may run more than once in a process (vLLM calls it from
several places); a later call does only what an earlier one could not.
Nothing here searches the whole heap: `unreached()` does, for the
self-check and `make audit`, never at start-up.
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

from vllm_xpu_fakes.say import say as _say

ANY_PLATFORM = "VLLM_XPU_FAKES_ANY_PLATFORM"

# vLLM's modules that register its own fakes of the XPU GEMMs (and define
# ipex_ops / xpu_ops), each with the kernel package it needs.
REGISTERING_MODULES = (
    ("vllm._xpu_ops", "vllm_xpu_kernels"),
    ("vllm._ipex_ops", "intel_extension_for_pytorch"),
)
# Kernel packages whose callees the contracts route (an image's ESIMD ops,
# whose schemas hide their writes), imported by the plugin if installed.
KERNEL_PACKAGES = ("custom_esimd_kernels_vllm",)
# A tree patched by the series has this module (make apply).
PATCHED_MODULE = "vllm._xpu_gemm_fakes"
# The modules whose copies of a callee the sweep rebinds, and whose calls of
# IPEXWeightOnlyQuantizedLinear.from_weight get the wrapped module: vLLM's
# (a downstream's patched files are vLLM's modules too).
VLLM = "vllm"

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

# What each callee of the contracts returns to its caller on XPU, which a
# traced call of its wrapper returns too: "" nothing, a parameter's name
# (that argument), "query, key" (a tuple of them), "result" (the op's
# result). Written by `make ops` from data/opaque_calls.toml (callee_returns).
CALLEE_RETURNS = {
    "vllm._C.ops.rotary_embedding": "",
    "vllm._C.ops.rms_norm": "",
    "vllm._C.ops.fused_add_rms_norm": "",
    "intel_extension_for_pytorch.llm.functional.silu_and_mul": "out",
    "intel_extension_for_pytorch.llm.functional.gelu_and_mul": "out",
    "intel_extension_for_pytorch.llm.functional.gelu_quick": "out",
    "intel_extension_for_pytorch.llm.functional.rotary_embedding_batched": "query, key",
    "intel_extension_for_pytorch.llm.functional.rms_norm": "result",
    "intel_extension_for_pytorch.llm.functional.add_rms_norm": "result",
    "intel_extension_for_pytorch.llm.functional.bgmv_shrink": "",
    "intel_extension_for_pytorch.llm.functional.bgmv_expand": "",
    "intel_extension_for_pytorch.llm.functional.bgmv_expand_slice": "",
    "torch.ops.torch_ipex.rms_norm_vllm": "",
    "torch.ops.torch_ipex.fused_add_rms_norm_vllm": "",
    "torch.ops.torch_ipex.rotary_embedding": "",
    "custom_esimd_kernels_vllm.esimd_fused_add_rms_norm": "hidden_states",
    "custom_esimd_kernels_vllm.esimd_fused_add_rms_norm_batched": "hidden_states",
    "custom_esimd_kernels_vllm.esimd_fused_scaled_add_rms_norm": "hidden_states",
    "custom_esimd_kernels_vllm.esimd_gemm_fp8_blockscale": "output",
    "custom_esimd_kernels_vllm.esimd_gemm_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_gemm_int4_pgrp": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp16": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_pert_fused2": "o0",
    "custom_esimd_kernels_vllm.esimd_gemv_int4": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_int4_fused2": "o0",
    "custom_esimd_kernels_vllm.esimd_moe_gelu_tanh_mul": "output",
    "custom_esimd_kernels_vllm.esimd_moe_topk": "top_values",
    "custom_esimd_kernels_vllm.esimd_norm_add_norm": "",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_int4_pert": "output",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_norm_fp16": "",
    "custom_esimd_kernels_vllm.esimd_resadd_norm_gemv_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_resadd_norm_gemv_int4_pert": "output",
    "custom_esimd_kernels_vllm.esimd_rms_norm": "output",
    "custom_esimd_kernels_vllm.esimd_rms_norm_gated": "output",
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused": "output",
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused_seq": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_blockscale_fp16_fused2": "o0",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_fp8_blockscale": "output",
    "torch.ops.moe_ops.moe_forward_full_fp8_block": "output",
    "custom_esimd_kernels_vllm.esimd_qkv_split_norm_rope": "q_out",
    "custom_esimd_kernels_vllm.esimd_gemv_fp16_gelu_mul": "output",
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused_seq_spec": "output",
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
STEPS = ("fakes", "woq", "rebind", "logs")
# vllm/logger.py's methods bound on each vLLM logger; Dynamo refuses any
# logging.Logger method it is not told to ignore (intel/llm-scaler #699)
LOG_ONCE = ("debug_once", "info_once", "warning_once", "error_once")

_STATE: dict = {
    "calls": 0,
    "callers": [],  # the functions that called register()
    "steps": {},  # step -> "done", "not needed", "failed (...)"
    "registered": [],  # ops whose fake is ours
    "differs": [],  # what differs from what the plugin knows (left as is)
    "woq": "",  # how IPEX's WOQ modules are wrapped
    "rebound": [],  # callees now calling their op
    "logs": [],  # vLLM's logger.*_once that Dynamo skips while tracing
    "copies": [],  # copies of a callee rebound (module.name, Class.name)
    "not_reached": [],  # copies out of reach: filled by unreached() only
    "skipped": "",  # why the plugin did nothing
    "said": "",  # the last line said, without its time
    "seconds": 0.0,  # the last register() call's time
}
# id(original) -> (original, wrapper, callee name), for unreached()
_REBOUND: dict[int, tuple[object, object, str]] = {}


def state() -> dict:
    """What register() did in this process (JSON-able)."""
    return {
        k: list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v
        for k, v in _STATE.items()
    }


def register(caller: str = "") -> dict:
    """Make the fix in this process (see the module's docstring); returns
    state(). `caller`: who called (vLLM's load_general_plugins, ...).
    Never raises."""
    start = time.perf_counter()
    _STATE["calls"] += 1
    if caller and caller not in _STATE["callers"]:
        _STATE["callers"].append(caller)
    reason = why_not()
    if reason:
        _STATE["seconds"] = round(time.perf_counter() - start, 4)
        if reason != _STATE["skipped"]:
            _STATE["skipped"] = reason
            _say(f"vllm-xpu-fakes: {reason}: nothing to do ({_STATE['seconds']:.3f} s)")
        return state()
    _STATE["skipped"] = ""
    kernels = _import_registering_modules()
    _step("fakes", _register_fakes)
    if "intel_extension_for_pytorch" in kernels:
        _step("woq", _wrap_ipex_woq)
    else:
        _STATE["steps"]["woq"] = "not needed"
    _step("rebind", _rebind_untraceable_calls)
    _step("logs", _ignore_log_once_while_tracing)
    _STATE["seconds"] = round(time.perf_counter() - start, 4)
    said = summary(kernels)
    if said != _STATE["said"]:
        _STATE["said"] = said
        failed = any(s.startswith("failed") for s in _STATE["steps"].values())
        _say(f"vllm-xpu-fakes: {said} ({_STATE['seconds']:.3f} s)", warning=failed)
    return state()


def summary(kernels: list[str] | None = None) -> str:
    """One line: what is in effect in this process (without the time)."""
    s = _STATE
    said = []
    if kernels is not None and not kernels:
        said.append(
            "no XPU kernel package (vllm_xpu_kernels, intel_extension_for_pytorch) "
            "is importable"
        )
    for step, status in s["steps"].items():
        if status.startswith("failed"):
            said.append(f"{step}: {status}")
    said.append(f"fakes registered: {', '.join(s['registered']) or 'none'}")
    if s["woq"]:
        said.append(s["woq"])
    said.append(
        "calls rebound to custom ops: "
        + (", ".join(s["rebound"]) or "none")
        + (f" (+{len(s['copies'])} copies in vLLM's modules)" if s["copies"] else "")
    )
    if s["logs"]:
        said.append(f"skipped while Dynamo traces: logger.{'/'.join(s['logs'])}")
    if s["differs"]:
        said.append(f"left as vLLM has it: {'; '.join(s['differs'])}")
    return "; ".join(said)


class _Journal:
    """What a step changed, to undo it if the step fails part-way."""

    def __init__(self) -> None:
        self.undo: list[Callable[[], None]] = []

    def setattr(self, owner, name: str, value) -> None:
        space = getattr(owner, "__dict__", {})
        had, old = name in space, space.get(name)  # a class's raw descriptor
        setattr(owner, name, value)
        self.undo.append(
            lambda: setattr(owner, name, old) if had else delattr(owner, name)
        )

    def setitem(self, mapping: dict, key, value) -> None:
        had, old = key in mapping, mapping.get(key)
        mapping[key] = value
        self.undo.append(
            (lambda: mapping.__setitem__(key, old))
            if had
            else (lambda: mapping.pop(key, None))
        )

    def append(self, values: list, value) -> None:
        values.append(value)
        self.undo.append(lambda: values.remove(value))

    def rollback(self) -> None:
        while self.undo:
            self.undo.pop()()


def _step(name: str, run: Callable[[_Journal], str]) -> None:
    """Run one step; if it raises, undo what it changed and say so (the
    next register() tries it again)."""
    journal = _Journal()
    try:
        _STATE["steps"][name] = run(journal) or "done"
    except Exception as e:  # noqa: BLE001 - undone, said, vLLM goes on
        journal.rollback()
        _STATE["steps"][name] = (
            f"failed ({type(e).__name__}: {e}); undone, as vLLM has it"
        )


def _ignore_log_once_while_tracing(journal: _Journal) -> str:
    """vLLM's `logger.*_once` (what vllm/logger.py's init_logger binds on
    each logger, its _METHODS_TO_PATCH) added to torch._dynamo.config
    .ignore_logging_functions: a call the compiled forward runs is skipped
    while Dynamo traces (as the recipe path's `if not
    torch.compiler.is_compiling():` does), and logs as before when run
    eagerly."""
    import torch._dynamo.config as dynamo_config
    from vllm import logger as vllm_logger

    # the name before torch 2.13 (an alias of it since)
    ignored = getattr(dynamo_config, "ignore_logging_functions", None)
    if ignored is None:
        ignored = getattr(dynamo_config, "ignore_logger_methods", None)
    if ignored is None:
        raise RuntimeError("this torch's Dynamo has no ignore_logging_functions")
    # what init_logger binds (0.10.2: the lru_cache'd _print_*_once; later
    # releases: _VllmLogger's methods)
    bound = getattr(vllm_logger, "_METHODS_TO_PATCH", {})
    found = [(name, bound[name]) for name in LOG_ONCE if name in bound]
    if not found:
        return "not needed"
    for name, function in found:
        if function not in ignored:
            ignored.add(function)
            journal.undo.append(lambda f=function: ignored.discard(f))
        if name not in _STATE["logs"]:
            journal.append(_STATE["logs"], name)
    return "done"


# ---------------------------------------------------------------------------
# Where the plugin acts
# ---------------------------------------------------------------------------


def why_not() -> str:
    """Why the plugin does nothing in this process, or ''."""
    if importlib.util.find_spec(VLLM) is None:
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


def is_vllms(module_name: str) -> bool:
    """A module of vLLM (whose copies the sweep rebinds)."""
    return module_name == VLLM or module_name.startswith(VLLM + ".")


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
        _say(f"vllm-xpu-fakes: {what}; left as vLLM has it", warning=True)


# ---------------------------------------------------------------------------
# 0001: the fakes
# ---------------------------------------------------------------------------


def _register_fakes(journal: _Journal) -> str:
    """Each fake is registered whole or not at all (torch.library); one
    registered stays registered (it is the fix), and one that could not be
    is tried again at the next call."""
    from vllm_xpu_fakes import _xpu_gemm_fakes as fakes

    # torch.library.register_fake asks inspect.getmodule for its caller's
    # module; on a miss inspect resolves the file of every loaded module once
    # (0.35 s in a loaded worker, most of register()'s time). Tell it where
    # that caller, _xpu_gemm_fakes._register, is: what it would find itself.
    inspect.modulesbyfile.setdefault(
        os.path.normcase(os.path.abspath(fakes.__file__)), fakes.__name__
    )
    wrappers = {q: (s, getattr(fakes, f)) for q, (s, f) in WRAPPER_FAKES.items()}
    failed = []
    for table in (fakes.XPU_GEMM_FAKES, fakes.IPEX_GEMM_FAKES, wrappers):
        for qualname, (schema, fake) in table.items():
            op = fakes._find_overload(qualname)
            if op is None:
                continue  # the kernels of this process do not have it
            if not fakes.exact_for(qualname, schema, str(op._schema)):
                _differs(f"{qualname}: its schema is {str(op._schema)!r}")
                continue
            try:
                fakes._register(qualname, schema, fake)
            except Exception as e:  # noqa: BLE001 - said, tried again later
                failed.append(f"{qualname}: {type(e).__name__}: {e}")
                continue
            if qualname not in _STATE["registered"]:
                _STATE["registered"].append(qualname)
    if failed:
        return (
            f"failed ({'; '.join(failed)}); the others are registered; "
            "tried again at the next call"
        )
    return "done" if _STATE["registered"] else "not needed"


# ---------------------------------------------------------------------------
# 0002: IPEX's WOQ linear module as one op
# ---------------------------------------------------------------------------


def _wrap_ipex_woq(journal: _Journal) -> str:
    module = sys.modules.get(IPEX_WOQ[0])
    cls = getattr(module, IPEX_WOQ[1], None)
    if cls is None:
        return "not needed"
    raw = inspect.getattr_static(cls, "from_weight", None)
    if raw is None:
        _differs(f"{IPEX_WOQ[1]} has no from_weight")
        return "not needed"
    if getattr(getattr(raw, "__func__", raw), MARK, None) is not None:
        return "done"  # wrapped by an earlier call
    if not isinstance(raw, classmethod | staticmethod):
        _differs(f"{IPEX_WOQ[1]}.from_weight is neither a classmethod nor static")
        return "not needed"
    from vllm_xpu_fakes._ipex_woq_linear import opaque_ipex_woq_linear

    made = raw.__func__
    bound = isinstance(raw, classmethod)  # IPEX's: made(cls, ...) is cls's

    def from_weight(*args, **kwargs):
        module = made(*args, **kwargs)
        if not is_vllms(sys._getframe(1).f_globals.get("__name__", "")):
            return module  # IPEX's own module, for any caller but vLLM
        name, index = WOQ_OUT_FEATURES
        index += bound
        out = kwargs.get(name, args[index] if len(args) > index else None)
        out = getattr(module, "out_features", None) if out is None else out
        if not isinstance(out, int):
            _differs(f"{IPEX_WOQ[1]}.from_weight: no out_features in its call")
            return module
        return opaque_ipex_woq_linear(module, out)

    from_weight.__name__ = from_weight.__qualname__ = "from_weight"
    from_weight.__doc__ = made.__doc__
    setattr(from_weight, MARK, raw)
    journal.setattr(cls, "from_weight", type(raw)(from_weight))
    _STATE["woq"] = (
        f"IPEX WOQ linear modules wrapped as vllm::ipex_woq_linear for vLLM's "
        f"calls of {IPEX_WOQ[1]}.from_weight"
    )
    journal.undo.append(lambda: _STATE.__setitem__("woq", ""))
    return "done"


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


def _is_torch_op(callee) -> bool:
    """A torch op (torch.ops.<ns>.<name>), not anything else that answers
    `overloads` (an object whose every attribute is a name)."""
    import torch

    return isinstance(callee, torch._ops.OpOverloadPacket)


def _arity(callee) -> tuple[int, int] | None:
    """(required, most) positional parameters of a live callee, or None if
    it cannot be told (a C function without a signature)."""
    schemas = []
    if _is_torch_op(callee):
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


def _keywords(callee, names: tuple[str, ...]) -> frozenset[str]:
    """The contract's parameters a call may give by keyword: those the
    callee names the same at the same place (a keyword the callee does not
    take must fail as it would)."""
    try:
        if _is_torch_op(callee):  # its first overload
            schema = getattr(callee, callee.overloads()[0])._schema
            theirs = [a.name for a in schema.arguments]
        else:
            theirs = list(inspect.signature(callee).parameters)
    except (TypeError, ValueError, IndexError, AttributeError):
        return frozenset()
    return frozenset(n for i, n in enumerate(names) if theirs[i : i + 1] == [n])


def _wrapper(name: str, op_name: str, original, params: tuple[str, ...]) -> object:
    """What the callee becomes. Not traced by Dynamo: the original's call,
    as it was (its return, its writes, any call form). Traced, a call the
    contract describes becomes the op's (one node with an exact fake) and
    returns what the callee returns (CALLEE_RETURNS); any other call form
    stays the original's."""
    import torch

    op = getattr(torch.ops.vllm, op_name)
    names = tuple(p.split()[1].partition("=")[0] for p in params)
    optional = frozenset(n for n, p in zip(names, params, strict=True) if "=" in p)
    keywords = _keywords(original, names)
    returns = CALLEE_RETURNS.get(name, "")
    picked = ()  # the arguments it returns
    if returns and returns != "result":
        picked = tuple(names.index(r) for r in returns.split(", "))
    compiling = getattr(torch.compiler, "is_compiling", None) or (
        torch._dynamo.is_compiling
    )

    def bound(args: tuple, kwargs: dict) -> list | None:
        """The contract's arguments in order, or None for a call the
        contract does not describe."""
        if len(args) > len(names):
            return None
        rest = names[len(args) :]
        for key in kwargs:
            if key not in rest or key not in keywords:
                return None
        given = list(args)
        for n in rest:
            if n in kwargs:
                given.append(kwargs[n])
            elif n in optional:
                given.append(None)
            else:
                return None
        return given

    def call(*args, **kwargs):
        if not compiling():
            return original(*args, **kwargs)
        given = bound(args, kwargs)
        if given is None:
            return original(*args, **kwargs)
        result = op(*given)
        if returns == "result":
            return result
        if not picked:
            return None
        if len(picked) == 1:
            return given[picked[0]]
        return tuple(given[i] for i in picked)

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


def _import_kernel_packages() -> None:
    """Import the kernel packages whose callees the contracts route and that
    vLLM imports late (a model's module does): their callees are rebound
    before vLLM's modules copy them (`f = _esimd.f`). A package that is
    not installed is left alone; one that fails to import is said."""
    for package in KERNEL_PACKAGES:
        if package in sys.modules or not _present(package):
            continue
        try:
            importlib.import_module(package)
        except Exception as e:  # noqa: BLE001 - said, the rest goes on
            _differs(f"{package} cannot be imported ({type(e).__name__}: {e})")


def _register_kernel_fakes() -> None:
    """The kernel packages' ops that have no fake at all (KERNEL_FAKES: an
    image's fused MoE kernels) get ours, on the ops themselves (once their
    package is imported); one with another schema is said."""
    from vllm_xpu_fakes import _xpu_opaque_calls as opaque

    for qualname, done in opaque.register_kernel_fakes().items():
        if done == "ours" and qualname not in _STATE["registered"]:
            _STATE["registered"].append(qualname)
        elif done.startswith(("differs: ", "failed: ")):
            _differs(f"{qualname}: {done}: no fake of ours")


def _rebind_untraceable_calls(journal: _Journal) -> str:
    _import_kernel_packages()
    _register_kernel_fakes()
    contracts = {
        name: contract
        for name, contract in _contracts().items()
        if _is_new(_live(name))
    }
    if not contracts:
        return "done" if _STATE["rebound"] else "not needed"
    from vllm_xpu_fakes import _xpu_opaque_calls as opaque

    rebound: dict[int, tuple[object, object, str]] = {}
    for name, (op_name, params, _mutates, _returns) in contracts.items():
        owner, attribute, original = _live(name)
        if not _fits(original, params):
            _differs(f"{name} does not take the parameters ({', '.join(params)})")
            continue
        journal.setitem(opaque._callees, name, original)  # the op's kernel
        wrapper = _wrapper(name, op_name, original, params)
        journal.setattr(owner, attribute, wrapper)
        rebound[id(original)] = (original, wrapper, name)
        journal.append(_STATE["rebound"], name)
    del original
    _sweep(rebound, journal)
    for key, entry in rebound.items():
        journal.setitem(_REBOUND, key, entry)
    return "done" if _STATE["rebound"] else "not needed"


def _is_new(live) -> bool:
    """A callee that exists and is not rebound yet."""
    return live is not None and getattr(live[2], MARK, None) is None


def _sweep(rebound: dict, journal: _Journal) -> None:
    """Rebind the copies of the callees (`from x import f` taken before the
    plugin ran) in the globals of vLLM's loaded modules and in the classes
    they define. Other modules (IPEX's own, third-party code) keep what
    they hold: their calls are not vLLM's."""
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not is_vllms(name) or not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            entry = rebound.get(id(value))
            if entry is not None and entry[0] is value:
                journal.setitem(namespace, key, entry[1])
                journal.append(_STATE["copies"], f"{name}.{key}")
            elif isinstance(value, type) and _defined_in(value, name):
                _sweep_class(value, rebound, journal)


def _defined_in(cls: type, module_name: str) -> bool:
    return type.__getattribute__(cls, "__module__") == module_name


def _binds(value) -> bool:
    """Whether a class attribute holding it becomes a bound method."""
    return hasattr(type(value), "__get__") and not isinstance(
        value, staticmethod | classmethod
    )


def _sweep_class(cls: type, rebound, journal: _Journal) -> None:
    for key, value in list(vars(cls).items()):
        held = value.__func__ if isinstance(value, staticmethod) else value
        entry = rebound.get(id(held))
        if entry is None or entry[0] is not held:
            continue
        wrapper = entry[1]
        if isinstance(value, staticmethod) or (_binds(wrapper) and not _binds(held)):
            wrapper = staticmethod(wrapper)  # stays unbound, as the original was
        journal.setattr(cls, key, wrapper)
        journal.append(_STATE["copies"], f"{cls.__module__}.{cls.__qualname__}.{key}")


# ---------------------------------------------------------------------------
# What the sweep could not reach (on demand: a whole-heap search)
# ---------------------------------------------------------------------------


def unreached() -> list[str]:
    """The copies of a rebound callee that vLLM's code can still call
    through and the sweep could not rebind (a default argument, a closure,
    an object's attribute, a container in a module's global), each said
    once; also kept in state()["not_reached"]. Passes over every object the
    garbage collector tracks: for the self-check and `make audit`, never at
    start-up. Changes nothing; a search that fails says so."""
    try:
        found = _search_holders()
    except Exception as e:  # noqa: BLE001 - said; nothing was changed
        found = [f"unknown: the search failed ({type(e).__name__}: {e})"]
    _STATE["not_reached"] = found
    return list(found)


def _search_holders() -> list[str]:
    found: list[str] = []
    originals = tuple(entry[0] for entry in _REBOUND.values())
    if not originals:
        return found
    ours = {id(_REBOUND), id(originals), id(sys._getframe())}
    ours |= {id(entry) for entry in _REBOUND.values()}
    opaque = sys.modules.get("vllm_xpu_fakes._xpu_opaque_calls")
    if opaque is not None:
        ours.add(id(opaque._callees))
    for _, wrapper, _ in _REBOUND.values():
        call = getattr(wrapper, "_call", wrapper)  # a _ReboundOp's function
        ours |= {id(getattr(wrapper, "__dict__", None)), id(call.__dict__)}
        ours |= {id(cell) for cell in call.__closure__ or ()}
    holders = [
        h
        for h in gc.get_referrers(*originals)
        if id(h) not in ours
        and not isinstance(h, types.FrameType)
        and not _is_torchs(h)
        and not (isinstance(h, dict) and _is_module_dict(h))
    ]
    for holder in holders:
        where = _where_held(holder)
        if where:
            names = [n for o, _, n in _REBOUND.values() if _holds(holder, o)]
            what = f"{', '.join(names) or '?'} in {where}"
            if what not in found:
                found.append(what)
    return found


def _is_torchs(obj) -> bool:
    return (type(obj).__module__ or "").startswith("torch")


def _is_module_dict(holder: dict) -> bool:
    name = holder.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    return getattr(module, "__dict__", None) is holder


def _where_held(holder) -> str:
    """Where in vLLM's code a holder of an original is, as a reader finds
    it: a default argument or a closure of a function, an object's
    attribute, a container in a module's global; '' for what is not vLLM's
    (IPEX's own modules, third-party code: their calls are theirs), what
    nothing reachable holds (garbage of a finished trace), or torch's."""
    kind = type(holder).__name__
    for referrer in gc.get_referrers(holder):
        if isinstance(referrer, types.FunctionType):
            if not is_vllms(referrer.__module__ or ""):
                continue
            function = f"{referrer.__module__}.{referrer.__qualname__}"
            if referrer.__defaults__ is holder or referrer.__kwdefaults__ is holder:
                return f"a default argument of {function}"
            if holder in (referrer.__closure__ or ()):
                return f"a closure of {function}"
        elif isinstance(referrer, dict) and _is_module_dict(referrer):
            if not is_vllms(referrer["__name__"]):
                continue
            key = next((k for k, v in referrer.items() if v is holder), "?")
            return f"a {kind} in {referrer['__name__']}.{key}"
        elif getattr(referrer, "__dict__", None) is holder and is_vllms(
            type(referrer).__module__ or ""
        ):
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
