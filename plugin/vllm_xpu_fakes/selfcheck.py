# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""``python -m vllm_xpu_fakes``: what the plugin does in this environment.

vLLM's own plugin loading runs as in any vLLM process
(``vllm.plugins.load_general_plugins()``: the entry points it finds,
``VLLM_PLUGINS`` honoured), then the report says what came of it: the
platform, vLLM and the kernel packages, the fakes registered, the callees
and copies rebound, the copies out of reach (``plugin.unreached()``: a
search of the whole heap, fine here, not at start-up), whether the tree is
already patched by ``make apply``, and vLLM's compile cache made before the
plugin was installed. ``Report.failures`` says why the fix would not be in
effect (the exit status is 1 then), ``Report.cautions`` what may still keep
it from a start-up without stopping it.
"""

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_xpu_fakes import installed
from vllm_xpu_fakes.plugin import _present

PACKAGE = "vllm_xpu_fakes"
DISTRIBUTION = "vllm-xpu-fakes"
ANY_PLATFORM = "VLLM_XPU_FAKES_ANY_PLATFORM"
KERNEL_PACKAGES = ("vllm_xpu_kernels", "intel_extension_for_pytorch")
PATCHED_MODULE = "vllm._xpu_gemm_fakes"  # what make apply adds to vllm/


@dataclass
class Report:
    lines: list[tuple[str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # the fix is not in effect
    cautions: list[str] = field(default_factory=list)

    def add(self, label: str, text: str) -> None:
        self.lines.append((label, text))

    @property
    def ok(self) -> bool:
        return not self.failures

    def verdict(self) -> str:
        if self.failures:
            return "vllm-xpu-fakes: the fix is NOT in effect here: " + "; ".join(
                self.failures
            )
        more = f" ({len(self.cautions)} caution(s) above)" if self.cautions else ""
        return f"vllm-xpu-fakes: the fix is in effect here{more}"

    def text(self) -> str:
        width = max(len(label) for label, _ in self.lines)
        said = [f"{label + ':':<{width + 1}} {text}" for label, text in self.lines]
        said += [f"CAUTION: {c}" for c in self.cautions]
        return "\n".join([*said, self.verdict()])


def check() -> Report:
    """Load the plugins as vLLM does in this process and report."""
    report = Report()
    here = Path(__file__).resolve().parent
    report.add("vllm-xpu-fakes", f"{_version(DISTRIBUTION)} in {here}")
    report.add("python", f"{sys.version.split()[0]} ({sys.executable})")
    try:
        import torch
        import vllm
        import vllm.plugins
    except Exception as e:  # noqa: BLE001 - said
        report.failures.append(f"vLLM cannot be imported ({type(e).__name__}: {e})")
        return report
    report.add("torch", f"{torch.__version__} (XPU available: {_xpu_available()})")
    report.add("vLLM", f"{vllm.__version__} in {Path(vllm.__file__).parent}")
    points = _entry_points()
    report.add(
        "entry point",
        ", ".join(f"{e.name} = {e.value}" for e in points) + f" ({installed.GROUP})"
        if points
        else f"none for {PACKAGE} in {installed.GROUP}: vLLM cannot find the "
        "plugin (installed without its .dist-info?)",
    )
    name = points[0].name if points else installed.ENTRY_POINT
    allowed = installed.allow_list()
    excluded = installed.loaded_by_vllm(name=name)
    report.add(
        "VLLM_PLUGINS",
        "not set: vLLM loads every plugin"
        if allowed is None
        else excluded or f"{','.join(allowed)!r} names {name!r}",
    )

    # vLLM's own loading of its general plugins, as in every vLLM process
    start = time.perf_counter()
    try:
        vllm.plugins.load_general_plugins()
    except Exception as e:  # noqa: BLE001 - said
        report.failures.append(
            f"vLLM's load_general_plugins() raised {type(e).__name__}: {e}"
        )
    loading = time.perf_counter() - start
    from vllm_xpu_fakes import plugin, say

    say.flush()  # the plugin's line above the report, where vLLM kept it

    state = plugin.state()
    called = state["calls"] > 0
    report.add(
        "load_general_plugins()",
        f"called register() ({', '.join(state['callers']) or '?'}; {loading:.2f} s)"
        if called
        else f"did not call register() ({loading:.2f} s)",
    )

    platform_ok = _platform(report)
    _kernels(report)
    patched = importlib.util.find_spec(PATCHED_MODULE)
    if patched is not None:
        report.add(
            "tree",
            f"patched by make apply ({patched.origin}): the series' fix is in "
            "vLLM's files; the plugin does nothing here, it is not needed",
        )
        if platform_ok:
            _patched_fakes(report)
        _cache(report, here)
        return report
    report.add("tree", f"not patched (no {PATCHED_MODULE.replace('.', '/')}.py)")
    if not called:
        report.failures.append(
            excluded
            or (
                "vLLM did not call the plugin's register(): no entry point"
                if not points
                else "vLLM did not call the plugin's register() (its log above "
                "says why)"
            )
        )
    why_not = plugin.why_not()
    if not called:
        report.add("the plugin", "not called: it did nothing in this process")
    else:
        report.add(
            "the plugin", f"does nothing here: {why_not}" if why_not else "acts here"
        )
    if called and platform_ok and why_not:
        report.failures.append(why_not)
    for step, outcome in state.get("steps", {}).items():
        report.add(f"step {step}", outcome)
        if outcome.startswith("failed"):
            report.failures.append(f"the step {step!r} {outcome}")
    if called and platform_ok and not why_not:
        _plugin_fakes(report, state, plugin)
    else:
        report.add("fakes registered", ", ".join(state["registered"]) or "none")
    if state.get("woq"):
        report.add("IPEX WOQ", state["woq"])
    report.add("callees rebound", ", ".join(state["rebound"]) or "none")
    report.add(
        "copies rebound",
        f"{len(state['copies'])}: {', '.join(state['copies'])}"
        if state["copies"]
        else "none",
    )
    if called and platform_ok and not why_not:
        lying_ops(report, state, plugin)
    if state["rebound"]:
        _unreached(report, plugin)
    for differs in state["differs"]:
        report.add("left as vLLM has it", differs)
    if called:
        report.add("register()", f"{state['seconds']:.3f} s (its last call)")
    _cache(report, here)
    return report


def lying_ops(report: Report, state: dict, plugin) -> None:
    """The image's kernel ops whose schemas hide what they write (the
    contracts' callees of plugin.KERNEL_PACKAGES): each the package has
    must be rebound (compiled, it runs as a vLLM op that declares its
    writes); one it has and that is not rebound is a failure."""
    try:
        contracts = plugin._contracts()
    except Exception as e:  # noqa: BLE001 - said (the rebind step fails too)
        report.add("ops whose schemas lie", f"not checked ({type(e).__name__}: {e})")
        return
    for package in plugin.KERNEL_PACKAGES:
        callees = [c for c in contracts if c.split(".")[0] == package]
        label = f"{package} ops whose schemas lie"
        if not callees:
            continue
        if not _present(package):
            report.add(label, f"{len(callees)} known; not installed here")
            continue
        try:
            importlib.import_module(package)
        except Exception as e:  # noqa: BLE001 - said
            report.failures.append(f"{package} cannot be imported: {e}")
            continue
        has = [c for c in callees if plugin._live(c) is not None]
        rebound = [c for c in has if c in state["rebound"]]
        left = [c for c in has if c not in state["rebound"]]
        report.add(
            label,
            f"{len(rebound)} run as vLLM ops"
            + (
                f": {', '.join(c.rpartition('.')[2] for c in rebound)}"
                if rebound
                else ""
            )
            + f"; {len(callees) - len(has)} of the {len(callees)} known are not in "
            "this package",
        )
        if left:
            report.failures.append(
                f"{package}: {', '.join(left)} not rebound: compiled, what they "
                "write unmarked may be lost"
            )


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown: no distribution metadata)"


def _xpu_available() -> bool:
    import torch

    return bool(hasattr(torch, "xpu") and torch.xpu.is_available())


def _entry_points() -> list:
    """This package's entry points in vLLM's group, as vLLM finds them."""
    found = importlib.metadata.entry_points(group=installed.GROUP)
    return [e for e in found if e.value.partition(":")[0].strip() == PACKAGE]


def _platform(report: Report) -> bool:
    """Whether the plugin would act on this platform (XPU, or any with
    VLLM_XPU_FAKES_ANY_PLATFORM=1); the reason it would not, a failure."""
    try:
        from vllm.platforms import current_platform

        name = type(current_platform).__name__
        xpu = bool(current_platform.is_xpu())
    except Exception as e:  # noqa: BLE001 - said
        name, xpu = f"unknown ({type(e).__name__}: {e})", False
    anyway = os.environ.get(ANY_PLATFORM) == "1"
    if xpu:
        report.add("platform", f"{name} (XPU)")
    elif anyway:
        report.add("platform", f"{name}, not XPU; {ANY_PLATFORM}=1: acted on anyway")
    else:
        report.add("platform", f"{name}, not XPU")
        report.failures.append(
            f"the platform is not XPU ({name}): vLLM runs no XPU kernel here "
            f"({ANY_PLATFORM}=1 makes the plugin act on any platform, for tests)"
        )
    return xpu or anyway


def _kernels(report: Report) -> None:
    said = []
    for package in KERNEL_PACKAGES:
        if not _present(package):
            said.append(f"{package}: not installed")
            continue
        version = getattr(sys.modules.get(package), "__version__", None)
        if version is None:
            version = _version(package)
        said.append(f"{package} {version}")
    report.add("kernels", "; ".join(said))


def registering_modules() -> list[str]:
    """Import vLLM's modules that register the fakes (as vLLM does on an XPU
    once its kernels exist); the ones imported."""
    from vllm_xpu_fakes import plugin

    imported = []
    for module, package in plugin.REGISTERING_MODULES:
        if importlib.util.find_spec(module) is None or not _present(package):
            continue
        importlib.import_module(module)
        imported.append(module)
    return imported


def _existing(*tables) -> list[str]:
    """The ops of the fakes' tables that exist here (the kernels have them)."""
    from vllm_xpu_fakes import _xpu_gemm_fakes as fakes

    return [
        qualname
        for table in tables
        for qualname in table
        if fakes._find_overload(qualname) is not None
    ]


