"""Schema truth (proof/static/schematruth.py, `make audit`): an op whose schema
hides what its kernel does is found, each class with its negative control
(the truthful schema passes). Small synthetic trees and a synthetic kernel
package, read the way the real ones are (trees/kernelcxx.py reads the C++,
changes/esimdfacts.py makes the data), and the real pinned 0.33.0 sdist.
In memory: no tree is written, nothing is imported; ~10 s (two checks of
0.33.0, ~3 s of CPU each, one parse shared)."""

import ast
import textwrap
import tomllib

import pytest

from support import releases
from xpufakes.changes import esimdfacts, recipes
from xpufakes.common import opschema
from xpufakes.proof import audit
from xpufakes.proof.static import pathconditions, schematruth
from xpufakes.proof.static.scan import IF_ENABLED, TRACED, CallSite
from xpufakes.trees import kernelcxx, tree

PACKAGE = "custom_esimd_kernels_vllm"

# The package's C++: the schemas are filled in by each test. Each function
# casts what it reads to a const pointer and what it writes to a writable
# one, as llm-scaler's package does; toy_fill hands its tensors to a
# function outside the package, of which the reader knows nothing.
CXX = """
#include <torch/library.h>

at::Tensor toy_gemm(at::Tensor input, at::Tensor weight, at::Tensor output) {
    launch(reinterpret_cast<const fp16*>(input.data_ptr()),
           reinterpret_cast<const uint8_t*>(weight.data_ptr()),
           reinterpret_cast<fp16*>(output.data_ptr()));
    return output;
}

void toy_two(at::Tensor x, at::Tensor out, at::Tensor out2) {
    two(reinterpret_cast<const fp16*>(x.data_ptr()),
        reinterpret_cast<fp16*>(out.data_ptr()),
        reinterpret_cast<fp16*>(out2.data_ptr()));
}

void toy_fill(at::Tensor x, at::Tensor out) {
    fill_tensors(x, out);
}

TORCH_LIBRARY(custom_esimd_kernels_vllm, m) {
  m.def("GEMM");
  m.impl("toy_gemm", torch::kXPU, &toy_gemm);
  m.def("TWO");
  m.impl("toy_two", torch::kXPU, &toy_two);
  m.def("FILL");
  m.impl("toy_fill", torch::kXPU, &toy_fill);
}
"""

LIES = {
    "GEMM": "toy_gemm(Tensor input, Tensor weight, Tensor output) -> Tensor",
    "TWO": "toy_two(Tensor x, Tensor out, Tensor(a!) out2) -> ()",
    "FILL": "toy_fill(Tensor x, Tensor out) -> ()",
}
TRUTHS = {
    "GEMM": "toy_gemm(Tensor input, Tensor weight, Tensor(a!) output) -> Tensor(a!)",
    "TWO": "toy_two(Tensor x, Tensor(a!) out, Tensor(b!) out2) -> ()",
    "FILL": "toy_fill(Tensor x, Tensor(a!) out) -> ()",
}

WRAPPERS = """
import torch

_ops = torch.ops.custom_esimd_kernels_vllm


def toy_gemm(input, weight, output):
    return _ops.toy_gemm(input, weight, output)


def toy_two(x, out, out2):
    return _ops.toy_two(x, out, out2)


def toy_fill(x, out):
    return _ops.toy_fill(x, out)
"""


def _data(schemas: dict[str, str]) -> dict[str, dict]:
    """The schema data with the toy package at one image commit, made as
    `make esimd-schemas` makes it (from the C++ and the wrappers)."""
    cxx = CXX
    for key, schema in schemas.items():
        cxx = cxx.replace(f'm.def("{key}")', f'm.def("{schema}")')
    data = schematruth.load_data()
    data["esimd"] = {
        "c0ffee0": {
            "commit": "c0ffee0" * 5 + "00000",
            "date": "2026-01-01",
            "vllm": "9.9.9",
            "ops": esimdfacts.ops({"csrc/toy.cc": cxx}),
            "wrappers": esimdfacts.wrappers({"python/ops.py": WRAPPERS}),
        }
    }
    return data


# The tree: a re-exporting module as llm-scaler's esimd_utils, a quantized
# method that calls the GEMM on the traced path (its `apply`) and drops the
# result, a layer that holds the other kernels as attributes, a call in
# set-up (not traced).
ESIMD_UTILS = """
try:
    import custom_esimd_kernels_vllm as _esimd
    ESIMD_AVAILABLE = True
except ImportError:
    _esimd = None
    ESIMD_AVAILABLE = False

if ESIMD_AVAILABLE:
    toy_gemm = _esimd.toy_gemm
    toy_fill = getattr(_esimd, "toy_fill", None)
"""

