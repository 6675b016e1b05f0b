"""Stand-in kernels and the patched vLLM files, in a test process.

The stand-ins are the overlay's CPU reference kernels
(vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py), defined with
the exact schemas of the kernel release a vLLM release pins. vLLM's files are
imported for real from the release's tree; only the XPU kernel package, which
cannot exist on a CPU, is replaced by an empty stub.
"""

import importlib
import importlib.util
import sys
import types
from pathlib import Path

from xpufakes import paths, pins

REFERENCE = (
    paths.OVERLAY / "tests" / "kernels" / "quantization" / "xpu_gemm_reference.py"
)


def reference():
    """The reference-kernel module (loaded once per process)."""
    name = "xpu_gemm_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REFERENCE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def kernels_of(version: str) -> tuple[str, str]:
    """(package, release) of the XPU kernels a vLLM release pins."""
    package, release = pins.load().releases[version].kernels.split()
    return package, release


def define_standins(version: str) -> list:
    """Define the stand-in ops of the kernel release vLLM `version` pins.
    Returns the libraries; keep them referenced."""
    package, release = kernels_of(version)
    ref = reference()
    if package == "intel-extension-for-pytorch":
        return [ref.define_torch_ipex_kernels()]
    return [ref.define_xpu_c_kernels(release)]


def stub_xpu_kernel_package() -> None:
    """vllm_xpu_kernels needs an Intel GPU runtime; vLLM imports two of its
    functions at module level, which the GEMM fakes never call."""
    package = types.ModuleType("vllm_xpu_kernels")
    package.__path__ = []
    sys.modules["vllm_xpu_kernels"] = package
    for name, functions in {
        "flash_attn_interface": ["flash_attn_varlen_func"],
        "rotary": ["apply_rotary_emb"],
    }.items():
        module = types.ModuleType(f"vllm_xpu_kernels.{name}")
        for function in functions:
            setattr(module, function, _unavailable(function))
        sys.modules[module.__name__] = module
        setattr(package, name, module)


def _unavailable(name: str):
    def function(*args, **kwargs):
        raise RuntimeError(f"vllm_xpu_kernels.{name} is a stub in these tests")

    return function


def import_vllm_module(root: Path, version: str):
    """Import the vLLM file that registers the GEMM fakes, from the tree at
    root: vllm/_ipex_ops.py (IPEX era) or vllm/_xpu_ops.py."""
    assert "vllm" not in sys.modules, "vllm was imported before the tree was chosen"
    stub_xpu_kernel_package()
    sys.path.insert(0, str(root))
    era = pins.load().releases[version].series.split("-")[0]
    module = importlib.import_module(
        "vllm._ipex_ops" if era == "ipex" else "vllm._xpu_ops"
    )
    assert Path(module.__file__).is_relative_to(root), module.__file__
    return module
