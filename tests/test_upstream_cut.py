"""The upstream cut (scripts/xpufakes/upstream.py) on the canonical overlay:
what each transformation keeps and drops, for the 0.33.0 tree and for trees
that pin differently (the negative controls: an older kernels pin keeps the
gate's check, an unpinned tree keeps the gating, an old torch keeps the
shims, the IPEX era keeps the IPEX fakes)."""

import ast

import pytest

from support import releases
from xpufakes import recipes, upstream
from xpufakes.series import overlay_source

FAKES = recipes.FAKES_MODULE
REFERENCE = recipes.TREE_TEST_REFERENCE
TEST = recipes.TREE_TEST
TWO_D_ONLY = "OneDNN Matmul only support 2D weights!"


def _cut(target: upstream.Target) -> dict[str, str]:
    files = {p: overlay_source(p).read_text() for p in recipes.OVERLAY}
    pristine = releases.pristine("0.33.0") / "vllm" / "_xpu_ops.py"
    files["vllm/_xpu_ops.py"] = recipes.edit_xpu_ops(pristine.read_text())
    return upstream.cut(files, target)


def _defined(text: str) -> set[str]:
    return {n.name for n in ast.parse(text).body if hasattr(n, "name")}


def test_the_tree_pins_are_read_from_requirements():
    target = upstream.target_of(releases.pristine("0.33.0"), "kernels")
    assert target == upstream.Target("kernels", (0, 1, 15, 4), (2, 14, 0))
    assert upstream.pinned("vllm-xpu-kernels>=0.1.10\n", "vllm_xpu_kernels") is None
    assert upstream.pinned("vllm_xpu_kernels==0.1.9 ; x\n", "vllm-xpu-kernels") == (
        0,
        1,
        9,
    )


def test_kernels_cut_of_0_33_0():
    cut = _cut(upstream.target_of(releases.pristine("0.33.0"), "kernels"))
    fakes, reference = cut[FAKES], cut[REFERENCE]
    for text in cut.values():
        compile(text, "cut", "exec")
        assert "# xpufakes:" not in text
    assert {"register_xpu_gemm_fakes", "fp8_gemm_fake"} <= _defined(fakes)
    assert not {"register_ipex_gemm_fakes", "ipex_fp8_gemm_w8a16_fake"} & _defined(
        fakes
    )
    assert "_kernel_has" not in fakes and TWO_D_ONLY not in fakes
    assert "t.is_contiguous()" in fakes  # the folded gate's check stays
    assert "torch.float4_e2m1fn_x2" in fakes and "getattr(torch, " not in fakes
    assert "init_logger(__name__)" in fakes and "import logging" not in fakes
    assert "define_xpu_c_kernels" in _defined(reference)
    assert not {"define_torch_ipex_kernels", "ReferenceWOQLinear"} & _defined(reference)
    assert '"torch_ipex"' not in reference
    assert "register_ipex_gemm_fakes" not in cut[TEST]


def test_negative_controls_keep_what_the_tree_may_use():
    older = _cut(upstream.Target("kernels", (0, 1, 10), (2, 14)))[FAKES]
    assert TWO_D_ONLY in older and "_kernel_has" not in older
    assert "t.is_contiguous()" not in older  # contiguity checks came in 0.1.13
    unpinned = _cut(upstream.Target("kernels", None, (2, 14)))[FAKES]
    assert "_kernel_has(" in unpinned and "_xpu_kernels_version" in unpinned
    old_torch = _cut(upstream.Target("kernels", (0, 1, 15, 4), (2, 6)))[FAKES]
    assert 'getattr(torch, "float4_e2m1fn_x2", None)' in old_torch
    ipex = _cut(upstream.Target("ipex"))
    assert "register_ipex_gemm_fakes" in _defined(ipex[FAKES])
    assert "define_torch_ipex_kernels" in ipex[TEST]
    assert "# xpufakes:" not in ipex[TEST]


def test_an_unclosed_region_is_an_error():
    with pytest.raises(ValueError, match="unclosed"):
        upstream.strip_regions("# xpufakes: ipex-only begin\nx = 1\n", {"ipex-only"})
