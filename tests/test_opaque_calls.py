"""The wrappers of the calls Dynamo cannot trace: the contracts (one table,
data/opaque_calls.toml, and its copy in vllm/_xpu_opaque_calls.py), the
recipe that turns each call into its op's call (any file of vllm/, refusing
what it cannot rewrite), and the ops themselves, imported from a patched
tree with the stand-ins as the kernels: a compiled trace through the op
passes where the same trace through the callee fails as on the XPU, the
results are the callee's, and opcheck catches a wrong contract.

(opcheck of every op against CPU references runs inside the patched 0.14.1
tree with vLLM's own opcheck: tests/test_tree_test.py.)"""

import ast
import importlib
import re
import sys

import pytest

from support import downstream, releases
from xpufakes.changes import recipes
from xpufakes.common import paths

OVERLAY = paths.OVERLAY / recipes.OPAQUE_MODULE


def overlay_contracts(text: str) -> dict:
    """vllm/_xpu_opaque_calls.py's CONTRACTS, read from its source."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.AnnAssign) and node.target.id == "CONTRACTS":
            return ast.literal_eval(node.value)
    raise AssertionError("no CONTRACTS in the overlay module")


def differences(table: dict, copy: dict) -> list[str]:
    """Where the overlay's copy differs from the tool's table."""
    found = [f"{c}: only in the table" for c in table if c not in copy]
    found += [f"{c}: only in the copy" for c in copy if c not in table]
    for callee in set(table) & set(copy):
        entry = table[callee]
        expected = (
            entry["op"],
            tuple(entry["params"]),
            tuple(entry["mutates"]),
            entry["returns"],
        )
        if copy[callee] != expected:
            found.append(f"{callee}: {copy[callee]} != {expected}")
    return found


def test_the_overlay_carries_the_same_contracts():
    copy = overlay_contracts(OVERLAY.read_text())
    assert differences(recipes.OPAQUE_CALLS, copy) == []
    # negative control: a copy that lost a mutation is caught
    callee = "vllm._C.ops.fused_add_rms_norm"
    op, params, _, returns = copy[callee]
    wrong = copy | {callee: (op, params, ("input",), returns)}
    assert differences(recipes.OPAQUE_CALLS, wrong) == [
        f"{callee}: {wrong[callee]} != {copy[callee]}"
    ]


def test_every_contract_has_a_source_and_consistent_params():
    for callee, entry in recipes.OPAQUE_CALLS.items():
        names = [p.split()[1].split("=")[0] for p in entry["params"]]
        assert set(entry["mutates"]) <= set(names), callee
        assert entry["source"], callee
        if entry["returns"]:
            assert entry["returns"].split()[1] in names, callee


REFUSED = [
    (
        "ipex.llm.functional.silu_and_mul(x, out=out, approximate='tanh')",
        "keyword 'approximate' is not in the contract",
    ),
    ("ipex.llm.functional.silu_and_mul(*args)", "it passes *args"),
    ("ipex.llm.functional.silu_and_mul(x)", "it does not pass 'out'"),
]


@pytest.mark.parametrize(("call", "why"), REFUSED, ids=[w for _, w in REFUSED])
def test_a_call_the_recipe_cannot_rewrite_is_refused(call, why):
    text = (
        "import torch\n\nimport intel_extension_for_pytorch as ipex\n\n"
        "from vllm.logger import init_logger\n\n\n"
        f"def act(x, out, args):\n    {call}\n"
    )
    with pytest.raises(recipes.RecipeRefusal, match=re.escape(why)) as refusal:
        recipes.edit_opaque_calls(text)
    assert "line 9: intel_extension_for_pytorch.llm.functional.silu_and_mul" in str(
        refusal.value
    )
    # negative control: the call as vLLM writes it is rewritten
    good = text.replace(call, "ipex.llm.functional.silu_and_mul(x, out=out)")
    assert "torch.ops.vllm.ipex_silu_and_mul(x, out=out)" in (
        recipes.edit_opaque_calls(good)
    )


def test_the_recipe_finds_the_calls_in_every_import_form():
    text = (
        "import torch\n\nimport vllm._C.ops\nfrom vllm._C import ops as native\n"
        "from vllm.logger import init_logger\n\n\n"
        "def f(q, k, x, w):\n"
        "    from vllm._C.ops import rms_norm\n\n"
        "    vllm._C.ops.rotary_embedding(q, q, k, 4, q, True)\n"
        "    native.fused_add_rms_norm(x, x, w, 1e-6)\n"
        "    rms_norm(x, x, w, 1e-6)\n"
        "    torch.ops.torch_ipex.rms_norm_vllm(x, x, w, 1e-6)\n"
    )
    edited = recipes.edit_opaque_calls(text)
    for op in (
        "xpu_c_rotary_embedding",
        "xpu_c_fused_add_rms_norm",
        "xpu_c_rms_norm",
        "ipex_rms_norm_vllm",
    ):
        assert f"torch.ops.vllm.{op}(" in edited, edited
    assert recipes.opaque_call_sites(edited) == []
    assert edited.splitlines()[2:4] == [
        # left for the import's other effects, marked for the linter (eed18be)
        "import vllm._C.ops  # noqa: F401",
        "import vllm._xpu_opaque_calls  # noqa: F401",
    ]
    # negative control: a function of the same name from elsewhere is left
    other = text.replace(
        "from vllm._C.ops import rms_norm", "from mine import rms_norm"
    )
    assert "    rms_norm(x, x, w, 1e-6)\n" in recipes.edit_opaque_calls(other)


# ---------------------------------------------------------------------------
# The ops, from a patched tree, with the stand-ins as kernels (forked: they
# register ops and hook the import system)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def b6_patched(tmp_path_factory):
    """A b6-like tree (tests/support/downstream.py) applied by recipe."""
    root = downstream.b6_like(tmp_path_factory.mktemp("b6") / "tree")
    from support import tool

    result = tool.run("apply", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm/_ipex_ops.py: changed by recipe" in result.stdout
    return root


def _ops_module(tree):
    """Stand-ins first (IPEX, the native vllm._C, torch_ipex ops with CPU
    kernels for the eager runs), then the tree's vllm/_xpu_opaque_calls.py."""
    import torch  # noqa: F401

    from xpufakes.proof.xpu import extensions, ipex

    libraries = [ipex.define_torch_ipex_ops(also_cpu=True)]
    ipex.install_ipex()
    extensions.stub_vllm_extensions(tree)
    sys.path.insert(0, str(tree))
    import vllm._xpu_opaque_calls as calls

    return libraries, calls


