"""`make audit MODEL=... TRANSFORMERS=4.57.0`: build the models with the
transformers release a tree's image pins, not the one in .venv-tree.

A tree made for transformers 4 (intel/llm-scaler's 0.10.2-based images pin
transformers==4.57.0 in vllm/docker/Dockerfile) cannot read some configs
that transformers 5 writes (Gemma 3's per-layer rope_parameters; a
Qwen2.5-VL rope_scaling with both `type` and `rope_type`), so a model the
image runs would be "not built" here for our venv's sake. The release, with
the huggingface-hub and tokenizers it requires, is installed once into the
tool's cache (pip --target, --no-deps: nothing else of the venv changes) and
put first on the model proof's PYTHONPATH."""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from xpufakes.common import paths
from xpufakes.common.errors import Refusal

# what transformers needs beside the venv's packages and pins (its own
# Requires-Dist says which releases)
COMPANIONS = ("huggingface-hub", "tokenizers")
_VERSION = re.compile(r"\d+(\.\d+)*([a-z]+\d+)?")
_REQUIRES = re.compile(r"Requires-Dist: ([A-Za-z0-9_.-]+) ?\(?([^;()]*)\)?$")


def _pip(python: str, target: Path, *requirements: str) -> None:
    done = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
        + list(requirements),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise Refusal(f"pip could not install {' '.join(requirements)}: {tail}")


def _companions(target: Path, version: str) -> list[str]:
    """huggingface-hub and tokenizers as that transformers' METADATA
    requires them."""
    metadata = target / f"transformers-{version}.dist-info" / "METADATA"
    wanted = []
    for line in metadata.read_text().splitlines():
        found = _REQUIRES.match(line.strip())  # one without an extra's marker
        if found and found.group(1).lower().replace("_", "-") in COMPANIONS:
            wanted.append(f"{found.group(1)}{found.group(2).strip()}")
    return wanted


def overlay(version: str, python: str) -> Path:
    """The directory that holds transformers `version` and its companions
    (made with `python`'s pip if the cache has none). A Refusal, in one
    line, if the version is not one or pip cannot install it."""
    if not _VERSION.fullmatch(version):
        raise Refusal(f"TRANSFORMERS={version!r} is not a release (e.g. 4.57.0)")
    made = paths.cache_dir() / "transformers" / version
    with paths.cache_lock(f"transformers-{version}"):
        if (made / ".complete").is_file():
            return made
        made.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=made.parent))
        try:
            _pip(python, work, f"transformers=={version}")
            _pip(python, work, *_companions(work, version))
            (work / ".complete").write_text(version + "\n")
            shutil.rmtree(made, ignore_errors=True)
            work.rename(made)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return made
