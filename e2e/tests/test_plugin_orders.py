"""The plugin's registration order on torch <= 2.12 (0.14.1's venv: torch
2.9.1), with a kernels-era tree's own fakes (vLLM 0.16.0's vllm/_xpu_ops.py,
from its pinned sdist): on this torch a fake registered before vLLM's makes
vLLM's import raise, so the plugin imports vLLM's module first. The same on
torch 2.13, where vLLM's wrong fake would silently win instead:
tests/test_plugin.py."""

import json
import subprocess
import zipfile

import engine
import pytest

TREE_RELEASE = "0.16.0"  # the first kernels-era release (torch 2.9)
SCRIPT = engine.REPO / "e2e" / "engine" / "plugin_orders.py"


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    site = tmp_path_factory.mktemp("plugin")
    with zipfile.ZipFile(engine.plugin_wheel()) as wheel:
        wheel.extractall(site)
    return site


@pytest.mark.parametrize("orders_release", ["0.14.1"])
@pytest.mark.parametrize("order", ["plugin", "vllm-first", "fakes-first"])
def test_registration_order_on_torch_2_9(orders_release, order, plugin_dir, tmp_path):
    venv = engine.venvs.ensure(orders_release)
    out = tmp_path / "out.json"
    done = subprocess.run(
        [str(engine.venvs.python(venv)), str(SCRIPT), order, TREE_RELEASE]
        + [str(plugin_dir)]
        + [str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(engine.ENGINE_ENV, PATH="/usr/bin:/bin", OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0 and out.is_file(), done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["torch"].startswith("2.9."), result
    if order == "fakes-first":
        # the negative control: vLLM's own import refuses the second fake
        assert "already has an fake impl registered" in result["vllm_import"]
    else:
        assert result["owner"] == "vllm_xpu_fakes._xpu_gemm_fakes", result
    if order == "plugin":
        assert result["imported_by_the_plugin"], result
