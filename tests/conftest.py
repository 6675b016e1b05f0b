"""Shared set-up: the tool's package on sys.path, which releases a run covers
(--all-releases for every pinned one), and a warm torch for forked tests."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

# The proofs that passed are remembered (proof.ProofCache); each run of the
# tests starts with none, so that every proof a test expects runs.
if "VLLM_XPU_FAKES_PROOF_CACHE" not in os.environ:
    _PROOFS = tempfile.mkdtemp(prefix="xpufakes-test-proofs-")
    os.environ["VLLM_XPU_FAKES_PROOF_CACHE"] = _PROOFS

    def pytest_unconfigure(config):
        shutil.rmtree(_PROOFS, ignore_errors=True)


from support import releases  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--all-releases",
        action="store_true",
        help="test every pinned release (default: first and last of each series)",
    )


def selected_releases(config) -> list[str]:
    if config.getoption("--all-releases"):
        return releases.all_releases()
    return releases.representative()


def sample_releases(config) -> list[str]:
    if config.getoption("--all-releases"):
        return releases.all_releases()
    return releases.era_examples()


def pytest_generate_tests(metafunc):
    """`release`: every series' first release and each era's last (all with
    --all-releases); `sample_release`: a few releases of each era (all);
    `ipex_release` / `kernels_release`: the `release` set of one era;
    `ipex_sample_release`: the `sample_release` set of the IPEX era."""
    chosen = selected_releases(metafunc.config)
    if "release" in metafunc.fixturenames:
        metafunc.parametrize("release", chosen)
    if "sample_release" in metafunc.fixturenames:
        metafunc.parametrize("sample_release", sample_releases(metafunc.config))
    if "ipex_sample_release" in metafunc.fixturenames:
        metafunc.parametrize(
            "ipex_sample_release",
            [v for v in sample_releases(metafunc.config) if releases.era(v) == "ipex"],
        )
    if "ipex_release" in metafunc.fixturenames:
        metafunc.parametrize(
            "ipex_release", [v for v in chosen if releases.era(v) == "ipex"]
        )
    if "kernels_release" in metafunc.fixturenames:
        metafunc.parametrize(
            "kernels_release", [v for v in chosen if releases.era(v) == "kernels"]
        )


def _warm_torch() -> None:
    """Import and warm up torch, dynamo and opcheck once, in the parent, so
    that forked tests start warm."""
    import torch
    import torch._dynamo  # noqa: F401
    from torch.testing._internal.optests import generate_tests  # noqa: F401

    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))


_warm_torch()
