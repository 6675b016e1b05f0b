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

import hashlib
import re
import sys
from pathlib import Path

import pytest
import torch

from support import images, releases, tool
from xpufakes.changes import recipes
from xpufakes.common import ops, paths
from xpufakes.proof.xpu import registering, xpu_kernels

pytestmark = pytest.mark.forked

W8A16 = images.W8A16


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


def _import_tree(tree: Path):
    """The tree's vllm/_xpu_ops.py imported (its fakes and ours registered)."""
    sys.dont_write_bytecode = True
    xpu_kernels.stub_xpu_kernel_package()
    sys.path.insert(0, str(tree))
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


def _remove_every_block(tree: Path, original: str) -> None:
    """Today's apply: its recipe on the tree's vllm/_xpu_ops.py as it was
    before apply (every `if hasattr(torch.ops._xpu_C, ...)` fake removed,
    however the tree wrote it), and our fake module without the fakes of
    downstream builds."""
    body = recipes._statements(original)
    known = {
        f"{ops.XPU_C}::{recipes.xpu_c_gemm_guard(n)}": frozenset(
            {recipes.fake_block_digest(n)}
        )
        for n in body
        if recipes.xpu_c_gemm_guard(n)
    }
    saved = recipes._known_tree_fakes
    recipes._known_tree_fakes = lambda: known
    try:
        edited = recipes.edit_xpu_ops_and_wrappers(original)
    finally:
        recipes._known_tree_fakes = saved
    (tree / recipes.XPU_OPS).write_text(edited)
    # and ours knowing only upstream's schemas, as it did
    with (tree / recipes.FAKES_MODULE).open("a") as module:
        module.write("\nSCHEMA_VARIANTS.clear()  # today's: upstream's schemas only\n")


def _cached(name: str, build) -> Path:
    """A tree `build(root)` makes, made once per content of what makes it
    (the recipes, our fake module, the data, this file) and kept in the
    cache: the tests run forked, so a fixture would be made in each."""
    digest = hashlib.sha256()
    for path in (
        Path(recipes.__file__),
        paths.OVERLAY / recipes.FAKES_MODULE,
        paths.OVERLAY / recipes.OPAQUE_MODULE,
        recipes.TREE_FAKES,
        Path(__file__),
    ):
        digest.update(path.read_bytes())
    return images.cached(f"{name}-{digest.hexdigest()[:16]}", build)


def _apply(tree: Path) -> None:
    result = tool.run("apply", str(tree), "--no-proof")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def b31_schema() -> str:
    """The image's schema of fp8_gemm_w8a16 (a function-scoped fixture: a
    module-scoped one would hold every test on one worker, conftest.py)."""
    return "_xpu_C::" + images.image_schema(images.kernels_patch(), W8A16)


