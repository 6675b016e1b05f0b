"""The plugin's self-check, `python -m vllm_xpu_fakes` (plugin/vllm_xpu_fakes/
__main__.py, selfcheck.py, opcheck.py), from the wheel `make plugin` builds,
unpacked as pip installs it (its .dist-info too: vLLM finds its entry point
through it).

It runs vLLM's own plugin loading (`load_general_plugins()`), so each run is
a process of its own: a forked test process that puts a release's tree and
the plugin on sys.path, defines the stand-in kernels (and IPEX's stand-in
for 0.14.1) as an XPU host has the real ones where a test needs kernels, and
runs the package's __main__ as `python -m` does (runpy); a real `python -m`
for `--verify` off an XPU, and in make e2e (e2e/tests/
test_plugin_selfcheck.py). Stubbed: the kernels (CPU stand-ins), IPEX (its
stand-in), and for the negative control of `--verify`'s gate
torch.xpu.is_available(). Each verdict has its negative control: the same
set-up with the one thing changed that must change it. Measured: 25 s of
CPU for the 16 tests, pytest's start included (52 s wall on 2 busy cores).
"""

import importlib.abc
import importlib.util
import os
import runpy
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import plugin as plugin_support
from support import releases, standins
from xpufakes.changes.kernels import REFERENCE
from xpufakes.proof import verify
from xpufakes.proof.xpu import extensions, ipex, reference, registering, xpu_kernels

PACKAGE = plugin_support.PACKAGE
IN_EFFECT = "vllm-xpu-fakes: the fix is in effect here"
NOT_IN_EFFECT = "vllm-xpu-fakes: the fix is NOT in effect here: "
IPEX_GEMM = "torch_ipex::fp8_gemm_w8a16.xpu"
CLEARED = ("VLLM_PLUGINS", "VLLM_XPU_FAKES_ANY_PLATFORM", "VLLM_CACHE_ROOT")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plugin's wheel, unpacked as pip installs it."""
    return plugin_support.installed(tmp_path_factory.mktemp("plugin"))


def _lines(out: str) -> dict[str, str]:
    """The report's `label: text` lines by label (vLLM's own log lines,
    printed before it, are not among them)."""
    found = {}
    for line in out.splitlines():
        label, sep, text = line.partition(": ")
        if sep and not line.startswith(("INFO", "WARNING", "DEBUG", "(")):
            found.setdefault(label.rstrip(":").strip(), text.strip())
    return found


# ---------------------------------------------------------------------------
# A process with the stand-in kernels (forked)
# ---------------------------------------------------------------------------


def _kernels(release: str) -> list:
    """The kernels of the release's era as an XPU host has them before vLLM
    is imported (stand-ins): the _xpu_C ops and the kernel package, or the
    torch_ipex ops and IPEX. Keep the libraries referenced."""
    sys.dont_write_bytecode = True
    libraries = standins.define_standins(release)
    if releases.era(release) == "ipex":
        libraries.append(ipex.define_torch_ipex_ops())
        ipex.install_ipex()
    else:
        xpu_kernels.stub_xpu_kernel_package()
    return libraries


def _run_here(site: Path, tree: Path, capsys, monkeypatch, *argv: str, **env: str):
    """`python -m vllm_xpu_fakes` in this (forked) process: the tree and the
    plugin on sys.path, the environment given; (exit status, stdout)."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sys.path[:0] = [str(site), str(tree)]
    monkeypatch.setattr(sys, "argv", [PACKAGE, *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(PACKAGE, run_name="__main__", alter_sys=True)
    return done.value.code, capsys.readouterr().out


@pytest.mark.forked
@pytest.mark.parametrize("any_platform", [False, True])
def test_on_a_cpu_host_it_says_not_xpu_and_fails(
    any_platform, site, tmp_path, capsys, monkeypatch
):
    """vLLM 0.33.0 on the path, a CPU torch, no kernels: vLLM's platform is
    not XPU, the plugin does nothing: exit 1, and the last line says why.
    The negative control: with VLLM_XPU_FAKES_ANY_PLATFORM=1 the platform is
    no reason (what is left: no kernel package here)."""
    tree = releases.pristine("0.33.0")
    env = {"VLLM_XPU_FAKES_ANY_PLATFORM": "1"} if any_platform else {}
    code, out = _run_here(
        site, tree, capsys, monkeypatch, VLLM_CACHE_ROOT=str(tmp_path), **env
    )
    said, last = _lines(out), out.splitlines()[-1]
    assert code == 1, out
    assert said["vLLM"] == f"0.33.0 in {tree / 'vllm'}", said
    assert said["load_general_plugins()"].startswith("called register()"), said
    assert said["entry point"].startswith("xpu_fakes = vllm_xpu_fakes:register")
    if not any_platform:
        assert said["platform"] == "UnspecifiedPlatform, not XPU", said
        assert last.startswith(NOT_IN_EFFECT + "the platform is not XPU"), last
    else:
        assert "platform" not in last, last
        assert last == NOT_IN_EFFECT + (
            "no fake is registered: no XPU kernel op exists here (neither "
            "vllm_xpu_kernels nor intel_extension_for_pytorch)"
        ), last


# A module of vLLM's (a downstream's file in vllm/) that took copies of
# IPEX's functions before vLLM loaded the plugins: a global, which the
# plugin's sweep rebinds, and a default argument, which no sweep can.
COPIES = """
from intel_extension_for_pytorch.llm.functional import gelu_and_mul, silu_and_mul