METHOD = """
import torch

from vllm.model_executor.layers.esimd_utils import ESIMD_AVAILABLE, toy_gemm


class ToyLinearMethod:
    def process_weights_after_loading(self, layer):
        scratch = torch.empty(1, 1)
        toy_gemm(layer.weight, layer.weight, scratch)
        layer.scratch = scratch

    def apply(self, layer, x, bias=None):
        M = x.shape[0]
        N, K = layer.weight.shape
        if M >= 16 and N % 128 == 0 and K % 128 == 0:
            return x @ layer.weight.t()
        out = torch.empty(M, N)
        toy_gemm(x, layer.weight, out)
        return out
"""

LAYER = """
import torch
from torch import nn


class ToyNorm(nn.Module):
    def __init__(self):
        super().__init__()
        from custom_esimd_kernels_vllm import toy_two
        self._op = toy_two

    def forward(self, x):
        out = torch.empty_like(x)
        out2 = torch.empty_like(x)
        self._op(x, out, out2)
        if x.shape[0] == 1:
            torch.ops.custom_esimd_kernels_vllm.toy_fill(x, torch.empty_like(x))
        return out + out2
"""


def _tree(**files: str) -> dict[str, str]:
    texts = {
        "vllm/__init__.py": "",
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/layers/__init__.py": "",
        "vllm/model_executor/layers/esimd_utils.py": ESIMD_UTILS,
        "vllm/model_executor/layers/quantization/toy.py": METHOD,
        "vllm/model_executor/layers/toy_norm.py": LAYER,
    }
    for name, text in files.items():
        texts[f"vllm/{name.replace('__', '/')}.py"] = textwrap.dedent(text)
    return {p: textwrap.dedent(t) for p, t in texts.items()}


def _check(texts, schemas) -> dict[str, schematruth.OpTruth]:
    truth = schematruth.check(texts, "9.9.9", data=_data(schemas))
    return {o.op: o for o in truth.ops}


def _kinds(found: dict, op: str) -> set[tuple[str, str]]:
    return {(x.kind, x.argument) for x in found[op].lies} if op in found else set()


GEMM, TWO, FILL = (f"{PACKAGE}::toy_{n}" for n in ("gemm", "two", "fill"))


def test_each_class_of_lie_and_its_truthful_schema():
    texts = _tree()
    lies = _check(texts, LIES)
    # (a) the C++ writes `output` (a writable pointer; const for the
    # inputs) and returns it; (b) returns it, no alias set
    assert _kinds(lies, GEMM) == {("a", "output"), ("b", "output")}
    # (a) alone: writes `out` unmarked, marks `out2`
    assert _kinds(lies, TWO) == {("a", "out")}
    # (c): returns nothing and marks nothing; the C++ hands both tensors to
    # a function outside the package: no word about what it writes
    assert _kinds(lies, FILL) == {("c", "")}
    truths = _check(texts, TRUTHS)
    assert not {GEMM, TWO, FILL} & set(truths), truths.keys()


def test_the_evidence_and_when_it_is_compiled():
    found = _check(_tree(), LIES)
    gemm = found[GEMM]
    (a,) = [x for x in gemm.lies if x.kind == "a"]
    assert a.evidence[0] == "writable pointer handed to launch (csrc/toy.cc:7)"
    assert a.evidence[1] == "returns it (csrc/toy.cc:8)"
    site = "vllm/model_executor/layers/quantization/toy.py:19"
    assert f"{site} drops the result and reads `out` after (line 20)" in a.evidence
    assert gemm.failing  # a traced call reaches it
    sites = {f"{s.call.file}:{s.call.line}": s for s in gemm.sites}
    traced = sites[site]
    assert traced.reached and traced.call.via == "toy_gemm"
    assert traced.call.args == {"input": "x", "weight": "layer.weight", "output": "out"}
    # the early return leaves: any token count where the weight is not
    # 128-aligned, and small token counts
    assert traced.when.startswith(
        "at any token count when N % 128 != 0 [weight shape] | K % 128 != 0 "
        "[weight shape]; at a traced token count (max_num_batched_tokens) "
        "where M < 16"
    ), traced.when
    # the call in set-up is not compiled
    setup = sites["vllm/model_executor/layers/quantization/toy.py:10"]
    assert not setup.reached
    # through `self._op = toy_two`, under a token-count condition
    two = {f"{s.call.file}:{s.call.line}": s for s in found[TWO].sites}
    assert two["vllm/model_executor/layers/toy_norm.py:15"].reached
    fill = found[FILL].sites[0]
    assert fill.when == (
        "at a traced token count (max_num_batched_tokens) where x.shape[0] == 1"
    )


