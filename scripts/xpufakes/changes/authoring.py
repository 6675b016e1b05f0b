"""`make refresh`: write patches/ and patches/pins.toml from the recipes and
the official sdists.

For every vLLM release on the package index between FIRST and LAST, the
sdist is downloaded (sha256 from the index on first pinning, from pins.toml
afterwards: a changed sdist is an error), the recipe of its era edits the
pristine target file, and releases whose diffs are the same (but for line
numbers) share one series directory, named after its first release.

A release with no sdist, only wheels (0.15.0, 0.15.1), is pinned by its
x86_64 wheel: on first pinning the whole wheel is downloaded (~509 MB),
checked against the index's sha256, and the sha256 of its RECORD is pinned;
afterwards only the members are read, verified against that RECORD
(wheel.py).
"""

import ast
import datetime
import hashlib
import json
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import kernels, opfacts, recipes, unidiff
from xpufakes.common import ops, paths
from xpufakes.common.errors import Refusal
from xpufakes.trees import fetch, index, pinfacts, pins, wheel
from xpufakes.trees.pins import version_tuple

FIRST, LAST = (0, 10, 0), (0, 34, 0)
SIGNED_OFF_BY = (
    "Seed a851f495 maintainers <maintainers@users.noreply.a-seed-a851f495.example>"
)


def index_releases() -> dict[str, index.File]:
    """release -> its sdist on the index, or (a release with no sdist) its
    x86_64 wheel, for the releases between FIRST and LAST."""
    sdists, wheels = {}, {}
    for name, f in index.project_files("vllm").items():
        sdist = re.fullmatch(r"vllm-(\d+(?:\.\d+)*)\.tar\.gz", name)
        built = re.fullmatch(r"vllm-(\d+(?:\.\d+)*)-[^-]+-[^-]+-[^-]*x86_64\.whl", name)
        if sdist:
            sdists[sdist.group(1)] = f
        elif built:
            wheels.setdefault(built.group(1), []).append(f)
    found = dict(sdists)
    for version, files in wheels.items():
        found.setdefault(version, sorted(files, key=lambda f: f.name)[0])
    return {
        v: found[v]
        for v in sorted(found, key=version_tuple)
        if FIRST <= version_tuple(v) <= LAST
    }


def _pin_of(version: str, f: index.File, known: pins.Pin | None) -> pins.Pin:
    """The pin that fetches the release (series and kernels to be found);
    a file that changed on the index since it was pinned is an error."""
    if f.sha256 is None:
        raise Refusal(f"the package index gives no sha256 for {f.name}")
    if not f.name.endswith(".whl"):
        if known is not None and known.sdist_sha256 != f.sha256:
            raise Refusal(f"{f.name} changed on the index: {f.sha256}")
        return pins.Pin(version, f.sha256, series="", kernels="")
    if known is not None and known.wheel == f.name:
        if known.wheel_sha256 != f.sha256:
            raise Refusal(f"{f.name} changed on the index: {f.sha256}")
        record = known.record_sha256
    else:  # first pinning: the whole wheel, verified, gives its RECORD's
        whole = index.download(
            f.url, f.name, f.sha256, paths.cache_dir() / "wheels", ""
        )
        try:
            record = wheel.record_sha256_of_whole(whole, f.name)
        finally:
            whole.unlink()
    return pins.Pin(
        version,
        "",
        series="",
        kernels="",
        wheel=f.name,
        wheel_sha256=f.sha256,
        record_sha256=record,
    )


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
    texts: dict[str, str] = {}  # each file as the patches before leave it
    for recipe in recipes.RECIPES[era]:
        diff = ""
        for edit in recipe.edits:
            for target, required in edit.files:
                path = tree / target
                if not path.is_file():
                    if required:
                        raise Refusal(f"{tree.name}: {target} is missing")
                    continue
                if target not in texts:
                    raw = path.read_bytes()
                    texts[target] = raw.decode("utf-8", errors="surrogateescape")
                    hashes[target] = hashlib.sha256(raw).hexdigest()
                try:
                    new = edit.edit(texts[target])
                except recipes.RecipeError as e:
                    raise Refusal(f"{tree.name}: {target}: {e}") from None
                diff += unidiff.unified(texts[target], new, target)
                texts[target] = new
            _refuse_missed_files(tree, recipe, edit)
        diffs.append(diff)
    return tuple(diffs), hashes


