"""Compiled = eager, in numbers (proof/model/numbers.py, issue 42 item 3):
a model of the catalog built once, run eagerly and compiled as vLLM
compiles it (aot_eager and Inductor) with the same weights and inputs,
traced afresh at each token count.

In `make test` (the ESIMD-GEMV-like tree, support/downstream.py
esimd_gemv_like: the newest pin
with the decode GEMV of llm-scaler b18beee's shape, which drops the
result of custom_esimd_kernels_vllm.esimd_gemv_fp8_pert and returns the
buffer it passed; the op has the image's schema, which marks nothing, and
the tree's fake returns a new tensor, as the image's does):

  1 token, the image's schema     compiled != eager (aot_eager, Inductor):
                                  the write is dropped, the buffer is NaN
  2 tokens (the branch not taken) compiled = eager: the control that the
                                  comparison passes where nothing lies
  1 token, the truthful schema    compiled = eager: the same kernel, its
                                  write declared (`Tensor(a!) output`)

The MoE path as the b18beee image builds it (proof/xpu/xpu_moe.py): the
router and the experts' CPU references against the MoE written out token
by token; a router that does not renormalize, or a wrong expert, fails it.
IPEX's MoE module as the IPEX-era trees make it (proof/xpu/ipex_moe.py),
16-bit and fp8, against the same written-out MoE; gate and up swapped, no
renormalization, the fp8 scales dropped or another expert's, fail it.

On the real intel/llm-scaler b18beee tree (XPUFAKES_LLM_SCALER; opt-in, CI
has none): the MoE entries compiled = eager at 2048 and 2 tokens (1 token:
the decode GEMV's dropped write, or Mixtral's eager forward stopping on the
tree's own dtype mismatch, a failure, said so); with the experts' gather
dropping its write, nothing is compared, a failure. The block-fp8 model with N = 192
(deepseek_v2_fp8_block) takes the ESIMD block GEMM at the start-up's 2048
tokens: compiled != eager, unpatched; the aligned one (qwen3_fp8_block)
only below 16 tokens. With the truthful schemas, compiled = eager. After
`make apply` (the lying ops run as vLLM ops that declare their writes),
and with the plugin installed on the tree as it is: the static audit finds
no lie on the traced path, and compiled = eager at every count.

What is stood in: the device (the ESIMD kernels, vllm-xpu-kernels' MoE
ops and XPU flash attention are XPU code; their CPU references compute
what the C++ writes), as numbers.py, proof/xpu/esimd.py and
proof/xpu/xpu_moe.py say."""

import json
import os
import shutil
from pathlib import Path

import pytest
from test_model_limits import (
    TREE_MODULE,
    standin_fault,
    traced_configuration,
    tree_module,
)
from test_model_trace import TREE_PYTHON

from support import downstream, releases, tool
from xpufakes.proof import audit
from xpufakes.proof.model import numbers
from xpufakes.proof.model import report as model_report
from xpufakes.proof.model import runner as model_runner
from xpufakes.trees import tree

pytestmark = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)

# a per-tensor fp8 checkpoint: its weights are the checkpoint's (random
# here), not made while loading
MODEL = "llama3_fp8_checkpoint"
GEMV = "custom_esimd_kernels_vllm::esimd_gemv_fp8_pert"
BLOCK_GEMM = "custom_esimd_kernels_vllm::esimd_gemm_fp8_blockscale"


def default(found: dict) -> dict:
    [cell] = [c for c in found["configurations"] if c["configuration"] == "default"]
    return cell


def cells(found: dict) -> dict[tuple[int, str], dict]:
    """(tokens, backend) -> cell, of the default configuration (traced
    whole, or its writes lost: both are compared)."""
    traced = default(found)
    assert traced["result"] in ("traced", "writes lost"), traced
    return {(c["tokens"], c["backend"]): c for c in traced["numbers"]["cells"]}


def prove(
    root: Path, models: list[str], counts: str, truthful=False, plugin=None
) -> list:
    kernels = audit.kernels_of(tree.locate(str(root)))
    return model_runner.run_all(
        root,
        models,
        kernels,
        "default",
        str(TREE_PYTHON),
        plugin=plugin,
        numbers=counts,
        esimd_truthful=truthful,
    )


def verdicts(found: dict) -> dict[tuple[int, str], str]:
    return {key: c["result"] for key, c in cells(found).items()}


@pytest.fixture(scope="module")
def gemv_tree(tmp_path_factory) -> Path:
    """The ESIMD-GEMV-like tree of the newest pin (module docstring)."""
    return downstream.esimd_gemv_like(
        releases.newest(), tmp_path_factory.mktemp("gemv") / "tree"
    )


@pytest.fixture(scope="module")
def truthful_one(gemv_tree) -> dict:
    """Its proof at 1 token with the truthful schema (the GEMV's write
    declared): the run that passes, the control of a dropped write and of
    a crash only Inductor meets."""
    [found] = prove(gemv_tree, [MODEL], "1", truthful=True)
    return found