def test_a_lie_only_set_up_reaches_does_not_fail():
    texts = _tree()
    text = texts["vllm/model_executor/layers/quantization/toy.py"]
    texts["vllm/model_executor/layers/quantization/toy.py"] = text.replace(
        "        toy_gemm(x, layer.weight, out)\n", "        pass\n"
    )
    gemm = _check(texts, LIES)[GEMM]
    assert gemm.lies and not gemm.failing
    assert [s.call.line for s in gemm.sites] == [10]


def test_d_a_fake_that_returns_a_new_tensor_where_the_kernel_returns_its_argument():
    fake = """
    import torch

    torch.library.register_fake(
        "custom_esimd_kernels_vllm::toy_gemm",
        lambda input, weight, output: FAKE,
    )
    """
    wrong = _tree(toy_fakes=fake.replace("FAKE", "torch.empty_like(output)"))
    found = _check(wrong, TRUTHS)
    assert _kinds(found, GEMM) == {("d", "output")}
    (d,) = found[GEMM].lies
    assert d.evidence == [
        "the fake at vllm/toy_fakes.py:6 returns a new tensor; the kernel "
        "returns `output` (csrc/toy.cc:8)"
    ]
    right = _tree(toy_fakes=fake.replace("FAKE", "output"))
    assert GEMM not in _check(right, TRUTHS)


@pytest.mark.parametrize(
    "returned, found",
    [
        # the kernel returns output too ((a), (b)): the fake agrees with the
        # kernel, not with the schema, which declares no alias
        ("output", {("e", "output")}),
        ("output.view(-1)", {("e", "output")}),
        ("(output.t(), torch.empty_like(output))", {("e", "output")}),
        # an argument the kernel does not return (and not the one it does:
        # (d) too)
        ("input", {("e", "input"), ("d", "output")}),
        # negative controls: a new tensor ((d): the kernel returns output)
        ("torch.empty_like(output)", {("d", "output")}),
        ("output.clone()", {("d", "output")}),
    ],
)
def test_e_a_fake_that_returns_an_argument_the_schema_does_not_alias(returned, found):
    """(e): a fake whose output is one of its arguments (as it came, or a
    view of it) where the schema declares no alias: torch takes the op's
    output for that argument. The schema that declares the alias (TRUTHS'
    `-> Tensor(a!)`) has none."""
    fake = f"""
    import torch

    torch.library.register_fake(
        "custom_esimd_kernels_vllm::toy_gemm",
        lambda input, weight, output: {returned},
    )
    """
    lies = _check(_tree(toy_fakes=fake), LIES)
    kinds = _kinds(lies, GEMM) - {("a", "output"), ("b", "output")}
    assert kinds == found
    (e,) = [x for x in lies[GEMM].lies if x.kind == "e"] or [None]
    if e is not None:
        assert e.evidence[0].startswith("the fake at vllm/toy_fakes.py:6 returns ")
        assert ("does not return it" in " ".join(e.evidence)) == (returned == "input")
    truthful = _check(_tree(toy_fakes=fake), TRUTHS)
    assert ("e", "output") not in _kinds(truthful, GEMM)


OWN = """
import torch

from vllm.utils.torch_utils import direct_register_custom_op


def _sample_impl(out: torch.Tensor, x: torch.Tensor, k: int) -> None:
    torch.ops.custom_esimd_kernels_vllm.toy_fill(x, out)


def _sample_fake(out: torch.Tensor, x: torch.Tensor, k: int) -> None:
    return


direct_register_custom_op(
    op_name="toy_sample",
    op_func=_sample_impl,
    fake_impl=_sample_fake,MUTATES
)
"""


def test_a_tree_op_registered_without_its_mutates_args():
    missing = _tree(toy_ops=OWN.replace("MUTATES", ""))
    found = _check(missing, TRUTHS)
    # it passes `out` to the kernel op's marked argument and returns nothing
    assert _kinds(found, "vllm::toy_sample") == {("a", "out"), ("c", "")}
    (a,) = [x for x in found["vllm::toy_sample"].lies if x.kind == "a"]
    assert a.evidence[0].startswith(
        f"passed as `out` of {FILL}, marked in {FILL}'s schema"
    )
    given = _tree(toy_ops=OWN.replace("MUTATES", '\n    mutates_args=["out"],'))
    assert "vllm::toy_sample" not in _check(given, TRUTHS)


