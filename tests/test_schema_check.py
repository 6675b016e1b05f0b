"""Schema truth on a device (plugin/vllm_xpu_fakes/schemacheck.py,
schemacases.py; `make verify-xpu`, `python -m vllm_xpu_fakes --verify`):
the findings it confirms are exactly schema truth's on the checkout's data,
every lying op of the image has a case or says why not, and the check
itself tells a lie from the truth. On this CPU host: stand-in kernels of this
test's own (and verify.py's CPU stand-ins), never the image's kernels, which
need an Intel GPU. Each verdict with its negative control: a schema that
declares the write, a kernel that does not write, an output not filled with
NaN, a case the kernel refuses, a GEMM case of the wrong shape (the old
`.t`). Measured: 8 s of CPU for the 11 tests, pytest's start and torch
included (21 s wall on 2 busy cores); 0.33.0's schema truth ~3 s of it, the
forked run of the stand-ins ~4 s (torch's optests imported, SchemaCheckMode
comparing half tensors on a CPU)."""

import tomllib

import pytest
import torch

from support import releases
from xpufakes.common import paths
from xpufakes.proof import verify
from xpufakes.proof.static import schematruth
from xpufakes.trees import images, tree

cases = verify.schemacases
check = verify.schemacheck
NAMESPACES = ("custom_esimd_kernels_vllm", "esimd_topk_v2", "_xpu_C")
CONTRACTS = paths.DATA / "schema_contracts.toml"


def _found(ops: list) -> dict[str, dict[str, list[str]]]:
    """Schema truth's lies, as FINDINGS writes them (no (d): the tree's)."""
    found = {}
    for o in ops:
        kinds: dict[str, list[str]] = {}
        for lie in o.lies:
            if lie.kind != "d":
                kinds.setdefault(lie.kind, []).append(lie.argument)
        found[o.op] = {k: sorted(set(v)) for k, v in kinds.items()}
    return found


def _data_lies(data=None) -> dict[str, dict[str, list[str]]]:
    """The lies the data shows (the C++), for a tree of the b18beee image."""
    package = schematruth.ESIMD_PACKAGE
    image = images.as_image(verify.CASES_IMAGE)
    facts, *_ = schematruth.kernel_facts({"": package}, "0.21.0", data, image)
    return _found(
        [
            schematruth.OpTruth(f, schematruth._lies(f, [], [], None), [])
            for op, f in facts.items()
            if op.split("::")[0] in NAMESPACES
        ]
    )


def _sorted(findings: dict) -> dict:
    return {op: {k: sorted(v) for k, v in f.items()} for op, f in findings.items()}


ESIMD = "custom_esimd_kernels_vllm::"


def test_the_findings_are_schema_truths_and_each_has_a_case_or_a_reason():
    lies = {op: f for op, f in _data_lies().items() if f}
    shipped = {op: f for op, f in cases.FINDINGS.items() if op.split("::")[0] != "vllm"}
    assert _sorted(shipped) == lies
    named = ("gemm_fp8_blockscale", "gemv_int4", "rms_norm", "norm_add_norm")
    assert {f"custom_esimd_kernels_vllm::esimd_{n}" for n in named} <= set(lies)
    for op in cases.FINDINGS:
        assert (op in cases.CASES) != (op in cases.NO_CASE), op
    # the ops the fix's contracts cover (traced lies, on any image audited)
    # that lie in the data of the image the cases are read from (b18beee)
    # all have a case: b3.1's esimd_gemv_fp16_gelu_mul, traced on b3.1 only,
    # lies in b18beee's schema too. A contract that is no lie here is one
    # made only from another image (0a85564's gdn_conv_fused,
    # qkv_split_norm_rope, whose b18beee schemas declare what they write)
    entries = [
        entry
        for entry in tomllib.loads(CONTRACTS.read_text()).values()
        if entry["kernel_op"].split("::")[0] in NAMESPACES
    ]
    # (not those of an op that returns a declared alias, which does not lie:
    # functionalization refuses its schema, issue 50)
    data = schematruth.load_data()["esimd"][verify.CASES_IMAGE]["ops"]
    aliasing = {
        op
        for op, entry in data.items()
        if "Tensor(" in entry["schema"].rsplit("->", 1)[1]
    }
    entries = [e for e in entries if e["kernel_op"] not in aliasing]
    contracts = {e["kernel_op"] for e in entries}
    lying = {op for op in contracts if op in lies or not op.startswith(ESIMD)}
    assert lying and lying <= set(cases.CASES), lying - set(cases.CASES)
    for e in entries:
        if e["kernel_op"] not in lying:
            assert not any("b18beee" in tree for tree in e["trees"]), e
    assert ESIMD + "esimd_gemv_fp16_gelu_mul" in lying
    # negative control: the data with esimd_gemm_fp8_blockscale's schema
    # truthful no longer gives the shipped finding
    data = schematruth.load_data()
    entry = data["esimd"]["b18beee"]["ops"][
        "custom_esimd_kernels_vllm::esimd_gemm_fp8_blockscale"
    ]
    entry["schema"] = (
        entry["schema"]
        .replace("Tensor output", "Tensor(a!) output")
        .replace("-> Tensor", "-> Tensor(a!)")
    )
    assert "custom_esimd_kernels_vllm::esimd_gemm_fp8_blockscale" not in {
        op for op, f in _data_lies(data).items() if f
    }