def gelu(x, out, kernel=gelu_and_mul):
    kernel(x, out)
"""


def _vllm_module(name: str, source: str, directory: Path):
    """`source` imported as vLLM's module vllm.<name> (vLLM imported first,
    from the tree on sys.path; the tree in the cache is not written to)."""
    import vllm

    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"vllm.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    setattr(vllm, name, module)
    return module


class _Failing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """vLLM's vllm/_ipex_ops.py found, and raising when it is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "vllm._ipex_ops":
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise RuntimeError("a fault in vLLM's module")


def _stale_cache(root: Path) -> None:
    """vLLM's compile cache with an entry from before the plugin was installed."""
    entry = root / "torch_compile_cache" / "a1b2"
    entry.mkdir(parents=True)
    os.utime(entry, (1_000_000_000, 1_000_000_000))


@pytest.mark.forked
@pytest.mark.parametrize(
    "fault", ["none", "fake refused", "step failed", "vLLM's module fails"]
)
def test_unpatched_with_the_kernels_the_fix_is_in_effect(
    fault, site, tmp_path, capsys, monkeypatch
):
    """0.14.1 unpatched, IPEX's kernels (stand-ins), VLLM_XPU_FAKES_ANY_PLATFORM
    =1: the plugin registers the GEMM's fake, wraps IPEX's WOQ linear modules,
    rebinds IPEX's untraceable functions; exit 0, and the report says what,
    the copy out of reach and the stale compile cache as cautions. The
    negative controls, each exit 1: the fake refused by the plugin (its
    schema made not the op's), so the kernels have an op the fix has no fake
    for; the rebinding step failing (its module cannot be imported); vLLM's
    registering module failing to import, so the fake the plugin registered
    is not the newest once vLLM imports it."""
    tree = releases.pristine("0.14.1")
    libraries = _kernels("0.14.1")  # noqa: F841
    sys.path.insert(0, str(tree))
    _vllm_module("downstream_copies", COPIES, tmp_path)

    cache = tmp_path / "vllm-cache"
    _stale_cache(cache)
    if fault == "fake refused":
        sys.path.insert(0, str(site))
        from vllm_xpu_fakes import _xpu_gemm_fakes as fakes

        schema, fake = fakes.IPEX_GEMM_FAKES[IPEX_GEMM]
        fakes.IPEX_GEMM_FAKES[IPEX_GEMM] = fakes.FakeSpec(schema + " ", fake)
    elif fault == "step failed":
        monkeypatch.setitem(sys.modules, f"{PACKAGE}._xpu_opaque_calls", None)
    elif fault == "vLLM's module fails":
        monkeypatch.setattr(sys, "meta_path", [_Failing(), *sys.meta_path])
    code, out = _run_here(
        site,
        tree,
        capsys,
        monkeypatch,
        VLLM_XPU_FAKES_ANY_PLATFORM="1",
        VLLM_CACHE_ROOT=str(cache),
    )
    said, last = _lines(out), out.splitlines()[-1]
    assert said["tree"].startswith("not patched"), said
    assert said["platform"].endswith("VLLM_XPU_FAKES_ANY_PLATFORM=1: acted on anyway")
    assert said["kernels"].startswith("vllm_xpu_kernels: not installed; "), said
    assert "CAUTION: vLLM's compile cache" in out
    if fault == "none":
        assert code == 0, out
        assert last == f"{IN_EFFECT} (2 caution(s) above)", last
        assert said["fakes registered"] == IPEX_GEMM, said
        assert "IPEXWeightOnlyQuantizedLinear.from_weight" in said["IPEX WOQ"]
        rebound = said["callees rebound"].split(", ")
        assert "intel_extension_for_pytorch.llm.functional.silu_and_mul" in rebound
        assert said["copies rebound"] == (
            "2: vllm.downstream_copies.gelu_and_mul, "
            "vllm.downstream_copies.silu_and_mul"
        ), said
        assert said["copies out of reach"].startswith(
            "intel_extension_for_pytorch.llm.functional.gelu_and_mul in a default "
            "argument of vllm.downstream_copies.gelu (searched the heap: "
        ), said
        assert said["step fakes"] == said["step rebind"] == "done", said
    elif fault == "fake refused":
        assert code == 1, out
        assert said["fakes NOT registered"] == IPEX_GEMM, said
        assert last == NOT_IN_EFFECT + (
            f"the kernels have {IPEX_GEMM}, and the fix's fake is not registered for it"
        ), last
    elif fault == "vLLM's module fails":
        assert code == 1, out
        assert said["fakes registered"] == IPEX_GEMM, said  # but too early
        assert last == NOT_IN_EFFECT + (
            "vllm._ipex_ops cannot be imported (RuntimeError: a fault in vLLM's "
            "module): the plugin registers its fakes after vLLM's module has "
            "registered vLLM's own, and it has not"
        ), last
    else:
        assert code == 1, out
        assert said["step rebind"].startswith("failed ("), said
        assert said["step rebind"].endswith("; undone, as vLLM has it"), said
        assert last.startswith(NOT_IN_EFFECT + "the step 'rebind' failed ("), last
        assert said["callees rebound"] == "none", said