def test_a_dropped_write_is_caught_in_numbers_and_a_truthful_schema_is_not(
    gemv_tree, truthful_one
):
    root = gemv_tree
    [lying] = prove(root, [MODEL], "1,2")
    found = cells(lying)
    for backend in numbers.BACKENDS:
        dropped, control = found[(1, backend)], found[(2, backend)]
        assert dropped["result"] == numbers.DIFFERENT, dropped
        # NaN where the empty buffer is torch's (aot_eager: deterministic
        # fill), whatever memory held where Inductor allocates it
        assert not dropped["difference"] <= 0.02 * dropped["largest"], dropped
        assert control["result"] == numbers.EQUAL, control
        assert control["largest"] > 0, control  # something was compared
    assert model_report.failing(lying)
    said = model_report.table(lying)
    assert "graph break(s); compiled != eager at 1 tokens" in said, said
    assert "FAIL: traced whole" in said, said
    assert "1 tokens: aot_eager nan FAIL" in said, said
    assert "2 tokens: aot_eager 0 ok" in said, said
    # the truthful control: the same kernel with its write declared
    truthful = truthful_one
    assert "TRUTHFUL CONTROL" in truthful["standins"], truthful["standins"]
    assert set(verdicts(truthful).values()) == {numbers.EQUAL}, cells(truthful)
    assert not model_report.failing(truthful)
    for c in cells(truthful).values():
        assert c["largest"] > 0 and c["difference"] <= 0.02 * c["largest"], c