def test_calls_are_the_evidence_where_the_kernel_says_nothing():
    """An op of a known package without C++ evidence: a call that drops the
    result and reads an argument after says the op writes it."""
    no_word = TRUTHS | {"FILL": "toy_fill(Tensor x, Tensor out) -> Tensor"}
    reads = _tree()
    layer = reads["vllm/model_executor/layers/toy_norm.py"]
    reads["vllm/model_executor/layers/toy_norm.py"] = layer.replace(
        "toy_fill(x, torch.empty_like(x))", "toy_fill(x, out)"
    )
    found = _check(reads, no_word)
    assert _kinds(found, FILL) == {("a", "out")}
    assert found[FILL].lies[0].evidence == [
        "vllm/model_executor/layers/toy_norm.py:17 drops the result and reads "
        "`out` after (line 18)"
    ]
    # the result used: no evidence
    uses = dict(reads)
    call = "torch.ops.custom_esimd_kernels_vllm.toy_fill(x, out)"
    path = "vllm/model_executor/layers/toy_norm.py"
    uses[path] = reads[path].replace(call, f"out = {call}")
    assert FILL not in _check(uses, no_word)


# ---------------------------------------------------------------------------
# The C++ reader
# ---------------------------------------------------------------------------


def test_the_cxx_reader_takes_evidence_only_where_the_code_says_it():
    text = """
    at::Tensor f(at::Tensor a, at::Tensor b, at::Tensor c) {
        EXTRACT_PTR(pa, a);
        k(reinterpret_cast<const half*>(pa), reinterpret_cast<half*>(b.data_ptr()));
        c = at::empty_like(a);
        return c;
    }
    at::Tensor g(at::Tensor a, at::Tensor b) {
        EXTRACT_PTR(pa, a); EXTRACT_PTR(pb, b);
        k(reinterpret_cast<half*>(pa), reinterpret_cast<half*>(pb));
        return std::move(b);
    }
    """
    found = kernelcxx.functions("x.cc", textwrap.dedent(text))
    returns, writes = kernelcxx.evidence(found["f"], found)
    # c is a new tensor (bound anew), a read through a const pointer
    assert returns == []
    assert [(e.param, e.how, e.line) for e in writes] == [
        ("b", "writable pointer handed to k", 4)
    ]
    returns, writes = kernelcxx.evidence(found["g"], found)
    assert [(e.param, e.line) for e in returns] == [("b", 11)]
    # every pointer writable, handed to a function the reader does not
    # know: both count as written (sound: a read is shown, never assumed)
    assert [(e.param, e.how, e.line) for e in writes] == [
        ("a", "writable pointer handed to k (through pa, x.cc:10)", 9),
        ("b", "writable pointer handed to k (through pb, x.cc:10)", 9),
    ]


# llm-scaler's fused GEMVs, small (b18beee csrc/xpu/esimd_kernel.sycl:155,
# esimd_kernels/fp8_GEMV_v2.h:441-520): every pointer taken writable by
# EXTRACT_PTR, gathered into arrays, handed to a templated host function
# that casts what it reads to const and sets a kernel's fields, whose
# member function stores through the output it picks by index.
FUSED = """
#define EXTRACT_PTR(var, t) auto var = reinterpret_cast<uint8_t*>(t.data_ptr())

template<int COUNT>
struct Fused_kernel {
    const fp16* input;
    const uint8_t* weights[COUNT];
    fp16* outputs[COUNT];
    int K;

    void row(int i, int n) const SYCL_ESIMD_FUNCTION {
        fp16* o_ptr = outputs[i];
        simd<fp16, 8> x = block_load<fp16, 8>(input + n);
        o_ptr[n] = fp16(reduce<float>(x, std::plus<>()));
    }
    void operator()(sycl::nd_item<1> item) const SYCL_ESIMD_KERNEL {
        row(item.get_group(0) % COUNT, item.get_local_id(0));
    }
};

template<int COUNT>
inline void fused_host(uint8_t* input_data, uint8_t* weight_ptrs[COUNT],
                       uint8_t* output_ptrs[COUNT], int K, sycl::queue& q) {
    auto* p_in = reinterpret_cast<const fp16*>(input_data);
    q.submit([&](sycl::handler& h) {
        Fused_kernel<COUNT> kern;
        kern.input = p_in;
        for (int i = 0; i < COUNT; i++) {
            kern.weights[i] = reinterpret_cast<const uint8_t*>(weight_ptrs[i]);
            kern.outputs[i] = reinterpret_cast<OUT*>(output_ptrs[i]);
        }
        h.parallel_for(sycl::nd_range<1>(K, 1), kern);
    });
}

at::Tensor fused2(at::Tensor input, at::Tensor w0, at::Tensor o0,
                  at::Tensor w1, at::Tensor o1) {
    EXTRACT_PTR(p_in, input);
    EXTRACT_PTR(pw0, w0); EXTRACT_PTR(po0, o0);
    EXTRACT_PTR(pw1, w1); EXTRACT_PTR(po1, o1);
    TORCH_CHECK(o0.data_ptr() != o1.data_ptr());
    uint8_t* wp[2] = {pw0, pw1};
    uint8_t* op[2] = {po0, po1};
    fused_host<2>(p_in, wp, op, (int)w0.size(1), get_device_queue(input));
    return o0;
}
"""