@pytest.mark.forked
@pytest.mark.parametrize("fault", ["none", "the tree's fake refused"])
def test_a_tree_patched_by_make_apply(fault, site, tmp_path, capsys, monkeypatch):
    """0.14.1 patched by make apply: the plugin does nothing, the tree's own
    fake (vllm/_xpu_gemm_fakes.py) is registered once vLLM imports its
    registering module: exit 0, said so. The negative control: the tree's
    fake refused (its table's schema made not the op's): exit 1, the op
    named."""
    tree = releases.patched("0.14.1")
    libraries = _kernels("0.14.1")  # noqa: F841
    if fault != "none":
        sys.path.insert(0, str(tree))
        import vllm._xpu_gemm_fakes as fakes

        assert Path(fakes.__file__).is_relative_to(tree)
        schema, fake = fakes.IPEX_GEMM_FAKES[IPEX_GEMM]
        fakes.IPEX_GEMM_FAKES[IPEX_GEMM] = fakes.FakeSpec(schema + " ", fake)
    code, out = _run_here(
        site, tree, capsys, monkeypatch, VLLM_XPU_FAKES_ANY_PLATFORM="1"
    )
    said, last = _lines(out), out.splitlines()[-1]
    assert said["tree"].startswith(
        f"patched by make apply ({tree / 'vllm' / '_xpu_gemm_fakes.py'})"
    ), said
    assert said["load_general_plugins()"].startswith("called register()"), said
    if fault == "none":
        assert code == 0, out
        assert last == IN_EFFECT, last
        assert said["fakes registered"] == (
            f"{IPEX_GEMM} (by vllm._xpu_gemm_fakes, vLLM's own file)"
        ), said
    else:
        assert code == 1, out
        assert said["fakes NOT registered"] == IPEX_GEMM, said
        assert last.startswith(NOT_IN_EFFECT + f"the kernels have {IPEX_GEMM}")


