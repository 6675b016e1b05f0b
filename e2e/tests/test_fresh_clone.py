"""A fresh clone of this repository and a Python without torch: one command,
`make apply VLLM=<downstream tree>`, patches a downstream tree. apply sets
up the proof's Python itself (.venv, as `make venv` makes it: ~1.3 GB, about
two minutes here, so this runs with the engine tests in make e2e, not in
make test), says so as it goes, proves, applies and names the Python that
ran the proof; the next apply uses that .venv at once; revert gives the
tree back byte for byte. The Python really has no torch (checked)."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from xpufakes.trees import fetch, pins  # noqa: E402

RELEASE = "0.14.1"  # IPEX era: the proof runs in a few seconds


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _downstream(destination: Path) -> Path:
    shutil.copytree(fetch.fetch(pins.load().get(RELEASE)), destination)
    with open(destination / "vllm" / "_ipex_ops.py", "a") as f:
        f.write("# an image builder's change\n")
    return destination


def _make(clone: Path, python: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_XPU_FAKES_PROOF_PYTHON"}
    env["VLLM_XPU_FAKES_PROOF_CACHE"] = "off"  # every proof runs
    return subprocess.run(
        ["make", "-s", "-C", str(clone), *args, f"PYTHON={python}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )


def test_a_fresh_clone_patches_a_downstream_tree_in_one_command(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    assert not (clone / ".venv").exists()
    base = tmp_path / "python"  # this interpreter's base Python, nothing added
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(base)], check=True
    )
    python = str(base / "bin" / "python")
    assert subprocess.run(
        [python, "-c", "import torch"], capture_output=True
    ).returncode
    tree = _downstream(tmp_path / "tree")
    before = _hashes(tree)
    venv = clone / ".venv"
    try:
        result = _make(clone, python, "apply", f"VLLM={tree}")
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        err = result.stderr
        assert f"the proof needs torch, and {python} has none: setting up {venv}" in err
        # uv's own progress came through (pip's would say "Successfully installed")
        assert re.search(r"^Installed \d+ packages in ", err, re.M), err[-3000:]
        assert f"{venv} is ready (" in err
        out = result.stdout.splitlines()
        assert out[0].startswith(
            f"vLLM {RELEASE} (vllm/_version.py); its files are modified"
        )
        assert (
            f"the proof's Python: {venv}/bin/python (this repository's .venv, set up "
            "just now)"
        ) in out
        assert any(line.startswith("proof: every op of ours") for line in out)
        # 0001-0003, and 0004: 0.14.1's deepseek_v2.py registers the indexer op
        assert out[-1].startswith("applied 4 patch(es) by recipe")
        assert (venv / ".installed").is_file()

        # the next one uses it at once (another tree: nothing remembered)
        other = _downstream(tmp_path / "other")
        result = _make(clone, python, "check", f"VLLM={other}")
        assert result.returncode == 0, result.stderr
        assert "setting up" not in result.stderr
        assert f"the proof's Python: {venv}/bin/python (this repository's .venv)" in (
            result.stdout.splitlines()
        )

        result = _make(clone, python, "revert", f"VLLM={tree}")
        assert result.returncode == 0, result.stderr
        assert _hashes(tree) == before
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # 1.3 GB
