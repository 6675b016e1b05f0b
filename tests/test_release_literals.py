"""Supporting a new release is: raise LAST, `make refresh`, `make e2e-lock`,
commit (docs/layout.md). So nothing outside the data may hold a figure of
the pins or stand for "newer than every pin": the docs' ranges and counts
are marked places that `make refresh` writes (trees/pinfacts.py), and code
and tests compute the newest pin and a release newer than every pin
(tests/support/releases.py). A pinned release named as a fixture (0.14.1,
the IPEX era's last sdist) stays true when the next one is pinned; the
next release named in code does not (the day it is pinned, a test that
used it as "newer than every pin" fails). Each check has its negative
control: a stale doc, a planted literal."""

import re
from pathlib import Path

from support import releases
from xpufakes.common import paths
from xpufakes.trees import pinfacts, pins

# Where a release literal would be a copy of the pins (the data --
# scripts/xpufakes/data/, patches/, e2e's pins and locks -- is not scanned).
CODE = ("tests", "e2e", "scripts", "plugin", "tools", "vllm_overlay")
NOT_CODE = ("scripts/xpufakes/data/",)


def _code_files() -> list[Path]:
    found = [paths.REPO / "Makefile"]
    for top in CODE:
        for path in sorted((paths.REPO / top).rglob("*.py")):
            relative = path.relative_to(paths.REPO).as_posix()
            if not relative.startswith(NOT_CODE) and ".venv" not in relative:
                found.append(path)
    return found


def _literals(text: str, version: str) -> list[int]:
    """Line numbers where `version` appears as a release (not inside a
    longer version)."""
    pattern = re.compile(rf"(?<![\d.]){re.escape(version)}(?![\d])")
    return [n for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]


def test_no_code_names_the_next_release():
    newer = releases.newer_than_every_pin()
    found = [
        f"{path.relative_to(paths.REPO)}:{n}"
        for path in _code_files()
        for n in _literals(path.read_text(errors="replace"), newer)
    ]
    assert found == [], f"{newer} written outside the data: {found}"


def test_the_literal_scan_finds_a_planted_literal():
    """Negative control: the scan finds the next release where a test would
    write it (as test_a_release_newer_than_every_pin once did), and not
    inside a longer version."""
    newer = releases.newer_than_every_pin()
    text = f'NEWER = "{newer}"\nOTHER = "1{newer}.1"\n'
    assert _literals(text, newer) == [1]


def test_the_docs_figures_are_the_pins():
    for name in pinfacts.DOCUMENTS:
        text = (paths.REPO / name).read_text()
        assert pinfacts.rewrite(text, pinfacts.facts()) == text, (
            f"{name}: a marked place disagrees with patches/pins.toml "
            "(`make refresh` writes them)"
        )
    readme = (paths.REPO / "README.md").read_text()
    marked = {m.group(1) for m in pinfacts.MARKED.finditer(readme)}
    assert {"range", "ipex", "kernels", "count", "newest"} <= marked
    notes = (paths.REPO / "docs" / "releases.md").read_text()
    marked = {m.group(1) for m in pinfacts.MARKED.finditer(notes)}
    assert {"first", "newest", "count_short", "series_table"} <= marked
    # outside the marked places, no count of the pins
    for text in (readme, notes):
        outside = pinfacts.MARKED.sub("", text)
        assert not re.search(r"\b\d+ releases", outside), outside


def test_a_doc_written_before_a_new_pin_is_stale():
    """Negative control: the docs as they were before the newest release was
    pinned (the facts of the pins without it) fail the check above."""
    loaded = pins.load()
    before = pins.Pins(
        {v: p for v, p in loaded.releases.items() if v != releases.newest()}
    )
    for name in pinfacts.DOCUMENTS:
        current = (paths.REPO / name).read_text()
        old = pinfacts.rewrite(current, pinfacts.facts(before))
        assert old != current
        assert pinfacts.rewrite(old, pinfacts.facts()) == current


def test_newer_than_every_pin_is_no_pin():
    newer = releases.newer_than_every_pin()
    assert newer not in pins.load().releases
    assert pins.version_tuple(newer) > pins.load().ordered()[-1].release
