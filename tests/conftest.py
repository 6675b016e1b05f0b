"""Shared set-up: the tool's package on sys.path, which releases a run covers
(--all-releases for every pinned one), and a warm torch for forked tests."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

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


def pytest_generate_tests(metafunc):
    """A test that takes `release` runs for each selected release; one that
    takes `release_of_era` for each selected release of that era (the test
    module sets ERA)."""
    chosen = selected_releases(metafunc.config)
    if "release" in metafunc.fixturenames:
        metafunc.parametrize("release", chosen)
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