def _traced(function, *args) -> str:
    import torch

    class Traced(Exception):
        pass

    def backend(gm, example_inputs):
        raise Traced

    torch._dynamo.reset()
    try:
        torch.compile(function, fullgraph=True, backend=backend, dynamic=True)(*args)
    except Exception as e:  # noqa: BLE001 - the message is the result
        if isinstance(getattr(e, "inner_exception", None), Traced):
            return "traced"
        return " ".join(str(e).split())
    raise AssertionError("the backend was not called")


@pytest.mark.forked
def test_the_rotary_op_traces_where_the_pybind_call_does_not(b6_patched):
    import torch

    libraries, calls = _ops_module(b6_patched)  # noqa: F841
    native = importlib.import_module("vllm._C.ops")
    cache = torch.randn(16, 8)

    def through_op(positions, q, k):
        torch.ops.vllm.xpu_c_rotary_embedding(positions, q, k, 8, cache, True)
        return q + k.sum()

    def through_callee(positions, q, k):
        native.rotary_embedding(positions, q, k, 8, cache, True)
        return q + k.sum()

    positions, q, k = torch.arange(3), torch.randn(3, 16), torch.randn(3, 8)
    assert _traced(through_op, positions, q, k) == "traced"
    error = _traced(through_callee, positions, q, k)
    assert "marked as skipped" in error and "PyCapsule.rotary_embedding" in error
    # eager: the op runs the callee (the stand-in's reference), in place
    expected_q, expected_k = q.clone(), k.clone()
    native.rotary_embedding(positions, expected_q, expected_k, 8, cache, True)
    through_op(positions, q, k)
    torch.testing.assert_close((q, k), (expected_q, expected_k))


