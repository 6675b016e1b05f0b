"""The vLLM plugin (plugin/) as the tests use it: its wheel, built by
`make plugin`, and the wheel installed into a directory as pip installs a
pure-Python wheel (its files and its .dist-info), for a Python to import;
its build backend, as a module."""

import importlib.util
import subprocess
import types
import zipfile
from pathlib import Path

from xpufakes.common import paths, pluginsource

PACKAGE = pluginsource.package()


def build(directory: Path) -> Path:
    """`make plugin DIST=directory`; the wheel it wrote."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(paths.REPO), "plugin"]
        + [f"DIST={directory}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = directory.glob(f"{PACKAGE}-*-py3-none-any.whl")
    assert done.stdout.strip().endswith(wheel.name), done.stdout
    return wheel


def installed(directory: Path) -> Path:
    """The wheel built and unpacked into `directory` (a site-packages of
    its own); returns the directory."""
    wheel = build(directory / "dist")
    with zipfile.ZipFile(wheel) as files:
        files.extractall(directory / "site")
    return directory / "site"


def backend() -> types.ModuleType:
    """plugin/vllm_xpu_fakes_build.py, the checkout's build backend, loaded
    as a module of its own (not on sys.path)."""
    path = paths.REPO / "plugin" / "vllm_xpu_fakes_build.py"
    spec = importlib.util.spec_from_file_location("vllm_xpu_fakes_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