@pytest.mark.forked
@pytest.mark.parametrize(
    "allowed, loads",
    [("other", False), ("other,xpu_fakes", True), ("other, xpu_fakes", False)],
)
def test_vllm_plugins_without_the_plugin(
    allowed, loads, site, tmp_path, capsys, monkeypatch
):
    """VLLM_PLUGINS set without the plugin's entry point name: vLLM's
    load_general_plugins() does not call register(), the self-check says so
    and fails. The negative control: the name in the list, exit 0 (0.33.0's
    kernels, the plugin's fakes over vLLM's own). vLLM compares the names as
    written: ' xpu_fakes' is not the plugin's, and the report agrees with
    what vLLM did."""
    tree = releases.pristine("0.33.0")
    libraries = _kernels("0.33.0")  # noqa: F841
    code, out = _run_here(
        site,
        tree,
        capsys,
        monkeypatch,
        VLLM_XPU_FAKES_ANY_PLATFORM="1",
        VLLM_PLUGINS=allowed,
        VLLM_CACHE_ROOT=str(tmp_path),
    )
    said, last = _lines(out), out.splitlines()[-1]
    if loads:
        assert code == 0, out
        assert last == IN_EFFECT, last
        assert said["VLLM_PLUGINS"] == "'other,xpu_fakes' names 'xpu_fakes'"
        assert said["load_general_plugins()"].startswith("called register()")
        registered = said["fakes registered"].split(", ")
        assert {"_xpu_C::fp8_gemm_w8a16", "vllm::xpu_fp8_bmm"} <= set(registered)
    else:
        assert code == 1, out
        assert said["load_general_plugins()"].startswith("did not call register()")
        assert said["the plugin"] == "not called: it did nothing in this process"
        why = f"VLLM_PLUGINS={allowed!r} does not name 'xpu_fakes'"
        assert said["VLLM_PLUGINS"].startswith(why), said
        assert last.startswith(NOT_IN_EFFECT + why), last
        assert said["fakes registered"] == "none", said


def test_make_audit_and_the_self_check_read_one_source(site):
    """What vLLM does with VLLM_PLUGINS and where its compile cache is: the
    plugin's installed.py, shipped in the wheel, and loaded by its path by
    make audit's module (scripts/xpufakes/proof/plugin.py), which keeps no
    copy. Its entry point name is the wheel's. vLLM compares the names of
    VLLM_PLUGINS as written (vllm/envs.py splits at commas and strips
    nothing): ' xpu_fakes' is not the plugin's (the tool stripped them
    before; the forked run above shows vLLM agreeing)."""
    import importlib.metadata

    from xpufakes.common import paths
    from xpufakes.proof import plugin as installed_plugin

    shared = installed_plugin.SHARED
    assert Path(shared.__file__) == paths.REPO / "plugin" / PACKAGE / "installed.py"
    assert (site / PACKAGE / "installed.py").read_bytes() == Path(
        shared.__file__
    ).read_bytes()
    (dist,) = importlib.metadata.distributions(path=[str(site)])
    points = {
        (e.group, e.name) for e in dist.entry_points if e.value == f"{PACKAGE}:register"
    }
    assert points == {(shared.GROUP, shared.ENTRY_POINT)}
    for value, loads in [("other,xpu_fakes", True), ("other, xpu_fakes", False)]:
        said = installed_plugin.loaded_by_vllm({"VLLM_PLUGINS": value})
        assert (said == "") is loads, said
    assert said.endswith("vLLM compares the names as written: ' xpu_fakes'"), said


# ---------------------------------------------------------------------------
# --verify: the grid shipped from the in-tree tests' source
# ---------------------------------------------------------------------------


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as files:
        return {name: files.read(name) for name in files.namelist()}


def grid_differences(members: dict[str, bytes]) -> list[str]:
    """How the wheel's grid differs from the in-tree tests' (the module the
    tests and make verify-xpu load: xpufakes.changes.kernels.REFERENCE)."""
    shipped = members.get(f"{PACKAGE}/{REFERENCE.name}")
    if shipped is None:
        return [f"{REFERENCE.name}: not shipped"]
    return [] if shipped == REFERENCE.read_bytes() else [f"{REFERENCE.name}: differs"]


def test_the_wheel_ships_the_grid_of_the_in_tree_tests(tmp_path):
    """One source: the wheel's xpu_gemm_reference.py is the overlay's, byte
    for byte. Negative controls: a copy edited, a wheel without it."""
    members = _members(plugin_support.build(tmp_path / "dist"))
    assert grid_differences(members) == []
    name = f"{PACKAGE}/{REFERENCE.name}"
    edited = dict(members, **{name: members[name] + b"# edited\n"})
    assert grid_differences(edited) == [f"{REFERENCE.name}: differs"]
    members.pop(name)
    assert grid_differences(members) == [f"{REFERENCE.name}: not shipped"]


