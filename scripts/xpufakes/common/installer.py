"""Install requirements into a venv: uv, told what pip is told.

    PYTHONPATH=scripts python3 -m xpufakes.common.installer VENV_PYTHON ARGS...

The venvs of this repository are made through here: .venv (`make venv`, or
apply when the proof needs torch), .venv-tree and the engine venvs of
`make e2e`. uv unpacks a wheel once into its cache and links it into every
venv that asks for it (torch 2.13.0 goes into four), and compiles the
bytecode on every core: .venv took pip 107 s and takes uv 41 s from an empty
cache, 26 s from a warm one (docs/testing.md). The bytecode is compiled at
install because Python may not write it later: where PYTHONDONTWRITEBYTECODE
is set, every process would compile again all it imports.

uv itself (UV below) is installed once by pip, into ``uv-<version>`` in the
cache directory (paths.cache_dir()), where uv keeps its own cache
(``uv-cache``). uv gets pip's configuration (`pip config list` by the venv's
pip: pip's files and PIP_* variables): the index, the extra indexes, find-links, the
constraints and the CA bundle, and it chooses among the indexes as pip does
(`--index-strategy unsafe-best-match`). If uv cannot be installed, or
XPUFAKES_INSTALLER=pip, pip installs instead.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

from xpufakes.common import children, paths

UV = "0.13.9"
# pip's settings that uv takes, and uv's names for them
PIP_SETTINGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraints",
    "cert": "--cert",
}


def pip_config(python: Path) -> dict[str, list[str]]:
    """pip's settings by name, as the pip of `python` reads them (a later
    source overrides an earlier one), each split into its values."""
    listing = subprocess.run(
        [str(python), "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
    ).stdout
    settings: dict[str, list[str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        section, dot, option = name.rpartition(".")
        if sep and dot and section in (":env:", "global", "install"):
            settings[option] = shlex.split(value.strip().strip("'\""))
    return settings


def uv_options(settings: dict[str, list[str]]) -> list[str]:
    out = ["--index-strategy", "unsafe-best-match"]
    for option, flag in PIP_SETTINGS.items():
        for value in settings.get(option, []):
            out += [flag, value]
    return out


def uv(say) -> Path | None:
    """The pinned uv, installed by pip the first time (one process at a
    time); None if pip cannot install it."""
    home = paths.cache_dir() / f"uv-{UV}"
    binary = home / "bin" / "uv"
    with paths.cache_lock(f"uv-{UV}"):
        if not binary.is_file():
            say(f"installing uv {UV} into {home} (pip)")
            steps = [
                [sys.executable, "-m", "venv", "--clear", str(home)],
                [str(home / "bin" / "python"), "-m", "pip", "install", "-qq"]
                + ["--disable-pip-version-check", f"uv=={UV}"],
            ]
            for step in steps:
                if children.run(step).returncode != 0:
                    say(f"pip could not install uv {UV}: installing with pip instead")
                    return None
    return binary


def command(
    python: Path, args: list[str], *, quiet: bool, say, copy: bool = False
) -> tuple[list[str], dict]:
    """The command that installs `args` (pip install's arguments) into the
    venv of `python`, and its environment. copy: uv copies the files instead
    of linking them from its cache (files that the tests edit in place)."""
    binary = None if os.environ.get("XPUFAKES_INSTALLER") == "pip" else uv(say)
    if binary is None:
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
        return cmd + (["-qq"] if quiet else []) + args, dict(os.environ)
    cmd = [str(binary), "pip", "install", "--python", str(python), "--compile-bytecode"]
    cmd += ["--quiet"] if quiet else []
    cmd += ["--link-mode=copy"] if copy else []
    cmd += uv_options(pip_config(python)) + args
    return cmd, dict(os.environ, UV_CACHE_DIR=str(paths.cache_dir() / "uv-cache"))


def install(python: Path, args: list[str], copy: bool = False) -> None:
    """Install quietly (for make and e2e/venvs.py); CalledProcessError if it
    fails."""
    cmd, env = command(python, args, quiet=True, say=_stderr, copy=copy)
    subprocess.run(cmd, env=env, check=True)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    try:
        install(Path(argv[0]), argv[1:])
    except subprocess.CalledProcessError as error:
        print(
            f"error: {error.cmd[0]} exited with status {error.returncode}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