# A crash only Inductor meets (issue 51, requirement 4): Inductor's lowering
# of aten.mul.Tensor (every layer's norm and activation) raising while it
# compiles the forward the numbers trace (inside their compile backend:
# the tree's eager forward compiles helpers of its own with Inductor, which
# lower as they are). The trace (Dynamo and AOT functionalization) and
# aot_eager never lower, so only the Inductor cell meets it.
INDUCTOR_FAULT = """
import sys

import torch
from torch._inductor import lowering

from xpufakes.proof.model import cli, numbers

MUL = torch.ops.aten.mul.Tensor
lowers, in_forward = lowering.lowerings[MUL], [False]


def broken(*args, **kwargs):
    if in_forward[0]:
        raise RuntimeError("an injected lowering fault")
    return lowers(*args, **kwargs)


def backend_of(choice, made=numbers._backend):
    backend = made(choice)

    def compile_forward(gm, example_inputs):
        in_forward[0] = True
        try:
            return backend(gm, example_inputs)
        finally:
            in_forward[0] = False

    return compile_forward


lowering.lowerings[MUL] = broken
numbers._backend = backend_of
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_crash_only_inductor_meets_fails_the_audit(gemv_tree, truthful_one, tmp_path):
    """The run that passes (truthful_one: traced whole, compiled = eager),
    again with Inductor's lowering of aten.mul raising: the trace and the
    aot_eager cell pass, the Inductor cell fails with the error, and the
    model fails (the audit's exit status: audit.Result.failing). Before, the
    cell was "not run" and the audit exited 0. A listed limit naming that
    error for this tree, model and configuration excuses it (the frames are
    torch's and the tree's); one for another configuration does not. Costs
    one model process (~40 s)."""
    import copy
    import subprocess

    from xpufakes.changes import live, ourlines
    from xpufakes.common import isolated
    from xpufakes.proof.model import limits

    assert set(verdicts(truthful_one).values()) == {numbers.EQUAL}
    assert not model_report.failing(truthful_one)  # the control
    out = tmp_path / "faulty.json"
    kernels = audit.kernels_of(tree.locate(str(gemv_tree)))
    done = subprocess.run(
        [str(TREE_PYTHON), "-c", INDUCTOR_FAULT, str(gemv_tree), MODEL, str(out)]
        + ["--standins", kernels, "--configurations", "default", "--numbers", "1"]
        + ["--esimd-truthful"],
        capture_output=True,
        text=True,
        env=isolated.env(),
        timeout=900,
    )
    assert out.is_file(), done.stderr[-3000:]
    [raw] = json.loads(out.read_text())["models"]
    [faulty] = limits.classify_tree([copy.deepcopy(raw)], gemv_tree)
    assert default(faulty)["result"] == "traced", default(faulty)
    got = cells(faulty)
    assert got[(1, "aot_eager")]["result"] == numbers.EQUAL, got
    crashed = got[(1, "inductor")]
    assert crashed["result"] == numbers.RAISED, crashed
    reason = "LoweringException: RuntimeError: an injected lowering fault"
    assert crashed["error"] == reason, crashed
    assert crashed["ours"] == [], crashed  # torch's frames and the tree's
    assert model_report.failing(faulty)
    said = model_report.table(faulty)
    assert "FAIL: traced whole" in said, said
    assert f"inductor FAIL, raised: {reason}" in said, said
    assert "1 compiled raised" in model_report.matrix([faulty])
    # listed exactly, for this configuration: the tree's limit, not compared
    texts = tree.python_sources(gemv_tree)
    ours = ourlines.ours(gemv_tree, live.edited_by_us(texts))
    name = limits.tree_name(gemv_tree)
    for configuration, fails in (("default", False), ("sp", True)):
        listed = [limits.Limit(name, MODEL, configuration, reason, "listed")]
        [judged] = limits.classify([copy.deepcopy(raw)], name, ours, listed)
        assert model_report.failing(judged) == fails, judged
    assert cells(judged)[(1, "inductor")]["result"] == numbers.RAISED


def test_a_cell_with_nothing_to_compare_is_not_equal():
    """An eager output that is NaN or all zeros compares nothing: the cell
    is not run, never equal (the negative control of `largest > 0`)."""
    import torch

    assert numbers._vacuous([torch.zeros(3)]) == (
        "the eager output is all zeros: nothing compared"
    )
    assert "not finite" in numbers._vacuous([torch.tensor([1.0, float("nan")])])
    assert numbers._vacuous([torch.tensor([0.0, 1.0])]) == ""
    assert numbers.verdict(0.01, 1.0) == numbers.EQUAL
    assert numbers.verdict(0.03, 1.0) == numbers.DIFFERENT
    assert numbers.verdict(float("nan"), 1.0) == numbers.DIFFERENT
    eager = [torch.tensor([1.0, 2.0])]
    assert numbers.difference(eager, [torch.tensor([1.0, float("nan")])])[0] != 0
    assert numbers.difference(eager, [torch.tensor([1.0, 2.5])]) == (0.5, 2.0)
    assert numbers.difference(eager, [torch.tensor([1.0])])[0] != 0  # shape


# --- a crash is a failure (issue 51, requirement 4) ---------------------------


def run_cells(monkeypatch, tmp_path, eager, compiled) -> list[dict]:
    """numbers._cells of one token count with the runs stood in: `eager`
    and `compiled` (backend -> outputs) a list of tensors, or an exception
    raised."""
    from xpufakes.proof.model import build as building

    def give(value):
        if isinstance(value, BaseException):
            raise value
        return value

    monkeypatch.setattr(building, "inputs", lambda *a: {})
    monkeypatch.setattr(numbers, "_eager", lambda *a: give(eager))
    monkeypatch.setattr(
        numbers, "_compiled", lambda built, i, v, c, name: give(compiled[name])
    )
    return numbers._cells(None, None, None, [""], 2, numbers.BACKENDS, tmp_path)


def configuration(cells: list[dict]) -> dict:
    """A model's found result: one traced configuration with these numbers."""
    return {
        "model": "m",
        "what": "m",
        "standins": "k",
        "configurations": [traced_configuration(cells)],
    }


def test_an_eager_run_that_fails_or_compares_nothing_fails_the_proof(
    monkeypatch, tmp_path
):
    """The eager forward NaN, all zeros, or raising: every cell of the
    count fails (never "not run"), the configuration fails and the audit's
    table says FAIL and why. The control: an eager output with values,
    compiled equal to it, passes."""
    import torch

    good = [torch.tensor([1.0, 2.0])]
    compiled = dict.fromkeys(numbers.BACKENDS, good)
    control = run_cells(monkeypatch, tmp_path, good, compiled)
    assert {c["result"] for c in control} == {numbers.EQUAL}, control
    assert not model_report.failing(configuration(control))
    for eager, said in (
        ([torch.tensor([1.0, float("nan")])], "not finite"),
        ([torch.zeros(2)], "all zeros"),
        (RuntimeError("the tree's forward stops"), "the tree's forward stops"),
    ):
        got = run_cells(monkeypatch, tmp_path, eager, compiled)
        assert [c["backend"] for c in got] == list(numbers.BACKENDS), got
        for c in got:
            assert c["result"] == numbers.EAGER_FAILED, c
            assert said in c["message"], c
        found = configuration(got)
        assert found["configurations"][0]["numbers"]["result"] == numbers.EAGER_FAILED
        assert model_report.failing(found)
        table = model_report.table(found)
        assert "FAIL: traced whole" in table, table
        assert "aot_eager, inductor not compared, FAIL: " in table, table
        assert "; 1 FAIL" in model_report.matrix([found])


def test_a_compiled_run_that_raises_fails_its_cell(monkeypatch, tmp_path):
    """Inductor raising where aot_eager runs: the Inductor cell fails
    (never "not run") with the error as a limit would name it and the
    frames it passed through, ours outside the tree among them (here the
    stand-in's); the configuration and the audit fail."""
    import torch

    good = [torch.tensor([1.0, 2.0])]
    fault = standin_fault(tmp_path)
    got = run_cells(monkeypatch, tmp_path, good, {"aot_eager": good, "inductor": fault})
    by = {c["backend"]: c for c in got}
    assert by["aot_eager"]["result"] == numbers.EQUAL, by
    raised = by["inductor"]
    assert raised["result"] == numbers.RAISED, raised
    assert raised["error"] == (
        "RuntimeError: esimd_gemm_fp8_blockscale: input must be fp16"
    ), raised
    assert raised["files"] == [TREE_MODULE], raised
    # the stand-in's frames: its kernel, and the check it shares with the
    # MoE kernels' module
    stand_in = (
        "scripts/xpufakes/proof/xpu/esimd_kernels.py:",
        "scripts/xpufakes/proof/xpu/esimd_moe_kernels.py:",
    )
    assert raised["ours"] and all(f.startswith(stand_in) for f in raised["ours"]), (
        raised
    )
    assert any(f.endswith(" gemm_fp8_blockscale") for f in raised["ours"]), raised
    found = configuration(got)
    assert model_report.failing(found)
    table = model_report.table(found)
    assert "inductor FAIL, raised: RuntimeError: esimd_gemm_fp8_blockscale" in table
    assert (
        "compiled raised"
        in model_report.numbers_brief(found["configurations"][0]["numbers"])
        or "the compiled run raised" in table
    ), table


def test_a_run_that_reaches_a_stand_in_without_a_reference_fails_said_so(
    monkeypatch, tmp_path
):
    """IPEX's MoE module with int4 experts (sym_int4's, GPTQ's) is a
    stand-in that computes nothing (proof/xpu/ipex_moe.py: made, refused
    when run): a run that reaches it, compiled or eager, compares nothing.
    That is the proof's limit, not the tree's: each cell fails, saying it
    was not computed here and why, and no listed limit excuses it (the
    stand-in's frame)."""
    import torch

    from xpufakes.proof.model import limits
    from xpufakes.proof.xpu.ipex_moe import GatedMLPMOE

    int4 = GatedMLPMOE(torch.zeros(4, 8, 64), torch.zeros(4, 64, 4), is_int4=True)
    x, logits = torch.zeros(2, 64), torch.zeros(2, 4)
    try:
        tree_module(tmp_path).forward(int4, x, False, 2, logits, True)
    except RuntimeError as e:
        moe = e
    got = run_cells(monkeypatch, tmp_path, moe, dict.fromkeys(numbers.BACKENDS, moe))
    said = (
        "GatedMLPMOE (IPEX's MoE) with int4 or mxfp4 experts (is_int4, is_mxfp4): "
        "no CPU reference (no catalog model reaches it); proof/xpu/ipex_moe.py"
    )
    for c in got:
        assert c["result"] == numbers.RAISED, c
        assert c["not_computed"] == said, c
    found = configuration(got)
    assert model_report.failing(found)
    table = model_report.table(found)
    assert f"aot_eager FAIL, not computed here: {said} (a stand-in without" in table
    assert "not computed here at 2 tokens" in model_report.cell(
        found["configurations"][0], short=True
    )
    listed = limits.Limit("0.14.1", "m", "default", got[0]["error"], "listed")
    [judged] = limits.classify([found], "0.14.1", {}, [listed])
    assert model_report.failing(judged)
    assert (
        "proof/xpu/ipex_moe.py"
        in judged["configurations"][0]["numbers"]["cells"][0]["not_excused"]
    )


def test_each_compiled_run_starts_from_the_modules_state_before_it(monkeypatch):
    """vLLM's wrapper up to 0.11 appends the code Dynamo compiled to its
    list `compiled_codes` and, once that holds one, runs it without
    compiling. Each compiled run starts with the list as it was before the
    first (empty), so Inductor's run compiles with Inductor, not runs
    aot_eager's code (measured on 0.10.2: "inductor 0 ok (0.0 s)" before,
    25.6 s and 0.000488 from eager after). Negative control: restoring the
    list object, as before, keeps the previous run's code."""
    import torch

    class Wrapped(torch.nn.Module):
        do_not_compile = False

        def __init__(self):
            super().__init__()
            self.compiled_codes = []

    module = Wrapped()
    seen = []

    def run(built, inputs, vllm_config):
        seen.append(list(module.compiled_codes))
        module.compiled_codes.append(f"code of {choice[0]}")
        return []

    monkeypatch.setattr(numbers, "_run", run)
    choice = [""]
    for name in numbers.BACKENDS:
        numbers._compiled(module, {}, None, choice, name)
    assert seen == [[], []], seen
    assert module.compiled_codes == []
    # the control: the state kept as the same list object
    saved = dict(vars(module))
    run(module, {}, None)
    vars(module).update(saved)
    assert module.compiled_codes == [f"code of {choice[0]}"]


# --- the real b18beee tree (opt-in) ------------------------------------------

GIT_DIR = os.environ.get("XPUFAKES_LLM_SCALER", "")
BLOCK_MODELS = ["deepseek_v2_fp8_block", "qwen3_fp8_block"]


def lie_reached(root: Path, op: str) -> bool:
    """Whether the static audit finds `op`'s schema lie on the traced path."""
    result = tool.run("audit", str(root), "--json", "--static")
    truth = json.loads(result.stdout)["schema_truth"]
    return any(o["op"] == op and o["reached"] for o in truth["ops"])


@pytest.mark.skipif(
    not GIT_DIR or not Path(GIT_DIR).is_dir(),
    reason="set XPUFAKES_LLM_SCALER to an intel/llm-scaler git directory",
)
def test_block_fp8_on_the_real_b18beee_tree(tmp_path):
    from test_llm_scaler_trees import rebuild

    root = rebuild("b18beee", tmp_path / "b18beee")
    unpatched = {m["model"]: m for m in prove(root, BLOCK_MODELS, "2048,1")}
    truthful = {m["model"]: m for m in prove(root, BLOCK_MODELS, "2048,1", True)}
    for backend in numbers.BACKENDS:
        # N = 192: the ESIMD block GEMM at every count, its write dropped
        odd = verdicts(unpatched["deepseek_v2_fp8_block"])
        assert odd[(2048, backend)] == odd[(1, backend)] == numbers.DIFFERENT, odd
        # aligned: oneDNN's matmul from 16 tokens, the ESIMD GEMM below
        aligned = verdicts(unpatched["qwen3_fp8_block"])
        assert aligned[(2048, backend)] == numbers.EQUAL, aligned
        assert aligned[(1, backend)] == numbers.DIFFERENT, aligned
    # the trace at 2048 tokens sees the dropped op of the non-aligned one
    # too ("writes lost"); the aligned one's is only below 16 tokens, where
    # only the numbers look
    lost = default(unpatched["deepseek_v2_fp8_block"])
    assert lost["result"] == "writes lost", lost
    assert lost["dropped"] == [BLOCK_GEMM], lost
    assert default(unpatched["qwen3_fp8_block"])["result"] == "traced"
    for found in truthful.values():
        assert default(found)["result"] == "traced", default(found)
        assert set(verdicts(found).values()) == {numbers.EQUAL}, cells(found)
    patched = tmp_path / "patched"
    shutil.copytree(root, patched, symlinks=True)
    applied = tool.run("apply", str(patched), "--no-proof")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # the fix: the lying ops run as vLLM ops that declare their writes; the
    # audit no longer finds the lie on the traced path, and the numbers agree
    assert lie_reached(root, BLOCK_GEMM)  # the control: unpatched, it does
    assert not lie_reached(patched, BLOCK_GEMM)
    after = {m["model"]: m for m in prove(patched, BLOCK_MODELS, "2048,1")}
    # the same with the plugin installed on the tree as it is
    from support import plugin as plugin_support

    site = plugin_support.installed(tmp_path / "plugin")
    routed = {m["model"]: m for m in prove(root, BLOCK_MODELS, "2048,1", plugin=site)}
    for found in (*after.values(), *routed.values()):
        assert default(found)["result"] == "traced", default(found)
        assert set(verdicts(found).values()) == {numbers.EQUAL}, cells(found)


# --- the reference kernels ----------------------------------------------------


def test_the_block_gemm_reference_is_the_block_math_and_refuses_what_the_cxx_refuses():
    """esimd_gemm_fp8_blockscale's CPU kernel against the block
    dequantization written out block by block; it writes `output` and
    returns that tensor; a non-aligned K is refused as its C++ refuses it
    (esimd_kernel_gemm.sycl:116). Negative control: one scale per row of
    blocks instead of per block gives another result."""
    import torch

    from xpufakes.proof.xpu import esimd_kernels

    g = torch.Generator().manual_seed(0)
    m, n, k = 3, 192, 256  # N: one and a half blocks
    x = torch.randn(m, k, generator=g).half()
    w = (torch.randn(n, k, generator=g) * 0.1).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 2, generator=g) + 0.5
    expected = torch.zeros(m, n)
    for nb in range(2):
        for kb in range(2):
            rows, cols = (
                slice(nb * 128, (nb + 1) * 128),
                slice(kb * 128, (kb + 1) * 128),
            )
            block = w[rows, cols].float() * scale[nb, kb]
            expected[:, rows] += x[:, cols].float() @ block.t()
    out = torch.full((m, n), float("nan"), dtype=torch.float16)
    returned = esimd_kernels.gemm_fp8_blockscale(x, w, scale, out, 128, 128)
    assert returned is out
    assert torch.allclose(out.float(), expected, rtol=1e-2, atol=1e-2)
    per_row = scale[:, :1].expand(2, 2).contiguous()
    wrong = esimd_kernels.gemm_fp8_blockscale(x, w, per_row, out.clone(), 128, 128)
    assert not torch.allclose(wrong.float(), expected, rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match="K must be a multiple of block_k"):
        esimd_kernels.gemm_fp8_blockscale(
            x[:, :192].contiguous(), w[:, :192].contiguous(), scale, out, 128, 128
        )


