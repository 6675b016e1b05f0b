"""Downstream image trees rebuilt from the public inputs in
../shared/reference/images/ (beside the checkout, as CI lays it): the vLLM
sdist the image's Dockerfile clones, then `git apply` of the image's one
vLLM patch, as the image builds it. Nothing of the inputs is copied into this
repository.

* llm-scaler 0.21.0-b3.1 (intel/llm-scaler 25095b4, PR #612): vLLM 0.21.0
  and vllm_for_multi_arc.patch; its kernels patch (vllm_xpu_kernels.patch)
  changes `_xpu_C` schemas, e.g. fp8_gemm_w8a16's trailing
  `int group_size=0`.

Where the inputs are absent (a clone without ../shared), the tests that need
them skip; under CI (CI=true) they fail instead, so a missing input can never
pass as green.
"""

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from xpufakes.common import paths

from . import releases

IMAGES = paths.REPO.parent / "shared" / "reference" / "images"
B31 = IMAGES / "llm-scaler-0.21.0-b3.1"
B31_RELEASE = "0.21.0"
W8A16 = "_xpu_C::fp8_gemm_w8a16"


def need(directory: Path) -> Path:
    """The image's inputs, or skip (fail under CI) where they are absent."""
    if not directory.is_dir():
        message = f"no image inputs at {directory} (../shared/reference/images)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return directory


def kernels_patch(directory: Path = B31) -> str:
    """The image's patch of vllm-xpu-kernels, as text."""
    return gzip.decompress(
        (need(directory) / "vllm_xpu_kernels.patch.gz").read_bytes()
    ).decode()


def vllm_patch(directory: Path = B31) -> bytes:
    return gzip.decompress(
        (need(directory) / "vllm_for_multi_arc.patch.gz").read_bytes()
    )


def b31_tree(root: Path) -> Path:
    """A fresh copy of the b3.1 image's vLLM tree at `root`: the 0.21.0 sdist
    and the image's patch applied with `git apply`, no reject (as its
    Dockerfile does; the tree then has no .git)."""
    patch = vllm_patch(B31)
    releases.copy_of(B31_RELEASE, root)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    try:
        subprocess.run(
            ["git", "apply", "-"],
            cwd=root,
            input=patch,
            check=True,
            capture_output=True,
        )
    finally:
        shutil.rmtree(root / ".git", ignore_errors=True)
    return root


def cached(name: str, build) -> Path:
    """The tree `build(root)` makes, made once (by one test worker at a
    time) and kept in the cache as test-trees/<name>: do not change it."""
    target = paths.cache_dir() / "test-trees" / name
    if target.is_dir():
        return target
    with paths.cache_lock(f"test-tree-{name}"):
        if not target.is_dir():
            staging = target.with_name(target.name + f".tmp{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            build(staging)
            os.replace(staging, target)
    return target


def b31_cached() -> Path:
    """The b3.1 tree, made once per cache (do not change it; copy it)."""
    return cached("llm-scaler-0.21.0-b3.1", b31_tree)


def b31_copy(root: Path) -> Path:
    shutil.copytree(b31_cached(), root, symlinks=True)
    return root


def image_schema(patch: str, op: str) -> str:
    """The op's schema as the image's kernels patch defines it (the `+` lines
    of csrc/xpu/torch_bindings.cpp's `xpu_ops.def("<op>(...)")`, joined)."""
    section = patch.split("diff --git a/csrc/xpu/torch_bindings.cpp", 1)[1]
    section = section.split("\ndiff --git", 1)[0]
    name = op.partition("::")[2]
    at = section.index(f'"{name}(')
    text = []
    for line in section[at:].splitlines():
        if line.startswith("-"):
            continue
        text += re.findall(r'"([^"]*)"', line)
        if ");" in line:
            break
    return re.sub(r"\s+", " ", "".join(text)).strip()
