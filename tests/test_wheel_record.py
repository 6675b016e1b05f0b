"""An installed wheel: apply and revert keep vllm-*.dist-info/RECORD true,
so `pip uninstall vllm` removes everything. The wheel is built here from the
pinned sdist's vllm/ files the series reads and writes (a real vLLM wheel is
~400 MB of CUDA binaries), in the wheel format, with the release's version,
and installed for real with pip into a fresh venv."""

import base64
import csv
import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import releases, small_tree, tool

RELEASES = ["0.10.2", "0.33.0"]


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _build_wheel(version: str, out: Path) -> Path:
    tree = small_tree.make(version, out / "src", quantization_dir=False)
    files = {
        p.relative_to(tree).as_posix(): p.read_bytes()
        for p in sorted((tree / "vllm").rglob("*"))
        if p.is_file()
    }
    info = f"vllm-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: xpufakes-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        writer.writerow([name, _digest(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    wheel = out / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def _venv(path: Path) -> tuple[Path, Path]:
    """(python, site-packages) of a fresh venv."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return python, Path(site)


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "-q", "--disable-pip-version-check", *args],
        check=True,
    )


def _record_problems(site: Path) -> list[str]:
    """What RECORD gets wrong about the installed files: a listed file
    whose hash or size differs, a file under vllm/ that is not listed."""
    (info,) = site.glob("vllm-*.dist-info")
    problems = []
    listed = set()
    with open(info / "RECORD", newline="") as f:
        for path, digest, size in csv.reader(f):
            listed.add(path)
            if not digest:
                continue
            data = (site / path).read_bytes() if (site / path).is_file() else None
            if data is None:
                problems.append(f"{path}: listed, missing")
            elif _digest(data) != digest or len(data) != int(size):
                problems.append(f"{path}: hash or size differs")
    for path in (site / "vllm").rglob("*"):
        rel = path.relative_to(site).as_posix()
        if path.is_file() and "__pycache__" not in rel and rel not in listed:
            problems.append(f"{rel}: not listed")
    return problems


def _left(site: Path) -> list[str]:
    return sorted(p.name for p in site.iterdir() if p.name.startswith("vllm"))


@pytest.mark.parametrize("version", RELEASES)
def test_record_through_apply_revert_uninstall(version, tmp_path):
    wheel = _build_wheel(version, tmp_path / "wheel")
    python, site = _venv(tmp_path / "venv")
    _pip(python, "install", "--no-deps", "--no-index", str(wheel))
    (info,) = site.glob("vllm-*.dist-info")
    record = (info / "RECORD").read_bytes()
    assert _record_problems(site) == []

    # negative control: the series applied without RECORD handling
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(site / "vllm", copy / "vllm")
    shutil.copytree(info, copy / info.name)
    releases.apply(copy)
    assert _record_problems(copy)

    result = tool.run("apply", str(site))
    assert result.returncode == 0, result.stderr
    assert _record_problems(site) == []
    added = [p for p in (site / "vllm").glob("_*.py") if "_xpu_gemm_fakes" in p.name]
    assert added
    # as after an import: the bytecode of our files
    subprocess.run([str(python), "-m", "compileall", "-q", str(site / "vllm")])
    _pip(python, "uninstall", "-y", "vllm")
    assert _left(site) == []

    _pip(python, "install", "--no-deps", "--no-index", str(wheel))
    assert tool.run("apply", str(site)).returncode == 0
    result = tool.run("revert", str(site))
    assert result.returncode == 0, result.stderr
    assert (info / "RECORD").read_bytes() == record  # byte-identical
    _pip(python, "uninstall", "-y", "vllm")
    assert _left(site) == []
