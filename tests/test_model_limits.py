"""The trees' limits are data, exact, and few (proof/model/limits.py,
data/limits.toml): a cell of the model proof that fails is excused as the
tree's limit only by a listed limit of its tree, model and configuration
whose reason is exactly the cell's error, and never if the error passed
through a line our series or recipes wrote (or one changed since) in a file
they edit or add; a listed limit that no
longer happens is reported; a limit of the proof itself (TP=1) is never
called the tree's, and the table counts each kind. Cheap: no model is built
(the whole audit with the injected fault is in test_model_trace.py).

Negative controls in each test: the reason one character off, the limit of
another tree, model or configuration, the same reason through ipex_quant.py
(a file the series edits), a limited cell that traced."""

import dataclasses
from pathlib import Path

import pytest

from support import downstream, releases, tool
from xpufakes.changes import esimdfacts, live, ourlines
from xpufakes.common import paths
from xpufakes.proof.model import limits, models, report, trace
from xpufakes.trees import pins, tree

REASON = (
    "TypeError: FlashAttentionImpl.__init__() got an unexpected keyword "
    "argument 'q_lora_rank'"
)
ATTENTION = "vllm/v1/attention/backends/flash_attn.py"
OURS = "vllm/model_executor/layers/quantization/ipex_quant.py"
LIMIT = limits.Limit("0.14.1", "deepseek_v2_fp8", "default", REASON, "no MLA")


def _found(result: str, error: str = REASON, files=(ATTENTION,), model=None):
    lines = [f"{f}:{10 if f == OURS else 1}" for f in files]
    cell = {
        "configuration": "default",
        "result": result,
        "error": error,
        "where": [f"{f}:1 f" for f in files],
        "files": list(files),
        "lines": lines,
        "graphs": 0,
        "graph_breaks": 0,
        "ops": [],
        "custom_ops": ["none"],
    }
    return [{"model": model or LIMIT.model, "configurations": [cell]}]


def _classified(found, tree_name="0.14.1", ours=None):
    """classify(), with ipex_quant.py ours whole unless `ours` says which
    of its lines are."""
    return limits.classify(found, tree_name, ours or {OURS: None}, [LIMIT])


def _cell(found) -> dict:
    return found[0]["configurations"][0]


def test_a_listed_limit_excuses_exactly_its_reason():
    for kind in report.ERRORS:  # not built, or failed in the trace
        found = _classified(_found(kind))
        assert _cell(found)["result"] == report.TREE_LIMIT
        assert _cell(found)["limit"] == "no MLA"
        assert not report.failing(found[0])
        assert report.cell(_cell(found)).startswith("the tree's limit: no MLA (")
    # the reason one character off: fails, and the listed one is reported
    # as no longer happening
    found = _classified(_found("not built", REASON + "."))
    assert _cell(found)["result"] == "not built"
    assert report.failing(found[0])
    assert _cell(found)["limit_gone"] == [REASON]
    # another tree, another model, another configuration: nothing listed
    for found in (
        _classified(_found("not built"), tree_name="0.14.0"),
        _classified(_found("not built", model="qwen3_moe")),
        _classified(
            [
                {
                    "model": LIMIT.model,
                    "configurations": [
                        dict(_cell(_found("not built")), configuration="sp")
                    ],
                }
            ]
        ),
    ):
        assert _cell(found)["result"] == "not built", found
        assert "limit_gone" not in _cell(found)
    # a failure of ours (writes lost) is never a limit, whatever its error
    found = _classified(_found("writes lost"))
    assert _cell(found)["result"] == "writes lost"


def test_no_error_through_a_file_of_ours_is_excused():
    """The issue's fault: the reason listed, exactly, but raised in
    ipex_quant.py (which the series edits): it fails, saying why."""
    found = _classified(_found("failed", files=(ATTENTION, OURS)))
    cell = _cell(found)
    assert cell["result"] == "failed" and report.failing(found[0])
    assert OURS in cell["not_excused"]
    assert "not excused: data/limits.toml lists it" in report.table(
        dict(found[0], what="m", standins="k")
    )
    # the control: the same cell with no file of ours is excused
    assert _cell(_classified(_found("failed")))["result"] == report.TREE_LIMIT