@pytest.mark.parametrize(
    "variant, written",
    [
        # both outputs written, the inputs and weights only read
        ("fp16", ["o0", "o1"]),
        # negative control: the same flow, the outputs cast to const: read
        ("const fp16", []),
    ],
)
def test_a_pointer_is_written_unless_the_code_shows_it_read_only(variant, written):
    """EXTRACT_PTR's writable pointers, pointer arrays, a templated host
    call and a kernel's fields are followed: `o1`, which the fused GEMVs
    write and do not return, is a write (issue 51); what the code shows
    read-only (const casts, block_load, a check) is not."""
    text = textwrap.dedent(FUSED).replace("OUT", variant)
    found = kernelcxx.functions("fused.sycl", text)
    assert "struct Fused_kernel" in found
    returns, writes = kernelcxx.evidence(found["fused2"], found)
    assert [e.param for e in returns] == ["o0"]
    assert [e.param for e in writes] == written
    if written:
        (o1,) = [e for e in writes if e.param == "o1"]
        assert o1.how.startswith("written through"), o1.how
        assert (
            o1.line
            == text.splitlines().index(
                "    EXTRACT_PTR(pw1, w1); EXTRACT_PTR(po1, o1);"
            )
            + 1
        )


def test_an_output_pointer_handed_where_the_reader_cannot_follow_is_written():
    """Sound by construction: a pointer handed to a function outside the
    package, kept where the reader does not look, counts as written."""
    text = textwrap.dedent(FUSED).replace("OUT", "const fp16")
    text = text.replace(
        "    return o0;\n}", "    external_copy(po1, 16);\n    return o0;\n}"
    )
    found = kernelcxx.functions("fused.sycl", text)
    _, writes = kernelcxx.evidence(found["fused2"], found)
    assert [(e.param, e.how.split(" (")[0]) for e in writes] == [
        ("o1", "writable pointer handed to external_copy")
    ]


def test_schemas_are_read_from_m_def_strings_with_file_and_line():
    schema = '"toy_gemm(Tensor input, "\n  "Tensor(a!) output) -> Tensor(a!)"'
    text = CXX.replace('"GEMM"', schema)
    text += 'PYBIND11_MODULE(x, m) { m.def("toy_gemm", &toy_gemm); }\n'
    (gemm,) = [d for d in kernelcxx.definitions("t.cc", text) if d.name == "toy_gemm"]
    assert gemm.schema == "toy_gemm(Tensor input, Tensor(a!) output) -> Tensor(a!)"
    assert (gemm.namespace, gemm.line) == (PACKAGE, 22)
    schema = opschema.parse(gemm.schema)
    assert schema.marked == ["output"] and schema.returned_aliases() == ["output"]


# ---------------------------------------------------------------------------
# The summary line
# ---------------------------------------------------------------------------


def _result(conforms: bool | None, context: str) -> audit.Result:
    schema = "mhc_pre(Tensor residual) -> Tensor"
    report = audit.OpReport("_xpu_C::mhc_pre", schema, True)
    report.sites = [CallSite("vllm/x.py", 3, "X.forward", context)]
    if conforms is not None:
        report.fake, report.conforms = "registered", conforms
    return audit.Result("vllm-xpu-kernels 0.1.0", [report], [])


def test_the_summary_never_says_ok_above_a_warning(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / "vllm" / "_xpu_ops.py").write_text("")
    found = tree.locate(str(tmp_path))
    warned = audit.table(found, _result(None, IF_ENABLED))
    assert "_xpu_C::mhc_pre: warn: no fake" in warned
    last = warned.splitlines()[-1]
    assert last.startswith("WARN: nothing on the traced path fails, but 1 ")
    assert "_xpu_C::mhc_pre: warn: no fake" in last
    # negative control: the same op with a conformant fake
    checked = audit.table(found, _result(True, TRACED))
    assert checked.splitlines()[-1].startswith("OK: every traced")


def test_a_void_op_that_marks_nothing_is_not_ok():
    report = audit.OpReport("_xpu_C::f", "f(Tensor x, Tensor out) -> ()", False)
    report.sites = [CallSite("vllm/x.py", 3, "X.forward", TRACED)]
    assert report.verdict.startswith("lies: returns nothing and marks nothing")
    marked = audit.OpReport("_xpu_C::f", "f(Tensor x, Tensor! out) -> ()", False)
    marked.sites = report.sites
    assert marked.verdict == "ok (no tensor returned)"


# ---------------------------------------------------------------------------
# The real pinned 0.33.0
# ---------------------------------------------------------------------------