def test_the_fused_add_norm_reference_writes_both_buffers():
    """esimd_fused_add_rms_norm: residual += hidden_states, hidden_states =
    rmsnorm(residual) * weight, in place; returns hidden_states. Negative
    control: the buffers as they were are not the result."""
    import torch

    from xpufakes.proof.xpu import esimd_kernels

    g = torch.Generator().manual_seed(1)
    # one row: the kernel's (tests/test_esimd_references.py: a second row stays)
    hidden, residual = torch.randn(1, 64, generator=g).half(), torch.randn(1, 64).half()
    weight = torch.rand(64, generator=g).half() + 1
    total = hidden.float() + residual.float()
    normed = total / torch.sqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6)
    h, r = hidden.clone(), residual.clone()
    returned = esimd_kernels.fused_add_rms_norm(h, r, weight, 1e-6)
    assert returned is h
    assert torch.allclose(r.float(), total, atol=1e-2)
    assert torch.allclose(h.float(), normed * weight.float(), atol=2e-2)
    assert not torch.allclose(hidden.float(), h.float(), atol=2e-2)
    assert not torch.allclose(residual.float(), r.float(), atol=1e-2)


def test_the_group_quant_reference_round_trips_within_fp8():
    """_C::per_token_group_fp8_quant's CPU kernel: dequantized (q * scale
    per group) it is the input within e4m3's precision, and each group's
    largest value reaches fp8_max. Negative control: a scale taken over the
    whole row, not the group, leaves a group with a small range far below
    fp8_max."""
    import torch

    from xpufakes.proof.xpu.cpu_kernels import per_token_group_fp8_quant

    x = torch.randn(4, 256)
    x[:, 128:] *= 0.01  # a second group of small values
    q = torch.empty(4, 256, dtype=torch.float8_e4m3fn)
    s = torch.empty(4, 2)
    per_token_group_fp8_quant(x, q, s, 128, 1e-10, -448.0, 448.0, False)
    back = q.float().view(4, 2, 128) * s.view(4, 2, 1)
    assert torch.allclose(back.view(4, 256), x, rtol=0.07, atol=1e-6)
    assert torch.allclose(q.float().abs().view(4, 2, 128).amax(-1), torch.tensor(448.0))
    whole_row = x.abs().amax(-1, keepdim=True) / 448.0
    assert (x[:, 128:] / whole_row).abs().amax() < 448.0 / 10


