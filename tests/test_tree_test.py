"""`make test-tree`: the upstream-style test the series ships into vLLM's
tests/ tree, run inside a patched release with that release's dependencies
(.venv-tree, which `make test` sets up) and vLLM's own
tests/kernels/utils.py::opcheck, against the CPU reference kernels."""

import re
import subprocess

import pytest

from support import releases
from xpufakes.common import paths

TREE_PYTHON = paths.REPO / ".venv-tree" / "bin" / "python"
# the release whose dependencies .venv-tree has (the Makefile's choice)
RELEASE = re.search(
    r"^TREE_TEST_RELEASE \?= (\S+)$", (paths.REPO / "Makefile").read_text(), re.M
).group(1)

pytestmark = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)


def _make_test_tree(tree, args: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "make",
            "-s",
            "test-tree",
            f"VLLM={tree}",
            f"PYTHON={TREE_PYTHON}",
            f"ARGS={args}",
        ],
        cwd=paths.REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.mark.parametrize("version", ["0.14.1", RELEASE])
def test_in_tree_test_passes_on_a_patched_release(version, tmp_path):
    """The newest release of each era, with vLLM's own test utilities of
    that release (the IPEX era's also runs test_ipex_woq_linear.py)."""
    tree = releases.copy_of(version, tmp_path / "vllm-src")
    releases.apply(tree)
    result = _make_test_tree(tree, "-rA")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"vLLM {version} (vllm/_version.py)" in result.stdout
    passed = re.findall(r"^PASSED (\S+)\[(cpu-reference-[^\]]+)\]", result.stdout, re.M)
    assert len(passed) > 400, result.stdout[-2000:]
    files = {name.split("::")[0] for name, _ in passed}
    expected = {"tests/kernels/quantization/test_xpu_gemm_fakes.py"}
    if version == "0.14.1":
        expected.add("tests/kernels/quantization/test_ipex_woq_linear.py")
        expected.add("tests/kernels/test_xpu_opaque_calls.py")
    assert files == expected
    # the indexer patch's test (any platform: the registered schema)
    assert f"PASSED {INDEXER_TEST}::{INDEXER_CASE}" in result.stdout


INDEXER_TEST = "tests/kernels/test_sparse_attn_indexer_op.py"
INDEXER_CASE = "test_sparse_attn_indexer_declares_its_write_and_returns_nothing"


def test_the_indexer_in_tree_test_fails_on_the_unpatched_op(tmp_path):
    """Negative control of the indexer patch's in-tree test: the patched tree
    with the release's own sparse_attn_indexer.py put back (the op returns
    its buffer as a plain Tensor) fails it."""
    tree = releases.copy_of(RELEASE, tmp_path / "vllm-src")
    releases.apply(tree)
    module = "vllm/model_executor/layers/sparse_attn_indexer.py"
    (tree / module).write_bytes((releases.pristine(RELEASE) / module).read_bytes())
    result = _make_test_tree(tree, f"-rA -k {INDEXER_CASE}")
    assert result.returncode != 0
    assert f"FAILED {INDEXER_TEST}::{INDEXER_CASE}" in result.stdout, result.stdout
    assert "assert not schema.returns" in result.stdout


def test_in_tree_test_fails_with_a_wrong_fake(tmp_path):
    """Negative control: the same test on a tree whose fake returns
    contiguous strides (right shape) fails."""
    tree = releases.copy_of(RELEASE, tmp_path / "vllm-src")
    releases.apply(tree)
    fakes = tree / "vllm" / "_xpu_gemm_fakes.py"
    text = fakes.read_text()
    rule = "strides = (*(s // k * n for s in A.stride()[:-1]), A.stride(-1))"
    assert rule in text
    fakes.write_text(text.replace(rule, "strides = (*A.shape[:-1], n)[1:] + (1,)"))
    result = _make_test_tree(tree, "-x -k fp8_gemm_w8a16-row-sliced")
    assert result.returncode != 0
    assert "Stride mismatch" in result.stdout, result.stdout[-3000:]


def test_an_unpatched_tree_has_no_test_to_run(tmp_path):
    tree = releases.copy_of(RELEASE, tmp_path / "vllm-src")
    result = _make_test_tree(tree)
    assert result.returncode != 0  # make turns the tool's 1 into its own 2
    assert "run make apply first" in result.stderr
