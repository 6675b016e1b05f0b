"""The custom ops this project gives fakes to, by name: data, no logic that
needs torch. The recipes wire the fakes in, the audit and the proof look
for calls of these ops, verify-xpu checks their fakes."""

import re
import tomllib
from dataclasses import dataclass

from xpufakes.common import paths

# The XPU kernel namespaces: vllm-xpu-kernels' and IPEX's.
XPU_C, TORCH_IPEX = "_xpu_C", "torch_ipex"
NAMESPACES = (XPU_C, TORCH_IPEX)

# The ops with a fake of ours, and their facts: data/fakes.toml, the one table.
FAKES = tomllib.loads((paths.DATA / "fakes.toml").read_text())["op"]

# vllm-xpu-kernels' GEMMs (torch.ops._xpu_C.<gemm>), vLLM 0.16.0 on.
XPU_C_GEMMS = tuple(
    op["name"].partition("::")[2] for op in FAKES if op["era"] == "kernels"
)
# The in-place cut's test regions of code several GEMMs' cases share
# (region -> the GEMMs that need it; fakes.toml's shared_test_region).
SHARED_TEST_TAGS: dict[str, tuple[str, ...]] = {}
for _op in FAKES:
    if "shared_test_region" in _op:
        SHARED_TEST_TAGS[_op["shared_test_region"]] = (
            *SHARED_TEST_TAGS.get(_op["shared_test_region"], ()),
            _op["name"].partition("::")[2],
        )
# IPEX's GEMM that vLLM 0.10.2 - 0.15.1 call from XPUFp8LinearMethod.apply
# (without its overload).
(IPEX_GEMM,) = (op["name"].split(".")[0] for op in FAKES if op["era"] == "ipex")
# IPEX's weight-only-quantized linear module, called as layer.ipex_qlinear(x)
# by the IPEX era's AWQ / GPTQ / wNa16 methods. Its forward reaches
# torch_ipex ops registered as CompositeImplicitAutograd kernels, which
# cannot take a fake; vllm/_ipex_woq_linear.py wraps the module in one op,
# made by opaque_ipex_woq_linear(...).
IPEX_WOQ = "torch_ipex::WeightOnlyQuantizedLinear.forward"
IPEX_WOQ_WRAPPER = "opaque_ipex_woq_linear"
# The op vllm/_ipex_woq_linear.py registers around it (with its own test).
IPEX_WOQ_OP = "vllm::ipex_woq_linear"


@dataclass(frozen=True)
class Wrapper:
    """A vLLM op (in vllm/_xpu_ops.py) that returns one of the _xpu_C GEMMs'
    outputs unchanged: its fake must be that GEMM's."""

    gemm: str  # the _xpu_C GEMM it returns
    impl: str  # vLLM's implementation function
    fake: str  # vLLM's fake function, which the recipe makes the GEMM's
    canonical: str  # the fake of vllm/_xpu_gemm_fakes.py it delegates to


WRAPPERS = {
    "vllm::xpu_fp8_bmm": Wrapper(
        "fp8_bmm", "_xpu_fp8_bmm_impl", "_xpu_fp8_bmm_fake", "fp8_bmm_fake"
    ),
}
# wrapper op -> the GEMM ("vllm::xpu_fp8_bmm" -> "_xpu_C::fp8_bmm")
WRAPPER_OPS = {op: f"{XPU_C}::{w.gemm}" for op, w in WRAPPERS.items()}

# The ops of ours (by name, without overload).
OURS = frozenset({f"{XPU_C}::{gemm}" for gemm in XPU_C_GEMMS} | {IPEX_GEMM, IPEX_WOQ})


def exact_schemas(op: str) -> list[str]:
    """The schemas (qualified, as torch prints them) the fake of one of our
    ops is exact for: its kernels' own (op_schemas.toml) and those of the
    downstream builds fakes.toml's `also` names."""
    namespace, _, name = op.partition("::")
    own = tomllib.loads((paths.DATA / "op_schemas.toml").read_text())
    schemas = (
        [f"{namespace}::{own[namespace][name]}"]
        if name in own.get(namespace, {})
        else []
    )
    for entry in FAKES:
        if entry["name"] == op:
            schemas += [f"{namespace}::{a['schema']}" for a in entry.get("also", ())]
    return schemas


def is_ours(op: str) -> bool:
    """Whether an op (as the audit names it, maybe with an overload) is ours."""
    return op in OURS or op.split(".")[0] in OURS


_XPU_C_GEMM_CALL = re.compile(
    r"torch\.ops\." + XPU_C + r"\.(?:" + "|".join(XPU_C_GEMMS) + r")\b"
)


def xpu_c_gemm_of(function: str) -> str | None:
    """The GEMM a call's function names ("torch.ops._xpu_C.fp8_gemm" or
    with an overload), else None."""
    parts = function.split(".")
    if parts[:3] == ["torch", "ops", XPU_C] and len(parts) in (4, 5):
        return parts[3] if parts[3] in XPU_C_GEMMS else None
    return None


def calls_xpu_c_gemms(text: str) -> bool:
    """Whether source text calls one of the _xpu_C GEMMs."""
    return bool(_XPU_C_GEMM_CALL.search(text))


# The calls a recipe (and the plugin) route through a vLLM op of
# vllm/_xpu_opaque_calls.py, callee -> contract: data/opaque_calls.toml (calls
# Dynamo cannot trace) and data/schema_contracts.toml (a kernel package's op
# whose schema hides a write or an alias, issue 42). A contract of the tree's
# own vLLM op (`torch.ops.vllm.*`: its registration is the fix, not another
# op around it) and a second contract of a callee ("<callee>#2": another
# release's parameters) are not routed: data/known_lies.toml lists the former.
CONTRACT_KEYS = ("op", "params", "mutates", "returns", "callee_returns", "source")


def _routed_schema_contracts() -> dict[str, dict]:
    path = paths.DATA / "schema_contracts.toml"
    data = tomllib.loads(path.read_text()) if path.is_file() else {}
    return {
        callee: {k: entry[k] for k in CONTRACT_KEYS}
        for callee, entry in data.items()
        if "#" not in callee and not entry["kernel_op"].startswith("vllm::")
    }


SCHEMA_CONTRACTS: dict[str, dict] = _routed_schema_contracts()
ROUTED_CALLS: dict[str, dict] = {
    **tomllib.loads((paths.DATA / "opaque_calls.toml").read_text()),
    **SCHEMA_CONTRACTS,
}