def test_the_cited_lines_are_the_datas():
    package = schematruth.ESIMD_PACKAGE
    image = images.as_image(verify.CASES_IMAGE)
    facts, *_ = schematruth.kernel_facts({"": package}, "0.21.0", image=image)
    for op, lines in cases.WHERE.items():
        f = facts[op]
        assert lines == sorted({e["at"] for e in f.writes + f.returns}), op
        assert all(line in cases.CITED[op] for line in lines), op
    assert set(cases.WHERE) == {op for op in cases.FINDINGS if op in facts}
    gemm = "custom_esimd_kernels_vllm::esimd_gemm_fp8_blockscale"
    assert cases.CITED[gemm].startswith("llm-scaler b18beee")


def test_the_upstream_vllm_op_finding_is_schema_truths_on_0_33_0():
    texts = tree.python_sources(releases.pristine("0.33.0"))
    truth = schematruth.check(texts, "0.33.0")
    found = _found(truth.ops)
    op = "vllm::xpu_topk_topp_sampler"
    assert found[op] == _sorted({op: cases.FINDINGS[op]})[op]
    for upstream in ("_xpu_C::fp8_gemm_out", "_xpu_C::topk_topp_sampler"):
        assert found[upstream] == cases.FINDINGS[upstream], upstream


def test_each_case_fits_its_schema_and_fills_outputs_with_nan():
    texts = verify._schema_texts()
    for op, case in cases.CASES.items():
        args = check.make_args(case, "cpu")
        if op not in texts:
            continue  # vLLM's own op: the _xpu_C sampler's arguments
        params = texts[op].partition("(")[2].rpartition(") ->")[0].split(",")
        names = [p.strip().split(" ")[1].partition("=")[0] for p in params]
        assert len(names) == len(args), op
        for name in cases.FINDINGS[op].get("a", []):
            # an argument only written is NaN; one also read (in place) is not
            t = args[names.index(name)]
            if " nan" in case[1][names.index(name)]:
                assert t.isnan().all(), (op, name)
            else:
                assert not t.float().isnan().any(), (op, name)
    # the GEMM of the brief: 16x256x384, 128x128 block scales: the scales'
    # shape is what the C++ checks, [ceil(N/128), ceil(K/128)]
    gemm = check.make_args(
        cases.CASES["custom_esimd_kernels_vllm::esimd_gemm_fp8_blockscale"], "cpu"
    )
    x, w, s, out = gemm[:4]
    m, k = x.shape
    n = w.shape[0]
    assert (m, n, k) == (16, 256, 384) and w.dtype == torch.uint8
    assert tuple(s.shape) == (-(-n // 128), -(-k // 128)) and out.shape == (m, n)


def _args(op: str) -> list:
    return check.make_args(cases.CASES[op], "cpu")


def test_the_gemm_cases_have_the_shapes_their_kernels_check():
    """What the kernels' C++ checks of a GEMM's shapes (written here from
    the C++, not from the cases): input [M, K], weight [N, K] (int4: K/2
    bytes a row, scales [N, K/128]), output [M, N]; _xpu_C::fp8_gemm_out's
    out [M, N] for A [M, K] and B [K, N]."""
    for name in ("gemm_fp8_pert", "gemm_fp8_blockscale", "gemv_fp8_pert", "gemv_fp16"):
        x, w = _args(f"custom_esimd_kernels_vllm::esimd_{name}")[:2]
        out = _args(f"custom_esimd_kernels_vllm::esimd_{name}")[
            -1 if name == "gemv_fp16" else 3
        ]
        assert w.shape[1] == x.shape[1] and out.shape == (x.shape[0], w.shape[0])
    for name in ("gemm_int4_pgrp", "gemv_int4"):
        x, w, s, out = _args(f"custom_esimd_kernels_vllm::esimd_{name}")
        k, n = x.shape[1], w.shape[0]
        assert w.shape[1] * 2 == k and s.shape == (n, k // 128)
        assert out.shape == (x.shape[0], n) and n % 16 == 0 and k % 128 == 0
    # gelu_mul: one row, weight [2N, K] (gate and up), output [1, N]
    x, w, out = _args("custom_esimd_kernels_vllm::esimd_gemv_fp16_gelu_mul")
    assert x.shape[0] == 1 and w.shape == (2 * out.shape[1], x.shape[1])
    assert out.shape[0] == 1
    out, a, b = _args("_xpu_C::fp8_gemm_out")[:3]
    assert a.shape[1] == b.shape[0] and out.shape == (a.shape[0], b.shape[1])
    assert not b.is_contiguous()  # the weight as vLLM passes it: [N, K] transposed
    # negative control: B made [K, N] and transposed (the old `.t`) does not fit
    sizes, specs, where = cases.CASES["_xpu_C::fp8_gemm_out"]
    old = check.make_args(
        (sizes, [*specs[:2], "fp8e4m3[K,N].t", *specs[3:]], where), "cpu"
    )
    assert old[1].shape[1] != old[2].shape[0]


# ---------------------------------------------------------------------------
# The check, on kernels of this test's own
# ---------------------------------------------------------------------------

LIB = torch.library.Library("schema_check_probe", "DEF")
for _schema in (
    "lie(Tensor x, Tensor output) -> Tensor",  # (a) (b) output
    "honest(Tensor x, Tensor(a!) output) -> Tensor(a!)",
    "idle(Tensor x, Tensor output) -> Tensor",  # returns a new tensor
    "zeros(Tensor x, Tensor output) -> Tensor",  # writes zeros
    "picky(Tensor x, Tensor output) -> Tensor",
):
    LIB.define(_schema)


def _write(x, output):
    output.copy_(x * 2)
    return output


def _zeros(x, output):
    output.zero_()
    return output


def _picky(x, output):
    if x.shape[0] != 3:
        raise RuntimeError("picky: x must have 3 rows")
    return _write(x, output)


LIB.impl("lie", _write, "CPU")
LIB.impl("honest", _write, "CPU")
LIB.impl("idle", lambda x, output: x * 2, "CPU")
LIB.impl("zeros", _zeros, "CPU")
LIB.impl("picky", _picky, "CPU")
FINDING = {"a": ["output"], "b": ["output"]}
CASE = ({"N": 8}, ["f32[N]", "f32[N] nan"], "this test")


def _check(name: str, case=CASE):
    op = getattr(torch.ops.schema_check_probe, name).default
    return check.check(name, op, FINDING, case, "cpu")


def test_a_lie_is_confirmed_and_its_truthful_schema_is_declared():
    lie = _check("lie")
    assert lie.status == "confirmed", lie
    assert lie.test_schema.startswith("fails: Argument output is not defined")
    assert lie.seen == {"(a) output": check.SEEN, "(b) output": check.SEEN}
    honest = _check("honest")
    assert honest.status == "declared here" and honest.test_schema == "passes"


def test_a_kernel_that_does_not_do_it_is_not_confirmed():
    idle = _check("idle")
    assert idle.status == "not confirmed" and idle.test_schema == "passes", idle
    assert set(idle.seen.values()) == {check.NOT_SEEN}


def test_only_an_output_filled_with_nan_shows_a_write_of_zeros():
    assert _check("zeros").status == "confirmed"
    zero_filled = ({"N": 8}, ["f32[N]", "f32[N] =0"], "this test")
    missed = _check("zeros", zero_filled)
    assert missed.seen["(a) output"] == check.NOT_SEEN, missed
    assert missed.test_schema.startswith(
        "fails: Argument output is not defined to alias"
    )


def test_a_case_the_kernel_refuses_is_an_error_that_says_why():
    refused = _check("picky")
    assert refused.status == "error"
    assert "picky: x must have 3 rows" in refused.note
    fits = ({"N": 3}, ["f32[N]", "f32[N] nan"], "this test")
    assert _check("picky", fits).status == "confirmed"


def test_ops_not_loaded_and_ops_without_a_case_are_said():
    results = check.run(
        {"nowhere::op": {"a": ["x"]}, "somewhere::op": {"a": ["x"]}},
        {},
        {"somewhere::op": "why not"},
        "cpu",
        check.loaded,
    )
    assert [(r.status, r.note) for r in results] == [
        ("not here", "not loaded in this process"),
        ("no case", "why not"),
    ]
    assert "2 ops: 1 no case, 1 not here" in check.table(results)


@pytest.mark.forked
def test_the_cpu_standins_confirm_every_case_and_pass_the_truthful_controls():
    """verify-xpu --standins' part: each stand-in has the data's schema and
    does the hidden write; its truthful control (the writes marked) is not
    failed by test_schema."""
    truth = verify.schema_truth(verify.SchemaTruth(), True)
    checked = {r.op: r.status for r in truth.results if r.status != "no case"}
    assert checked.pop("vllm::xpu_topk_topp_sampler") == "not here"
    assert checked == {
        op: "confirmed by the call alone"  # test_schema: the `lambda` parameter
        if op == "_xpu_C::topk_topp_sampler"
        else "confirmed"
        for op in cases.CASES
        if op != "vllm::xpu_topk_topp_sampler"
    }
    assert {c.status for c in truth.controls} == {"declared here"}
    assert not [c for c in truth.controls if c.test_schema.startswith("fails")]
    assert truth.ok
    table = verify.schema_table(truth)
    assert "CPU stand-ins, not the image's kernels" in table
    assert table.splitlines()[-1].startswith("schema truth logic: PASS")
    # negative control: a control that lies (its schema unmarked) fails it
    truth.controls[0] = truth.results[0]
    assert not truth.ok