SAMPLER = "vllm::xpu_topk_topp_sampler"
INDEXER = "vllm::sparse_attn_indexer"


@pytest.fixture(scope="module")
def upstream():
    """0.33.0's texts, and their syntax trees as the first check parses
    them (each check gets a copy: one parse of the tree for the module)."""
    texts = tree.python_sources(releases.pristine("0.33.0"))
    parsed: dict = {}
    truth = schematruth.check(texts, "0.33.0", parsed)
    return texts, parsed, truth


def test_upstream_sampler_and_the_aliasing_gemm_named_and_placed(upstream):
    upstream, parsed, truth = upstream
    parsed = dict(parsed)
    found = {o.op: o for o in truth.ops}
    sampler = found[SAMPLER]
    kinds = {(x.kind, x.argument) for x in sampler.lies}
    assert ("c", "") in kinds and ("a", "logits_to_return") in kinds
    (a,) = [x for x in sampler.lies if x.argument == "logits_to_return"]
    assert "csrc/xpu/sampler/topk_topp_sampler.cpp:62" in a.evidence[0]
    # the sampler runs on the model's output, outside the compiled forward
    assert sampler.sites and not sampler.reached and not sampler.failing
    assert sampler.sites[0].call.file == "vllm/v1/sample/ops/topk_topp_sampler.py"
    out = found["_xpu_C::fp8_gemm_out"]
    assert {(x.kind, x.argument) for x in out.lies} == {("b", "out")}
    assert out.sites == []  # no call in the tree: not compiled
    # negative control: the registration given its mutates_args
    fixed = dict(upstream)
    path = "vllm/_xpu_ops.py"
    anchor = '                op_name="xpu_topk_topp_sampler",\n'
    assert anchor in fixed[path]
    fixed[path] = fixed[path].replace(
        anchor,
        anchor + '                mutates_args=["random_sampled", '
        '"logits_to_return", "logits", "seeds"],\n',
    )
    parsed.pop(path)
    again = {o.op for o in schematruth.check(fixed, "0.33.0", parsed).ops}
    assert SAMPLER not in again and "_xpu_C::fp8_gemm_out" in again
    ast.parse(fixed[path])


def test_the_series_indexer_patch_leaves_no_lie_of_the_indexer(upstream):
    """0.33.0 with the series' indexer patch (the recipe's edit of the files
    that register or call vllm::sparse_attn_indexer): schema truth finds no
    lie of it, and still finds the others. Negative control: the pristine
    0.33.0 lists it, of kind (b)."""
    texts, parsed, truth = upstream
    found = {o.op: o for o in truth.ops}
    assert {x.kind for x in found[INDEXER].lies} == {"b", "e"}  # the control
    fixed = dict(texts)
    parsed = dict(parsed)
    changed = []
    for path in recipes.INDEXER_FILES:
        if path in fixed:
            edited = recipes.edit_sparse_attn_indexer(fixed[path])
            if edited != fixed[path]:
                changed.append(path)
                fixed[path] = edited
                parsed.pop(path, None)
    assert changed == ["vllm/model_executor/layers/sparse_attn_indexer.py"]
    again = {o.op: o for o in schematruth.check(fixed, "0.33.0", parsed).ops}
    assert INDEXER not in again
    assert SAMPLER in again and "_xpu_C::fp8_gemm_out" in again


