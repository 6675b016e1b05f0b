"""What a vLLM worker has, asked from the test through ``collective_rpc``
(``LLM.collective_rpc(inspect_worker)``): the plugin's state in that process,
the quantization method and kernel of each linear layer, Dynamo's counters."""

import os


def _names(obj, depth: int = 0) -> list[str]:
    """The class of a quantization method and of the scheme / kernel it
    delegates to (vLLM's attribute names for them)."""
    if obj is None or depth > 3:
        return []
    names = [type(obj).__name__]
    for attr in ("scheme", "fp8_linear", "kernel", "linear_kernel"):
        names += _names(getattr(obj, attr, None), depth + 1)
    return names


def linear_methods(model) -> dict[str, list[str]]:
    """Distinct (method, kernel) chains -> the layer names using them."""
    chains: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or not hasattr(module, "input_size"):
            continue
        chain = _names(method) + _names(getattr(module, "scheme", None))
        ipex = getattr(module, "ipex_qlinear", None)
        if ipex is not None:
            chain.append(f"ipex_qlinear={type(ipex).__name__}")
        chains.setdefault(" > ".join(chain), []).append(name)
    return chains


def _model(worker):
    runner = worker.model_runner
    get = getattr(runner, "get_model", None)
    return get() if get is not None else runner.model


def inspect_worker(worker) -> dict:
    import torch._dynamo.utils

    import xpufakes_e2e_plugin

    counters = torch._dynamo.utils.counters
    return {
        "pid": os.getpid(),
        "plugin": xpufakes_e2e_plugin.state(),
        "linear_methods": linear_methods(_model(worker)),
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": counters["stats"].get("unique_graphs", 0),
    }
