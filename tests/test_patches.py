"""The series in patches/: generated from the pinned sdists (fresh), applying
with zero fuzz to every release that takes them, headed like upstream PRs,
adding no lint findings, and consistent with pins.toml."""

import hashlib
import json
import re
import shutil
import subprocess
import sys

import pytest

from support import releases
from xpufakes.changes import authoring, recipes, series
from xpufakes.common import paths
from xpufakes.trees import pins

REQUIRED_FIELDS = ("Description", "Origin", "Bug", "Forwarded", "Last-Update")


def _series_names() -> list[str]:
    return sorted({pin.series for pin in pins.load().releases.values()})


def test_every_series_is_used_and_every_pin_has_one():
    on_disk = {p.parent.name for p in paths.PATCHES.glob("*/series")}
    assert on_disk == set(_series_names())
    for version, pin in pins.load().releases.items():
        assert pin.series.split("-")[0] == pins.era_of(pins.version_tuple(version)), (
            version
        )
        assert pin.files, version


@pytest.mark.parametrize("name", _series_names())
def test_patch_headers(name):
    loaded = series.load(name)
    assert loaded.patches
    for patch in loaded.patches:
        for field in REQUIRED_FIELDS:
            assert patch.field(field), f"{patch.name}: no {field}"
        assert re.search(r"^Signed-off-by: .+ <.+@.+>$", patch.header, re.M)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", patch.field("Last-Update"))
        for path in patch.overlay:
            assert series.overlay_source(path).is_file(), path
        versions = [v for v, p in pins.load().releases.items() if p.series == name]
        assert f"applies to vLLM {', '.join(versions)}." in patch.field("Description")


def test_patches_are_generated_from_the_sdists(release):
    """Regenerating the release's patches from its pristine sdist gives the
    committed ones (the same hunks, up to line offsets), and for the first
    release of a series, the committed files byte for byte."""
    pin = pins.load().get(release)
    era = pin.series.split("-")[0]
    diffs, hashes = authoring.release_diffs(era, releases.pristine(release))
    patches = series.load(pin.series).patches
    # a recipe whose diff is empty here (the indexer's, on a release without
    # the op) has no patch in the series; every other recipe has one
    made = [(i, r.name) for i, r in enumerate(recipes.RECIPES[era]) if diffs[i]]
    assert [p.name for p in patches] == [name for _, name in made]
    assert all(r.optional for i, r in enumerate(recipes.RECIPES[era]) if not diffs[i])
    assert hashes == pin.files
    for (index, _), patch in zip(made, patches, strict=True):
        assert authoring._normalized(diffs[index]) == authoring._normalized(patch.diff)
    if pin.series == f"{era}-{release}":
        versions = [
            v for v, p in pins.load().releases.items() if p.series == pin.series
        ]
        variant = authoring.Variant(era, diffs, versions)
        for (index, _), patch in zip(made, patches, strict=True):
            expected = authoring.patch_text(variant, index, patch.field("Last-Update"))
            assert patch.text == expected


def test_pinned_file_hashes_are_the_sdist_files(release):
    pin = pins.load().get(release)
    for path, digest in pin.files.items():
        data = (releases.pristine(release) / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest


def test_series_applies_with_gnu_patch_and_zero_fuzz(release, tmp_path):
    """Each patch in series order, on the files as the patches before it
    leave them (two patches may change one file: 0001 and 0003 of the IPEX
    era both change vllm/_ipex_ops.py)."""
    pristine = releases.pristine(release)
    tree = tmp_path / "tree"
    pin = pins.load().get(release)
    for path in pin.files:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pristine / path, tree / path)
    for patch in series.load(pin.series).patches:
        for dry in (["--dry-run"], []):
            result = subprocess.run(
                ["patch", *dry, "-s", "-t", "-F", "0", "-N", "-p1"]
                + ["-i", str(patch.path)],
                cwd=tree,
                capture_output=True,
                text=True,
            )
            assert result.returncode == 0, result.stdout + result.stderr


RUFF_RULES = "E,F,W,I,UP,B,SIM,ISC"


def _ruff(root, path) -> set[str]:
    """Findings of ruff on a file, as 'code: message' (no line numbers)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--no-cache",
            f"--select={RUFF_RULES}",
            "--line-length=88",
            "--target-version=py310",
            "--output-format=json",
            path,
        ],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return {f"{f['code']}: {f['message']}" for f in json.loads(result.stdout)}


def test_patched_files_add_no_lint_findings(release):
    """ruff on the patched file finds nothing it did not find in the
    pristine one (vLLM's rules; imports sorted the way vLLM sorts them)."""
    for path in pins.load().get(release).files:
        before = _ruff(releases.pristine(release), path)
        assert _ruff(releases.patched(release), path) <= before