def test_a_known_lie_is_a_warning_and_exactly_as_listed(upstream, monkeypatch):
    """data/known_lies.toml: each entry is a traced lie of the pinned 0.33.0
    with exactly the kinds listed (a stale entry fails here); a listed lie
    is a WARN, not an OK and not a FAIL. Negative controls: the list
    without the entry, or with another kind, makes the same lie fail."""
    _, _, truth = upstream
    known = schematruth.known_lies()
    found = {o.op: o for o in truth.ops}
    for op, entry in known.items():
        assert op in found and found[op].traced, op
        assert sorted({x.kind for x in found[op].lies}) == sorted(entry["kinds"])
        assert found[op].known == entry["why"] and not found[op].failing
    assert {o.op for o in truth.known} == set(known)
    monkeypatch.setattr(schematruth, "known_lies", lambda: {})
    assert {o.op for o in truth.failing} >= set(known)
    other = {op: dict(e, kinds=["a"]) for op, e in known.items()}
    monkeypatch.setattr(schematruth, "known_lies", lambda: other)
    assert {o.op for o in truth.failing} >= set(known)
    # what fixes it elsewhere is said (the indexer: the series, not applied
    # to this pristine tree); without `fixed`, "not fixed yet"
    monkeypatch.setattr(schematruth, "known_lies", lambda: known)
    said = "\n".join(schematruth.lines(truth))
    assert f"known, fixed by {known[INDEXER]['fixed']}, not applied" in said
    bare = {op: {k: v for k, v in e.items() if k != "fixed"} for op, e in known.items()}
    monkeypatch.setattr(schematruth, "known_lies", lambda: bare)
    assert "known, not fixed yet" in "\n".join(schematruth.lines(truth))
    # the same lie on a tree `make apply` patched: the series' fix did not
    # take, so it fails, and says why; one the series does not fix stays a
    # warning there
    monkeypatch.setattr(schematruth, "known_lies", lambda: known)
    indexer = found[INDEXER]
    indexer.patched = True
    try:
        assert indexer.failing and not indexer.known
        said = "\n".join(schematruth.lines(truth))
        assert "this tree is patched, and the fix did not take" in said
        rope = found["vllm::xpu_ops_deepseek_scaling_rope"]
        rope.patched = True
        assert rope.known and not rope.failing
    finally:
        indexer.patched = False
        found["vllm::xpu_ops_deepseek_scaling_rope"].patched = False
    # (e) on the pinned release: vLLM's own fake of the DeepSeek rope
    # returns its query and key (the kernel returns new tensors)
    assert (
        "alias (e): vllm::sparse_attn_indexer, vllm::xpu_ops_deepseek_scaling_rope"
        in ("\n".join(schematruth.lines(truth)))
    )


def test_a_lying_splitting_op_is_said_to_run_between_the_compiled_pieces(upstream):
    """vLLM splits its compiled graph at its default splitting ops
    (CompilationConfig._attention_ops): the traced call of the lying
    `vllm::sparse_attn_indexer` says so, where the tree lists it, and when it
    is compiled inside a graph after all. Negative controls: an op not in
    the list (the sampler) says nothing of it; the tree with the op taken
    out of the list says nothing either."""
    texts, parsed, truth = upstream
    split = pathconditions.splitting_ops(texts)
    assert "vllm::unified_attention_with_output" in split
    at = split[INDEXER]
    path, _, line = at.partition(":")
    assert texts[path].splitlines()[int(line) - 1].strip() == f'"{INDEXER}",'
    found = {o.op: o for o in truth.ops}
    traced = [s for s in found[INDEXER].sites if s.reached]
    assert traced and all(at in s.split for s in traced)
    said = "\n".join(schematruth.lines(truth))
    assert "use_inductor_graph_partition" in said
    # the modes that compile the model whole, from the tree's enum: 0.33.0's
    # set_splitting_ops_for_v1 empties splitting_ops for any mode but
    # VLLM_COMPILE (its value 3, the last; NONE, 0, compiles nothing)
    enum = texts[path][texts[path].index("class CompilationMode") :]
    assert "STOCK_TORCH_COMPILE = 1" in enum and "VLLM_COMPILE = 3" in enum
    whole = "CompilationMode.STOCK_TORCH_COMPILE or CompilationMode.DYNAMO_TRACE_ONCE"
    assert all(whole in s.split for s in traced)
    assert "VLLM_COMPILE (split" not in said and "NONE" not in traced[0].split
    levels = {
        path: "class CompilationLevel:\n    NO_COMPILATION = 0\n"
        "    DYNAMO_AS_IS = 1\n    DYNAMO_ONCE = 2\n    PIECEWISE = 3\n"
    }
    assert pathconditions.whole_graph_modes(levels) == [
        "CompilationLevel.DYNAMO_AS_IS",
        "CompilationLevel.DYNAMO_ONCE",
    ]
    assert pathconditions.whole_graph_modes({}) == []
    assert all(not s.split for s in found[SAMPLER].sites)
    alone = dict(texts)
    alone[path] = alone[path].replace(f'"{INDEXER}",', "", 1)
    assert INDEXER not in pathconditions.splitting_ops(alone)
    parsed = dict(parsed)
    parsed.pop(path, None)
    again = schematruth.check(alone, "0.33.0", parsed)
    sites = [s for o in again.ops if o.op == INDEXER for s in o.sites]
    assert sites and not any(s.split for s in sites)
    assert pathconditions.splitting_ops({}) == {}


# ---------------------------------------------------------------------------
# The fix's contracts (proof/schemacontracts.py, data/schema_contracts.toml)
# ---------------------------------------------------------------------------