def test_verify_off_xpu_says_it_cannot_run_here(site, tmp_path):
    """No Intel GPU: `python -m vllm_xpu_fakes --verify` says so and exits
    77 (not a failure), as make verify-xpu does; nothing else is needed for
    that (no vLLM on the path). Its negative control is the next test."""
    environ = {k: v for k, v in os.environ.items() if k not in CLEARED}
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, "--verify"],
        capture_output=True,
        text=True,
        env=dict(environ, PYTHONPATH=str(site)),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 77, done.stdout + done.stderr
    assert done.stdout.startswith("vllm-xpu-fakes --verify: cannot run here: no Intel")


@pytest.mark.forked
def test_verify_on_an_xpu_runs_the_grid_on_it(site, tmp_path, capsys, monkeypatch):
    """The negative control of the gate: where torch says an XPU is there
    (stubbed: none can be on this host), --verify runs the grid on the
    device "xpu": every case fails here (a CPU torch has no such device),
    and the report says so, exit 1."""
    import torch

    tree = releases.pristine("0.33.0")
    libraries = _kernels("0.33.0")  # noqa: F841
    # an XPU for --verify's gate only (the __main__ module's call): vLLM's
    # platform would otherwise look for the real kernels' native module
    monkeypatch.setattr(
        torch.xpu,
        "is_available",
        lambda: sys._getframe(1).f_globals.get("__name__") == "__main__",
    )
    code, out = _run_here(
        site,
        tree,
        capsys,
        monkeypatch,
        "--verify",
        VLLM_XPU_FAKES_ANY_PLATFORM="1",
        VLLM_CACHE_ROOT=str(tmp_path),
    )
    assert code == 1, out
    lines = out.splitlines()
    assert IN_EFFECT in lines, out  # the self-check's verdict, then the grid
    assert "FAIL: 0 of 8 ops conform on the kernels" in lines, out
    assert "XPU" in out.split("opcheck grid", 1)[1], out  # why each failed
    # schema truth on the image's ops: the ESIMD package is not here, the
    # stand-in _xpu_C::fp8_gemm_out and vLLM's sampler op are, and their cases
    # cannot be made on an "xpu" a CPU torch does not have (said, not counted
    # as confirmed)
    truth = out.split("schema truth on the XPU", 1)[1].split("opcheck grid", 1)[0]
    assert "custom_esimd_kernels_vllm: not installed" in truth, truth
    assert "_xpu_C::fp8_gemm_out: error (the case does not run: " in truth, truth
    counts = [x for x in truth.splitlines() if x.startswith("schema truth: ")]
    assert counts and "confirmed" not in counts[0] and "2 error" in counts[0], truth
    assert lines[-1] == (
        "vllm-xpu-fakes --verify: FAIL: 8 of 8 ops' fakes do not conform to this "
        "XPU's kernels (above); the fix is in effect"
    ), lines[-1]


def _summary(results) -> dict[str, tuple]:
    """op -> (a fake registered, passed, failed, the failed cases)."""
    return {
        r.op: (r.fake in (True, "registered"), r.passed, r.failed, sorted(r.failures))
        for r in results
    }


@pytest.mark.forked
def test_the_shipped_grid_agrees_with_make_verify_xpu(site):
    """The self-check's grid run (opcheck.py, the shipped grid) and make
    verify-xpu's (verify.py, the grid loaded from the checkout) on the same
    ops and fakes: with vLLM 0.33.0's own fakes (unpatched, no plugin) each
    op has cases that pass and cases that fail, and the two runs agree case
    by case; after the plugin's register() the self-check's run passes every
    case (make verify-xpu's does too: tests/test_plugin.py). --quick's
    subset of the grid: the whole grid takes 66 s."""
    tree = releases.pristine("0.33.0")
    libraries = reference.define_standins("vllm-xpu-kernels 0.1.15.4")  # noqa: F841
    xpu_kernels.stub_xpu_kernel_package()
    extensions.stub_vllm_extensions(tree)
    registering.import_registering_module(tree)
    sys.path.insert(0, str(site))
    from vllm_xpu_fakes import opcheck

    before = _summary(opcheck.run("cpu", full=False))
    assert before == _summary(verify.grid("cpu", full=False))
    assert "vllm::xpu_fp8_bmm" in before and "_xpu_C::fp8_bmm" in before
    assert all(failed for _, _, failed, _ in before.values()), before
    assert sum(passed for _, passed, _, _ in before.values()) > 0, before
    registering.load_plugin(site, any_platform=True)
    after = _summary(opcheck.run("cpu", full=False))
    assert set(after) == set(before)
    assert all(
        fake and passed and not failed for fake, passed, failed, _ in after.values()
    )
