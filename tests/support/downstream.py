"""Downstream trees as intel/llm-scaler builds them, made here from a pinned
sdist plus our own edits that make the same kinds of calls (CI has no copy
of llm-scaler's patch; tests/test_llm_scaler_trees.py rebuilds the real
ones where it is given).

* b6-like (intel/llm-scaler b5571c3, the bug report's image): the
  release's vllm/_ipex_ops.py calls a pybind11 build extension,
  `vllm._C.ops.rotary_embedding` / `rms_norm` / `fused_add_rms_norm`
  (imported at module level and inside the function, as b5571c3 does), and
  MRotaryEmbedding.forward_native begins with
  `return self.forward_xpu(positions, query, key)`, which sends every
  Qwen3-VL-MoE attention (custom op off, vLLM's default) into that call.
  (In 0.10.2 MRotaryEmbedding derives from RotaryEmbedding, whose
  forward_xpu calls ipex_ops.rotary_embedding; in 0.14.1 it derives from
  RotaryEmbeddingBase, so the edit gives it that forward_xpu.)
* 0.14.0-like (intel/llm-scaler 0a85564's shape): a new quantization
  module that makes its own IPEX WOQ linear module
  (vllm/.../quantization/sym_int4.py) and lines changed next to the WOQ
  anchors of ipex_quant.py, so that the pinned series does not apply with
  zero fuzz and the recipe path changes a file the series does not name
  (add_woq_module, change_next_to_the_woq_anchor).

Synthetic: no line of llm-scaler's patch is used.
"""

from pathlib import Path

from . import releases

# An IPEX-era release with Qwen3-VL-MoE upstream, in make test's set.
B6_BASE = "0.14.1"


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


B6_ROPE = """\
        rot_dim = cos_sin_cache.size(1)
        ipex.llm.functional.rotary_embedding_batched(
            positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim
        )
"""
B6_ROPE_NATIVE = """\
        import vllm._C.ops

        vllm._C.ops.rotary_embedding(
            positions, query, key, head_size, cos_sin_cache, is_neox
        )
"""
B6_NORM = """\
        out = torch.empty_like(input)
        torch.ops.torch_ipex.rms_norm_vllm(out, input.contiguous(), weight, epsilon)
        return out
"""
B6_NORM_NATIVE = """\
        tmp = torch.empty_like(input)
        vllm._C.ops.rms_norm(tmp, input, weight, epsilon)
        return tmp
"""
B6_ADD_NORM = """\
        torch.ops.torch_ipex.fused_add_rms_norm_vllm(input, residual, weight, epsilon)
"""
B6_ADD_NORM_NATIVE = """\
        vllm._C.ops.fused_add_rms_norm(input, residual, weight, epsilon)
"""
B6_MROPE_XPU = """\
    def forward_xpu(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        from vllm._ipex_ops import ipex_ops as ops

        self._match_cos_sin_cache_dtype(query)
        ops.rotary_embedding(
            positions,
            query,
            key,
            self.head_size,
            self.cos_sin_cache,
            self.is_neox_style,
        )
        return query, key

    def forward_cuda(
"""
B6_REROUTE = """\
        assert positions.ndim == 1 or positions.ndim == 2
        assert key is not None

        self._match_cos_sin_cache_dtype(query)
        num_tokens = positions.shape[-1]
"""


def b6_like(root: Path, reroute: bool = True) -> Path:
    """0.14.1 edited as intel/llm-scaler's b6 patch edits 0.10.2 (see the
    module's docstring). `reroute=False`: the pybind11 calls without the
    forward_native -> forward_xpu reroute (the b5 image's MRoPE, plain torch)."""
    releases.copy_of(B6_BASE, root)
    ops = root / "vllm" / "_ipex_ops.py"
    _replace(
        ops,
        '    logger.debug("Import error msg: %s", e.msg)\n',
        '    logger.debug("Import error msg: %s", e.msg)\n\nimport vllm._C.ops\n',
    )
    _replace(ops, B6_ROPE, B6_ROPE_NATIVE)
    _replace(ops, B6_NORM, B6_NORM_NATIVE)
    _replace(ops, B6_ADD_NORM, B6_ADD_NORM_NATIVE)
    mrope = root / "vllm/model_executor/layers/rotary_embedding/mrope.py"
    _replace(mrope, "    def forward_cuda(\n", B6_MROPE_XPU)
    if reroute:
        _replace(
            mrope,
            B6_REROUTE,
            "        assert positions.ndim == 1 or positions.ndim == 2\n"
            "        assert key is not None\n\n"
            "        return self.forward_xpu(positions, query, key)\n\n"
            + B6_REROUTE.split("\n\n", 1)[1],
        )
    return root


