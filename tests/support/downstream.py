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
* ESIMD-like (intel/llm-scaler b18beee's shape, vLLM 0.21.0): calls of the
  image's ESIMD ops whose schemas hide their writes, through a re-export
  module, a kept callee and a dropped result (esimd_texts, esimd_like).

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


# The ESIMD-like tree (intel/llm-scaler b18beee's shape, vLLM 0.21.0): the
# image's `custom_esimd_kernels_vllm` ops, whose schemas hide what they
# write (`esimd_rms_norm(Tensor input, Tensor output, ...) -> Tensor` writes
# and returns `output`), called through a re-export module (esimd_utils's
# `f = _esimd.f`), a function's own import kept on `self` (`self._op = f`),
# and a call that drops the result and reads the buffer after. The schemas
# are data/esimd_schemas.toml's (b18beee, the newest: this tree's release
# is not an image's, which schema truth says as a warning).

ESIMD_BASE = "0.27.1"  # a kernels-era release in make test's set
ESIMD_UTILS = "vllm/model_executor/layers/esimd_utils.py"
ESIMD_BLOCK = f"{QUANTIZATION}/utils/xpu_block_esimd.py"
ESIMD_LAYERNORM = "vllm/model_executor/layers/layernorm.py"

ESIMD_UTILS_TEXT = '''\
"""A handle on the image's ESIMD kernel package (downstream-like)."""

import os

try:
    import custom_esimd_kernels_vllm as _esimd

    ESIMD_AVAILABLE = True
except ImportError:
    _esimd = None
    ESIMD_AVAILABLE = False

DISABLE_ESIMD_NORM = os.environ.get("DISABLE_ESIMD_NORM", "0") == "1"

if ESIMD_AVAILABLE:
    esimd_rms_norm = _esimd.esimd_rms_norm
    esimd_gemm_fp8_blockscale = _esimd.esimd_gemm_fp8_blockscale
else:
    esimd_rms_norm = None
    esimd_gemm_fp8_blockscale = None
'''

ESIMD_BLOCK_TEXT = '''\
"""Block-FP8 (128x128) linear through the ESIMD GEMM (downstream-like)."""

import torch

from vllm.model_executor.layers.esimd_utils import esimd_gemm_fp8_blockscale


def apply_block_scaled_mm(A16, B, Bs, block_n: int, block_k: int) -> torch.Tensor:
    M, N = A16.shape[0], B.shape[0]
    Bs32 = Bs.to(torch.float32).contiguous()
    out = torch.empty(M, N, dtype=torch.float16, device=A16.device)
    esimd_gemm_fp8_blockscale(A16, B, Bs32, out, block_n, block_k)
    return out
'''

ESIMD_NORM_XPU = """\
    def forward_xpu(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.forward_cuda(x, residual)
"""
ESIMD_NORM_XPU_DOWNSTREAM = """\
    def forward_xpu(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None and x.shape[0] == 1 and esimd_rms_norm is not None:
            out = torch.empty_like(x)
            esimd_rms_norm(x, out, self.weight.data, self.variance_epsilon)
            return out
        if residual is not None and x.shape[0] == 1 and self._add_norm is not None:
            self._add_norm(x, residual, self.weight.data, self.variance_epsilon)
            return x, residual
        return self.forward_cuda(x, residual)

    def _probe_esimd(self) -> None:
        try:
            from custom_esimd_kernels_vllm import esimd_fused_add_rms_norm

            self._add_norm = esimd_fused_add_rms_norm
        except ImportError:
            self._add_norm = None
"""
ESIMD_NORM_INIT = "        self.pass_weight_add = self.has_weight\n"
ESIMD_NORM_IMPORT = "from vllm.logger import init_logger\n"


def esimd_texts(texts: dict[str, str]) -> dict[str, str]:
    """A release's Python (path -> text) with the ESIMD-like edits."""
    edited = dict(texts)
    edited[ESIMD_UTILS] = ESIMD_UTILS_TEXT
    edited[ESIMD_BLOCK] = ESIMD_BLOCK_TEXT
    norm = edited[ESIMD_LAYERNORM]
    for old, new in (
        (ESIMD_NORM_XPU, ESIMD_NORM_XPU_DOWNSTREAM),
        (ESIMD_NORM_INIT, ESIMD_NORM_INIT + "        self._probe_esimd()\n"),
        (
            ESIMD_NORM_IMPORT,
            ESIMD_NORM_IMPORT
            + "from vllm.model_executor.layers.esimd_utils import esimd_rms_norm\n",
        ),
    ):
        assert old in norm, old
        norm = norm.replace(old, new, 1)
    edited[ESIMD_LAYERNORM] = norm
    return edited


def esimd_like(root: Path) -> Path:
    """ESIMD_BASE with the ESIMD-like edits, written to `root`."""
    releases.copy_of(ESIMD_BASE, root)
    paths = (ESIMD_UTILS, ESIMD_BLOCK, ESIMD_LAYERNORM)
    texts = {p: (root / p).read_text() for p in paths if (root / p).is_file()}
    for path, text in esimd_texts(texts).items():
        (root / path).write_text(text)
    return root


# The ESIMD-GEMV-like tree: the shape of intel/llm-scaler b18beee's decode GEMV
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


def esimd_gemv_like(version: str, root: Path) -> Path:
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