@pytest.mark.forked
def test_opcheck_catches_a_contract_that_hides_a_mutation(b6_patched):
    """The ops pass opcheck with the stand-ins; the same op registered with
    a mutation left out of its schema fails test_schema (negative control)."""
    import torch

    libraries, calls = _ops_module(b6_patched)  # noqa: F841
    x, residual, w = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    args = (x, residual, w, 1e-6)
    torch.library.opcheck(torch.ops.vllm.xpu_c_fused_add_rms_norm.default, args)
    norm = torch.randn(4, 8)
    torch.library.opcheck(torch.ops.vllm.ipex_rms_norm.default, (norm, w, 1e-6))
    torch.library.opcheck(
        torch.ops.vllm.ipex_rms_norm_vllm.default,
        (torch.empty_like(norm), norm, w, 1e-6),
    )
    op, params, _, returns = calls.CONTRACTS["vllm._C.ops.fused_add_rms_norm"]
    signature = calls._signature(params)
    lib = torch.library.Library("xpufakes_wrong", "FRAGMENT")  # noqa: F841
    lib.define(
        "op"
        + torch.library.infer_schema(
            calls._impl("vllm._C.ops.fused_add_rms_norm", returns, signature),
            mutates_args=["input"],  # residual's write left out
        )
    )
    lib.impl(
        "op", calls._impl("vllm._C.ops.fused_add_rms_norm", returns, signature), "CPU"
    )
    lib._register_fake(
        "op", calls._fake("vllm._C.ops.fused_add_rms_norm", returns, signature)
    )
    with pytest.raises(Exception, match="mutated"):
        torch.library.opcheck(torch.ops.xpufakes_wrong.op.default, args)


def test_pinned_ipex_releases_patched_reach_no_call_dynamo_cannot_trace():
    """The series' 0003 on every IPEX-era sample release: the audit's search
    finds no reached call left (negative control: the pristine release)."""
    from xpufakes.proof.static import reach
    from xpufakes.trees import tree

    for version in ("0.10.2", "0.14.1"):
        pristine = reach.find(tree.python_sources(releases.pristine(version)))
        assert any(f.reached for f in pristine), version
        patched = reach.find(tree.python_sources(releases.patched(version)))
        assert [str(f.site) for f in patched if f.reached] == [], version


def test_a_kernel_call_made_too_long_is_laid_out_as_ruff_does():
    """An image's call whose rewrite passes 88 columns, and its import left
    for the ImportError it may raise, laid out as ruff formats them (the
    tree's ruff adds no finding on b18beee: tests/test_llm_scaler_trees.py).
    Negative control: a call that still fits stays on its line."""
    text = (
        "import torch\n\nfrom vllm.logger import init_logger\n\n\n"
        "def act(x, out, n_gate_up, n_half, total_rows):\n"
        "    if x.is_contiguous():\n"
        "        if out.is_contiguous():\n"
        "            try:\n"
        "                from custom_esimd_kernels_vllm import "
        "esimd_moe_gelu_tanh_mul\n"
        "                esimd_moe_gelu_tanh_mul("
        "x, out, n_gate_up, n_half, total_rows)\n"
        "            except ImportError:\n"
        "                pass\n"
    )
    edited = recipes.edit_opaque_calls(text)
    assert (
        "                from custom_esimd_kernels_vllm import (\n"
        "                    esimd_moe_gelu_tanh_mul,  # noqa: F401\n"
        "                )\n"
        "                torch.ops.vllm.esimd_moe_gelu_tanh_mul(\n"
        "                    x, out, n_gate_up, n_half, total_rows\n"
        "                )\n"
    ) in edited, edited
    assert max(len(line) for line in edited.splitlines()) <= 88
    short = text.replace("n_gate_up, n_half, total_rows", "n, h, t")
    assert (
        "                torch.ops.vllm.esimd_moe_gelu_tanh_mul(x, out, n, h, t)\n"
        in (recipes.edit_opaque_calls(short))
    )


# The ops whose schemas return a declared alias (`-> Tensor(a!)`, issue 50):
# llm-scaler b18beee's Qwen3-Next calls, as its tree spells them
MOE_BLOCK = "torch.ops.moe_ops.moe_forward_full_fp8_block"
PACKAGE = "custom_esimd_kernels_vllm"
ALIAS_UTILS = """\
try:
    import custom_esimd_kernels_vllm as _esimd

    ESIMD_AVAILABLE = True
except ImportError:
    _esimd = None
    ESIMD_AVAILABLE = False

if ESIMD_AVAILABLE:
    esimd_norm_gemv_fp8_blockscale = getattr(
        _esimd, "esimd_norm_gemv_fp8_blockscale", None
    )
    esimd_gemv_fp8_blockscale_fused2 = getattr(
        _esimd, "esimd_gemv_fp8_blockscale_fused2", None
    )
"""


def _ruff_formatted(text: str) -> bool:
    import subprocess
    import sys
    from pathlib import Path

    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "format", "--diff", "--line-length", "88", "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    return done.returncode == 0


def test_a_getattr_kept_callee_becomes_as_custom_op_laid_out_as_ruff_does():
    """`f = getattr(_esimd, "f", None)` (llm-scaler's esimd_utils) keeps
    `as_custom_op("f", getattr(...))`, ruff-formatted; a getattr of a
    function no contract names is left as it was (the control)."""
    assert f"{PACKAGE}.esimd_norm_gemv_fp8_blockscale" in recipes.OPAQUE_CALLS
    assert f"{PACKAGE}.esimd_gemv_fp8_blockscale_fused2" not in recipes.OPAQUE_CALLS
    edited = recipes.edit_opaque_calls("import torch\n\n" + ALIAS_UTILS)
    assert (
        "    esimd_norm_gemv_fp8_blockscale = vllm._xpu_opaque_calls.as_custom_op(\n"
        '        "esimd_norm_gemv_fp8_blockscale",\n'
        '        getattr(_esimd, "esimd_norm_gemv_fp8_blockscale", None),\n'
        "    )\n"
    ) in edited
    assert (
        "    esimd_gemv_fp8_blockscale_fused2 = getattr(\n"
        '        _esimd, "esimd_gemv_fp8_blockscale_fused2", None\n'
        "    )\n"
    ) in edited
    assert "import vllm._xpu_opaque_calls\n" in edited  # used: no noqa
    assert _ruff_formatted(edited)


def test_a_call_whose_result_is_used_calls_routed():
    """A call of a callee whose vLLM op returns nothing, its result used,
    becomes `routed("<op>")(...)`, which gives the caller the argument the
    kernel returns (IPEX's silu_and_mul: `out`); the control: a callee that
    returns nothing the caller may use is refused there."""
    entry = recipes.OPAQUE_CALLS[MOE_BLOCK]
    assert (entry["returns"], entry["callee_returns"]) == ("", "output")
    text = (
        "import torch\n\n\n"
        "def moe(x, logits, output, *w):\n"
        f"    out = {MOE_BLOCK}(\n"
        "        x, logits, output, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],\n"
        "        w[8], 8, 1, 128,\n"
        "    )\n"
        "    return out\n"
    )
    edited = recipes.edit_opaque_calls(text)
    op = entry["op"]
    assert f'    out = vllm._xpu_opaque_calls.routed("{op}")(\n' in edited, edited
    assert "import vllm._xpu_opaque_calls\n" in edited
    assert recipes.opaque_call_sites(edited) == []
    # as a statement, its result dropped: the op's own call
    dropped = text.replace("    out = ", "    ").replace("return out", "return output")
    assert f"    torch.ops.vllm.{op}(\n" in recipes.edit_opaque_calls(dropped)
    ipex = (
        "import torch\n\nimport intel_extension_for_pytorch as ipex\n\n\n"
        "def act(x, out):\n    return ipex.llm.functional.silu_and_mul(x, out)\n"
    )
    assert 'return vllm._xpu_opaque_calls.routed("ipex_silu_and_mul")(x, out)' in (
        recipes.edit_opaque_calls(ipex)
    )
    native = (
        "import torch\n\nimport vllm._C.ops\n\n\n"
        "def norm(x, w):\n    y = vllm._C.ops.rms_norm(x, x, w, 1e-6)\n    return y\n"
    )
    with pytest.raises(recipes.RecipeRefusal, match="its result is used"):
        recipes.edit_opaque_calls(native)