def _missing(report: Report, existing: list[str], registered: list[str]) -> None:
    missing = [q for q in existing if q not in registered]
    if missing:
        report.add("fakes NOT registered", ", ".join(missing))
        report.failures.append(
            f"the kernels have {', '.join(missing)}, and the fix's fake is not "
            "registered for it"
        )
    elif not registered:
        present = [p for p in KERNEL_PACKAGES if _present(p)]
        report.failures.append(
            "no fake is registered: no XPU kernel op exists here"
            + ("" if present else f" (neither {' nor '.join(KERNEL_PACKAGES)})")
        )


def _plugin_fakes(report: Report, state: dict, plugin) -> None:
    from vllm_xpu_fakes import _xpu_gemm_fakes as fakes

    registered = state["registered"]
    report.add("fakes registered", ", ".join(registered) or "none")
    for module, package in plugin.REGISTERING_MODULES:
        if module in sys.modules or not _present(package):
            continue
        if importlib.util.find_spec(module) is not None:
            # vLLM imports it to run a model: its own fakes then replace the
            # plugin's (torch >= 2.13), or its import fails (older torch)
            said = [d for d in state["differs"] if d.startswith(f"{module} ")]
            report.failures.append(
                (said[0] if said else f"{module} is not imported")
                + ": the plugin registers its fakes after vLLM's module has "
                "registered vLLM's own, and it has not"
            )
    tables = (fakes.XPU_GEMM_FAKES, fakes.IPEX_GEMM_FAKES, plugin.WRAPPER_FAKES)
    _missing(report, _existing(*tables), registered)