def _refuse_missed_files(tree: Path, recipe: recipes.Recipe, edit: recipes.Edit):
    """An edit that may apply anywhere (`anywhere_if`) must name every file
    of the release it changes: the series edits only those, and a file it
    misses would be left as it was (a caller of the indexer op returning
    None). Read with the pre-filter first, then edited."""
    if edit.anywhere_if is None:
        return
    named = {path for path, _ in edit.files}
    for path in sorted((tree / "vllm").rglob("*.py")):
        rel = str(path.relative_to(tree))
        if rel in named:
            continue
        text = path.read_text(errors="surrogateescape")
        if not edit.anywhere_if(text):
            continue
        try:
            changed = edit.edit(text) != text
        except recipes.RecipeError:
            changed = True
        if changed:
            raise Refusal(
                f"{tree.name}: {rel} needs {recipe.name}'s edit, which does "
                "not name it: add it to the recipe's files"
            )


def _kernels(tree: Path, pin: pins.Pin) -> str:
    """The XPU kernel package pinned by requirements/xpu.txt; a wheel has
    none: the package of the release's era, release unknown (the stand-ins
    are the same for every IPEX release)."""
    requirements = tree / "requirements" / "xpu.txt"
    if pin.wheel and not requirements.is_file():
        return kernels.of_tree(tree)
    found = kernels.from_requirements(requirements.read_text())
    if found is None or not found.split(" ", 1)[1][0].isdigit():
        raise Refusal(f"{tree}/requirements/xpu.txt names no XPU kernel package")
    return found


def _normalized(diff: str) -> str:
    return re.sub(r"^@@ [^@]* @@", "@@", diff, flags=re.M)


def refresh(date: str | None = None) -> list[Variant]:
    known = pins.load().releases if paths.PINS.exists() else {}
    variants: dict[tuple, Variant] = {}
    entries = {}
    for version, f in index_releases().items():
        era = pins.era_of(version_tuple(version))
        if era is None:  # not affected, or refused (compiled.py)
            continue
        pin = _pin_of(version, f, known.get(version))
        tree = fetch.fetch(pin)
        diffs, hashes = release_diffs(era, tree)
        key = (era, tuple(_normalized(d) for d in diffs))
        variant = variants.setdefault(key, Variant(era, diffs, []))
        variant.releases.append(version)
        entries[version] = {
            "sdist_sha256": pin.sdist_sha256,
            "wheel": pin.wheel,
            "wheel_sha256": pin.wheel_sha256,
            "record_sha256": pin.record_sha256,
            "kernels": _kernels(tree, pin),
            "files": hashes,
        }
    _write_series(list(variants.values()), date)
    for variant in variants.values():
        for version in variant.releases:
            entries[version]["series"] = variant.series
    _write_pins(entries)
    pins.load.cache_clear()
    write_tree_fakes()
    # the copies of the data (the overlay's among them; the series names
    # overlay files, it holds none), from the pins just written: the
    # reference kernels' newest kernels release is the newest pin's
    opfacts.write()
    pinfacts.write(paths.REPO)
    newest = pins.load().ordered()[-1]
    write_overlay_lint(fetch.fetch(newest) / "pyproject.toml")
    return list(variants.values())


OVERLAY_LINT = paths.REPO / "vllm_overlay" / "ruff.toml"
# not for the overlay outside a tree: its directories are packages there
NOT_FOR_THE_OVERLAY = {"INP"}


