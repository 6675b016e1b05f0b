"""`make verify-xpu`: the opcheck grid of every registered XPU GEMM fake
against the real kernels on the device, as a pass/fail table.

On an XPU host it imports the installed vLLM (or the tree given), which
registers the fakes and loads the real kernels, and runs on device "xpu".
Elsewhere it stops with NOT_HERE (77). With --standins it runs the same logic
on the CPU against the stand-in kernels of a kernel release instead.
"""

import json
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
) -> list[OpResult]:
    """The opcheck grid of every registered fake: against the real kernels
    on the XPU, or (standins) the stand-ins of that kernel release on the
    CPU. With `select`, only the ops it names (asked once the tree is
    loaded; an overload counts as its op). With `plugin` (the directory
    this project's vLLM plugin is installed in), the plugin registers once
    the tree is loaded, and what it did goes into `plugin_state`. A Python
    without torch cannot run it (NOT_HERE)."""
    import sys

    try:
        return _run(vllm, standins, full, select, plugin, plugin_state)
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