def _b31_applied(root: Path) -> None:
    applied = tool.run("apply", str(images.b31_copy(root)), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # loud, in a warning and in the last line
    assert f"the tree's own fake of {W8A16}" in applied.stderr
    assert applied.stdout.rstrip().endswith(f"the tree's own fake kept for {W8A16}")


def _b31_today(root: Path) -> None:
    images.b31_copy(root)
    original = (root / recipes.XPU_OPS).read_text()
    _apply(root)
    _remove_every_block(root, original)


@pytest.fixture
def b31_trees() -> dict[str, Path]:
    """The b3.1 tree as it is, after apply, and after today's apply."""
    return {
        "unpatched": images.b31_cached(),
        "applied": _cached("b31-applied", _b31_applied),
        "today": _cached("b31-today", _b31_today),
    }


def test_the_image_schema_has_a_fake_of_ours(b31_schema):
    """Read from the image's kernels patch, not from our data: the b3.1
    schema is one fakes.toml's `also` names, and the overlay's fake for it
    is the one that table names."""
    assert b31_schema.endswith("Tensor? bias_, int group_size=0) -> Tensor")
    assert b31_schema in ops.exact_schemas(W8A16)
    assert b31_schema != ops.exact_schemas(W8A16)[0]  # not upstream's
    sys.path.insert(0, str(paths.OVERLAY))
    import vllm._xpu_gemm_fakes as fakes

    (entry,) = [e for e in ops.FAKES if e["name"] == W8A16]
    (also,) = entry["also"]
    assert fakes.SCHEMA_VARIANTS[W8A16][b31_schema].__name__ == also["fake"]


@pytest.mark.parametrize("how", ["unpatched", "applied", "today"])
def test_b31_fp8_gemm_w8a16_compiles_as_before_apply(how, b31_schema, b31_trees):
    tree = b31_trees[how]
    library = _define(b31_schema)  # noqa: F841 - keeps the op defined
    _import_tree(tree)
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
# with 0.28.0).
REPLACED = (
    "_xpu_C::fp8_gemm",
    W8A16,
    "_xpu_C::int4_gemm_w4a8",
    "_xpu_C::int4_gemm_w4a16",
)


def _b31_live_schema(op: str, b31_schema: str) -> str:
    return b31_schema if op == W8A16 else ops.exact_schemas(op)[0]


def _renamed(schema: str) -> str:
    """The schema with its first argument renamed."""
    renamed = re.sub(r"\(Tensor \w+,", "(Tensor input,", schema, count=1)
    assert renamed != schema
    return renamed


def _trailing(schema: str) -> str:
    return schema.replace(") ->", ", int extra=0) ->", 1)


def _varied(op: str, how: str) -> Path:
    """0.21.0 with one op's fake given a trailing defaulted argument, as an
    image does for its own build of the kernels: applied, or by today's
    apply."""

    def build(root: Path) -> None:
        _varied_tree(root, op)
        original = (root / recipes.XPU_OPS).read_text()
        result = tool.run("apply", str(root), "--no-proof")
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"the tree's own fake of {op}" in result.stderr
        if how == "today":
            _remove_every_block(root, original)

    return _cached(f"varied-{op.partition('::')[2]}-{how}", build)


@pytest.mark.parametrize("how", ["applied", "today"])
@pytest.mark.parametrize("op", REPLACED)
def test_a_trailing_argument_keeps_the_tree_fake(op, how):
    """The image changed the kernel's schema and the tree's fake; ours does
    not know that schema: the tree's fake stays."""
    library = torch.library.Library("_xpu_C", "FRAGMENT")  # noqa: F841
    library.define(_trailing(ops.exact_schemas(op)[0]).partition("::")[2])
    _import_tree(_varied(op, how))
    assert op not in sys.modules["vllm._xpu_gemm_fakes"]._registrations
    assert _registered_by(op) == (None if how == "today" else "_xpu_ops.py")


@pytest.mark.parametrize("how", ["applied", "today"])
@pytest.mark.parametrize("op", REPLACED)
def test_a_renamed_argument_keeps_the_tree_fake(op, how, b31_schema, b31_trees):
    """The kernels renamed an argument, the tree's fake is vLLM's (it binds
    by position): the fake stays where the live schema is not one ours is
    exact for."""
    library = torch.library.Library("_xpu_C", "FRAGMENT")  # noqa: F841
    library.define(_renamed(_b31_live_schema(op, b31_schema)).partition("::")[2])
    _import_tree(b31_trees[how])
    assert op not in sys.modules["vllm._xpu_gemm_fakes"]._registrations
    assert _registered_by(op) == (None if how == "today" else "_xpu_ops.py")


@pytest.mark.parametrize("op", REPLACED)
def test_a_schema_ours_is_exact_for_replaces_the_tree_fake(op, b31_schema, b31_trees):
    """Where the live schema is one ours is exact for, ours replaces the
    fake the tree keeps."""
    library = torch.library.Library("_xpu_C", "FRAGMENT")  # noqa: F841
    library.define(_b31_live_schema(op, b31_schema).partition("::")[2])
    _import_tree(b31_trees["applied"])
    assert op in sys.modules["vllm._xpu_gemm_fakes"]._registrations
    assert _registered_by(op) == "_xpu_gemm_fakes.py"


def _varied_tree(root: Path, op: str) -> Path:
    tree = releases.copy_of(images.B31_RELEASE, root)
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


@pytest.mark.parametrize("how", ["unpatched", "applied", "today"])
def test_the_b31_audit_sees_what_the_image_would_do(how, b31_trees):
    """`make audit` meets the image's schemas (its stand-ins are the
    image's build, proof/xpu/image_kernels.py): before apply the tree's
    fake does not conform (it flattens a 3-D activation) and other lies
    fail; after apply it exits 0; after today's apply the op has no fake,
    the report's crash, which the audit used to call ok."""
    result = tool.run("audit", str(b31_trees[how]))
    out = result.stdout
    assert "llm-scaler 0.21.0-b3.1 (llm-scaler 25095b4" in out, out[:500]
    assert "stand-in kernels: llm-scaler-kernels 25095b4; " in out, out[:500]
    verdict = {
        "unpatched": f"{W8A16}: FAIL: fake does not conform",
        "applied": f"{W8A16}: ok",
        "today": f"{W8A16}: FAIL: no fake",
    }[how]
    assert verdict in out.splitlines(), out[-3000:]
    assert result.returncode == (0 if how == "applied" else 1), out[-3000:]
    if how == "applied":
        assert not [line for line in out.splitlines() if line.startswith("FAIL")]
