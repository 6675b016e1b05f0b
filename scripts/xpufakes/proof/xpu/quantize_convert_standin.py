"""A CPU stand-in for vllm_xpu_kernels.quantization._quantize_convert, the
Python half of vllm-xpu-kernels that lays int4 checkpoints out for its
oneDNN int4 GEMM (`_xpu_C::int4_gemm_w4a16`). intel/llm-scaler's 0.21.0
tree (b18beee) calls it from AWQ's, GPTQ's and its own sym_int4's
process_weights_after_loading; vllm_xpu_kernels itself cannot be imported
without an Intel GPU runtime.

Written from the layouts, not copied: the packages's file is plain torch
that ends by moving a symmetric zero point to "xpu", which does not exist
here. What the GEMM reads (docs/kernel-contracts.md 5.6): B int32 logical
[K/8, N], eight 4-bit values per element, the lowest nibble first, packed
along K and stored NT (stride(-2) == 1); B_scale [K/group, N] contiguous;
B_zp int32 [K/group, N/8] packed along N (asymmetric) or the scalar 8 as
int8 (symmetric GPTQ). An AWQ checkpoint packs along N, with its nibbles in
the order 0, 2, 4, 6, 1, 3, 5, 7. The weights stay on the device they are
on (the CPU here)."""

import torch

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)
# AWQ's nibble i holds column AWQ_ORDER[i] of its eight
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _unpack(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """The 4-bit values of int32 data, unpacked along `dim` (0 or 1), the
    lowest nibble first."""
    shifts = _SHIFTS.to(packed.device)
    if dim == 1:
        values = packed.unsqueeze(2) >> shifts.view(1, 1, 8)
        return (values & 0xF).reshape(packed.shape[0], -1)
    values = packed.unsqueeze(1) >> shifts.view(1, 8, 1)
    return (values & 0xF).reshape(-1, packed.shape[1])


def _pack(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Eight 4-bit values per int32 along `dim` (0 or 1), the lowest nibble
    first: the inverse of _unpack."""
    shifts = _SHIFTS.to(values.device)
    codes = values.to(torch.int32) & 0xF
    if dim == 1:
        grouped = codes.reshape(codes.shape[0], -1, 8) << shifts.view(1, 1, 8)
        return grouped.sum(dim=2, dtype=torch.int32)
    grouped = codes.reshape(-1, 8, codes.shape[1]) << shifts.view(1, 8, 1)
    return grouped.sum(dim=1, dtype=torch.int32)


def _awq_columns(packed: torch.Tensor) -> torch.Tensor:
    """The values of AWQ data packed along N, columns in their real order."""
    values = _unpack(packed, dim=1)
    rows, columns = values.shape
    inverse = [AWQ_ORDER.index(i) for i in range(8)]
    return values.reshape(rows, columns // 8, 8)[:, :, inverse].reshape(rows, columns)


class AWQUtils:
    AWQ_PACK_ORDER = list(AWQ_ORDER)

    @classmethod
    def repack(cls, qweight: torch.Tensor, qzeros: torch.Tensor):
        """AWQ's qweight [K, N/8] and qzeros [K/group, N/8] (packed along N,
        AWQ's nibble order) as the GEMM takes them: qweight [K/8, N] packed
        along K, qzeros [K/group, N/8] along N, both in natural order."""
        weight = _pack(_awq_columns(qweight), dim=0)
        zeros = _pack(_awq_columns(qzeros), dim=1)
        return weight, zeros


class GPTQUtils:
    def __init__(self, bits: int = 4, blocksize: int = 128):
        if bits != 4:
            raise NotImplementedError("the stand-in packs 4-bit values only")
        self.bits = bits
        self.blocksize = blocksize

    def shuffle(self, qweight: torch.Tensor, g_idx: torch.Tensor):
        """An act-order GPTQ weight [K/8, N] with its rows sorted by group
        (stably), and the int32 row order the GEMM then reads A in."""
        order = torch.sort(g_idx.long(), stable=True).indices
        values = _unpack(qweight, dim=0)[order]
        return _pack(values, dim=0), order.to(torch.int32)


def transpose_onednn_woq_format(layer: torch.nn.Module, method: str, is_sym=True):
    """In place: qweight keeps its shape [K/8, N] but is stored NT; scales
    contiguous; GPTQ's zero points the scalar 8 (symmetric) or each nibble
    plus one (GPTQ checkpoints store zero point - 1)."""
    weight = layer.qweight
    nt = weight.data.t().contiguous().t()
    weight.data = nt
    layer.scales.data = layer.scales.data.contiguous()
    if method == "gptq":
        if is_sym:
            zeros = torch.tensor([8], dtype=torch.int8, device=weight.device)
        else:
            zeros = layer.qzeros.data + 0x11111111
        layer.qzeros.data = zeros
