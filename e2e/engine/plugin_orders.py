"""Which fake wins, by the order of registration, on the torch of an engine
venv (0.14.1's: torch 2.9.1, where register_fake does not override by
default). Runs in that venv, one order per process (registrations are
process-global):

    <venv>/bin/python plugin_orders.py ORDER RELEASE PLUGIN_DIR OUT.json

RELEASE is a pinned kernels-era vLLM release (its sdist, fetched by the
tool: its vllm/_xpu_ops.py registers vLLM's own fakes of the _xpu_C GEMMs
when imported), PLUGIN_DIR the plugin's wheel unpacked. ORDER:

* plugin: the plugin's register() with vllm/_xpu_ops.py not imported yet;
* vllm-first: vllm/_xpu_ops.py imported, then register();
* fakes-first: the plugin's fakes registered before vLLM's module is
  imported (what register() avoids), then the import.

OUT.json: the module of the fake of _xpu_C::fp8_gemm_w8a16 (or the error
vLLM's import raised), and torch's version. The XPU kernels are the
checkout's stand-ins of the kernel release vLLM pins
(scripts/xpufakes/proof/xpu).
"""

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OP = "_xpu_C::fp8_gemm_w8a16"


def _owner() -> str | None:
    from xpufakes.proof.xpu import registering

    fake = registering.fake_of(OP)
    while fake is not None and fake.__module__.startswith("torch."):
        cells = getattr(fake, "__closure__", None) or ()
        fake = getattr(fake, "func", None) or next(
            (c.cell_contents for c in cells if callable(c.cell_contents)), None
        )
    return None if fake is None else fake.__module__


def main(order: str, release: str, plugin: str, out: str) -> int:
    sys.path.insert(0, str(REPO / "scripts"))
    import torch

    from xpufakes.proof.xpu import reference, xpu_kernels
    from xpufakes.trees import fetch, pins

    pin = pins.load().get(release)
    tree = fetch.fetch(pin)
    libraries = reference.define_standins(pin.kernels)  # noqa: F841
    xpu_kernels.stub_xpu_kernel_package()
    sys.path[:0] = [plugin, str(tree)]
    os.environ["VLLM_XPU_FAKES_ANY_PLATFORM"] = "1"
    result = {"order": order, "torch": torch.__version__}
    if order == "plugin":
        import vllm_xpu_fakes

        vllm_xpu_fakes.register()
        result["imported_by_the_plugin"] = "vllm._xpu_ops" in sys.modules
    elif order == "vllm-first":
        import vllm._xpu_ops  # noqa: F401
        import vllm_xpu_fakes

        vllm_xpu_fakes.register()
    else:
        from vllm_xpu_fakes import _xpu_gemm_fakes

        _xpu_gemm_fakes.register_xpu_gemm_fakes()
        try:
            import vllm._xpu_ops  # noqa: F401
        except Exception as e:  # noqa: BLE001 - the result
            result["vllm_import"] = f"{type(e).__name__}: {e}"
    result["owner"] = _owner()
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
