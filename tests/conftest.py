"""Shared set-up: the tool's package on sys.path, which releases a run covers
(--all-releases for every pinned one), a warm torch for forked tests, and how
the tests share the machine's cores (`make test` runs them with pytest-xdist:
docs/testing.md)."""

import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

# One intra-op thread for every torch process of the tests (this one, the
# forked tests, and through the environment the tool, its proofs, the
# in-tree tests): the tensors are tiny, and `make test` already runs a
# pytest-xdist worker per core. With torch's default (a thread per core)
# the processes of the two workers share 2 cores among 4 OpenMP threads,
# whose spin-waits at each parallel region cost more than the work
# (measured, two copies at once of 9 test_compile cases: 90 s each on one
# thread, 106 s on two; docs/testing.md). Set before torch is imported; a
# value given by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The proofs that passed are remembered (proof.ProofCache); each run of the
# tests starts with none, so that every proof a test expects runs. Each
# pytest-xdist worker has its own: a proof remembered by a test on the other
# worker must not turn a proof this test expects into a look-up.
_OURS = "XPUFAKES_TEST_PROOF_CACHE"  # set when the directory is the tests' own
if "VLLM_XPU_FAKES_PROOF_CACHE" not in os.environ or os.environ.get(_OURS):
    _PROOFS = tempfile.mkdtemp(prefix="xpufakes-test-proofs-")
    os.environ["VLLM_XPU_FAKES_PROOF_CACHE"] = _PROOFS
    os.environ[_OURS] = "1"

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


# The slowest modules, slowest first: their tests are handed out first, so
# that the two workers finish together (measured with --durations on a cold
# run; docs/testing.md). A module not listed comes after them, in file order.
SLOWEST_FIRST = (
    "test_stage.py",
    "test_stage_indexer.py",
    "test_tree_test.py",
    "test_trees.py",
    "test_model_catalog.py",
    "test_model_catalog_b31.py",
    "test_ipex_woq.py",
    "test_fakes_by_release.py",
    "test_model_trace.py",
    "test_model_tensor_parallel.py",
    "test_compile.py",
    "test_proof_cache.py",
    "test_audit_verify.py",
)


def _group(item) -> str | None:
    """The tests that must run on one worker: those of a module that share a
    module-scoped fixture (a staged checkout, a venv), with the same
    parameters of it. None: any worker."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = []
    for name in item.fixturenames:
        definitions = info.name2fixturedefs.get(name)
        if definitions and definitions[-1].scope in ("module", "package", "class"):
            callspec = getattr(item, "callspec", None)
            param = callspec.params.get(name, "") if callspec else ""
            shared.append(f"{name}={param}")
    if not shared:
        return None
    if item.path.name in ONE_WORKER:
        return "stagings"
    return f"{item.path.name}:{','.join(sorted(shared))}"


# Modules whose tests run one after another on one worker (one group):
# their stagings share the tree checks' environment and mypy cache (in the
# tool's cache), which the first one builds cold (2–3 min); two cold at once
# on both workers cost twice that, or one worker waits on the other's lock
# (test_stage_indexer.py's set-up: 198 s in a cold CI run, 117 s beside it
# warm), the later ones are warm.
ONE_WORKER = ("test_stage.py", "test_stage_indexer.py")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups: docs/testing.md
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n`, `--dist loadgroup`): the tests that share a
    module-scoped fixture in one group (xdist_group), and the slowest
    modules first."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _warm_torch() -> None:
    """Import and warm up torch, dynamo and opcheck once, in the parent, so
    that forked tests start warm. Inductor's modules too: every vLLM release
    imports them (vllm/env_override.py), and so does each forked test that
    loads a release's file (about 2 s a test if not imported here); imported
    only, nothing compiled, so no compile worker is started before a fork."""
    import torch
    import torch._dynamo  # noqa: F401

    with warnings.catch_warnings():  # torch.jit's deprecation, on import
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch._inductor.compile_fx  # noqa: F401
        import torch._inductor.lowering  # noqa: F401
    from torch.testing._internal.optests import generate_tests  # noqa: F401

    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))


_warm_torch()