# --- the MoE path (vllm-xpu-kernels' MoE ops as the b18beee image builds them)


@pytest.fixture(scope="module")
def moe_ops():
    """The image's MoE ops defined with their CPU references, and `_C`'s
    silu_and_mul (the experts' activation) as vllm-xpu-kernels 0.1.7
    registers it; kept while the module's tests run."""
    from xpufakes.proof.xpu import xpu_kernels, xpu_moe

    entry = xpu_moe.image_entry("b18beee", "0.21.0")
    schemas = xpu_kernels.xpu_kernels_c_schemas("vllm-xpu-kernels 0.1.7")
    return [
        xpu_moe.define_ops(entry["ops"]),
        xpu_kernels.define_xpu_kernels_c_ops({"silu_and_mul": schemas["silu_and_mul"]}),
    ]


def moe_written_out(x, logits, w1, w3, w2, top_k: int, renormalize: bool):
    """Each token's MoE, token by token: the softmax of its router logits,
    its top-k experts (their softmax values, divided by their sum where
    renormalized), the sum of each chosen expert's silu(x W1^T) * (x W3^T)
    W2^T times its weight (float64; dequantized weights [out, in])."""
    import torch

    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.size(0)):
        p = torch.softmax(logits[t].double(), -1)
        ids = sorted(range(p.numel()), key=lambda e: -float(p[e]))[:top_k]
        total = sum(float(p[e]) for e in ids) if renormalize else 1.0
        for e in ids:
            row = x[t].double()
            gate, up = w1[e].double() @ row, w3[e].double() @ row
            act = gate * torch.sigmoid(gate) * up
            out[t] += float(p[e]) / total * (w2[e].double() @ act)
    return out


