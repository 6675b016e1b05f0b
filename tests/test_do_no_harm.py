"""Do no harm: after the fix, every op that had a fake in the tree still has
one for its live schema (issue 50).

The harm this guards against, found on intel/llm-scaler's 0.21.0-b3.1 image
(../shared/reference/images/): its kernels patch gives
`_xpu_C::fp8_gemm_w8a16` a trailing `int group_size=0` and the tree's own
vllm/_xpu_ops.py fake takes it. Apply used to remove that fake, and ours,
written for upstream's schema, registered nothing: start-up died with the
report's own `Unsupported: Operator does not support running with fake
tensors`.

Now apply removes a tree's fake only where it is one of vLLM's releases'
(data/tree_fakes.toml); any other stays, and ours replaces it at start-up
only where the live schema is one ours is exact for (the b3.1 schema is one:
fakes.toml's `also`, read here from the image's own kernels patch).

Each test imports the tree's vllm/_xpu_ops.py with the op defined on a CPU
as the image's kernels define it (stubbed: the XPU kernel, a CPU matmul;
the package vllm_xpu_kernels, which needs an Intel GPU runtime), in a forked
process (registrations are process-global). The negative control is today's
behaviour: every block removed and ours knowing only upstream's schema.
"""

import re
import sys
from pathlib import Path

import pytest
import torch

from support import images, releases, tool
from xpufakes.changes import recipes
from xpufakes.common import ops
from xpufakes.proof.xpu import registering, xpu_kernels

pytestmark = pytest.mark.forked

W8A16 = "_xpu_C::fp8_gemm_w8a16"


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


def _define(schema: str) -> torch.library.Library:
    """The op with `schema`, its CPU kernel the block-scaled W8A16 GEMM
    (A @ dequantized B; B [K, N], scales [K/g, N/g] or per-tensor)."""
    library = torch.library.Library("_xpu_C", "FRAGMENT")
    library.define(schema)
    name = schema.partition("(")[0]

    def kernel(A, B, B_scale, bias, *rest):
        group = rest[0] if rest else 0
        scale = B_scale.float() if B_scale is not None else torch.ones(1)
        if group:
            scale = scale.repeat_interleave(group, 0).repeat_interleave(group, 1)
        out = (A.float() @ (B.float() * scale)).to(A.dtype)
        return out if bias is None else out + bias

    library.impl(name, kernel, "CPU")
    return library


def _import_tree(tree: Path, today: bool = False):
    """The tree's vllm/_xpu_ops.py imported (its fakes and ours registered);
    `today`: ours knowing only upstream's schemas, as before this change."""
    sys.dont_write_bytecode = True
    xpu_kernels.stub_xpu_kernel_package()
    sys.path.insert(0, str(tree))
    if today and (tree / recipes.FAKES_MODULE).is_file():
        import vllm._xpu_gemm_fakes as fakes

        fakes.SCHEMA_VARIANTS.clear()
    return registering.import_registering_module(None)


def _registered_by(op: str) -> str | None:
    """The file that registered the op's fake ("_xpu_ops.py": the tree's;
    "_xpu_gemm_fakes.py": ours), or None."""
    kernel = registering.fake_of(op)
    return None if kernel is None else Path(kernel.source.rpartition(":")[0]).name


def _compiled_w8a16(A, B, scale, group):
    def f(a, b, s):
        return torch.ops._xpu_C.fp8_gemm_w8a16(a, b, s, None, group) * 2

    return torch.compile(f, fullgraph=True, backend="aot_eager")(A, B, scale)


def _remove_every_block(tree: Path) -> None:
    """Today's recipe: every `if hasattr(torch.ops._xpu_C, ...)` fake removed,
    however the tree wrote it."""
    path = tree / recipes.XPU_OPS
    text = path.read_text()
    body = recipes._statements(text)
    known = {
        f"{ops.XPU_C}::{recipes.xpu_c_gemm_guard(n)}": frozenset(
            {recipes.fake_block_digest(n)}
        )
        for n in body
        if recipes.xpu_c_gemm_guard(n)
    }
    original = recipes._known_tree_fakes
    recipes._known_tree_fakes = lambda: known
    try:
        path.write_text(recipes.edit_xpu_ops_and_wrappers(text))
    finally:
        recipes._known_tree_fakes = original


@pytest.fixture(scope="module")
def b31_schema() -> str:
    return "_xpu_C::" + image_schema(images.kernels_patch(), W8A16)


