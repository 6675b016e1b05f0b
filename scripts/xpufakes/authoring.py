"""`make refresh`: write patches/ and patches/pins.toml from the recipes and
the official sdists.

For every vLLM release on the package index between FIRST and LAST, the
sdist is downloaded (sha256 from the index on first pinning, from pins.toml
afterwards: a changed sdist is an error), the recipe of its era edits the
pristine target file, and releases whose diffs are the same (but for line
numbers) share one series directory, named after its first release.
"""

import datetime
import hashlib
import json
import re
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import fetch, kernels, paths, pins, recipes, unidiff
from .errors import Refusal
from .pins import version_tuple

FIRST, LAST = (0, 10, 0), (0, 33, 0)
NOT_NEEDED_REASON = (
    "vllm/platforms/xpu.py forces compilation off on XPU, so nothing is traced"
)
SIGNED_OFF_BY = (
    "Seed a851f495 maintainers <maintainers@users.noreply.a-seed-a851f495.example>"
)


def index_sdists() -> dict[str, str]:
    """release -> sha256 of its sdist, for the releases between FIRST and LAST."""
    page = fetch.index_url().rstrip("/") + "/vllm/"
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=120, context=fetch.ssl_context()) as r:
        files = json.loads(r.read())["files"]
    found = {}
    for f in files:
        match = re.fullmatch(r"vllm-(\d+(?:\.\d+)*)\.tar\.gz", f["filename"])
        if match and FIRST <= version_tuple(match.group(1)) <= LAST:
            found[match.group(1)] = f["hashes"]["sha256"]
    return dict(sorted(found.items(), key=lambda kv: version_tuple(kv[0])))


@dataclass
class Variant:
    era: str
    diffs: tuple[str, ...]  # one per patch of the era, in series order
    releases: list[str]

    @property
    def series(self) -> str:
        return pins.series_name(self.era, self.releases[0])


def release_diffs(era: str, tree: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """The diff of each patch of the era for the release in `tree`, and the
    sha256 of each file they change."""
    diffs = []
    hashes = {}
    for recipe in recipes.RECIPES[era]:
        diff = ""
        for edit in recipe.edits:
            for target, required in edit.files:
                path = tree / target
                if not path.is_file():
                    if required:
                        raise Refusal(f"{tree.name}: {target} is missing")
                    continue
                raw = path.read_bytes()
                pristine = raw.decode("utf-8", errors="surrogateescape")
                try:
                    diff += unidiff.unified(pristine, edit.edit(pristine), target)
                except recipes.RecipeError as e:
                    raise Refusal(f"{tree.name}: {target}: {e}") from None
                hashes[target] = hashlib.sha256(raw).hexdigest()
        diffs.append(diff)
    return tuple(diffs), hashes


def _kernels(tree: Path) -> str:
    """The XPU kernel package pinned by requirements/xpu.txt."""
    found = kernels.from_requirements((tree / "requirements" / "xpu.txt").read_text())
    if found is None or not found.split(" ", 1)[1][0].isdigit():
        raise Refusal(f"{tree}/requirements/xpu.txt names no XPU kernel package")
    return found


def _normalized(diff: str) -> str:
    return re.sub(r"^@@ [^@]* @@", "@@", diff, flags=re.M)


def refresh(date: str | None = None) -> list[Variant]:
    known = pins.load().releases if paths.PINS.exists() else {}
    sdists = index_sdists()
    variants: dict[tuple, Variant] = {}
    entries = {}
    not_needed = []
    for version, index_sha in sdists.items():
        era = pins.era_of(version_tuple(version))
        if era is None:
            not_needed.append(version)
            continue
        if version in known and known[version].sdist_sha256 != index_sha:
            raise Refusal(f"vllm-{version}.tar.gz changed on the index: {index_sha}")
        tree = fetch.fetch(pins.Pin(version, index_sha, series="", kernels=""))
        diffs, hashes = release_diffs(era, tree)
        key = (era, tuple(_normalized(d) for d in diffs))
        variant = variants.setdefault(key, Variant(era, diffs, []))
        variant.releases.append(version)
        entries[version] = {
            "sdist_sha256": index_sha,
            "kernels": _kernels(tree),
            "files": hashes,
        }
    _write_series(list(variants.values()), date)
    for variant in variants.values():
        for version in variant.releases:
            entries[version]["series"] = variant.series
    _write_pins(entries, not_needed)
    return list(variants.values())


def patch_text(variant: Variant, index: int, date: str) -> str:
    recipe = recipes.RECIPES[variant.era][index]
    header = recipe.header.format(releases=_ranges(variant.releases), date=date)
    overlay = "".join(f"X-Overlay: {path}\n" for path in recipe.overlay)
    depends = "".join(f"X-Depends: {dependency}\n" for dependency in recipe.depends)
    return (
        header
        + overlay
        + depends
        + f"Signed-off-by: {SIGNED_OFF_BY}\n"
        + "---\n"
        + variant.diffs[index]
    )


def _ranges(releases: list[str]) -> str:
    return ", ".join(releases)


def _write_series(variants: list[Variant], date: str | None) -> None:
    keep = {v.series for v in variants}
    for directory in paths.PATCHES.iterdir():
        if directory.is_dir() and directory.name not in keep:
            shutil.rmtree(directory)
    for variant in variants:
        directory = paths.PATCHES / variant.series
        directory.mkdir(parents=True, exist_ok=True)
        names = []
        for index, recipe in enumerate(recipes.RECIPES[variant.era]):
            target = directory / recipe.name
            old = target.read_text() if target.exists() else ""
            old_date = re.search(r"^Last-Update: (\S+)", old, re.M)
            text = patch_text(variant, index, old_date.group(1) if old_date else "")
            if text != old:  # a new or changed patch gets today's date
                today = date or datetime.date.today().isoformat()
                text = patch_text(variant, index, today)
            target.write_text(text)
            names.append(recipe.name)
        for stale in directory.glob("*.patch"):
            if stale.name not in names:
                stale.unlink()
        (directory / "series").write_text("".join(f"{n}\n" for n in names))


def _write_pins(entries: dict[str, dict], not_needed: list[str]) -> None:
    out = [
        "# The supported vLLM releases: the sha256 of each official sdist on the",
        "# package index, the series it takes, the XPU kernel package it pins",
        "# (requirements/xpu.txt), and the sha256 of each file the series patches,",
        "# as in the sdist. Written by `make refresh`; review changes like code.",
        "",
    ]
    for version, e in entries.items():
        files = ", ".join(
            f'"{path}" = "{digest}"' for path, digest in e["files"].items()
        )
        out += [
            f'[releases."{version}"]',
            f'sdist_sha256 = "{e["sdist_sha256"]}"',
            f'series = "{e["series"]}"',
            f'kernels = "{e["kernels"]}"',
            f"files = {{ {files} }}",
            "",
        ]
    out += ["# Releases that need no patch, and why.", "[not_needed]"]
    out += [f'"{v}" = "{NOT_NEEDED_REASON}"' for v in not_needed]
    paths.PINS.write_text("\n".join(out) + "\n")
    pins.load.cache_clear()