def test_a_limit_met_on_the_trees_own_line_of_a_file_we_edit_is_excused():
    """llm-scaler 0a85564's XPUFp8LinearMethod fails in ipex_quant.py, a
    file the series edits, on a line the tree had before apply: a listed
    limit there is the tree's. On a line we wrote (or changed since), or in a
    file whose own text is not known, it is not; a cell recorded without its
    lines is judged by its files."""
    through = _found("failed", files=(ATTENTION, OURS))  # ipex_quant.py:10
    for written, result in (
        ({1, 2, 11}, report.TREE_LIMIT),  # line 10 is the tree's
        ({10}, "failed"),  # line 10 is ours
        (None, "failed"),  # the tree's own text unknown: all of it ours
    ):
        cell = _cell(
            _classified(_found("failed", files=(ATTENTION, OURS)), ours={OURS: written})
        )
        assert cell["result"] == result, (written, cell)
        assert ("not_excused" in cell) == (result == "failed"), cell
    del _cell(through)["lines"]
    assert _cell(_classified(through, ours={OURS: {1}}))["result"] == "failed"


def test_the_trees_own_lines_are_those_it_had_before_apply():
    before = "a = 1\nb = 2\nc = 3\nd = 4\n"
    after = "a = 1\nimport ours\nb = 2\nc = 30\nd = 4\n"
    assert ourlines.not_the_trees(after, before) == {2, 4}
    assert ourlines.not_the_trees(before, before) == set()
    lines = {"x.py": {2}, "y.py": None}
    assert ourlines.frame_is_ours("x.py:2", lines)
    assert not ourlines.frame_is_ours("x.py:3", lines)
    assert ourlines.frame_is_ours("y.py:3", lines)
    assert not ourlines.frame_is_ours("z.py:2", lines)


def test_a_listed_limit_that_no_longer_happens_is_reported():
    traced = _found("traced", error="")
    _cell(traced).update(graphs=1, custom_ops=[], ops=[])
    found = _classified(traced)
    assert _cell(found)["result"] == "traced"
    assert _cell(found)["limit_gone"] == [REASON]
    table = report.matrix(found)
    assert "1 listed limit(s) no longer happen (data/limits.toml)" in table
    lines = report.table(dict(found[0], what="m", standins="k"))
    assert f"a listed limit no longer happens (data/limits.toml): {REASON}" in lines


def test_the_proofs_limit_is_never_the_trees_and_each_kind_is_counted():
    proof = {
        "configuration": "sp",
        "result": report.PROOF_LIMIT,
        "error": "the tree's VllmConfig turned enable_sp off: it needs tensor "
        "parallelism > 1, and the proof runs one process (TP=1)",
    }
    excused = _cell(_classified(_found("not built")))
    model = {"model": "m", "configurations": [excused, proof]}
    assert not report.failing(model)
    said = report.cell(proof, short=True)
    assert said == (
        "the proof's limit (TP=1): the tree's VllmConfig turned enable_sp off"
    )
    assert "the tree's limit" not in report.cell(proof)
    assert (
        "  0 of 2 traced whole; 1 excused as the tree's limit (data/limits.toml); "
        "1 the proof's limit (TP=1: not proven)"
    ) in report.matrix([model])
    # the control: a failure is counted as one, and fails the model
    broken = dict(excused, result="not built")
    failed = {"model": "m", "configurations": [broken, proof]}
    assert report.failing(failed)
    assert "0 excused as the tree's limit" in report.matrix([failed])
    assert "; 1 FAIL" in report.matrix([failed])


def test_the_listed_limits_are_well_formed():
    """Each names a pinned release, a model of the catalog (or "*"), a
    configuration (or "*"), vLLM's reason as "<Error>: <message>" and what
    it means; none twice."""
    listed = limits.load()
    assert listed, "data/limits.toml lists no limit"
    releases_pinned = set(pins.load().releases)
    catalog = set(models.load())
    images = esimdfacts.load()
    for limit in listed:
        assert limit.tree in releases_pinned, limit
        assert limit.model in catalog | {limits.ANY}, limit
        assert limit.configuration in set(models.CONFIGURATIONS) | {limits.ANY}
        error, _, message = limit.reason.partition(": ")
        assert error.isidentifier() and message, limit
        assert limit.why, limit
        if limit.image:  # an image commit of the data, whose image builds it
            assert images[limit.image]["vllm"] == limit.tree, limit
    keys = [(x.tree, x.image, x.model, x.configuration, x.reason) for x in listed]
    assert len(keys) == len(set(keys))


@pytest.fixture(scope="module")
def sources_of():
    return {
        "0.14.1": tree.python_sources(releases.pristine("0.14.1")),
        "0.14.1 patched": tree.python_sources(releases.patched("0.14.1")),
    }


