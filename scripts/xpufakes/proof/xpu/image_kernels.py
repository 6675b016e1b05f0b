"""A downstream image's own build of vllm-xpu-kernels, stood in: the `_xpu_C`
ops whose schema the image's kernels patch changes, defined with the
image's schema (data/fakes.toml `also`, by `image`) and a CPU kernel
written from the image's C++, before the release's reference kernels define
the rest (reference.define_standins: "llm-scaler-kernels <commit>" first in
the stand-ins string). So the proof meets the image's schemas where the
image would: a fake of ours written for upstream's schema is not registered
there, and a call with the image's extra argument does not fit upstream's.

Needs torch."""

import torch

from xpufakes.changes import kernels
from xpufakes.common import ops
from xpufakes.proof.xpu import defining

PACKAGE = kernels.IMAGE_KERNELS


def _fp8_gemm_w8a16_grouped(A, B, B_scale, bias, group_size=0):
    """llm-scaler 25095b4 (image 0.21.0-b3.1), vllm_xpu_kernels.patch:
    csrc/xpu/onednn/onednn_matmul.cpp fp8_gemm_w8a16 allocates the output
    with check_and_create_output_tensor(A, B, A.scalar_type()) -- A's
    leading shape, N = B.size(-1), A's strides rescaled from K to N -- then
    checks group_size >= 0 and, where it is > 0, float16 A, a given
    2-D scale grid [K / g, N / g] (contiguous, f32 / bf16 / f16, B's
    device) and B's dimensions divisible by g; fp8_gemm_w8a16.h scales the
    weight per g x g block (oneDNN mask (1 << 0) | (1 << 1), groups
    {g, g}), else per tensor or per N column (m2_sc)."""
    if group_size < 0:
        raise RuntimeError("group_size must be non-negative")
    if B.dtype not in (torch.float8_e5m2, torch.float8_e4m3fn):
        raise RuntimeError("weight must be f8_e5m2 or f8_e4m3fn for fp8 matmul")
    k, n = B.shape[-2], B.shape[-1]
    weight = B.float()
    if group_size > 0:
        if A.dtype != torch.float16:
            raise RuntimeError(
                "grouped FP8 weight scales currently require float16 activations"
            )
        if B_scale is None:
            raise RuntimeError("grouped FP8 weight scales must be provided")
        if B.dim() != 2 or k % group_size or n % group_size:
            raise RuntimeError(
                "grouped FP8 weight dimensions must be divisible by group_size"
            )
        if tuple(B_scale.shape) != (k // group_size, n // group_size):
            raise RuntimeError(
                "grouped FP8 weight scales must have shape "
                "[K / group_size, N / group_size]"
            )
        if not B_scale.is_contiguous():
            raise RuntimeError(
                "grouped FP8 weight scales must be contiguous in "
                "[K / group_size, N / group_size] order"
            )
        grid = B_scale.float().repeat_interleave(group_size, 0)
        weight = weight * grid.repeat_interleave(group_size, 1)
    elif B_scale is not None:
        weight = weight * (
            B_scale.float().reshape(1, -1) if B_scale.numel() > 1 else B_scale.float()
        )
    with torch.no_grad():
        product = A.reshape(-1, k).float() @ weight
        if bias is not None and bias.numel():
            product = product + bias.float()
        out = torch.empty_strided(
            (*A.shape[:-1], n),
            (*(s // k * n for s in A.stride()[:-1]), A.stride(-1)),
            dtype=A.dtype,
        )
        out.copy_(product.reshape(*A.shape[:-1], n))
    return out


# (op, image commit) -> the image's kernel of it, written from its C++
KERNELS = {
    ("_xpu_C::fp8_gemm_w8a16", "25095b4"): _fp8_gemm_w8a16_grouped,
}


def schemas(commit: str) -> dict[str, str]:
    """op -> its schema in the image's build of the kernels (fakes.toml)."""
    return {
        entry["name"]: also["schema"]
        for entry in ops.FAKES
        for also in entry.get("also", ())
        if also.get("image") == commit
    }


def define_image_kernels(commit: str) -> dict:
    """Define the ops the image's kernels patch changes, with the image's
    schemas and kernels; {"library": ..., "libraries": ..., "ops": [...]}:
    keep the libraries referenced."""
    found = schemas(commit)
    if not found:  # (changes/kernels.py names no such image)
        raise ValueError(f"no kernel facts of the image {commit} (data/fakes.toml)")
    libraries: dict[str, torch.library.Library] = {}
    defined = []
    for op, schema in found.items():
        if defining.defined(op):
            continue
        defining.define(libraries, op, schema, KERNELS[op, commit])
        defined.append(op.partition("::")[2])
    library = libraries.get(ops.XPU_C) or torch.library.Library(ops.XPU_C, "FRAGMENT")
    return {"library": library, "libraries": libraries, "ops": defined}