def test_the_moe_references_compute_each_tokens_experts(moe_ops):
    """The router (_moe_C::topk_softmax) and the experts
    (fused_moe_interface.XpuFusedMoe: remap_hidden_states, the grouped GEMM
    twice, silu_and_mul, moe_gather) against the MoE written out token by
    token: fp8 weights with one scale per expert, in the package's [E, K, N]
    layout. Negative controls: the router not renormalizing, and each token
    sent to the next expert, give another result. Costs well under 1 s."""
    import torch

    from xpufakes.proof.xpu import moe_kernels
    from xpufakes.proof.xpu.fused_moe_standin import XpuFusedMoe

    g = torch.Generator().manual_seed(0)
    tokens, hidden, inter, experts, top_k = 5, 64, 32, 4, 2
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, experts, generator=g).to(torch.bfloat16)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3).to(
        torch.float8_e4m3fn
    )
    w2 = (torch.randn(experts, hidden, inter, generator=g) * 0.3).to(
        torch.float8_e4m3fn
    )
    s13, s2 = torch.rand(experts, generator=g) + 0.5, torch.rand(experts) + 0.5
    deq13 = w13.float() * s13.view(-1, 1, 1)
    deq2 = w2.float() * s2.view(-1, 1, 1)
    expected = moe_written_out(
        x, logits, deq13[:, :inter], deq13[:, inter:], deq2, top_k, True
    )

    def route(renormalize: bool):
        weights = torch.empty(tokens, top_k)
        ids = torch.empty(tokens, top_k, dtype=torch.int32)
        rows = torch.empty(tokens, top_k, dtype=torch.int32)
        torch.ops._moe_C.topk_softmax(weights, ids, rows, logits, renormalize, None)
        return weights, ids, rows

    def experts_of(weights, ids):
        moe = XpuFusedMoe(
            w13.transpose(1, 2).contiguous(), s13, None,
            w2.transpose(1, 2).contiguous(), s2, None,
            top_k, "silu", experts, is_fp8=True,
        )  # fmt: skip
        out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16)
        moe.apply(out, x, weights, ids)
        return out.float()

    weights, ids, rows = route(True)
    assert torch.equal(rows.t().reshape(-1), torch.arange(tokens * top_k).int())
    assert torch.allclose(weights.sum(-1), torch.ones(tokens))
    got = experts_of(weights, ids)
    scale = float(expected.abs().max())
    assert scale > 0 and float((got - expected).abs().max()) <= 0.02 * scale
    # negative controls: a wrong router, a wrong expert
    plain, plain_ids, _ = route(False)
    assert torch.equal(plain_ids, ids) and not torch.allclose(plain, weights)
    for wrong in (experts_of(plain, ids), experts_of(weights, (ids + 1) % experts)):
        assert float((wrong - expected).abs().max()) > 0.1 * scale
    # the grouped GEMM writes ptr_D and returns it; its refusals are the C++'s
    a = torch.randn(3, hidden).to(torch.bfloat16)
    d = torch.empty(3, 2 * inter, dtype=torch.bfloat16)
    counts = torch.tensor([1, 0, 2, 0], dtype=torch.int32)
    b = w13.transpose(1, 2).contiguous()
    gemm = moe_kernels.cutlass_grouped_gemm_interface
    assert (
        gemm(a, b, s13, None, d, counts, 2 * inter, hidden, experts, False, False) is d
    )
    assert torch.allclose(
        d[1:].float(), a[1:].float() @ deq13[2].t(), rtol=0.02, atol=0.05
    )
    with pytest.raises(RuntimeError, match="ptr_scales of fp8 must be 1D"):
        gemm(a, b, s13.view(-1, 1), None, d, counts, 2 * inter, hidden, experts, 0, 0)
    with pytest.raises(RuntimeError, match="rows_per_expert must be int32"):
        moe_kernels.remap_hidden_states(
            x, None, torch.empty(tokens * top_k, hidden, dtype=x.dtype), None, None,
            torch.zeros(experts, dtype=torch.int64), rows, ids, experts, experts,
        )  # fmt: skip


