"""Stand-in kernels and the patched vLLM files, in a test process (the
tool's own loading code, keyed by vLLM release)."""

from pathlib import Path

from xpufakes import loading, pins

reference = loading.reference


def define_standins(version: str) -> list:
    """The stand-in ops of the kernel release vLLM `version` pins; keep the
    returned libraries referenced."""
    return loading.define_standins(pins.load().releases[version].kernels)


def import_vllm_module(root: Path, version: str):
    """Import the release's registering module (vllm/_xpu_ops.py or
    vllm/_ipex_ops.py) from the tree at root, the XPU kernel package (which
    cannot exist on a CPU) stubbed."""
    loading.stub_xpu_kernel_package()
    module = loading.import_registering_module(root)
    era = pins.load().releases[version].series.split("-")[0]
    expected = "vllm._ipex_ops" if era == "ipex" else "vllm._xpu_ops"
    assert module.__name__ == expected, module.__name__
    return module