def test_the_image_schema_is_one_ours_is_exact_for(b31_schema):
    """Read from the image's kernels patch, not from our data: the b3.1
    schema is one fakes.toml's `also` names, and the fake module's too."""
    assert b31_schema.endswith("Tensor? bias_, int group_size=0) -> Tensor")
    assert b31_schema in ops.exact_schemas(W8A16)
    assert b31_schema != ops.exact_schemas(W8A16)[0]  # not upstream's


@pytest.mark.parametrize("how", ["unpatched", "applied", "today"])
def test_b31_fp8_gemm_w8a16_compiles_as_before_apply(how, b31_schema, tmp_path):
    tree = images.b31_copy(tmp_path / "b3.1")
    if how == "applied":
        result = tool.run("apply", str(tree), "--no-proof")
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"the tree's own fake of {W8A16}" in result.stderr
        assert result.stdout.rstrip().endswith(f"the tree's own fake kept for {W8A16}")
    elif how == "today":
        assert tool.run("apply", str(tree), "--no-proof").returncode == 0
        _remove_every_block(tree)
    library = _define(b31_schema)  # noqa: F841 - keeps the op defined
    _import_tree(tree, today=how == "today")
    fake = _registered_by(W8A16)
    k, n, g = 256, 384, 128
    B = torch.randn(k, n).to(torch.float8_e4m3fn)
    scale = torch.rand(k // g, n // g) + 0.5
    A = torch.randn(5, k, dtype=torch.float16)
    if how == "today":
        with pytest.raises(Exception, match="does not support running with fake"):
            _compiled_w8a16(A, B, scale, g)
        assert fake is None
        return
    compiled = _compiled_w8a16(A, B, scale, g)
    eager = torch.ops._xpu_C.fp8_gemm_w8a16(A, B, scale, None, g) * 2
    torch.testing.assert_close(compiled, eager)
    if how == "applied":
        # ours, exact for the image's schema: a 3-D activation keeps its
        # shape (the tree's flattens it to 2-D)
        assert fake == "_xpu_gemm_fakes.py", fake
        A3 = torch.randn(2, 3, k, dtype=torch.float16)
        compiled = _compiled_w8a16(A3, B, scale, g)
        assert compiled.shape == (2, 3, n)
        torch.testing.assert_close(
            compiled, torch.ops._xpu_C.fp8_gemm_w8a16(A3, B, scale, None, g) * 2
        )
    else:
        assert fake == "_xpu_ops.py", fake


# The ops vllm/_xpu_ops.py of 0.21.0 registers a fake for (fp4_gemm's comes
# with 0.28.0), each given a trailing defaulted argument, in the kernels'
# schema and in the tree's fake, as an image would: not a schema we know.
VARIED = {
    op: ops.exact_schemas(op)[0].replace(") ->", ", int extra=0) ->", 1)
    for op in (
        "_xpu_C::fp8_gemm",
        W8A16,
        "_xpu_C::int4_gemm_w4a8",
        "_xpu_C::int4_gemm_w4a16",
    )
}


def _varied_tree(tmp_path: Path, op: str) -> Path:
    tree = releases.copy_of(images.B31_RELEASE, tmp_path / "tree")
    path = tree / recipes.XPU_OPS
    text = path.read_text()
    gemm = op.partition("::")[2]
    block = next(
        n for n in recipes._statements(text) if recipes.xpu_c_gemm_guard(n) == gemm
    )
    lines = text.splitlines(keepends=True)
    # the fake's signature gains the argument: `) -> torch.Tensor:` of its def
    for i in range(block.lineno - 1, block.end_lineno):
        if lines[i].strip() == ") -> torch.Tensor:":
            lines[i : i + 1] = ["        extra: int = 0,\n", lines[i]]
            break
    else:
        raise AssertionError(f"no signature end in {gemm}'s block")
    path.write_text("".join(lines))
    return tree


@pytest.mark.parametrize("how", ["applied", "today"])
@pytest.mark.parametrize("op", list(VARIED))
def test_a_live_schema_we_do_not_know_keeps_the_tree_fake(op, how, tmp_path):
    tree = _varied_tree(tmp_path, op)
    result = tool.run("apply", str(tree), "--no-proof")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"the tree's own fake of {op}" in result.stderr
    if how == "today":
        _remove_every_block(tree)
    library = torch.library.Library("_xpu_C", "FRAGMENT")  # noqa: F841
    library.define(VARIED[op].partition("::")[2])
    _import_tree(tree, today=how == "today")
    fake = _registered_by(op)
    fakes = sys.modules["vllm._xpu_gemm_fakes"]
    assert op not in fakes._registrations  # ours: not for this schema
    if how == "today":
        assert fake is None
    else:
        assert fake == "_xpu_ops.py", fake
