"""Stand-in kernels and the patched vLLM files, in a test process (the
tool's own loading code, keyed by vLLM release)."""

import sys
from pathlib import Path

from xpufakes.proof.xpu import reference as reference_kernels
from xpufakes.proof.xpu import registering, xpu_kernels
from xpufakes.trees import pins

reference = reference_kernels.reference


def define_standins(version: str) -> list:
    """The stand-in ops of the kernel release vLLM `version` pins; keep the
    returned libraries referenced."""
    return reference_kernels.define_standins(pins.load().releases[version].kernels)


def import_vllm_module(root: Path, version: str):
    """Import the release's registering module (vllm/_xpu_ops.py or
    vllm/_ipex_ops.py) from the tree at root, the XPU kernel package (which
    cannot exist on a CPU) stubbed."""
    xpu_kernels.stub_xpu_kernel_package()
    module = registering.import_registering_module(root)
    era = pins.load().releases[version].series.split("-")[0]
    expected = "vllm._ipex_ops" if era == "ipex" else "vllm._xpu_ops"
    assert module.__name__ == expected, module.__name__
    return module


def import_ipex_woq_linear(tree: Path, version: str):
    """The stand-ins (IPEX's WOQ ops and GEMMs), then the IPEX-era tree's
    vllm/_ipex_woq_linear.py; returns (libraries to keep referenced, the
    module)."""
    sys.dont_write_bytecode = True
    libraries = [reference().define_torch_ipex_woq_kernels()]
    libraries += define_standins(version)
    import_vllm_module(tree, version)
    sys.path.insert(0, str(tree))
    import vllm._ipex_woq_linear as woq

    assert Path(woq.__file__).is_relative_to(tree)
    return libraries, woq