def test_the_contract_of_a_lying_op_or_one_returning_an_alias_and_none_else():
    from xpufakes.proof import schemacontracts

    truth = schematruth.check(_tree(), "9.9.9", data=_data(LIES))
    found = schemacontracts.contracts(truth, "toy")
    gemm = found[f"{PACKAGE}.toy_gemm"]  # what the tree calls: the wrapper
    assert gemm["op"] == "toy_gemm" and gemm["kernel_op"] == GEMM
    assert gemm["params"] == ["Tensor input", "Tensor weight", "Tensor output"]
    assert (gemm["mutates"], gemm["returns"], gemm["callee_returns"]) == (
        ["output"],
        "",
        "output",
    )
    assert "csrc/toy.cc:8" in gemm["source"]
    # through `self._op = toy_two`: it marks out2, hides out, returns nothing
    two = found[f"{PACKAGE}.toy_two"]
    assert (two["mutates"], two["callee_returns"]) == (["out", "out2"], "")
    truthful = schematruth.check(_tree(), "9.9.9", data=_data(TRUTHS))
    # the truthful schemas: no contract of a lie; the GEMM's truthful schema
    # returns a declared alias (`-> Tensor(a!)`), which functionalization
    # refuses: the same form, its writes marked, the caller given the output
    assert {c.call.op for c in truthful.refused_sites} == {GEMM}
    routed = schemacontracts.contracts(truthful, "toy")
    assert list(routed) == [f"{PACKAGE}.toy_gemm"]
    alias = routed[f"{PACKAGE}.toy_gemm"]
    assert (alias["mutates"], alias["returns"], alias["callee_returns"]) == (
        ["output"],
        "",
        "output",
    )
    assert "returns a declared alias `output`" in alias["source"]
    # (TWO and FILL, truthful and returning nothing, have none: the control)


def test_the_committed_contracts_of_upstream_are_what_schema_truth_says(upstream):
    from xpufakes.proof import schemacontracts

    committed = {
        callee: entry
        for callee, entry in tomllib.loads(schemacontracts.DATA.read_text()).items()
        if "vLLM 0.33.0" in entry["trees"]
    }
    found = schemacontracts.contracts(upstream[2], "vLLM 0.33.0")
    keys = ("op", "kernel_op", "params", "mutates", "returns", "callee_returns")
    assert {c: [e[k] for k in keys] for c, e in found.items()} == {
        c.split("#")[0]: [e[k] for k in keys] for c, e in committed.items()
    }
    # the sampler is not on the traced path: no contract needed for it
    assert "torch.ops.vllm.xpu_topk_topp_sampler" not in found
    assert found["torch.ops.vllm.sparse_attn_indexer"]["callee_returns"] == (
        "topk_indices_buffer"
    )


def test_a_traced_call_of_a_kernel_op_the_data_does_not_know_is_a_warning():
    new = """
    import torch


    class XPUInt2LinearMethod:
        def METHOD(self, layer, x, bias=None):
            return torch.ops._xpu_C.int2_gemm_brand_new(x, layer.weight)
    """
    traced = _tree(xpu_new=new.replace("METHOD", "apply"))
    truth = schematruth.check(traced, "9.9.9", data=_data(TRUTHS))
    assert [(c.op, c.file, c.line) for c in truth.unknown] == [
        ("_xpu_C::int2_gemm_brand_new", "vllm/xpu_new.py", 7)
    ]
    assert any("not in the data: not checked" in x for x in schematruth.lines(truth))
    # negative control: called in set-up only, it is not on the traced path
    setup = _tree(xpu_new=new.replace("METHOD", "process_weights_after_loading"))
    assert schematruth.check(setup, "9.9.9", data=_data(TRUTHS)).unknown == []


def test_a_traced_call_of_an_op_returning_a_declared_alias_is_a_warning():
    """Truthful, `-> Tensor(a!)` is refused by functionalization for a custom
    op (tests/test_schema_truth_compile.py): a warning where it is traced."""
    truthful = schematruth.check(_tree(), "9.9.9", data=_data(TRUTHS))
    assert [(c.op, c.line) for c in truthful.refused] == [(GEMM, 19)]
    returns_nothing = TRUTHS | {
        "GEMM": "toy_gemm(Tensor input, Tensor weight, Tensor(a!) output) -> ()"
    }
    assert (
        schematruth.check(_tree(), "9.9.9", data=_data(returns_nothing)).refused == []
    )


def test_mutates_args_the_source_does_not_spell_out_is_said_not_guessed():
    named = _tree(toy_ops=OWN.replace("MUTATES", "\n    mutates_args=MUTATED,"))
    truth = schematruth.check(named, "9.9.9", data=_data(TRUTHS))
    assert "vllm::toy_sample" not in {o.op for o in truth.ops}
    (said,) = [w for w in truth.warnings if "vllm::toy_sample" in w]
    assert said.endswith("its mutates_args is not a literal: not checked")
    given = _tree(toy_ops=OWN.replace("MUTATES", '\n    mutates_args=["out"],'))
    assert schematruth.check(given, "9.9.9", data=_data(TRUTHS)).warnings == []