def test_the_moe_stand_ins_are_for_the_image_that_builds_them():
    """Only a tree of the image's vLLM release gets its MoE ops: another
    release's glue and schemas differ (the newest pin's vllm-xpu-kernels'
    grouped GEMM takes ptr_A_scale / ptr_B_scale, its XpuFusedMoe lays the
    weights out itself)."""
    from xpufakes.proof.xpu import xpu_moe

    entry = xpu_moe.image_entry("b18beee", "0.21.0")
    assert "rows_per_expert" in entry["ops"]["_moe_C::remap_hidden_states"]
    assert xpu_moe.image_entry("b18beee", releases.newest()) == {}
    assert xpu_moe.image_entry(None, "0.21.0") == {}


# --- IPEX's MoE module (the IPEX-era trees' experts: proof/xpu/ipex_moe.py)


def ipex_moe_case(fp8: bool):
    """(x, logits, w13 [E, 2I, H], w2 [E, H, I], scales or (None, None),
    dequantized w13, w2): the weights as vLLM holds them."""
    import torch

    g = torch.Generator().manual_seed(1)
    tokens, hidden, inter, experts = 6, 64, 32, 4
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, experts, generator=g).to(torch.bfloat16)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.3
    if not fp8:
        w13, w2 = w13.to(torch.bfloat16), w2.to(torch.bfloat16)
        return x, logits, w13, w2, (None, None), w13.double(), w2.double()
    w13, w2 = w13.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    s13 = torch.rand(experts, generator=g) + 0.5
    s2 = torch.rand(experts, generator=g) + 0.5
    deq13 = w13.double() * s13.double().view(-1, 1, 1)
    deq2 = w2.double() * s2.double().view(-1, 1, 1)
    return x, logits, w13, w2, (s13, s2), deq13, deq2


def run_ipex_moe(case, renormalize: bool, top_k: int = 2, scales=None):
    """IPEX's GatedMLPMOE stand-in as vLLM 0.10.2 makes it (layer.py:360,
    ipex_quant.py:401: the layer's parameters, use_prepack,
    experts_start_id) and calls it (hidden_states, use_grouped_topk,
    top_k, router_logits, renormalize, topk_group, num_expert_group,
    custom_routing_function=)."""
    import torch

    from xpufakes.proof.xpu.ipex_moe import GatedMLPMOE

    x, logits, w13, w2, given, _, _ = case
    s13, s2 = scales or given
    p13 = torch.nn.Parameter(w13.clone(), requires_grad=False)
    p2 = torch.nn.Parameter(w2.clone(), requires_grad=False)
    moe = GatedMLPMOE(
        p13, p2, w1_scale_inv=s13, w2_scale_inv=s2, a1_scale_inv=None,
        a2_scale_inv=None, use_prepack=True, experts_start_id=0,
    )  # fmt: skip
    return moe, moe(x, False, top_k, logits, renormalize, None, None,
                    custom_routing_function=None)  # fmt: skip


def test_the_ipex_moe_reference_computes_each_tokens_experts(monkeypatch):
    """IPEX's GatedMLPMOE stand-in, 16-bit and online fp8 (one scale per
    expert), renormalized or not, against the MoE written out token by
    token in float64 (moe_written_out: gate the first half of W13, up the
    second). What IPEX does besides: the output a new bf16 [tokens,
    hidden], nothing given written but the parameters, whose data the
    first forward replaces with the prepacked (transposed) weights, and a
    second forward the same. Negative controls, each failing the
    comparison: gate and up swapped, no renormalization, the scales
    dropped, each expert given the next one's scale. Costs well under 1 s."""
    import torch

    from xpufakes.proof.xpu import ipex_moe

    def off(got, expected) -> float:
        """The largest difference, relative to the largest expected value."""
        return float((got.double() - expected).abs().max() / expected.abs().max())

    silu_and_mul, gemm = ipex_moe._silu_and_mul, ipex_moe._gemm
    inter = 32
    for fp8 in (False, True):
        case = ipex_moe_case(fp8)
        x, logits, w13, w2, scales, deq13, deq2 = case
        before = (x.clone(), logits.clone())
        for renormalize in (True, False):
            expected = moe_written_out(
                x, logits, deq13[:, :inter], deq13[:, inter:], deq2, 2, renormalize
            )
            moe, got = run_ipex_moe(case, renormalize)
            assert got.dtype == torch.bfloat16 and got.shape == x.shape
            assert off(got, expected) <= 0.02, (fp8, renormalize)
            # the controls that the comparison can fail: no renormalization
            _, other = run_ipex_moe(case, not renormalize)
            assert off(other, expected) > 0.1, (fp8, renormalize)
            # the prepack: the parameters' data replaced, transposed; again
            assert moe.W13.shape == (4, 64, 2 * inter) and moe.W13.is_contiguous()
            assert torch.equal(moe.W13.float(), w13.transpose(1, 2).float())
            assert torch.equal(moe.W2.float(), w2.transpose(1, 2).float())
            assert torch.equal(moe(x, False, 2, logits, renormalize), got)
        assert torch.equal(before[0], x) and torch.equal(before[1], logits)
        expected = moe_written_out(
            x, logits, deq13[:, :inter], deq13[:, inter:], deq2, 2, True
        )

        # gate and up swapped
        def swapped(t):
            return silu_and_mul(torch.cat(t.chunk(2, -1)[::-1], -1))

        with monkeypatch.context() as m:
            m.setattr(ipex_moe, "_silu_and_mul", swapped)
            assert off(run_ipex_moe(case, True)[1], expected) > 0.1, fp8
    # fp8: the scales dropped; each expert given the next one's scale
    case = ipex_moe_case(True)
    x, logits, w13, w2, (s13, s2), deq13, deq2 = case
    expected = moe_written_out(
        x, logits, deq13[:, :inter], deq13[:, inter:], deq2, 2, True
    )
    with monkeypatch.context() as m:
        m.setattr(ipex_moe, "_gemm", lambda a, b, scale: gemm(a, b, None))
        assert off(run_ipex_moe(case, True)[1], expected) > 0.1
    rolled = (s13.roll(1), s2.roll(1))
    assert off(run_ipex_moe(case, True, scales=rolled)[1], expected) > 0.1


