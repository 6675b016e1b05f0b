"""The proofs that passed are remembered (proof.ProofCache): the same
edited tree, tool, stand-ins, Python, packages and environment is proven
again without starting the proof's Python; a change of any of them runs the
proof again, and a proof that fails is never remembered, so a refusal
always comes from a proof that ran (negative controls: a wrong fake, a
proof Python that runs nothing, a tree edited after the proof passed)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import releases, tool

RELEASE = "0.14.1"
PROOF = "proof: every op of ours the edited tree calls from traced code"


@pytest.fixture
def setting(tmp_path):
    """(a 0.14.1 tree changed downstream, the environment of a run that
    remembers proofs in its own directory and counts the proof's Pythons)."""
    root = releases.copy_of(RELEASE, tmp_path / "tree")
    with open(root / "vllm" / "_ipex_ops.py", "a") as f:
        f.write("# a downstream change\n")
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\necho run >> "{calls}"\nexec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    env = {
        "VLLM_XPU_FAKES_PROOF_CACHE": str(tmp_path / "proofs"),
        "VLLM_XPU_FAKES_PROOF_PYTHON": str(python),
    }
    return root, env, calls


def _runs(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def _check(root, env, **extra):
    return tool.run("check", str(root), env={**env, **extra})


def test_a_proof_that_passed_is_not_run_again(setting):
    root, env, calls = setting
    first = _check(root, env)
    assert first.returncode == 0 and PROOF in first.stdout, first.stderr
    assert _runs(calls) == 1
    (entry,) = Path(env["VLLM_XPU_FAKES_PROOF_CACHE"]).glob("*.json")
    loaded = json.loads(entry.read_text())["loaded"]
    assert any(path.endswith("/torch/__init__.py") for path, _, _ in loaded)

    again = _check(root, env)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert _runs(calls) == 1  # remembered: no proof's Python started

    # apply after check: the same edited tree, proven by looking it up
    applied = tool.run("apply", str(root), env=env)
    assert applied.returncode == 0 and PROOF in applied.stdout, applied.stderr
    assert _runs(calls) == 1
    assert tool.run("revert", str(root), env=env).returncode == 0


def test_any_change_of_an_input_runs_the_proof_again(setting):
    root, env, calls = setting
    assert _check(root, env).returncode == 0
    # a file of the tree the recipes do not touch
    with open(root / "vllm" / "envs.py", "a") as f:
        f.write("# changed after the proof\n")
    assert _check(root, env).returncode == 0
    assert _runs(calls) == 2
    # the environment of the proof's Python
    assert _check(root, env, VLLM_LOGGING_LEVEL="DEBUG").returncode == 0
    assert _runs(calls) == 3
    # a file the proof's Python loaded (its size or mtime as recorded)
    proofs = root.parent / "other-proofs"
    assert _check(root, env, VLLM_XPU_FAKES_PROOF_CACHE=str(proofs)).returncode == 0
    assert _check(root, env, VLLM_XPU_FAKES_PROOF_CACHE=str(proofs)).returncode == 0
    assert _runs(calls) == 4  # that one is remembered
    (entry,) = proofs.glob("*.json")
    data = json.loads(entry.read_text())
    data["loaded"][0][2] += 1  # as if the interpreter had been rebuilt
    entry.write_text(json.dumps(data))
    assert _check(root, env, VLLM_XPU_FAKES_PROOF_CACHE=str(proofs)).returncode == 0
    assert _runs(calls) == 5


BROKEN_FAKE = """

def _broken_fp8_gemm_w8a16_fake(A, B, trans_B, B_scale, bias):
    n = B.size(0) if trans_B else B.size(1)
    return A.new_empty(A.shape[:-1] + (n + 1,))  # one column too many


IPEX_GEMM_FAKES["torch_ipex::fp8_gemm_w8a16.xpu"] = IPEX_GEMM_FAKES[
    "torch_ipex::fp8_gemm_w8a16.xpu"
]._replace(fake=_broken_fp8_gemm_w8a16_fake)
"""


def test_a_refusal_is_never_remembered(setting, tmp_path):
    """Negative control: the tree proven, then the same tree with a wrong
    fake of ours (VLLM_XPU_FAKES_OVERLAY) is refused, every time, by a proof
    that runs; and a proof's Python that runs nothing proves nothing."""
    root, env, calls = setting
    assert _check(root, env).returncode == 0
    overlay = tmp_path / "overlay"
    shutil.copytree(tool.SCRIPTS.parent / "vllm_overlay", overlay)
    fakes = overlay / "vllm" / "_xpu_gemm_fakes.py"
    text = fakes.read_text()
    assert '    IPEX_GEMM_FAKES,\n    "torch_ipex::fp8_gemm_w8a16.xpu(' in text
    fakes.write_text(text + BROKEN_FAKE)
    for runs in (2, 3):
        result = _check(root, env, VLLM_XPU_FAKES_OVERLAY=str(overlay))
        assert result.returncode == 1, result.stdout
        assert "the edited tree fails the proof" in result.stderr
        assert "torch_ipex::fp8_gemm_w8a16: FAIL: fake does not conform" in (
            result.stderr
        )
        assert _runs(calls) == runs
    result = _check(root, env, VLLM_XPU_FAKES_PROOF_PYTHON="/bin/false")
    assert result.returncode == 1 and "the proof could not run" in result.stderr
    assert len(list(Path(env["VLLM_XPU_FAKES_PROOF_CACHE"]).glob("*.json"))) == 1


def test_no_cache_when_told(setting):
    root, env, calls = setting
    for runs in (1, 2):
        result = _check(root, env, VLLM_XPU_FAKES_PROOF_CACHE="off")
        assert result.returncode == 0 and PROOF in result.stdout, result.stderr
        assert _runs(calls) == runs
    assert not os.path.exists(env["VLLM_XPU_FAKES_PROOF_CACHE"])


def test_a_proof_killed_says_so_and_changes_nothing(setting, tmp_path):
    """The proof's Python killed (kill -9, the OOM killer): refused, saying
    so, the tree as it was (before: "the proof could not run (...: no
    output)")."""
    root, env, _ = setting
    killed = tmp_path / "killed"
    killed.write_text("#!/bin/sh\nkill -9 $$\n")
    killed.chmod(0o755)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    result = tool.run(
        "apply", str(root), env={**env, "VLLM_XPU_FAKES_PROOF_PYTHON": str(killed)}
    )
    assert result.returncode == 1, result.stderr
    assert (
        f"the proof could not run ({killed}: killed by SIGKILL, no output); "
        "nothing changed" in result.stderr
    )
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


@pytest.fixture
def full_tmp(tmp_path):
    """A temporary directory on a filesystem that is full after a few
    files (a 64 KiB tmpfs with 200 inodes), or a skip where mounting one is
    not allowed (not root, no CAP_SYS_ADMIN)."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=200", "tmpfs", str(small)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield small
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)  # lazy: never busy


def test_a_full_disk_under_the_proof_is_one_line_and_changes_nothing(setting, full_tmp):
    """No room to lay the edited tree out (TMPDIR on a full filesystem):
    refused in one line naming the file, the tree as it was (before: a
    traceback ending in OSError: [Errno 28] No space left on device)."""
    root, env, _ = setting
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    result = tool.run("apply", str(root), env={**env, "TMPDIR": str(full_tmp)})
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the proof could not run (No space left on device: ")
    assert str(full_tmp) in last and last.endswith("); nothing changed"), last
    assert "Traceback" not in result.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
