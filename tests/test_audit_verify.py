"""`make audit` and `make verify-xpu` on real releases: unpatched trees are
reported non-conformant, patched ones conformant; an op of unknown schema is
reported as unknown; verify-xpu stops clearly where there is no XPU."""

import json

import pytest

from support import releases, tool
from xpufakes.common.errors import NOT_HERE
from xpufakes.proof.audit import IPEX_WOQ
from xpufakes.trees import pins


def _audit(tree, *args) -> tuple[int, dict]:
    result = tool.run("audit", str(tree), "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def _op(report: dict, name: str) -> dict:
    return next(op for op in report["ops"] if op["op"] == name)


def _gemm(version: str) -> str:
    era = pins.load().get(version).series.split("-")[0]
    return "torch_ipex::fp8_gemm_w8a16" if era == "ipex" else "_xpu_C::fp8_gemm_w8a16"


def test_audit_unpatched_is_non_conformant(sample_release):
    version = sample_release
    status, report = _audit(releases.pristine(version))
    assert status == 1 and not report["ok"]
    gemm = _op(report, _gemm(version))
    assert gemm["traced"] and gemm["returns_tensor"]
    assert gemm["verdict"].startswith("FAIL")
    sites = [s for s in gemm["sites"] if s["context"] == "traced"]
    assert any("apply" in s["function"] for s in sites), sites
    if pins.load().get(version).series.startswith("ipex"):
        woq = _op(report, IPEX_WOQ)  # the AWQ / GPTQ path into IPEX's module
        assert woq["verdict"] == "FAIL: no fake", woq
    if _has_fp8_bmm_wrapper(version):
        # vllm::xpu_fp8_bmm returns _xpu_C::fp8_bmm's output; its own fake
        # fails against the kernel's stand-in
        op = _op(report, "vllm::xpu_fp8_bmm")
        assert op["verdict"] == "FAIL: fake does not conform", op
        assert "Stride mismatch" in op["detail"], op["detail"]
        assert any("deepseek_v4/xpu" in s["file"] for s in op["sites"])


def test_audit_patched_is_conformant(sample_release):
    version = sample_release
    status, report = _audit(releases.patched(version))
    assert status == 0 and report["ok"], [
        (o["op"], o["verdict"])
        for o in report["ops"]
        if o["verdict"].startswith("FAIL")
    ]
    gemm = _op(report, _gemm(version))
    assert gemm["fake"] == "registered" and gemm["conforms"] is True
    if pins.load().get(version).series.startswith("ipex"):
        woq = _op(report, IPEX_WOQ)
        assert woq["verdict"] == "ok" and "ipex_woq_linear" in woq["fake"], woq
    if _has_fp8_bmm_wrapper(version):
        op = _op(report, "vllm::xpu_fp8_bmm")
        assert op["verdict"] == "ok" and op["conforms"] is True, op


def _has_fp8_bmm_wrapper(version: str) -> bool:
    return tuple(int(p) for p in version.split(".")) >= (0, 27, 0)


def test_audit_reports_an_unknown_op_as_unknown(tmp_path):
    """A newer tree (here: 0.33.0 with a new quantized method) calling an op
    whose schema this project does not know, through a helper."""
    tree = releases.copy_of("0.33.0", tmp_path / "main")
    releases.apply(tree)
    new = tree / "vllm" / "model_executor" / "layers" / "quantization" / "xpu_new.py"
    new.write_text(
        "import torch\n\n\n"
        "def _new_gemm(x, w):\n"
        "    return torch.ops._xpu_C.int2_gemm_brand_new(x, w)\n\n\n"
        "class XPUInt2LinearMethod:\n"
        "    def apply(self, layer, x, bias=None):\n"
        "        return _new_gemm(x, layer.weight)\n"
    )
    status, report = _audit(tree)
    op = _op(report, "_xpu_C::int2_gemm_brand_new")
    assert op["verdict"] == "unknown schema" and op["returns_tensor"] is None
    caller = [s for s in op["sites"] if s["function"] == "XPUInt2LinearMethod.apply"]
    assert (
        caller and caller[0]["context"] == "traced" and "_new_gemm" in caller[0]["via"]
    )
    assert status == 0  # unknown is reported, not guessed into a failure


def test_audit_table_names_call_sites():
    result = tool.run("audit", str(releases.pristine("0.33.0")))
    assert result.returncode == 1
    assert "_xpu_C::fp8_gemm_w8a16: FAIL: fake does not conform" in result.stdout
    assert "scaled_mm/xpu.py:176 XPUW8A16FP8LinearKernel.apply_weights [traced]" in (
        result.stdout
    )
    assert "_xpu_C::mhc_pre: warn: no fake" in result.stdout


def test_verify_xpu_says_it_cannot_run_here():
    result = tool.run("verify-xpu")
    assert result.returncode == NOT_HERE
    assert "no Intel GPU here" in result.stderr


@pytest.mark.parametrize("version", ["0.14.1", "0.33.0"])
def test_verify_xpu_logic_against_standins(version):
    kernels = pins.load().get(version).kernels
    ok = tool.run(
        "verify-xpu",
        "--vllm",
        str(releases.patched(version)),
        "--standins",
        kernels,
        "--quick",
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS" in ok.stdout.splitlines()[-1]
    # schema truth's stand-ins are tests/test_schema_check.py's: --quick says so
    assert "schema truth on CPU stand-ins: not run (--quick" in ok.stdout
    bad = tool.run(
        "verify-xpu",
        "--vllm",
        str(releases.pristine(version)),
        "--standins",
        kernels,
        "--quick",
    )
    assert bad.returncode == 1
    assert "FAIL" in bad.stdout.splitlines()[-1]


# ---------------------------------------------------------------------------
# vLLM's wrapper ops, code inside opaque vLLM ops, compiled extensions,
# other namespaces
# ---------------------------------------------------------------------------


# A fused-MoE expert class calling a grouped GEMM, as a downstream tree does;
# vLLM runs it inside vllm::moe_forward (FusedMoE looks the layer up at run
# time), so Dynamo never traces it.
_MOE_EXPERTS = """\
import torch

import vllm.model_executor.layers.fused_moe.modular_kernel as mk


class XPUGroupedExperts(mk.FusedMoEPermuteExpertsUnpermute):
    def apply(self, output, hidden_states, w1, w2, rows, n, k, experts):
        return torch.ops._xpu_C.cutlass_grouped_gemm_interface(
            hidden_states, None, w1, None, None, output, rows, n, k, experts
        )
"""


MOE_EXPERTS = "vllm/model_executor/layers/fused_moe/experts/xpu_grouped.py"
# the negative control: the same call in a linear method's apply() is traced
GROUPED_LINEAR = "vllm/model_executor/layers/quantization/xpu_grouped_linear.py"
XPU_OTHER_NS = "vllm/model_executor/layers/quantization/xpu_other_ns.py"
CUDA_OTHER_NS = "vllm/model_executor/layers/quantization/cuda_other_ns.py"
_OTHER_NS = (
    "import torch\n\n\n"
    "class {cls}:\n"
    "    def apply(self, layer, x, bias=None):\n"
    "        return torch.ops._xpu_moe_C.brand_new_gemm(x, layer.weight)\n"
)


@pytest.fixture(scope="module")
def downstream_tree(tmp_path_factory):
    """Patched 0.33.0 with what a downstream tree has: a fused-MoE expert
    class calling a grouped GEMM, `import vllm._C` at the top of
    vllm/_xpu_ops.py, and a call into another op namespace (in an XPU
    method and, not XPU code, a CUDA one); plus the negative control of the
    MoE case, the same call in a linear method."""
    tree = releases.copy_of("0.33.0", tmp_path_factory.mktemp("d") / "tree")
    releases.apply(tree)
    files = {
        MOE_EXPERTS: _MOE_EXPERTS,
        GROUPED_LINEAR: _MOE_EXPERTS.replace(
            "mk.FusedMoEPermuteExpertsUnpermute", "object"
        ).replace("XPUGroupedExperts", "XPUGroupedLinearMethod"),
        XPU_OTHER_NS: _OTHER_NS.format(cls="XPUOtherLinearMethod"),
        CUDA_OTHER_NS: _OTHER_NS.format(cls="CudaOtherLinearMethod"),
    }
    for name, text in files.items():
        (tree / name).write_text(text)
    xpu_ops = tree / "vllm" / "_xpu_ops.py"
    xpu_ops.write_text(
        xpu_ops.read_text().replace(
            "import torch\n", "import torch\n\nimport vllm._C  # noqa: F401\n", 1
        )
    )
    status, report = _audit(tree)
    return status, report


def test_audit_does_not_call_code_inside_moe_forward_traced(downstream_tree):
    status, report = downstream_tree
    op = _op(report, "_xpu_C::cutlass_grouped_gemm_interface")
    by_file = {s["file"]: s for s in op["sites"]}
    assert by_file[MOE_EXPERTS]["context"] == "opaque", by_file[MOE_EXPERTS]
    assert by_file[MOE_EXPERTS]["via"] == "vllm::moe_forward"
    assert by_file[GROUPED_LINEAR]["context"] == "traced", by_file[GROUPED_LINEAR]
    # only the linear method's call makes it a failure
    assert op["verdict"] == "FAIL: no fake"
    failing = [o["op"] for o in report["ops"] if o["verdict"].startswith("FAIL")]
    assert failing == ["_xpu_C::cutlass_grouped_gemm_interface"] and status == 1


def test_audit_loads_a_tree_that_imports_vllm_c_at_module_level(downstream_tree):
    _, report = downstream_tree
    for op in ("_xpu_C::fp8_gemm_w8a16", "vllm::xpu_fp8_bmm"):
        assert _op(report, op)["conforms"] is True, _op(report, op)


def test_audit_reports_other_namespaces_in_xpu_code_as_unknown(downstream_tree):
    _, report = downstream_tree
    op = _op(report, "_xpu_moe_C::brand_new_gemm")
    assert op["verdict"] == "unknown namespace", op
    assert [s["file"] for s in op["sites"]] == [XPU_OTHER_NS]
