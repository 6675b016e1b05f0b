"""Pinned releases for the tests: which ones a run covers, their pristine
trees (fetched and verified by the tool), and copies to change."""

import hashlib
import os
import shutil
from pathlib import Path

from xpufakes.changes import engine, series
from xpufakes.common import paths, transaction
from xpufakes.trees import fetch, pins, tree

# `make test` covers every series (context variant) by its first release,
# plus 0.14.1 (the IPEX era's last sdist, the release make e2e runs; the
# wheel-only 0.15.x come after it) and the newest pin; the tool's own
# checks use one or two releases of each era. `make test-all` tests every
# release everywhere.


def newest() -> str:
    """The newest pinned release (a new pin moves it: no test names it)."""
    return pins.load().newest().version


def first() -> str:
    return pins.load().ordered()[0].version


def newer_than_every_pin() -> str:
    """A plain release newer than every pin (the next minor release)."""
    return pins.load().next_release()


def newest_kernels() -> str:
    """The vllm-xpu-kernels release the newest kernels-era pin pins."""
    return pins.load().newest_kernels()


# fixtures of each era (the newest pin is added when asked: it moves)
ERA_EXAMPLES = ("0.10.2", "0.14.1", "0.16.0", "0.27.1")


def representative() -> list[str]:
    releases = pins.load().releases
    chosen = {"0.14.1", newest()}
    seen_series: set[str] = set()
    for version, pin in releases.items():
        if pin.series not in seen_series:
            seen_series.add(pin.series)
            chosen.add(version)
    return [v for v in releases if v in chosen]


def era_examples() -> list[str]:
    return [*ERA_EXAMPLES, newest()]


def all_releases() -> list[str]:
    return list(pins.load().releases)


def era(version: str) -> str:
    return pins.load().releases[version].era


def pristine(version: str) -> Path:
    """The unpacked official sdist, or a wheel-only release as it installs
    (do not modify it)."""
    return fetch.fetch(pins.load().get(version))


# Releases the tool pins no series for, whose sdists (sha256 from the
# package index) the tests fetch and verify the same way, to show what the
# tool does with them: 0.10.1.1 forces torch.compile off on XPU, 0.9.1 runs
# XPU on vLLM's V0 engine (both not affected), 0.9.2 compiles on XPU (V1) and
# is older than every pin (refused). See scripts/xpufakes/trees/compiled.py.
UNPINNED = {
    "0.10.1.1": "3099824ee4bdaa14c4c4f7178a092101a0ec206d4c9371edf295849b2b730a39",
    "0.9.2": "6b0d855ea8ba18d76364c9b82ea94bfcaa9c9e724055438b5733e4716ed104e1",
    "0.9.1": "c5ad11603f49a1fad05c88debabb8b839780403ce1b51751ec4da4e8a838082c",
}


def unpinned(version: str) -> Path:
    """The unpacked, verified sdist of a release in UNPINNED (do not modify)."""
    return fetch.fetch(pins.Pin(version, UNPINNED[version], series="", kernels=""))


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
    with paths.cache_lock(f"test-tree-{target.name}"):  # one test worker makes it
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
    transaction.commit(engine.changes_to(plan, state, set(plan.names)))


def gnu_patch(tree: Path, patches) -> None:
    """Apply patch files in order with GNU patch, zero fuzz, as a packager
    would (no backup files)."""
    import subprocess

    for path in patches:
        subprocess.run(
            [
                "patch",
                "-s",
                "-p1",
                "-F0",
                "-N",
                "--no-backup-if-mismatch",
                "-i",
                str(path),
            ],
            cwd=tree,
            check=True,
        )