def test_the_ipex_moe_stand_in_refuses_what_it_does_not_compute():
    """What no catalog model reaches raises NoCPUReference naming it (the
    numbers say "not computed here"); what IPEX refuses raises as IPEX
    does."""
    import torch

    from xpufakes.proof.xpu.ipex_moe import GatedMLPMOE
    from xpufakes.proof.xpu.uncomputed import NoCPUReference

    x, logits, w13, w2, _, _, _ = ipex_moe_case(False)

    def call(moe, **kw):
        args = {"use_grouped_topk": False, "top_k": 2, "renormalize": True} | kw
        return moe(x, args.pop("use_grouped_topk"), args.pop("top_k"), logits,
                   args.pop("renormalize"), **args)  # fmt: skip

    refused = {
        "int4 or mxfp4": GatedMLPMOE(w13, w2, is_int4=True),
        "biases": GatedMLPMOE(w13, w2, w13_bias=torch.zeros(4, 64)),
        "expert parallelism": GatedMLPMOE(w13, w2, experts_start_id=4),
    }
    for what, moe in refused.items():
        with pytest.raises(NoCPUReference, match=what):
            call(moe)
    plain = GatedMLPMOE(w13.clone(), w2.clone())
    with pytest.raises(NoCPUReference, match="grouped top-k"):
        call(plain, use_grouped_topk=True, topk_group=1, num_expert_group=1)
    with pytest.raises(NoCPUReference, match="custom routing function"):
        call(plain, custom_routing_function=lambda **kw: None)
    with pytest.raises(RuntimeError, match="not support topk"):
        call(plain, top_k=3)
    with pytest.raises(AssertionError, match="matrix_a_scale_inv"):
        call(GatedMLPMOE(w13, w2, a1_scale_inv=torch.ones(4)))


MOE_MODELS = ["qwen3_vl_moe", "qwen3_moe", "mixtral_fp8"]


@pytest.mark.skipif(
    not GIT_DIR or not Path(GIT_DIR).is_dir(),
    reason="set XPUFAKES_LLM_SCALER to an intel/llm-scaler git directory",
)
def test_the_moe_entries_on_the_real_b18beee_tree(tmp_path):
    """The MoE entries computed through the image's MoE ops (the router and
    the experts inside vLLM's opaque vllm::moe_forward): compiled = eager at
    2048 and 2 tokens; at 1 token the dense fp8 linear's decode GEMV drops
    its write (compiled != eager) for the Qwen3 ones, and Mixtral's eager
    forward itself stops (its bf16 router gate, mixtral.py:152, gets the
    float16 the GEMV path allocates): not compared, a failure, said so.
    About 70 s."""
    from test_llm_scaler_trees import rebuild

    root = rebuild("b18beee", tmp_path / "b18beee")
    found = {m["model"]: m for m in prove(root, MOE_MODELS, "2048,1,2")}
    for name in MOE_MODELS:
        assert "fused_moe_standin.py" in found[name]["standins"], found[name]
        got = cells(found[name])
        for backend in numbers.BACKENDS:
            for count in (2048, 2):
                cell = got[(count, backend)]
                assert cell["result"] == numbers.EQUAL, cell
                assert cell["largest"] > 0, cell
            one = got[(1, backend)]
            if name == "mixtral_fp8":
                assert one["result"] == numbers.EAGER_FAILED, one
                assert "mixtral.py:152" in one["message"], one
                assert "Half != c10::BFloat16" in one["error"], one
            else:
                assert one["result"] == numbers.DIFFERENT, one
    # the negative control: the experts' gather drops its write (the MoE
    # layer's output buffer left as torch allocated it, NaN): the eager
    # output is NaN, nothing compared, a failure; so the cells above
    # compared what the experts computed
    dropped = _with_gather_dropped(root, "qwen3_moe", tmp_path)
    for backend in numbers.BACKENDS:
        cell = dropped[(2, backend)]
        assert cell["result"] == numbers.EAGER_FAILED, cell
        assert "not finite" in cell["error"], cell


DROP_GATHER = """
import sys
from xpufakes.proof.model import cli
from xpufakes.proof.xpu import moe_kernels

moe_kernels.REFERENCES["_moe_C::moe_gather"] = lambda *args: None
sys.exit(cli.main(sys.argv[1:]))
"""


def _with_gather_dropped(root: Path, model: str, tmp_path: Path) -> dict:
    """(tokens, backend) -> cell of `model` at 2 tokens, its proof run with
    moe_gather's reference writing nothing."""
    import subprocess

    from xpufakes.common import isolated

    out = tmp_path / "dropped.json"
    kernels = audit.kernels_of(tree.locate(str(root)))
    subprocess.run(
        [str(TREE_PYTHON), "-c", DROP_GATHER, str(root), model, str(out)]
        + ["--standins", kernels, "--configurations", "default", "--numbers", "2"],
        capture_output=True,
        env=isolated.env(),
        timeout=900,
    )
    return cells(json.loads(out.read_text())["models"][0])