def test_the_files_our_series_and_recipes_edit(sources_of, tmp_path):
    pristine = live.edited_by_us(sources_of["0.14.1"])
    patched = live.edited_by_us(sources_of["0.14.1 patched"])
    for ours in (pristine, patched):
        assert {OURS, "vllm/_ipex_ops.py", "vllm/_xpu_gemm_fakes.py"} <= ours
        # the negative control: the tree's own files that we do not touch
        assert (
            not {
                "vllm/model_executor/layers/layernorm.py",
                "vllm/model_executor/models/llama.py",
                ATTENTION,
            }
            & ours
        )
    # a downstream tree's module that makes an IPEX WOQ module: the recipe
    # path edits it wherever it is (0.14.0-like, llm-scaler 0a85564's shape)
    root = releases.copy_of("0.14.1", tmp_path / "tree")
    made = downstream.add_woq_module(root).relative_to(root).as_posix()
    assert made not in pristine
    assert made in live.edited_by_us(tree.python_sources(root))


def test_a_limit_of_a_release_and_every_later_one():
    """`and_later`: a limit a release brought (0.32.0 removed sequence
    parallelism) covers every later tree, so that a new pin needs no new
    entry; never an earlier tree, and without it only its own release."""
    later = limits.Limit("0.32.0", limits.ANY, "sp", REASON, "no sp", True)
    assert later.covers("0.32.0", "m", "sp")
    assert later.covers(releases.newest(), "m", "sp")
    assert later.covers(releases.newer_than_every_pin(), "m", "sp")
    assert not later.covers("0.31.0", "m", "sp")  # the control: earlier
    assert not later.covers(releases.newest(), "m", "default")
    assert not later.covers("", "m", "sp")  # a tree that cannot tell
    exact = limits.Limit("0.32.0", limits.ANY, "sp", REASON, "no sp")
    assert exact.covers("0.32.0", "m", "sp")
    assert not exact.covers(releases.newest(), "m", "sp")  # the control: exact only
    listed = [x for x in limits.load() if x.and_later]
    assert any(x.covers(releases.newest(), "qwen3_moe", "sp") for x in listed)


def test_a_cell_not_run_never_shows_a_listed_limit_gone():
    """A cell the proof did not run (its own limit, an entry for other
    trees) says nothing of a listed limit; the control: the same cell run
    and traced reports the limit gone."""
    for kind in (report.PROOF_LIMIT, report.NOT_FOR_THIS_TREE):
        cell = _cell(_classified(_found(kind, error="the proof's limit: sp off")))
        assert cell["result"] == kind and "limit_gone" not in cell, cell
    traced = _cell(_classified(_found("traced", error="")))
    assert traced["limit_gone"] == [REASON]


def test_a_limit_of_an_image_covers_its_tree_and_never_the_plain_release():
    """`image`: a limit of intel/llm-scaler's b18beee (built on 0.21.0)
    covers the tree whose own Python names the image's ESIMD package, and
    neither a plain 0.21.0 nor the fix's own module naming it (the
    controls), nor another release."""
    esimd = {"vllm/layers/esimd_fake_ops.py": "import custom_esimd_kernels_vllm"}
    plain = {"vllm/platforms/xpu.py": "class XPUPlatform: ..."}
    routing = {"vllm/_xpu_opaque_calls.py": "'custom_esimd_kernels_vllm::esimd_x'"}
    # no tree to recognise (trees/images.py): the last image of the data
    # that builds the release
    commits = esimdfacts.load()
    by_release = max(
        (c for c in commits if commits[c]["vllm"] == "0.21.0"),
        key=lambda c: commits[c]["date"],
    )
    assert limits.image_of(plain | esimd, "0.21.0") == by_release != ""
    assert limits.image_of(plain, "0.21.0") == ""
    assert limits.image_of(plain | routing, "0.21.0") == ""
    assert limits.image_of(plain | esimd, "0.22.0") == ""
    assert limits.image_of(plain | esimd, "") == ""
    image = limits.Limit(
        "0.21.0", "deepseek_v2_fp8", "default", REASON, "MLA", image="b18beee"
    )
    assert image.covers("0.21.0", "deepseek_v2_fp8", "default", "b18beee")
    assert not image.covers("0.21.0", "deepseek_v2_fp8", "default")  # plain
    assert not image.covers("0.21.0", "deepseek_v2_fp8", "default", "0a85564")
    assert not image.covers("0.22.0", "deepseek_v2_fp8", "default", "b18beee")
    # a limit of the release covers the image's tree built on it too
    assert dataclasses.replace(image, image="").covers(
        "0.21.0", "deepseek_v2_fp8", "default", "b18beee"
    )
    on_image = limits.classify(_found("failed"), "0.21.0", {}, [image], "b18beee")
    assert _cell(on_image)["result"] == report.TREE_LIMIT
    on_plain = limits.classify(_found("failed"), "0.21.0", {}, [image])
    assert _cell(on_plain)["result"] == "failed"


