"""The fakes in the patched tree of every release, against stand-in kernels
with the schemas of the kernel release that vLLM release pins.

Each test imports vLLM's own file (vllm/_xpu_ops.py or vllm/_ipex_ops.py)
from the release's tree, so it runs in a forked process: registrations are
process-global.
"""

import sys
from pathlib import Path

import pytest

from support import grid, releases, standins

pytestmark = pytest.mark.forked


def _load(tree: Path, release: str):
    sys.dont_write_bytecode = True  # leave the trees as they are
    libraries = standins.define_standins(release)
    standins.import_vllm_module(tree, release)
    return libraries


def test_patched_release_registers_the_tree_fakes(release):
    tree = releases.patched(release)
    libraries = _load(tree, release)
    fakes = sys.modules["vllm._xpu_gemm_fakes"]
    assert Path(fakes.__file__).is_relative_to(tree)
    defined = {f"{lib['library'].ns}::{op}" for lib in libraries for op in lib["ops"]}
    assert defined, "no stand-in op was defined"
    assert set(fakes._registrations) == defined


def test_patched_release_fakes_match_the_kernels(release):
    tree = releases.patched(release)
    libraries = _load(tree, release)  # noqa: F841 - keeps the stand-ins alive
    results = grid.run()
    assert len(results) >= 8, results
    assert grid.failures(results) == {}


def _w8a16_cases(layouts):
    return [
        c.id
        for c in grid.cases()
        if c.name == "fp8_gemm_w8a16"
        and c.namespace == "_xpu_C"
        and c.params["layout"] in layouts
    ]


def test_unpatched_kernels_release_fails_the_same_grid(kernels_release):
    """Negative control: vLLM's own fakes fail where the canonical ones pass
    (3-D, transposed and row-sliced inputs; fp16 for out_dtype=None) and pass
    the 2-D contiguous cases, so the grid tells the two apart."""
    libraries = _load(releases.pristine(kernels_release), kernels_release)  # noqa: F841
    results = grid.run()
    failed = grid.failures(results)
    for case in _w8a16_cases({"3d", "3d-mbk", "row-sliced"}):
        assert case in failed, f"{case} passed with vLLM's own fake"
    for case in _w8a16_cases({"2d"}):
        assert results[case] is None, f"{case}: {results[case]}"
    fp8_gemm_none = [
        c.id
        for c in grid.cases()
        if c.name == "fp8_gemm"
        and c.overload == "default"
        and c.params["out_dtype"] is None
        and c.params["layout"] == "2d"
    ]
    if "_xpu_C::fp8_gemm" in _upstream_fakes(kernels_release):
        for case in fp8_gemm_none:
            assert "dtype" in failed.get(case, "").lower(), (case, failed.get(case))


def _upstream_fakes(release: str) -> set[str]:
    text = (releases.pristine(release) / "vllm" / "_xpu_ops.py").read_text()
    import re

    return set(re.findall(r'@register_fake\("(_xpu_C::\w+)"\)', text))
