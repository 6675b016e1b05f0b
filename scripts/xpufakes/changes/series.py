"""A series: an ordered list of patches (quilt's ``series`` file) in a
directory under patches/, each patch a DEP-3 header followed by a unified
diff. A patch may also introduce overlay files (``X-Overlay: <path>`` in its
header): files copied from vllm_overlay/<path> into the tree when the patch
is applied, and written as new-file diffs when the series is exported.
"""

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from xpufakes.changes import unidiff
from xpufakes.common import paths
from xpufakes.common.errors import Refusal

_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]?(.*)$")


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path

    @cached_property
    def text(self) -> str:
        return self.path.read_text()

    @cached_property
    def header(self) -> str:
        """Everything before the diff."""
        match = re.search(r"^--- .*\n\+\+\+ ", self.text, re.M)
        return self.text[: match.start()] if match else self.text

    @cached_property
    def diff(self) -> str:
        return self.text[len(self.header) :]

    @cached_property
    def fields(self) -> dict[str, list[str]]:
        return fields(self.header)

    def field(self, name: str, default: str = "") -> str:
        values = self.fields.get(name)
        return values[0] if values else default

    @cached_property
    def file_diffs(self) -> list[unidiff.FileDiff]:
        return unidiff.parse(self.diff)

    @property
    def targets(self) -> list[str]:
        return [d.path for d in self.file_diffs]

    @property
    def overlay(self) -> list[str]:
        return [v.strip() for v in self.fields.get("X-Overlay", [])]

    @property
    def depends(self) -> list[str]:
        """Patches this one needs: `X-Depends: <number> (<why>)`."""
        return [v.strip() for v in self.fields.get("X-Depends", [])]

    @property
    def description(self) -> tuple[str, str]:
        """(subject, body) of the patch as a commit."""
        return description(self.field("Description") or self.field("Subject"))


@dataclass(frozen=True)
class Series:
    name: str
    directory: Path
    patches: tuple[Patch, ...]

    @property
    def targets(self) -> list[str]:
        """Files the diffs modify, in first-touched order."""
        seen: dict[str, None] = {}
        for patch in self.patches:
            for target in patch.targets:
                seen.setdefault(target, None)
        return list(seen)

    @property
    def overlay(self) -> list[str]:
        return [path for patch in self.patches for path in patch.overlay]


def fields(header: str) -> dict[str, list[str]]:
    """DEP-3 fields; a field given several times keeps every value, and
    continuation lines (starting with a space) join the previous value."""
    found: dict[str, list[str]] = {}
    last = None
    for line in header.splitlines():
        match = _FIELD.match(line)
        if match:
            last = match.group(1)
            found.setdefault(last, []).append(match.group(2))
        elif line.startswith((" ", "\t")) and last:
            found[last][-1] += "\n" + line[1:]
        elif line.strip() in ("", "---"):
            last = None
    return found


def description(text: str) -> tuple[str, str]:
    """(subject, body) from a DEP-3 Description value: its first line, then
    the continuation lines ("." is an empty line)."""
    first, _, rest = text.partition("\n")
    lines = ["" if line.strip() == "." else line for line in rest.split("\n")]
    return first.strip(), "\n".join(lines).strip("\n")


def load(name: str) -> Series:
    """The series in patches/<name>."""
    directory = paths.PATCHES / name
    listing = directory / "series"
    if not listing.is_file():
        raise Refusal(f"series {name}: no {listing}")
    patches = []
    for line in listing.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        # quilt allows options after the name (e.g. -p1); only -p1 is supported
        parts = entry.split()
        if parts[1:] not in ([], ["-p1"]):
            raise Refusal(f"series {name}: unsupported options in {line!r}")
        patch = directory / parts[0]
        if not patch.is_file():
            raise Refusal(f"series {name}: {parts[0]} is listed but missing")
        patches.append(Patch(parts[0], patch))
    return Series(name, directory, tuple(patches))


def overlay_source(path: str) -> Path:
    """Where the overlay file a patch brings (its path in the tree) is kept."""
    return paths.OVERLAY / path
