"""A stand-in of an image's ESIMD package (intel/llm-scaler's
`custom_esimd_kernels_vllm`, XPU-only) for CPU tests of the fix: its block
FP8 GEMM op with the real schema (data/esimd_schemas.toml, b18beee), which
hides that it writes and returns `output`; a CPU kernel that really writes
it (128x128-block dequantized GEMM); the fake the image's tree registers
(esimd_fake_ops.py: a new tensor); the package's Python wrapper, which
returns the op's result. Registers an op and a module: forked tests only."""

import sys
import types

import torch

from xpufakes.proof.static import schematruth

PACKAGE = schematruth.ESIMD_PACKAGE
BLOCK_GEMM = f"{PACKAGE}::esimd_gemm_fp8_blockscale"


def define(ran: list) -> torch.library.Library:
    """The op and the package (sys.modules); each kernel run is appended to
    `ran`. Returns the library to keep alive."""
    data = schematruth.load_data()["esimd"]["b18beee"]
    lib = torch.library.Library(PACKAGE, "DEF")
    lib.define(data["ops"][BLOCK_GEMM]["schema"])

    def kernel(input, weight, weight_scale, output, block_n, block_k):
        ran.append(BLOCK_GEMM)
        n, k = weight.shape
        scale = weight_scale.repeat_interleave(block_n, 0)[:n]
        scale = scale.repeat_interleave(block_k, 1)[:, :k]
        output.copy_((input.float() @ (weight.float() * scale).t()).to(output.dtype))
        return output

    lib.impl("esimd_gemm_fp8_blockscale", kernel, "CPU")
    torch.library.register_fake(
        BLOCK_GEMM,
        lambda input, weight, weight_scale, output, bn, bk: torch.empty_like(output),
        lib=lib,
    )
    package = types.ModuleType(PACKAGE)
    op = torch.ops.custom_esimd_kernels_vllm.esimd_gemm_fp8_blockscale

    def esimd_gemm_fp8_blockscale(input, weight, weight_scale, output, bn, bk):
        return op(input, weight, weight_scale, output, bn, bk)

    package.esimd_gemm_fp8_blockscale = esimd_gemm_fp8_blockscale
    package.esimd_rms_norm = None  # the other kernel the ESIMD-like tree keeps
    sys.modules[PACKAGE] = package
    return lib


def block_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A16, B, Bs) of a 2-token block-FP8 GEMM whose N (320) is not a
    multiple of the 128 block: the case the tree sends to the ESIMD GEMM at
    any token count."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(2, 256, generator=generator).to(torch.float16)
    b = torch.randn(320, 256, generator=generator).to(torch.float8_e4m3fn)
    return a, b, torch.rand(3, 2, generator=generator) + 0.5
