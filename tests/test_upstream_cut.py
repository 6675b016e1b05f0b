"""The cuts of the canonical overlay: the full upstream cut
(scripts/xpufakes/staging/upstream.py), what each transformation keeps and drops,
for the 0.33.0 tree and for trees that pin differently (the negative
controls: an older kernels pin keeps the gate's check, an unpinned tree
keeps the gating, an old torch keeps the shims, the IPEX era keeps the IPEX
fakes); and the in-place cut (inplace.py) on the pristine files of older
releases (a missing fake added, only the ops the tree has) -- staging it on
0.33.0 is test_stage.py's."""

import ast
import subprocess
import sys
import textwrap

import pytest

from support import releases
from xpufakes.changes import recipes
from xpufakes.changes.series import overlay_source
from xpufakes.common import paths
from xpufakes.staging import inplace, upstream

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


def test_url_pins_name_their_release():
    wheel = "vllm_xpu_kernels @ https://x/v0.1.12/vllm_xpu_kernels-0.1.12-cp38-abi3.whl"
    assert upstream.pinned(wheel + "\n", "vllm-xpu-kernels") == (0, 1, 12)
    two = wheel + "\n" + wheel.replace("0.1.12", "0.1.13") + "\n"
    assert upstream.pinned(two, "vllm-xpu-kernels") is None
    target = upstream.target_of(releases.pristine("0.27.0"), "kernels")
    assert target.kernels == (0, 1, 12)


# ---------------------------------------------------------------------------
# The in-place cut (inplace.py), formatted with this project's ruff
# ---------------------------------------------------------------------------


def _ruff_format(text: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--config", str(OVERLAY_RUFF), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


OVERLAY_RUFF = paths.OVERLAY / "ruff.toml"


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    return {
        n.name: n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)
    }


def test_slim_keeps_what_computes_the_output():
    canonical = inplace.canonical_for(
        upstream.Target("kernels", (0, 1, 15, 4), (2, 14))
    )
    slim = _functions(inplace.slim(canonical, {"int4_gemm_w4a8_fake", "fp8_bmm_fake"}))
    w4a8 = ast.unparse(slim["int4_gemm_w4a8_fake"])
    assert "index_select(-1, g_idx)" in w4a8  # the permuted copy shapes the output
    assert "return _onednn_output(A, B, torch.float16)" in w4a8
    for gone in ("_check", "per_token", "bias"):
        assert gone not in w4a8.split("-> torch.Tensor:")[1], gone
    assert (
        ast.unparse(slim["fp8_bmm_fake"].body)
        == "return _onednn_output(A, B, out_dtype)"
    )
    # the helper keeps the oneDNN glue's checks; other fakes are untouched
    assert "_check(" in ast.unparse(slim["_onednn_output"])
    assert "_check" in ast.unparse(slim["fp8_gemm_fake"])


def test_renaming_follows_the_trees_parameters_and_refuses_a_clash():
    canonical = inplace.canonical_for(
        upstream.Target("kernels", (0, 1, 15, 4), (2, 14))
    )
    fake = _functions(canonical)["int4_gemm_w4a16_fake"]
    names = ["x", "w", "b", "s", "z", "g", "perm"]
    body = inplace.renamed_body(canonical, fake, names, "        ")
    code = ast.unparse(ast.parse(textwrap.dedent(body)))  # without comments
    assert "x = x.index_select(-1, perm)" in code and "g_idx" not in code
    with pytest.raises(inplace.CutError, match="parameters"):
        inplace.renamed_body(canonical, fake, names[:-1], "    ")
    with pytest.raises(inplace.CutError, match="_onednn_output"):
        inplace.renamed_body(canonical, fake, ["_onednn_output", *names[1:]], "    ")


def _in_place(release: str) -> tuple[str, str, inplace.Cut]:
    root = releases.pristine(release)
    cut = inplace.cut(root, _ruff_format)
    return (root / inplace.XPU_OPS).read_text(), cut.commits[-1].files, cut


def test_in_place_cut_of_0_27_0_adds_the_missing_fp4_fake():
    """0.27.0 calls fp4_gemm and has no fake for it (and pins vllm-xpu-kernels
    0.1.12 by URL): the cut adds a block after the others; a negative
    control: the pristine file has none."""
    pristine, files, cut = _in_place("0.27.0")
    assert cut.missing == ["fp4_gemm"] and cut.wrappers == ["_xpu_fp8_bmm_fake"]
    assert 'hasattr(torch.ops._xpu_C, "fp4_gemm")' not in pristine
    text = files[inplace.XPU_OPS]
    block = text.index('if hasattr(torch.ops._xpu_C, "fp4_gemm"):')
    assert block > text.index('if hasattr(torch.ops._xpu_C, "int4_gemm_w4a16"):')
    assert '@register_fake("_xpu_C::fp4_gemm")' in text[block:]
    assert "2D weights!" not in text  # 0.1.12 takes batched weights
    compile(text, "_xpu_ops.py", "exec")
    assert "op-fp4_gemm" not in files[recipes.TREE_TEST]  # markers never go in
    assert "_fp4_gemm" in files[recipes.TREE_TEST]
    assert cut.ops[-1] == "vllm::xpu_fp8_bmm"


def test_in_place_cut_of_0_16_0_keeps_only_its_ops():
    """0.16.0: two GEMMs, no wrapper op, vllm-xpu-kernels 0.1.2 (no batched
    weights, no Intel CI jobs): one commit, the test with those two ops."""
    _, files, cut = _in_place("0.16.0")
    assert cut.gemms == ["fp8_gemm_w8a16", "int4_gemm_w4a16"] and len(cut.commits) == 1
    assert "OneDNN Matmul only support 2D weights!" in files[inplace.XPU_OPS]
    test = files[recipes.TREE_TEST]
    assert "_fp8_gemm_w8a16" in test and "_int4_gemm_w4a16" in test
    for absent in ("_fp4_gemm", "_int4_gemm_w4a8", "_xpu_fp8_bmm", "xpufakes:"):
        assert absent not in test, absent
    assert set(files) == {inplace.XPU_OPS, recipes.TREE_TEST}
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(OVERLAY_RUFF)]
        + ["--stdin-filename", "t.py", "-"],
        input=test,
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout


def test_the_quantization_step_runs_the_test():
    old = (releases.pristine("0.33.0") / inplace.INTEL_QUANTIZATION_JOBS).read_text()
    sources = [inplace.XPU_OPS, recipes.TREE_TEST]
    new = inplace.add_to_quantization_step(old, recipes.TREE_TEST, sources)
    removed = [ln for ln in old.splitlines() if ln not in new.splitlines()]
    added = [ln for ln in new.splitlines() if ln not in old.splitlines()]
    assert len(removed) == 1 and removed[0].endswith("'")  # the last command
    assert added == [
        "  - vllm/_xpu_ops.py",
        f"  - {recipes.TREE_TEST}",
        removed[0].removesuffix("'"),
        f"    && pytest -v -s {recipes.TREE_TEST}'",
    ]
    assert new[len(new.rstrip()) :] == old[len(old.rstrip()) :]  # its last lines
    with pytest.raises(ValueError, match="key: quantization"):
        inplace.add_to_quantization_step("- label: x\n  key: other\n", "t.py", [])
