"""Pinned releases for the tests: which ones a run covers, their pristine
trees (fetched and verified by the tool), and copies to change."""

import hashlib
import os
import shutil
from pathlib import Path

from xpufakes import engine, fetch, paths, pins, series, transaction, tree

# Always tested: the first and last release of every series (every context
# variant, both ends of its range). `make test-all` tests every release.


def representative() -> list[str]:
    releases = pins.load().releases
    chosen: dict[str, None] = {}
    by_series: dict[str, list[str]] = {}
    for version, pin in releases.items():
        by_series.setdefault(pin.series, []).append(version)
    for versions in by_series.values():
        chosen[versions[0]] = None
        chosen[versions[-1]] = None
    return [v for v in releases if v in chosen]


def all_releases() -> list[str]:
    return list(pins.load().releases)


def era(version: str) -> str:
    return pins.load().releases[version].series.split("-")[0]


def pristine(version: str) -> Path:
    """The unpacked official sdist (do not modify it)."""
    return fetch.fetch(pins.load().get(version))


def copy_of(version: str, destination: Path) -> Path:
    shutil.copytree(pristine(version), destination, symlinks=True)
    return destination


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file below root, by relative path."""
    hashes = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            hashes[str(path.relative_to(root))] = hashlib.sha256(
                path.read_bytes()
            ).hexdigest()
    return hashes


def _series_digest(version: str) -> str:
    """Changes when the series or the overlay files change."""
    pin = pins.load().get(version)
    digest = hashlib.sha256()
    loaded = series.load(pin.series)
    for patch in loaded.patches:
        digest.update(patch.path.read_bytes())
        for path in patch.overlay:
            digest.update(series.overlay_source(path).read_bytes())
    return digest.hexdigest()[:16]


def patched(version: str) -> Path:
    """A patched copy of the release, made once per series content and kept in
    the cache (tests that import it must not change it)."""
    target = paths.cache_dir() / "test-trees" / f"{version}-{_series_digest(version)}"
    if target.is_dir():
        return target
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    copy_of(version, staging)
    apply(staging)
    os.replace(staging, target)
    return target


def apply(root: Path) -> None:
    """Apply the series with the tool's own code (in process)."""
    found = tree.locate(str(root))
    version, _ = tree.detect_version(found)
    pin = pins.load().get(version)
    plan = engine.Plan(found, pin, series.load(pin.series))
    state = engine.inspect(plan)
    transaction.commit(engine.changes_to_apply(plan, state))
