"""Which pinned release a vLLM tree is, or is based on.

An exact pinned release (its version, and files that are the release's,
pristine or patched by its series) takes the release's series unchanged.
Any other tree gets a *base*: the pinned release its version derives from,
checked against the files themselves, and one line saying which base was
assumed and why:

* a dev / local build (``0.10.3.dev0+g01efc7ef7``, ``0.33.0+xpu``): its
  release if pinned, else the nearest pinned release below it;
* an untagged git checkout: the nearest ``v<release>`` tag below HEAD
  (``git describe --tags``), "unreleased, based on v<release>";
* a plain version newer than every pinned release (the next release on
  the day it ships): "newer than the newest pinned release", based on it.

A tree older than the first patched release (0.10.2) is not affected when
torch.compile is off on XPU there (compiled.py): apply, check, revert and
status say so in one line and exit 0.

The files decide the era: ``vllm/_xpu_ops.py`` (the vllm-xpu-kernels era)
or ``vllm/_ipex_ops.py`` importing IPEX and no ``_xpu_ops.py`` (the IPEX
era). A version whose base is of the other era is moved to the nearest
pinned release of the files' era. Then, if the tree's files are a pinned
release's (pristine or patched, sha256), that release's series applies as
is; otherwise the recipes run on the files as they are (recipe_path.py).
"""

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from xpufakes.changes import engine, recipes, series
from xpufakes.common.errors import NotAffected, Refusal
from xpufakes.trees import compiled, pins
from xpufakes.trees.tree import (
    CHECKOUT,
    Tree,
    detect_version,
    files_era,
    python_sources,
)


@dataclass(frozen=True)
class Base:
    version: str  # what the tree says it is
    pin: pins.Pin  # the pinned release it is, or is based on
    era: str  # IPEX or KERNELS
    exact: bool  # the version is the pinned release itself
    series_fits: bool  # the files are the pin's (pristine or patched)
    reason: str  # one line: which base was assumed, and why

    @property
    def by_recipe(self) -> bool:
        """Whether the recipes must run on the live files."""
        return not self.series_fits


def _split(version: str, source: str) -> tuple[tuple[int, ...], str]:
    found = pins.split_version(version)
    if found is not None:
        return found
    if source == "VLLM_VERSION":
        raise Refusal(
            f"VLLM_VERSION={version} is not a vLLM version (a release such as "
            "0.14.1, or a build such as 0.10.3.dev0+g01efc7ef7); nothing changed"
        )
    raise Refusal(
        f"cannot read vLLM version {version!r} ({source}); set "
        "VLLM_VERSION=<release>; nothing changed"
    )


def not_affected(found: Tree) -> str | None:
    """The line that says a tree is not affected (nothing on XPU is traced
    in it), or None: it is, or its version cannot be read."""
    try:
        version, _ = detect_version(found)
    except Refusal:
        return None
    split = pins.split_version(version)
    why = compiled.off_on_xpu(found.root, split[0]) if split else None
    return f"vLLM {version} is not affected ({why})" if why else None


def refuse_unless_affected(found: Tree, version: str, source: str) -> None:
    """A tree older than the first patched release: not affected (raises
    NotAffected, which is success) when nothing on XPU is traced there, else
    refused."""
    release, _ = _split(version, source)
    if release >= pins.FIRST_PATCHED:
        return
    why = compiled.off_on_xpu(found.root, release)
    if why is not None:
        raise NotAffected(f"vLLM {version} is not affected ({why}): nothing to do")
    oldest = pins.load().ordered()[0].version
    raise Refusal(
        f"vLLM {version} ({source}) compiles the model on XPU ({compiled.XPU_PLATFORM} "
        f"does not turn torch.compile off) and is older than the oldest pinned "
        f"release ({oldest}): not supported; nothing changed"
    )


def git_describe(root: Path) -> tuple[str, int] | None:
    """(nearest v<release> tag below HEAD, commits since it), or None."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--tags", "--long", "--match", "v*"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.fullmatch(r"(.+)-(\d+)-g[0-9a-f]+", out.stdout.strip())
    if out.returncode != 0 or not match:
        return None
    return match.group(1).removeprefix("v"), int(match.group(2))


def _reported_version(found: Tree) -> tuple[str, str, int | None]:
    """(version, where it was read, commits since the tag or None)."""
    try:
        version, source = detect_version(found)
        return version, source, None
    except Refusal:
        described = git_describe(found.root) if found.shape == CHECKOUT else None
        if described is None:
            raise
        return described[0], "git describe --tags", described[1]


def _nearest(candidates: list[pins.Pin], release: tuple[int, ...]) -> pins.Pin:
    """The newest candidate not above `release`, else the oldest."""
    below = [p for p in candidates if p.release <= release]
    return below[-1] if below else candidates[0]


def _differing(found: Tree, pin: pins.Pin) -> list[str]:
    """The target files that are not the pin's, pristine or patched (what
    sits at the overlay paths is the series path's to judge)."""
    state = engine.inspect(engine.Plan(found, pin, series.load(pin.series)))
    return [
        f.path
        for f in state.files
        if f.status in (engine.MODIFIED, engine.MISSING, engine.DANGLING)
    ]