# The 0.14.0-like tree

QUANTIZATION = "vllm/model_executor/layers/quantization"
SYM_INT4 = f"{QUANTIZATION}/sym_int4.py"

WOQ_MODULE = '''\
"""A downstream int4 method that makes its own IPEX WOQ module."""

from vllm.model_executor.layers.linear import LinearMethodBase


class DownstreamInt4Method(LinearMethodBase):
    def process_weights_after_loading(self, layer) -> None:
        import intel_extension_for_pytorch as ipex

        woq = ipex.llm.quantization.woq_linear
        layer.ipex_qlinear = woq.IPEXWeightOnlyQuantizedLinear.from_weight(
            layer.qweight,
            layer.scales,
            layer.qzeros,
            in_features=layer.input_size_per_partition,
            out_features=layer.output_size_per_partition,
            group_size=128,
        )
'''


def add_woq_module(root: Path) -> Path:
    path = root / SYM_INT4
    path.write_text(WOQ_MODULE)
    return path


def change_next_to_the_woq_anchor(root: Path) -> None:
    """A line added right after the first WOQ module is made (inside the
    0002 hunk's context)."""
    quant = root / QUANTIZATION / "ipex_quant.py"
    text = quant.read_text()
    anchor = "            )\n        )\n\n    def apply("
    assert anchor in text
    quant.write_text(
        text.replace(
            anchor,
            '            )\n        )\n        layer.downstream_kind = "gptq"\n\n'
            "    def apply(",
            1,
        )
    )


# The ESIMD-like tree: the shape of intel/llm-scaler b18beee's decode GEMV
# (vllm/model_executor/kernels/linear/scaled_mm/xpu.py: at one token, the
# per-tensor fp8 linear calls custom_esimd_kernels_vllm.esimd_gemv_fp8_pert
# into a buffer it made, drops the op's result and returns the buffer; the
# tree registers a fake that returns a new tensor, as its esimd_fake_ops.py
# does), on a release of make test's set. The op's schema is the image's
# (data/esimd_schemas.toml): it returns `output` and marks nothing.
SCALED_MM_XPU = "vllm/model_executor/kernels/linear/scaled_mm/xpu.py"
ESIMD_GEMV_CALL = """\
        weight = layer.weight
        weight_scale = layer.weight_scale
        if x.shape[0] == 1 and bias is None and weight_scale.numel() == 1:
            from custom_esimd_kernels_vllm import esimd_gemv_fp8_pert

            out = torch.empty(1, weight.shape[1], dtype=x.dtype, device=x.device)
            esimd_gemv_fp8_pert(x, weight.t(), weight_scale, out)
            return out
        return torch.ops._xpu_C.fp8_gemm_w8a16(x, weight, weight_scale, bias)
"""
ESIMD_FAKE = """

try:
    import custom_esimd_kernels_vllm  # noqa: F401

    torch.library.register_fake(
        "custom_esimd_kernels_vllm::esimd_gemv_fp8_pert",
        lambda input, weight, weight_scale, output: torch.empty_like(output),
    )
except ImportError:
    pass
"""


def esimd_like(version: str, root: Path) -> Path:
    """A release of make test's set (0.33.0+: scaled_mm/xpu.py) with the
    decode GEMV of llm-scaler b18beee's shape (ESIMD_GEMV_CALL)."""
    releases.copy_of(version, root)
    path = root / SCALED_MM_XPU
    gemm = "torch.ops._xpu_C.fp8_gemm_w8a16(x, weight, weight_scale, bias)"
    _replace(
        path,
        "        weight = layer.weight\n"
        "        weight_scale = layer.weight_scale\n"
        f"        return {gemm}\n",
        ESIMD_GEMV_CALL,
    )
    text = path.read_text()
    path.write_text(text + ESIMD_FAKE)
    return root
