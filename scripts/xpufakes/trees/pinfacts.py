"""What the docs say about the pinned releases (ranges, counts, the newest),
computed from patches/pins.toml, and the marked places in the docs that
hold them: `<!-- pins:KEY -->text<!-- /pins -->`. `make refresh` rewrites
them; tests/test_release_literals.py checks that they agree with the pins,
so that supporting a release edits no doc by hand."""

import re
from pathlib import Path

from xpufakes.common import paths
from xpufakes.trees import pins

# The documents with marked places (relative to the repository).
DOCUMENTS = ("README.md", "docs/releases.md", "docs/testing.md")


def marked(kind: str) -> re.Pattern:
    """The marked places of one kind: `<!-- KIND:KEY -->text<!-- /KIND -->`
    (pins here; ops: changes/opfacts.py)."""
    return re.compile(rf"<!-- {kind}:(\w+) -->(.*?)<!-- /{kind} -->", re.S)


MARKED = marked("pins")

QUANTIZATION = "vllm/model_executor/layers/quantization/"


def _span(releases: list[pins.Pin]) -> str:
    return f"{releases[0].version} – {releases[-1].version}"


def _releases_cell(series: list[pins.Pin]) -> str:
    """0.30.0; 0.18.0, 0.18.1; 0.20.0 – 0.22.1; a wheel-only series says so."""
    versions = [p.version for p in series]
    text = ", ".join(versions) if len(versions) < 3 else _span(series)
    return text + (" (wheels only)" if all(p.wheel for p in series) else "")


def _patched_files(directory: Path) -> list[list[str]]:
    """Per patch of a series directory (in order), the vLLM files it edits."""
    return [
        re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)
        for patch in sorted(directory.glob("*.patch"))
    ]


def _short(path: str) -> str:
    return (
        path.removeprefix(QUANTIZATION)
        if path.startswith(QUANTIZATION)
        else path.rsplit("/", 1)[-1]
    )


def series_table(loaded: pins.Pins, patches: Path) -> str:
    """The series table of docs/releases.md: series | releases | the files
    each patch edits (patches separated by `;`; the first file in full)."""
    by_series: dict[str, list[pins.Pin]] = {}
    for pin in loaded.ordered():
        by_series.setdefault(pin.series, []).append(pin)
    rows = ["", "| series | releases | patches |", "|---|---|---|"]
    for name, series in by_series.items():
        cells, first = [], True
        for files in _patched_files(patches / name):
            shown = []
            for path in files:
                shown.append(f"`{path if first else _short(path)}`")
                first = False
            cells.append(", ".join(shown))
        rows.append(f"| `{name}` | {_releases_cell(series)} | {'; '.join(cells)} |")
    return "\n".join(rows) + "\n"


def facts(loaded: pins.Pins | None = None) -> dict[str, str]:
    """KEY -> the text of each marked place."""
    loaded = loaded or pins.load()
    every = loaded.ordered()
    ipex = loaded.ordered(pins.IPEX)
    kernels = loaded.ordered(pins.KERNELS)
    sdists = [p for p in ipex if not p.wheel]
    wheels = [p.version for p in ipex if p.wheel]
    series = {p.series for p in every}
    return {
        "range": _span(every),
        "newest": every[-1].version,
        "next": loaded.next_release(),
        "first": every[0].version,
        "ipex": _span(ipex),
        "ipex_releases": _span(sdists)
        + (f"; {', '.join(wheels)} (wheels only)" if wheels else ""),
        "kernels": _span(kernels),
        "count": f"{len(every)} releases in {len(series)} series",
        "count_short": f"{len(every)} releases, {len(series)} series",
        "series_table": series_table(loaded, paths.PATCHES),
    }


def rewrite(text: str, known: dict[str, str], kind: str = "pins") -> str:
    """The text with every marked place of `kind` holding its fact (an
    unknown key is an error: a typo would otherwise stay stale)."""

    def fill(match: re.Match) -> str:
        key = match.group(1)
        if key not in known:
            raise KeyError(f"unknown {kind} key {key!r}")
        return f"<!-- {kind}:{key} -->{known[key]}<!-- /{kind} -->"

    return marked(kind).sub(fill, text)


def write(repo: Path) -> list[str]:
    """Rewrite the marked places of DOCUMENTS; the documents changed."""
    known = facts()
    changed = []
    for name in DOCUMENTS:
        path = repo / name
        text = path.read_text()
        new = rewrite(text, known)
        if new != text:
            path.write_text(new)
            changed.append(name)
    return changed
