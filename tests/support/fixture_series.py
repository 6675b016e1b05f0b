"""A small multi-patch series for the tool's own tests, made from a real
pinned release at test time (so its context comes from the sdist, like the
real series): three patches over three files of vLLM 0.33.0, two of them
bringing overlay files."""

import hashlib
import textwrap
from pathlib import Path

from xpufakes.changes import unidiff
from xpufakes.trees import pins

from . import releases

RELEASE = "0.33.0"
# patch name -> (files it edits, overlay files it brings)
PATCHES = {
    "0001-first.patch": (["vllm/envs.py"], ["vllm/_fixture_overlay.py"]),
    "0002-second.patch": (["vllm/envs.py", "vllm/__init__.py"], []),
    "0003-third.patch": (["vllm/_custom_ops.py"], ["tests/fixture_overlay_test.py"]),
}


def _edit(text: str, patch: str) -> str:
    """Insert a comment naming the patch after the file's third line."""
    lines = text.split("\n")
    marker = f"# fixture edit by {patch}"
    return "\n".join([*lines[:3], marker, *lines[3:]])


def make(root: Path) -> tuple[Path, Path]:
    """Write the series to root; (patches dir, overlay dir)."""
    pristine = releases.pristine(RELEASE)
    pin = pins.load().get(RELEASE)
    patches, overlay = root / "patches", root / "overlay"
    (patches / "fixture").mkdir(parents=True)
    texts: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for name, (files, extra) in PATCHES.items():
        diff = ""
        for path in files:
            if path not in texts:
                raw = (pristine / path).read_bytes()
                hashes[path] = hashlib.sha256(raw).hexdigest()
                texts[path] = raw.decode()
            new = _edit(texts[path], name)
            diff += unidiff.unified(texts[path], new, path)
            texts[path] = new
        header = f"Description: fixture patch {name}\n"
        header += "".join(f"X-Overlay: {path}\n" for path in extra)
        (patches / "fixture" / name).write_text(header + "---\n" + diff)
        for path in extra:
            target = overlay / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f'"""Overlay file of {name}."""\n')
    (patches / "fixture" / "series").write_text("".join(f"{n}\n" for n in PATCHES))
    files = ", ".join(f'"{p}" = "{h}"' for p, h in hashes.items())
    (patches / "pins.toml").write_text(
        textwrap.dedent(
            f"""\
            [releases."{RELEASE}"]
            sdist_sha256 = "{pin.sdist_sha256}"
            series = "fixture"
            files = {{ {files} }}
            """
        )
    )
    return patches, overlay
