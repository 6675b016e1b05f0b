"""The code is ruff-clean: the tool and tests with the project's rules
(ruff.toml), the files shipped into vLLM with vLLM's (vllm_overlay/ruff.toml),
the plugin for the Pythons vLLM runs on (plugin/ruff.toml)."""

import subprocess
import sys
import tomllib

import pytest

from support import releases
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


def test_the_overlay_lints_with_the_newest_pins_rules():
    """vllm_overlay/ruff.toml selects and ignores what the newest pinned
    release's pyproject.toml does (a release that tightens the rules, as
    the one after 0.33.0 stopped ignoring F403, F405, B007, UP032, UP042,
    fails here, and the overlay must pass them), but INP (see the file)."""
    pyproject = tomllib.loads(
        (releases.pristine(releases.newest()) / "pyproject.toml").read_text()
    )["tool"]["ruff"]["lint"]
    overlay = tomllib.loads((paths.REPO / "vllm_overlay" / "ruff.toml").read_text())[
        "lint"
    ]
    assert set(overlay["select"]) == set(pyproject["select"]) - {"INP"}
    assert set(overlay["ignore"]) == set(pyproject["ignore"])