def write_overlay_lint(pyproject: Path) -> None:
    """vllm_overlay/ruff.toml's select and ignore: the newest pinned
    release's (its pyproject.toml [tool.ruff.lint]), the rest kept."""
    lint = tomllib.loads(pyproject.read_text())["tool"]["ruff"]["lint"]
    text = OVERLAY_LINT.read_text()
    for key, codes in (
        ("select", [c for c in lint["select"] if c not in NOT_FOR_THE_OVERLAY]),
        ("ignore", list(lint["ignore"])),
    ):
        line = f"{key} = {json.dumps(codes)}"  # a TOML array of strings
        text = re.sub(
            rf"^{key} = \[.*?\]$",
            lambda _, line=line: line,
            text,
            count=1,
            flags=re.M | re.S,
        )
    OVERLAY_LINT.write_text(text)


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
        for number, recipe in enumerate(recipes.RECIPES[variant.era]):
            if not variant.diffs[number]:  # the release has none of its files
                continue
            target = directory / recipe.name
            old = target.read_text() if target.exists() else ""
            old_date = re.search(r"^Last-Update: (\S+)", old, re.M)
            text = patch_text(variant, number, old_date.group(1) if old_date else "")
            if text != old:  # a new or changed patch gets today's date
                today = date or datetime.date.today().isoformat()
                text = patch_text(variant, number, today)
            target.write_text(text)
            names.append(recipe.name)
        for stale in directory.glob("*.patch"):
            if stale.name not in names:
                stale.unlink()
        (directory / "series").write_text("".join(f"{n}\n" for n in names))


def _write_pins(entries: dict[str, dict]) -> None:
    out = [
        "# The supported vLLM releases: the sha256 of each official sdist on the",
        "# package index, the series it takes, the XPU kernel package it pins",
        "# (requirements/xpu.txt), and the sha256 of each file the series patches,",
        "# as in the sdist. A release with no sdist is pinned by its x86_64 wheel:",
        "# its name and sha256 on the index, and the sha256 of its RECORD (which",
        "# holds every member's; the kernel package is not in a wheel). Written by",
        "# `make refresh`; review changes like code.",
        "",
    ]
    for version, e in entries.items():
        files = ", ".join(
            f'"{path}" = "{digest}"' for path, digest in e["files"].items()
        )
        source = (
            [
                f'wheel = "{e["wheel"]}"',
                f'wheel_sha256 = "{e["wheel_sha256"]}"',
                f'record_sha256 = "{e["record_sha256"]}"',
            ]
            if e["wheel"]
            else [f'sdist_sha256 = "{e["sdist_sha256"]}"']
        )
        out += [
            f'[releases."{version}"]',
            *source,
            f'series = "{e["series"]}"',
            f'kernels = "{e["kernels"]}"',
            f"files = {{ {files} }}",
            "",
        ]
    paths.PINS.write_text("\n".join(out).rstrip("\n") + "\n")
    pins.load.cache_clear()


def write_tree_fakes() -> None:
    """data/tree_fakes.toml: the digest of each `if hasattr(torch.ops._xpu_C,
    "<gemm>"):` fake block in vllm/_xpu_ops.py of every pinned kernels-era
    release, with the releases that have it (recipes.kept_tree_fakes: a
    tree's block that is none of these is kept)."""
    found: dict[str, dict[str, list[str]]] = {}
    for pin in pins.load().ordered():
        if pin.era != pins.KERNELS:
            continue
        path = fetch.fetch(pin) / "vllm" / "_xpu_ops.py"
        if not path.is_file():
            continue
        for node in ast.parse(path.read_text()).body:
            gemm = recipes.xpu_c_gemm_guard(node)
            if gemm is not None:
                digests = found.setdefault(f"{ops.XPU_C}::{gemm}", {})
                digests.setdefault(recipes.fake_block_digest(node), []).append(
                    pin.version
                )
    out = [
        "# The fakes of the _xpu_C GEMMs that vLLM's pinned releases register in",
        "# vllm/_xpu_ops.py: the digest of each `if hasattr(torch.ops._xpu_C,",
        '# "<gemm>"):` block (changes/recipes.py fake_block_digest: its AST, so',
        "# formatting and comments do not count), and the releases that have it.",
        "# A recipe removes a tree's block only if it is one of these; any other",
        "# (an image's fake for a kernel build of its own) stays, and ours",
        "# registers over it only where the live schema is one ours is exact for.",
        "#",
        "# Written by `make refresh` (changes/authoring.py); do not edit by hand.",
        "",
    ]
    for op in sorted(found):
        digests = found[op]
        out.append(f'[ops."{op}"]')
        out.append("digests = [" + ", ".join(f'"{d}"' for d in digests) + "]")
        for digest, versions in digests.items():
            out.append(f"# {digest}: {', '.join(versions)}")
        out.append("")
    recipes.TREE_FAKES.write_text("\n".join(out).rstrip("\n") + "\n")
