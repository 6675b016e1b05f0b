"""The engine cases: which release, which checkpoint and vLLM arguments,
which of vLLM's XPU paths they take, and what the unpatched release does."""

from dataclasses import dataclass, field

IPEX_ARGS = {"quantization": "ipex", "allow_deprecated_quantization": True}


@dataclass(frozen=True)
class Case:
    release: str
    name: str
    format: str  # e2e/engine/checkpoints.py
    llm: dict = field(hash=False)  # LLM(...) / vllm serve arguments
    route: str  # in every linear layer's (method > kernel) chain
    op: str  # the GEMM the route calls, as a fake-tensor error names it
    fake: str  # the op whose registered fake is checked
    family: str  # compare.TOLERANCE
    breaks_unpatched: bool  # compiled start-up dies on the unpatched release

    @property
    def id(self) -> str:
        return f"{self.release}-{self.name}"


CASES = (
    # IPEX era: the report's case (online fp8) and int4 through IPEX's WOQ
    # linear module (vLLM's IPEX AWQ / GPTQ methods; `--quantization ipex`,
    # as on an XPU, where ipex claims AWQ / GPTQ checkpoints)
    Case(
        "0.14.1",
        "fp8",
        "bf16",
        {"quantization": "fp8"},
        "XPUFp8LinearMethod",
        "torch_ipex.fp8_gemm_w8a16.xpu",
        "torch_ipex::fp8_gemm_w8a16.xpu",
        "weight-only",
        True,
    ),
    Case(
        "0.14.1",
        "awq",
        "awq",
        IPEX_ARGS,
        "IPEXAWQLinearMethod",
        "torch_ipex.mm_int4",
        "vllm::ipex_woq_linear",
        "weight-only",
        True,
    ),
    Case(
        "0.14.1",
        "gptq",
        "gptq",
        IPEX_ARGS,
        "IPEXGPTQLinearMethod",
        "torch_ipex.mm_int4",
        "vllm::ipex_woq_linear",
        "weight-only",
        True,
    ),
    # 0.22 - 0.27.1: vLLM has no fake for _xpu_C::fp4_gemm
    Case(
        "0.27.1",
        "mxfp4",
        "ct-mxfp4",
        {},
        "XPUMxFp4LinearKernel",
        "_xpu_C.fp4_gemm.default",
        "_xpu_C::fp4_gemm",
        "activation-quantized",
        True,
    ),
    # 0.32.0: vLLM's own fakes are right for what these paths pass (2-D,
    # contiguous activations, a dtype given): unpatched works
    Case(
        "0.32.0",
        "fp8-w8a16",
        "bf16",
        {"quantization": "fp8"},
        "XPUW8A16FP8LinearKernel",
        "_xpu_C.fp8_gemm_w8a16.default",
        "_xpu_C::fp8_gemm_w8a16",
        "weight-only",
        False,
    ),
    Case(
        "0.32.0",
        "fp8-w8a8",
        "ct-fp8-dynamic",
        # an XPU picks W8A16 for any fp8 layer unless told: --linear-backend xpu
        {"linear_backend": "xpu"},
        "XPUW8A8FP8LinearKernel",
        "_xpu_C.fp8_gemm.default",
        "_xpu_C::fp8_gemm",
        "activation-quantized",
        False,
    ),
    Case(
        "0.32.0",
        "int4-w4a16",
        "ct-w4a16",
        {},
        "XPUwNa16LinearKernel",
        "_xpu_C.int4_gemm_w4a16.default",
        "_xpu_C::int4_gemm_w4a16",
        "weight-only",
        False,
    ),
)

RELEASES = tuple(dict.fromkeys(c.release for c in CASES))

# How each release's tests run the tool: with VLLM=<site-packages>, or
# PYTHON=<venv>/bin/python and no VLLM= (the vLLM that Python imports).
APPLY_FORM = {"0.14.1": "VLLM", "0.27.1": "VLLM", "0.32.0": "PYTHON"}

# The width of the gate_up projection (2 x the intermediate size of
# e2e/engine/checkpoints.py): the output the wrong stand-in hands back in the
# wrong layout.
GATE_UP = 1024

# The case whose stand-in is made to disagree with its fake (the negative
# control of the comparison, e2e/plugin/xpufakes_e2e_plugin/negative.py).
WRONG_STANDIN = {"0.14.1": "fp8", "0.27.1": "mxfp4", "0.32.0": "fp8-w8a16"}

# The recipe path: a release whose installed vllm/ carries a downstream
# patch of our own near the anchors, and the case started on it.
RECIPE = {"0.14.1": "gptq", "0.27.1": "mxfp4"}

# vllm serve, one per era (the report's case in the IPEX era).
SERVE = {"0.14.1": "fp8", "0.32.0": "fp8-w8a16"}

# vllm serve with TP=2 in the unpatched venv with this project's vLLM plugin
# installed (the report's case: what its user runs, fixed by pip install).
PLUGIN_SERVE = {"0.14.1": "fp8"}

# Releases whose front end loads the plugins before it sets up vLLM's logging
# (0.32: vllm/entrypoints/cli/main.py, .../launchers/api_server/entry.py):
# with the plugin installed, that front end without a server
# (e2e/engine/front_end.py) and the one-line check a user tries, each for
# the plugin's line; the case whose checkpoint the front end is given.
PLUGIN_FRONT_END = {"0.32.0": "fp8-w8a16"}

# The LLM run vllm serve (TP=2) is compared with, by its tensor-parallel
# size. 0.14.1's online fp8 quantizes each TP shard of a weight with its own
# scale (amax of the shard), so at TP=2 it is another model than at TP=1;
# 0.32.0 all-reduces the amax over the ranks (amax_for_tp_weight_quant), so
# TP=2 is TP=1's model up to the order of the partial sums.
SERVE_REFERENCE_TP = {"0.14.1": 2, "0.32.0": 1}


def of(release: str) -> list[Case]:
    return [c for c in CASES if c.release == release]


def named(release: str, name: str) -> Case:
    return next(c for c in of(release) if c.name == name)
