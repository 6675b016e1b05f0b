"""Download a pinned release's official sdist, check it, unpack it to the cache.

The package index is pip's (index.py). The sdist must match the sha256
pinned in patches/pins.toml; a download that does not is discarded. A
release published only as a wheel (0.15.0, 0.15.1) is unpacked as it
installs, vllm/ and its .dist-info, without its native extensions, each
file verified against the wheel's pinned RECORD (wheel.py). A download shows
its progress on stderr (progress.py); a release already in the cache is
silent.
"""

import hashlib
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from xpufakes.common import paths
from xpufakes.trees import index, wheel
from xpufakes.trees.pins import Pin

# In the root of an unpacked release: the pinned sha256 it was verified
# against (the sdist's; a wheel's RECORD's).
_MARKER = ".xpufakes-sdist-sha256"
_WHEEL_MARKER = ".xpufakes-wheel-record-sha256"


def sdist_url(version: str) -> str:
    """The sdist's download address, from the index's project page."""
    return index.listed("vllm", f"vllm-{version}.tar.gz").url


def sdist_path(pin: Pin) -> Path:
    return paths.cache_dir() / "sdists" / f"vllm-{pin.version}.tar.gz"


def tree_path(pin: Pin) -> Path:
    return paths.cache_dir() / "trees" / pin.version


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(pin: Pin, step: str = "") -> Path:
    """The verified sdist in the cache (downloaded if not there yet, its
    progress shown; `step`: "k/N" of several)."""
    target = sdist_path(pin)
    if target.is_file() and _sha256_of(target) == pin.sdist_sha256:
        return target
    url, name = sdist_url(pin.version), f"vllm-{pin.version}.tar.gz"
    return index.download(url, name, pin.sdist_sha256, target.parent, step)


def cached(pin: Pin) -> bool:
    """Whether the release is unpacked and verified in the cache."""
    marker = tree_path(pin) / (_WHEEL_MARKER if pin.wheel else _MARKER)
    return marker.is_file() and marker.read_text().strip() == pin.verified_by


def fetch_all(chosen: list[Pin]) -> Iterator[tuple[Pin, Path]]:
    """fetch() each release, in turn; when there are several, the downloads
    are numbered "k/N" (N: how many are not in the cache yet)."""
    missing = [pin.version for pin in chosen if not cached(pin)]
    for pin in chosen:
        step = ""
        if len(chosen) > 1 and pin.version in missing:
            step = f"{missing.index(pin.version) + 1}/{len(missing)}"
        yield pin, fetch(pin, step)


def fetch(pin: Pin, step: str = "") -> Path:
    """The unpacked, verified release in the cache (made by one process at a
    time: another one that wants it waits, then finds it there)."""
    tree = tree_path(pin)
    if cached(pin):
        return tree
    with paths.cache_lock(f"tree-{pin.version}"):
        if cached(pin):
            return tree
        if pin.wheel:
            return _unpack_wheel(pin, tree, step)
        return _unpack(pin, download(pin, step), tree)


def _unpack(pin: Pin, sdist: Path, tree: Path) -> Path:
    def make(staging: Path) -> Path:
        with tarfile.open(sdist) as archive:
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(staging, **kwargs)
        (top,) = [p for p in staging.iterdir() if re.match(r"vllm-", p.name)]
        (top / _MARKER).write_text(pin.sdist_sha256 + "\n")
        return top

    return _made_in_place_of(tree, pin.version, make)


def _unpack_wheel(pin: Pin, tree: Path, step: str) -> Path:
    """A wheel-only release, as it installs (vllm/, its .dist-info), in the
    cache: every file but the native extensions, verified (wheel.py)."""
    url = index.listed("vllm", pin.wheel).url

    def make(staging: Path) -> Path:
        top = staging / "tree"
        wheel.unpack(
            url,
            pin.wheel,
            pin.wheel_sha256,
            pin.record_sha256,
            top,
            paths.cache_dir() / "wheels",
            step,
        )
        (top / _WHEEL_MARKER).write_text(pin.record_sha256 + "\n")
        return top

    return _made_in_place_of(tree, pin.version, make)


def _made_in_place_of(tree: Path, version: str, make: Callable[[Path], Path]) -> Path:
    """`tree`, replaced in one rename by what `make` builds in a staging
    directory beside it (and returns the top of); nothing is left behind if
    it fails."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=tree.parent, prefix=f".{version}-"))
    try:
        top = make(staging)
        if tree.exists():
            shutil.rmtree(tree)
        os.replace(top, tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree
