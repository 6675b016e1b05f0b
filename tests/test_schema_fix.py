"""The fix of the ops whose schemas lie (issue 42, item 2), on the
ESIMD-like tree (tests/support/downstream.py: a pinned kernels-era release
with an image's kind of calls): the opaque-calls recipe routes each lying
call through its vLLM op (vllm/_xpu_opaque_calls.py, its contracts
data/schema_contracts.toml's), and schema truth then reports each lie as
fixed, not failing and not hidden; the same with the plugin's contracts on
the tree as it is. Negative controls: the tree as it is fails; a contract
that leaves a write out fails; the plugin does nothing on a patched tree.
In memory (no tree written, nothing imported): ~20 s of CPU (five checks
of one release, one parse each; the recipe on its files).
(`make apply`/`make revert` of the real b18beee tree: tests/test_llm_scaler_trees.py,
opt-in; the compiled numbers: tests/test_schema_truth_compile.py.)"""

import ast

import pytest

from support import downstream, releases
from xpufakes.changes import recipes
from xpufakes.common import paths
from xpufakes.proof.static import schematruth
from xpufakes.trees import tree

PACKAGE = "custom_esimd_kernels_vllm"
LYING = {f"{PACKAGE}::{n}" for n in ("esimd_rms_norm", "esimd_fused_add_rms_norm")}
BLOCK = f"{PACKAGE}::esimd_gemm_fp8_blockscale"
OVERLAY = (paths.OVERLAY / recipes.OPAQUE_MODULE).read_text()


@pytest.fixture(scope="module")
def esimd_tree() -> dict[str, str]:
    texts = tree.python_sources(releases.pristine(downstream.ESIMD_BASE))
    return downstream.esimd_texts(texts)


def _applied(texts: dict[str, str], overlay: str = OVERLAY) -> dict[str, str]:
    """The tree as the recipe path leaves it (live.run_recipes' rule: each
    file the edit's anywhere_if names; the overlay module added)."""
    recipe = recipes.DOWNSTREAM["kernels"][0]  # the lying calls'
    (edit,) = recipe.edits
    edited = {p: edit.edit(t) if edit.anywhere_if(t) else t for p, t in texts.items()}
    edited[recipes.OPAQUE_MODULE] = overlay
    return edited


def _by_op(truth) -> dict[str, schematruth.OpTruth]:
    return {o.op: o for o in truth.ops}


def test_the_recipe_routes_the_lying_calls_and_schema_truth_says_fixed(esimd_tree):
    before = _by_op(schematruth.check(esimd_tree, downstream.ESIMD_BASE))
    # negative control: the tree as it is fails on each traced lie
    for op in LYING:
        assert before[op].failing and before[op].sites, op
        assert not before[op].fixed
    applied = _applied(esimd_tree)
    changed = sorted(p for p in applied if applied[p] != esimd_tree.get(p))
    assert changed == sorted(
        [downstream.ESIMD_UTILS, downstream.ESIMD_LAYERNORM, recipes.OPAQUE_MODULE]
    )
    utils = applied[downstream.ESIMD_UTILS]
    assert (
        "    esimd_rms_norm = vllm._xpu_opaque_calls.as_custom_op(\n"
        '        "esimd_rms_norm", _esimd.esimd_rms_norm\n    )\n'
    ) in utils
    assert "\nimport os\n\nimport vllm._xpu_opaque_calls\n\ntry:" in utils
    norm = applied[downstream.ESIMD_LAYERNORM]
    assert (
        "self._add_norm = vllm._xpu_opaque_calls.as_custom_op(\n"
        '                "esimd_fused_add_rms_norm", esimd_fused_add_rms_norm\n'
    ) in norm
    for text in (utils, norm):
        ast.parse(text)
    after = schematruth.check(applied, downstream.ESIMD_BASE)
    found = _by_op(after)
    for op in LYING | {BLOCK}:
        o = found[op]  # still listed: the kernel's schema still lies
        assert o.lies and not o.sites and not o.failing, op
        assert o.fixed_on_path and o.gaps == [], op
        assert o.fixed_by.startswith(f"vllm::{op.split('::')[1]} (the series'")
    assert not [o.op for o in after.failing if o.op.startswith(PACKAGE)]
    said = "\n".join(schematruth.lines(after))
    assert f"{BLOCK}: fixed: its schema lies, and the traced calls reach it" in said


def test_a_contract_that_leaves_a_write_out_fails(esimd_tree):
    callee = f"{PACKAGE}.esimd_fused_add_rms_norm"
    assert schematruth.contracts_of(OVERLAY)[callee][2] == ("hidden_states", "residual")
    entry = f'    "{callee}": (\n'
    at = OVERLAY.index(entry)
    marks = '        ("hidden_states", "residual"),\n'
    end = OVERLAY.index(marks, at) + len(marks)
    # the overlay with residual's write left out of that contract
    wrong = OVERLAY[:at] + OVERLAY[at:end].replace(
        marks, '        ("hidden_states",),\n'
    )
    wrong += OVERLAY[end:]
    assert schematruth.contracts_of(wrong)[callee][2] == ("hidden_states",)
    found = _by_op(schematruth.check(_applied(esimd_tree, wrong), "0.27.1"))
    o = found[f"{PACKAGE}::esimd_fused_add_rms_norm"]
    assert o.failing and not o.fixed_on_path
    assert o.gaps == [
        "(a) `residual` is written and vllm::esimd_fused_add_rms_norm does not mark it"
    ]
    # the others stay fixed
    assert not found[f"{PACKAGE}::esimd_rms_norm"].failing


def test_the_plugins_contracts_fix_the_tree_as_it_is(esimd_tree):
    routing = schematruth.Routing(
        schematruth.contracts_of(OVERLAY), "the vLLM plugin (test)", False
    )
    found = _by_op(schematruth.check(esimd_tree, "0.27.1", plugin=routing))
    for op in LYING | {BLOCK}:
        assert found[op].fixed_on_path and not found[op].failing, op
        assert (
            found[op].fixed_by == f"vllm::{op.split('::')[1]} (the vLLM plugin (test))"
        )
    # negative control: on a tree make apply patched the plugin does nothing
    patched = dict(esimd_tree) | {schematruth.PATCHED_MODULE: ""}
    found = _by_op(schematruth.check(patched, "0.27.1", plugin=routing))
    assert all(found[op].failing for op in LYING)