def _patched_fakes(report: Report) -> None:
    """A patched tree registers its own fakes (vllm/_xpu_gemm_fakes.py) when
    vLLM imports its registering module: imported here as on an XPU."""
    try:
        imported = registering_modules()
    except Exception as e:  # noqa: BLE001 - said
        report.failures.append(
            f"vLLM's registering module cannot be imported ({type(e).__name__}: {e})"
        )
        return
    tree = sys.modules.get(PATCHED_MODULE)
    if tree is None:
        report.failures.append(
            "no registering module of vLLM imports its fakes "
            f"({', '.join(imported) or 'none imported'})"
        )
        return
    registered = list(tree._registrations)
    report.add(
        "fakes registered",
        f"{', '.join(registered) or 'none'} (by {PATCHED_MODULE}, vLLM's own file)",
    )
    _missing(report, _existing(tree.XPU_GEMM_FAKES, tree.IPEX_GEMM_FAKES), registered)


def _unreached(report: Report, plugin) -> None:
    start = time.perf_counter()
    try:
        unreached = plugin.unreached()
    except Exception as e:  # noqa: BLE001 - said
        report.cautions.append(
            f"the search for copies out of reach failed ({type(e).__name__}: {e})"
        )
        return
    seconds = time.perf_counter() - start
    report.add(
        "copies out of reach",
        f"{'; '.join(unreached) or 'none'} (searched the heap: {seconds:.2f} s)",
    )
    if unreached:
        report.cautions.append(
            f"{len(unreached)} copies of a rebound callee are out of the plugin's "
            "reach: a call through one is not a custom op, and Dynamo cannot "
            "trace it (make audit says whether a model reaches it)"
        )


def _cache(report: Report, here: Path) -> None:
    cache = installed.compile_cache()
    stale = installed.stale_cache(installed.installed_at(here))
    if stale:
        report.cautions.append(stale)
    report.add(
        "compile cache",
        f"{cache}: "
        + (
            "entries made before the plugin was installed (CAUTION below)"
            if stale
            else "nothing made before the plugin was installed"
            if cache.is_dir()
            else "none"
        ),
    )