def _matching_releases(found: Tree, exclude: str) -> list[str]:
    """The other pinned releases whose target files this tree holds."""
    matches = []
    for version, pin in pins.load().releases.items():
        if version == exclude:
            continue
        try:
            if not _differing(found, pin):
                matches.append(version)
        except Refusal:
            continue
    return matches


def _refuse_other_release(found: Tree, pin: pins.Pin, differing: list[str]) -> None:
    """A tree that says it is one pinned release while none of its target
    files is that release's and they are another's (a wrong VLLM_VERSION, a
    stale version file) is refused, not taken by recipe as a modified
    release."""
    if len(differing) < len(series.load(pin.series).targets):
        return  # some are the release's: a modified release
    others = _matching_releases(found, exclude=pin.version)
    if others:
        raise Refusal(
            f"this tree is not vLLM {pin.version}: {', '.join(differing)} match "
            f"neither that release nor its series; the tree matches vLLM "
            f"{', '.join(others)}; nothing changed"
        )


# a tree whose target files are a release's, with calls of an image's lying
# kernels elsewhere (recipes.DOWNSTREAM)
_DOWNSTREAM_WHY = (
    "; {} other module(s) call an image's kernels whose schemas lie ({}...): "
    "applying by recipe"
)


def _downstream(found: Tree, pin: pins.Pin) -> list[str]:
    """The tree's modules the recipe path's DOWNSTREAM recipes would edit."""
    if not recipes.DOWNSTREAM.get(pin.era):
        return []
    return recipes.downstream_work(pin.era, python_sources(found.root))


def detect_base(found: Tree) -> Base:
    all_pins = pins.load()
    version, source, distance = _reported_version(found)
    refuse_unless_affected(found, version, source)
    pin = all_pins.releases.get(version)
    if pin is not None and distance is None:
        differing = _differing(found, pin)
        fits = not differing
        if not fits:
            _refuse_other_release(found, pin, differing)
        why = "" if fits else "; its files are modified: applying by recipe"
        downstream = _downstream(found, pin) if fits else []
        if downstream:
            fits, why = False, _DOWNSTREAM_WHY.format(len(downstream), downstream[0])
        return Base(
            version,
            pin,
            pin.era,
            True,
            fits,
            f"vLLM {version} ({source}){why}",
        )
    release, suffix = _split(version, source)
    ordered = all_pins.ordered()
    newest = ordered[-1]
    if not suffix and distance is None and release <= newest.release:
        all_pins.get(version)  # a release in the pinned range we do not pin
    era, era_why = files_era(found.root)
    if era is None:
        raise Refusal(f"{found.root}: cannot tell the XPU era: {era_why}")
    exact = all_pins.releases.get(".".join(map(str, release)))
    if distance is not None:
        kind = f"unreleased ({distance} commit(s) after v{version})"
    elif suffix:
        kind = "a dev/local build"
    else:
        kind = f"newer than the newest pinned release ({newest.version})"
    candidate = exact or _nearest(ordered, release)
    how = "its release" if exact else "the nearest pinned release below it"
    if candidate.era != era:
        candidate = _nearest(all_pins.ordered(era), release)
        how = f"the nearest pinned {era}-era release ({era_why})"
    # the files' fingerprints: a pinned release of the era whose files these are
    same_era = sorted(
        all_pins.ordered(era),
        key=lambda p: (
            p is not candidate,
            abs(ordered.index(p) - ordered.index(candidate)),
        ),
    )
    for pin in same_era:
        if not _differing(found, pin):
            if pin is not candidate:
                how = "the pinned release whose files these are (sha256)"
            downstream = _downstream(found, pin)
            if downstream:
                return Base(
                    version,
                    pin,
                    era,
                    False,
                    False,
                    f"vLLM {version} ({source}) is {kind}: assuming base "
                    f"{pin.version}, {how}; its files are {pin.version}'s"
                    + _DOWNSTREAM_WHY.format(len(downstream), downstream[0]),
                )
            return Base(
                version,
                pin,
                era,
                False,
                True,
                f"vLLM {version} ({source}) is {kind}: assuming base "
                f"{pin.version}, {how}; its files are {pin.version}'s",
            )
    to_pin = ""
    if not suffix and distance is None:
        to_pin = " (a maintainer pins it with `make refresh` once it is on the index)"
    return Base(
        version,
        candidate,
        era,
        False,
        False,
        f"vLLM {version} ({source}) is {kind}: assuming base "
        f"{candidate.version}, {how}; its files differ from every pinned "
        f"release's: applying by recipe{to_pin}",
    )