def test_the_trees_own_lines_of_a_tree_applied_by_recipe(tmp_path):
    """A downstream tree (0.14.1 with a line of its own beside the WOQ
    anchor, so the recipes run): before apply every line is the tree's; after, the
    lines the recipes wrote are ours and the rest of each file is the
    tree's, from the state file's pre-apply bytes; a line changed since
    apply is ours too."""
    root = releases.copy_of("0.14.1", tmp_path / "tree")
    downstream.change_next_to_the_woq_anchor(root)
    paths = live.edited_by_us(tree.python_sources(root))
    assert all(not lines for lines in ourlines.ours(root, paths).values())
    applied = tool.run("apply", str(root), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (root / live.STATE_FILE).is_file()  # the recipe path
    after = ourlines.ours(root, live.edited_by_us(tree.python_sources(root)))
    text = (root / OURS).read_text()
    numbered = text.splitlines()
    wrapped = {
        n for n, line in enumerate(numbered, 1) if "opaque_ipex_woq_linear(" in line
    }
    own = numbered.index("class IPEXAWQLinearMethod(AWQLinearMethod):") + 1
    assert after[OURS] is not None and wrapped <= after[OURS], after[OURS]
    assert own not in after[OURS]
    theirs = numbered.index('        layer.downstream_kind = "gptq"') + 1
    assert theirs not in after[OURS]  # the downstream tree's own line
    assert after["vllm/_xpu_gemm_fakes.py"] is None  # a module we add
    changed = numbered[own - 1] + "  # x"
    (root / OURS).write_text(text.replace(numbered[own - 1], changed))
    assert own in ourlines.ours(root, {OURS})[OURS]


# --- a fault of ours outside the tree (issue 51, requirement 4) ---------------

# a tree's module, and this repository's stand-in of the image's block GEMM
TREE_MODULE = "vllm/model_executor/models/crashing.py"
TREE_CODE = """
def forward(kernel, *args):
    return kernel(*args)


def own(message):
    raise RuntimeError(message)
"""


def tree_module(root: Path):
    """A module of a tree at root (its frames are the tree's)."""
    from xpufakes.common import bypath

    path = root / TREE_MODULE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TREE_CODE)
    # a name of its own per tree: bypath keeps a module once loaded
    return bypath.load(f"crashing_tree_module_{abs(hash(str(root)))}", path)


def standin_fault(root: Path) -> BaseException:
    """The tree's forward calling the image's block GEMM stand-in
    (proof/xpu/esimd_kernels.py) with an fp32 input: the stand-in raises."""
    import torch

    from xpufakes.proof.xpu import esimd_kernels

    module = tree_module(root)
    w = torch.zeros(128, 128, dtype=torch.float8_e4m3fn)
    scale, out = torch.ones(1, 1), torch.empty(1, 128, dtype=torch.float16)
    try:
        module.forward(
            esimd_kernels.gemm_fp8_blockscale,
            torch.zeros(1, 128),
            w,
            scale,
            out,
            128,
            128,
        )
    except RuntimeError as e:
        return e
    raise AssertionError("the stand-in did not raise")


def _raising_cell(error: BaseException, root: Path) -> dict:
    """A traced configuration whose numbers' Inductor run raised `error`
    (numbers._failed: its error, the tree's frames and ours)."""
    from xpufakes.proof.model import numbers

    raised = numbers._failed(2, "inductor", numbers.RAISED, error, root)
    equal = {"tokens": 2, "backend": "aot_eager", "result": "equal"}
    equal |= {"difference": 0.0, "largest": 1.0, "seconds": 0.1}
    return traced_configuration([equal, raised])


def traced_configuration(cells: list[dict]) -> dict:
    """The default configuration traced whole, with these numbers' cells."""
    return {
        "configuration": "default",
        "result": "traced",
        "graphs": 1,
        "graph_breaks": 0,
        "custom_ops": ["none"],
        "ops": [],
        "numbers": {"cells": cells, "result": report.numbers_outcome(cells)},
    }


