"""Which downstream image a vLLM tree is (data/images.toml, written by
`make images`, changes/imagefacts.py): for each image the data knows, the
git blob id of every file under vllm/ its vLLM patch leaves (the patch's
`index <pre>..<post>` lines). A tree is an image if all of that image's
files carry its blob ids; a modified image if more than half do (the image
with the largest share matching; which differ are said: `make apply` edits
some); else no known image (a pristine release may carry a file or two of
an image's, a change vLLM took later: 0.33.0 has 1 of b18beee's 87).
The blob ids are computed as `git hash-object` does (sha1 of
"blob <length>\\0" and the bytes): no git, each file read once."""

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

from xpufakes.common import paths

DATA = paths.DATA / "images.toml"


def blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def load(path: Path | None = None) -> dict[str, dict]:
    """short commit -> the image's entry (name, commit, vllm, files), from
    `path` (else DATA)."""
    path = path or DATA
    return tomllib.loads(path.read_text()) if path.is_file() else {}


@dataclass(frozen=True)
class Recognition:
    """What a tree is: `image` the data's key (a short llm-scaler commit) of
    the image it is, whole or modified (None: no known image); `differ` the
    image's files whose blob id is not the image's (absent ones too)."""

    image: str | None
    name: str = ""
    vllm: str = ""
    files: int = 0  # the image's files (those its patch leaves under vllm/)
    differ: tuple[str, ...] = ()
    known: int = 0  # the images the data knows
    # no known image: the one with the most files matching, and how many
    nearest: str = ""
    nearest_matched: int = 0
    nearest_files: int = 0

    @property
    def exact(self) -> bool:
        return self.image is not None and not self.differ

    @property
    def modified(self) -> bool:
        return self.image is not None and bool(self.differ)

    def describe(self) -> str:
        if self.image is None:
            return f"not one of the {self.known} images data/images.toml knows" + (
                f" (the nearest, {self.nearest}, has {self.nearest_matched} of "
                f"its {self.nearest_files} files here)"
                if self.nearest
                else " (no file of their vLLM patches matches)"
            )
        if self.exact:
            return (
                f"{self.name} (llm-scaler {self.image}, vLLM {self.vllm}): all "
                f"{self.files} files its vLLM patch leaves under vllm/ match"
            )
        shown = ", ".join(self.differ[:3]) + (", ..." if len(self.differ) > 3 else "")
        return (
            f"a modified {self.name} (llm-scaler {self.image}, vLLM {self.vllm}): "
            f"{len(self.differ)} of the {self.files} files its vLLM patch leaves "
            f"under vllm/ differ ({shown})"
        )

    def to_json(self) -> dict:
        return {
            "image": self.image,
            "name": self.name,
            "vllm": self.vllm,
            "exact": self.exact,
            "files": self.files,
            "differ": list(self.differ),
            "nearest": self.nearest,
            "said": self.describe(),
        }


def as_image(short: str, data: dict[str, dict] | None = None) -> Recognition:
    """A tree recognised as exactly that image (for a reader of one image's
    facts, e.g. the schema cases read from b18beee's package)."""
    images = load() if data is None else data
    entry = images[short]
    files = entry.get("files", {})
    return Recognition(
        short,
        entry.get("name", short),
        entry.get("vllm", ""),
        len(files),
        (),
        len(images),
    )


def recognise(root: Path, data: dict[str, dict] | None = None) -> Recognition:
    """The image the tree at `root` (the directory holding vllm/) is."""
    images = load() if data is None else data
    blobs: dict[str, str | None] = {}

    def blob(path: str) -> str | None:
        if path not in blobs:
            try:
                blobs[path] = blob_id((root / path).read_bytes())
            except OSError:
                blobs[path] = None
        return blobs[path]

    best = None
    for short, entry in images.items():
        files = entry.get("files", {})
        differ = tuple(
            sorted(p for p, post in files.items() if not _matches(blob(p), post))
        )
        matched = len(files) - len(differ)
        if not files or not matched:
            continue
        rank = (matched / len(files), matched, entry.get("date", ""))
        if best is None or rank > best[0]:
            best = (rank, short, entry, differ)
    if best is None:
        return Recognition(None, known=len(images))
    (share, matched, _), short, entry, differ = best
    if share <= 0.5:
        return Recognition(
            None,
            known=len(images),
            nearest=entry.get("name", short),
            nearest_matched=matched,
            nearest_files=len(entry["files"]),
        )
    return Recognition(
        short,
        entry.get("name", short),
        entry.get("vllm", ""),
        len(entry.get("files", {})),
        differ,
        len(images),
    )


def _matches(found: str | None, post: str) -> bool:
    """`post` may be abbreviated, as a patch's index line gives it; all
    zeros: the patch deletes the file."""
    if not post.strip("0"):
        return found is None
    return found is not None and found.startswith(post)
