"""A small tree of a real release: only the files the tool reads or writes
(vllm/__init__.py, the version, the series' targets, tests/kernels/
quantization/), copied from the pinned sdist, so that fault tests can run
many times on a filesystem of a few pages. Its pristine and patched sha256
references are made by copying and by the tool's own in-process apply."""

import os
import re
import shutil
import subprocess
from pathlib import Path

from support import releases
from xpufakes.changes import series
from xpufakes.trees import pins

STRAY = re.compile(r"^\..*\.xpufakes-\d+(\.(new|orig))?$")


def make(version: str, destination: Path, quantization_dir: bool = True) -> Path:
    source = releases.pristine(version)
    loaded = series.load(pins.load().get(version).series)
    wanted = ["PKG-INFO", "vllm/__init__.py", "vllm/_version.py", *loaded.targets]
    if quantization_dir:
        wanted.append("tests/kernels/quantization/__init__.py")
    else:
        wanted.append("tests/kernels/__init__.py")
    for rel in wanted:
        target = destination / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (source / rel).is_file():
            shutil.copy2(source / rel, target)
        else:
            target.write_text("")
    return destination


def references(version: str, work: Path) -> tuple[dict, dict]:
    """(pristine, patched) sha256 of every file of the small tree."""
    pristine = make(version, work / f"ref-pristine-{version}")
    patched = make(version, work / f"ref-patched-{version}")
    releases.apply(patched)
    return releases.file_hashes(pristine), releases.file_hashes(patched)


def strays(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if STRAY.match(p.name)]


def state(root: Path, pristine: dict, patched: dict) -> str:
    hashes = releases.file_hashes(root)
    if hashes == pristine:
        return "pristine"
    if hashes == patched:
        return "patched"
    return "mixed"


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        check=True,
        capture_output=True,
    )


def umount(where: Path) -> None:
    subprocess.run(["umount", str(where)], check=True)


def can_mount() -> str | None:
    """None if this process can mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    return None