def test_a_fault_in_a_stand_in_is_never_excused_by_a_listed_limit(tmp_path):
    """The image's block GEMM stand-in (proof/xpu/esimd_kernels.py), called
    by the tree's code, raises; a limit of the tree lists its message word
    for word. Neither as the trace's failure (not built) nor as the
    numbers' compiled run that raised is it excused: it passed through our
    code outside the tree, and the audit fails saying so. The controls: the
    same message raised by the tree's own code is excused, in both; listed
    for another configuration, it is not."""
    fault = standin_fault(tmp_path)
    reason = "RuntimeError: esimd_gemm_fp8_blockscale: input must be fp16"
    assert trace.error_of(fault) == reason
    listed = [limits.Limit("0.21.0", "m", "default", reason, "the tree's own")]
    module = tree_module(tmp_path)
    try:
        module.own("esimd_gemm_fp8_blockscale: input must be fp16")
    except RuntimeError as e:
        own = e

    def classified(error, configuration="default"):
        failed = {"configuration": "default"} | trace.not_built(error, tmp_path)
        found = [
            {"model": "m", "configurations": [failed, _raising_cell(error, tmp_path)]}
        ]
        limit = dataclasses.replace(listed[0], configuration=configuration)
        return limits.classify(found, "0.21.0", {}, [limit])[0]

    found = classified(fault)
    built, numbered = found["configurations"]
    assert built["result"] == "not built" and built["error"] == reason, built
    assert "esimd_kernels.py" in built["not_excused"], built
    raised = numbered["numbers"]["cells"][1]
    assert raised["result"] == "compiled raised", raised
    assert "our code outside the tree" in raised["not_excused"], raised
    assert numbered["numbers"]["result"] == "compiled raised"
    assert report.failing(found)
    table = report.table(dict(found, what="m", standins="k"))
    assert "inductor: not excused: data/limits.toml lists it" in table, table
    # the controls: the tree's own code, the same message
    found = classified(own)
    built, numbered = found["configurations"]
    assert built["result"] == report.TREE_LIMIT and built.get("ours") == [], built
    assert numbered["numbers"]["cells"][1]["result"] == report.TREE_LIMIT
    assert numbered["numbers"]["result"] == report.TREE_LIMIT
    assert not report.failing(found)
    assert "the tree's limit at 2 tokens" in report.cell(numbered), report.cell(
        numbered
    )
    # listed for another configuration: nothing excuses it
    found = classified(own, configuration="sp")
    assert report.failing(found)
    assert found["configurations"][1]["numbers"]["result"] == "compiled raised"


def test_our_code_outside_the_tree_is_known_by_its_files():
    """The stand-ins, the overlay and the plugin (in this repository or
    installed) are ours wherever their frames are; the proof's own modules
    only where the tree called them, and never as the compile backends
    through which every error of torch's passes; torch is not ours."""
    repo = paths.REPO
    standin = str(repo / "scripts/xpufakes/proof/xpu/ipex.py")
    assert trace._ours(standin, "f", False) == "scripts/xpufakes/proof/xpu/ipex.py"
    overlay = str(repo / "vllm_overlay/vllm/_xpu_gemm_fakes.py")
    assert trace._ours(overlay, "f", False) == "vllm_overlay/vllm/_xpu_gemm_fakes.py"
    site = "/v/lib/python3.11/site-packages/vllm_xpu_fakes/plugin.py"
    assert trace._ours(site, "f", False) == "vllm_xpu_fakes/plugin.py"
    numbers_py = str(repo / "scripts/xpufakes/proof/model/numbers.py")
    assert trace._ours(numbers_py, "forward", True).endswith("numbers.py")
    assert trace._ours(numbers_py, "forward", False) == ""  # the tree's caller
    assert trace._ours(numbers_py, "backend", True) == ""  # torch's backend
    torch_file = "/v/lib/python3.11/site-packages/torch/_inductor/graph.py"
    assert trace._ours(torch_file, "call_function", True) == ""


def test_the_plugin_is_ours_even_installed_in_the_tree(tmp_path):
    """A site-packages holding vllm/ is the tree; the plugin installed
    beside it is still ours, its frames never the tree's (the control: the
    tree's own module's are the tree's)."""
    plugin = tmp_path / "vllm_xpu_fakes" / "plugin.py"
    plugin.parent.mkdir()
    plugin.write_text("def register():\n    raise RuntimeError('listed')\n")
    from xpufakes.common import bypath

    module = bypath.load(f"plugin_in_tree_{abs(hash(str(tmp_path)))}", plugin)
    try:
        tree_module(tmp_path).forward(module.register)
    except RuntimeError as e:
        error = e
    assert trace.ours_outside(error, tmp_path) == [
        "vllm_xpu_fakes/plugin.py:2 register"
    ]
    assert trace.files_of(error, tmp_path) == [TREE_MODULE, "vllm_xpu_fakes/plugin.py"]
