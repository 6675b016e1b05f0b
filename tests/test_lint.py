"""The code is ruff-clean: the tool and tests with the project's rules
(ruff.toml), the files shipped into vLLM with vLLM's (vllm_overlay/ruff.toml),
the plugin for the Pythons vLLM runs on (plugin/ruff.toml)."""

import subprocess
import sys

import pytest

from xpufakes.common import paths


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff(command):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            *command,
            "--no-cache",
            "scripts",
            "tests",
            "vllm_overlay",
            "plugin",
        ],
        cwd=paths.REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
