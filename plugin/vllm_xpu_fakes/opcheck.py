# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""``python -m vllm_xpu_fakes --verify``: the opcheck grid of the fakes in
effect against the kernels on a device, as the checkout's ``make
verify-xpu`` runs it (scripts/xpufakes/proof/verify.py).

The grid is ``xpu_gemm_reference.py``: the build ships the checkout's
vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py as it is, the
module the in-tree tests and ``make verify-xpu`` take their cases from.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class OpResult:
    op: str
    fake: bool  # a fake is registered
    passed: int = 0
    failed: int = 0
    failures: dict[str, str] = field(default_factory=dict)  # case id -> why

    @property
    def ok(self) -> bool:
        return self.fake and self.failed == 0 and self.passed > 0


def run(device: str, full: bool = True) -> list[OpResult]:
    """Every case of the grid whose op exists here, then vLLM's own ops that
    return a GEMM's output unchanged (the plugin's WRAPPER_FAKES) over that
    GEMM's cases. `full`: the whole grid, as make verify-xpu runs it (else
    its covering subset, --quick)."""
    from vllm_xpu_fakes import xpu_gemm_reference as reference

    results: dict[str, OpResult] = {}
    cases = reference.opcheck_cases(full=full)
    for case in cases:
        if not case.available():
            continue
        overload = "default" if case.overload == "batched" else case.overload
        key = f"{case.namespace}::{case.name}"
        key = key if overload == "default" else f"{key}.{overload}"
        if key not in results:
            results[key] = OpResult(key, _has_fake(key))
        _opcheck(results[key], case.id, case.op, lambda c=case: c.args(device))
    for wrapper, (schema, gemm) in _wrappers().items():
        packet = _packet(wrapper)
        if packet is None:
            continue
        result = results[wrapper] = OpResult(wrapper, _has_fake(wrapper))
        op = packet.default
        out_dtype_optional = "ScalarType? out_dtype" in schema
        for case in cases:
            if f"{case.namespace}::{case.name}" != gemm or case.overload != "default":
                continue
            if not case.available():
                continue
            if case.params.get("out_dtype", 0) is None and not out_dtype_optional:
                continue  # the wrapper's schema does not take None
            _opcheck(result, case.id, lambda o=op: o, lambda c=case: c.args(device))
    return list(results.values())


def _opcheck(result: OpResult, case: str, op: Callable, args: Callable) -> None:
    """opcheck of op() on args() (both made inside: a case whose inputs
    cannot be made on the device is a failure too)."""
    import torch

    from vllm_xpu_fakes import xpu_gemm_reference as reference

    try:
        torch.library.opcheck(op(), args(), test_utils=reference.FAKE_CHECKS)
        result.passed += 1
    except Exception as e:  # noqa: BLE001 - every failure is a result
        result.failed += 1
        result.failures[case] = reason(e)


def _wrappers() -> dict[str, tuple[str, str]]:
    """vLLM's ops whose fake is a GEMM's (plugin.WRAPPER_FAKES): op -> (its
    schema, the GEMM whose fake it takes)."""
    from vllm_xpu_fakes import _xpu_gemm_fakes as fakes
    from vllm_xpu_fakes import plugin

    by_fake = {spec.fake.__name__: op for op, spec in fakes.XPU_GEMM_FAKES.items()}
    return {
        op: (schema, by_fake[fake].partition(".")[0])
        for op, (schema, fake) in plugin.WRAPPER_FAKES.items()
    }


def _packet(qualname: str):
    import torch

    namespace, _, name = qualname.partition("::")
    return getattr(getattr(torch.ops, namespace), name, None)


def _has_fake(qualname: str) -> bool:
    """Whether a fake is registered for the op overload (torch's registry)."""
    from torch._library.simple_registry import singleton

    return singleton.find(qualname).fake_impl.kernel is not None


def reason(error: BaseException) -> str:
    """One line saying why opcheck failed: the sub-test, and the mismatch
    that made it fail (the cause opcheck wraps)."""
    text = str(error)
    match = re.search(r"(test_\w+) failed", text)
    where = f"{match.group(1)}: " if match else ""
    cause = error.__cause__ or error
    message = " ".join(str(cause).split())
    for marker in ("found mismatched tensor metadata: ", "found mismatch in "):
        if marker in message:
            message = message.split(marker, 1)[1]
    return f"{where}{type(cause).__name__}: {message}"[:300]


def table(results: list[OpResult]) -> str:
    """The report: one row per op, its first failure, the verdict last."""
    width = max([len(r.op) for r in results] + [2])
    lines = [f"{'op':<{width}}  fake  passed  failed  first failure"]
    for r in results:
        first = next(iter(r.failures.items()), ("", ""))
        detail = f"{first[0]}: {first[1]}" if first[0] else ""
        fake = "yes" if r.fake else "NONE"
        counts = f"{r.passed:>6}  {r.failed:>6}"
        lines.append(f"{r.op:<{width}}  {fake:<4}  {counts}  {detail[:160]}")
    good = sum(r.ok for r in results)
    verdict = "PASS" if results and good == len(results) else "FAIL"
    lines.append(f"{verdict}: {good} of {len(results)} ops conform on the kernels")
    return "\n".join(lines)
