"""Run one IPEX-era vLLM release's own AWQ / GPTQ linear methods, with IPEX
replaced by the CPU reference kernels, and report for each which torch_ipex
ops its apply() reaches and whether torch.compile can compile it.

Run in a separate process with a Python that has vLLM's dependencies
(.venv-tree):

    python woq_probe.py TREE OUT.json METHOD:ENGINE [METHOD:ENGINE ...]

METHOD is gptq, gptq-act-order, awq (IPEXGPTQLinearMethod /
IPEXAWQLinearMethod) or wna16 (XPUwNa16LinearKernel, 0.13.0+); ENGINE onednn
or xetla. The cases run one after another in this process (the tree is
imported once; Dynamo is reset before each compile); OUT.json maps each
"METHOD:ENGINE" to its result. vLLM's files come from TREE; only
intel_extension_for_pytorch, which cannot exist on a CPU, is a stand-in (its
WOQ module is the reference one, whose forward dispatches to the torch_ipex
ops as IPEX's XPU forward does). With XPUFAKES_PROBE_PLUGIN=<dir>, the vLLM
plugin installed there registers first (VLLM_XPU_FAKES_ANY_PLATFORM=1 lets
it act on this CPU).
"""

import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE.parents[1] / "scripts"  # the tool, whose stand-ins these are
K, N, GROUP = 256, 128, 64


def _tool() -> None:
    """The checkout's tool importable (make e2e's plugin loads this file
    from the checkout by path, in a venv of its own)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))


def load_reference():
    """The reference kernels (vllm_overlay/tests/.../xpu_gemm_reference.py),
    as the tool loads them."""
    _tool()
    from xpufakes.proof.xpu import reference

    return reference.reference()


ENGINE = {"engine": "onednn"}  # the layout of the case being run


def load_standins():
    """The tool's IPEX stand-in (scripts/xpufakes/proof/xpu/ipex.py, torch
    only)."""
    _tool()
    from xpufakes.proof.xpu import ipex

    return ipex


def stub_ipex(reference, engine: str = "onednn") -> None:
    """intel_extension_for_pytorch as the tool stands it in, its WOQ linear
    module the reference one, in the layout of ENGINE (`engine` until a case
    sets another; make e2e's plugin calls this too)."""
    ENGINE["engine"] = engine

    def from_weight(*args, **kwargs):
        return reference.ReferenceWOQLinear.from_weight(
            *args, engine=ENGINE["engine"], **kwargs
        )

    load_standins().install_ipex(woq_from_weight=from_weight)


def make_layer(method: str, pack_rows) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.bias = None
    layer.skip_bias_add = False
    layer.scales = torch.rand(K // GROUP, N, dtype=torch.float16) / 8
    zeros = torch.randint(0, 16, (K // GROUP, N))
    if method.startswith("gptq"):
        layer.qweight = pack_rows(torch.randint(0, 16, (K, N)))  # [K/8, N]
        layer.qzeros = pack_rows(zeros.t()).t().contiguous()  # [K/G, N/8]
        layer.g_idx = (torch.arange(K) // GROUP)[torch.randperm(K)].to(torch.int32)
    else:  # AWQ: [K, N/8] packed along N
        layer.qweight = pack_rows(torch.randint(0, 16, (N, K))).t().contiguous()
        layer.qzeros = pack_rows(zeros.t()).t().contiguous()
    return layer


def wna16(layer: torch.nn.Module, pack_rows):
    """vLLM's XPUwNa16LinearKernel for a symmetric int4 layer (0.13.0+)."""
    base = "vllm.model_executor.layers.quantization.kernels.mixed_precision."
    xpu = importlib.import_module(base + "xpu")
    config_cls = importlib.import_module(base + "MPLinearKernel").MPLinearLayerConfig
    scalar_types = importlib.import_module("vllm.scalar_type").scalar_types
    config = config_cls(
        full_weight_shape=(K, N),
        partition_weight_shape=(K, N),
        weight_type=scalar_types.uint4b8,
        act_type=torch.float16,
        group_size=GROUP,
        zero_points=False,
        has_g_idx=False,
    )
    kernel = xpu.XPUwNa16LinearKernel(config, "weight_packed", "weight_scale")
    layer.weight_packed = pack_rows(torch.randint(0, 16, (K, N))).t().contiguous()
    layer.weight_scale = torch.rand(N, K // GROUP, dtype=torch.float16) / 8
    kernel.process_weights_after_loading(layer)
    return kernel.apply_weights


def main(tree: str, out: str, *cases: str) -> None:
    sys.path.insert(0, tree)
    reference = load_reference()
    library = reference.define_torch_ipex_woq_kernels()  # noqa: F841
    stub_ipex(reference)
    plugin = os.environ.get("XPUFAKES_PROBE_PLUGIN")
    if plugin:  # the installed vLLM plugin (plugin/), as vLLM loads it
        sys.path.insert(0, plugin)
        import vllm_xpu_fakes

        vllm_xpu_fakes.register()
    results = {}
    for case in cases:
        method, engine = case.split(":")
        ENGINE["engine"] = engine
        try:
            results[case] = one_case(method, reference)
        except Exception as e:  # noqa: BLE001 - reported, the next case runs
            results[case] = {"error": f"{type(e).__name__}: {e}"}
    Path(out).write_text(json.dumps(results))


def one_case(method: str, reference) -> dict:
    if method == "wna16":
        layer = torch.nn.Module()
        layer.bias, layer.skip_bias_add = None, False
        return run(wna16(layer, reference.pack_int4_rows), layer, reference)
    ipex_quant = importlib.import_module(
        "vllm.model_executor.layers.quantization.ipex_quant"
    )
    kwargs = {
        "method": method.split("-")[0],
        "weight_bits": 4,
        "group_size": GROUP,
        "desc_act": method == "gptq-act-order",
        "is_sym": method.startswith("gptq"),
    }
    accepted = inspect.signature(ipex_quant.IPEXConfig).parameters
    config = ipex_quant.IPEXConfig(**{k: v for k, v in kwargs.items() if k in accepted})
    cls = (
        ipex_quant.IPEXGPTQLinearMethod
        if method.startswith("gptq")
        else ipex_quant.IPEXAWQLinearMethod
    )
    linear = cls(config)
    layer = make_layer(method, reference.pack_int4_rows)
    linear.process_weights_after_loading(layer)
    return run(linear.apply, layer, reference)


def run(apply, layer: torch.nn.Module, reference) -> dict:
    """apply() eagerly (which torch_ipex ops it reaches), then compiled."""
    x = torch.randn(2, 8, K, dtype=torch.float16)
    reference.WOQ_CALLS.clear()
    expected = apply(layer, x)
    result = {
        "ops_met": list(reference.WOQ_CALLS),
        "module": type(layer.ipex_qlinear).__name__,
        "shape": list(expected.shape),
    }
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: apply(layer, t), fullgraph=True)
    try:
        got = compiled(x)
        torch.testing.assert_close(got, expected)
        result["compile"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        result["compile"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return result


if __name__ == "__main__":
    main(*sys.argv[1:])
