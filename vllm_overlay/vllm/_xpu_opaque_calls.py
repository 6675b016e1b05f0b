# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Run each XPU kernel call that torch.compile cannot trace as one custom op.

vLLM's XPU paths call some kernels in ways Dynamo cannot trace at all:

* IPEX's Python APIs (``ipex.llm.functional.silu_and_mul``,
  ``rotary_embedding_batched``, ``rms_norm``, ``add_rms_norm``, the LoRA
  ``bgmv_*``), which call ``torch_ipex`` ops that IPEX registers for the XPU
  key only, with no fake: "Operator does not support running with fake
  tensors";
* ``torch_ipex::rms_norm_vllm`` / ``fused_add_rms_norm_vllm``, registered
  without a dispatch key (CompositeImplicitAutograd), so no fake can be
  registered and a trace runs their C++ on fake tensors;
* a build's own pybind11 extension (an image's ``vllm._C.ops.rms_norm`` /
  ``rotary_embedding``): Dynamo does not trace into a C function at all.

vLLM compiles with ``fullgraph=True``, so each of them stops the engine at
start-up when the traced path reaches it: with the custom op on (sequence
parallelism turns ``+rms_norm`` on by itself; a user's ``custom_ops``), or
always, where a tree's ``forward_native`` calls its ``forward_xpu``.

And a kernel package's ops whose schemas hide what they write (an image's
``custom_esimd_kernels_vllm``: ``esimd_gemm_fp8_blockscale(..., Tensor
output, ...) -> Tensor`` writes ``output`` and returns it, unmarked). A call
that drops the result and reads ``output`` after is dead code to
functionalization: compiled, the caller reads the empty buffer. Each runs
here as a vLLM op that marks what the kernel writes and returns nothing; its
caller gets the argument the kernel returns, as it is (``CALLEE_RETURNS``).
Where a tree keeps such a callee to call later (``f = _esimd.f``,
``self._op = f``), ``as_custom_op`` gives the function to keep.

Each such call becomes a call of one custom op here (``torch.ops.vllm.<op>``,
registered with ``direct_register_custom_op``). Its implementation calls the
same callee, looked up when it runs, so the kernel the image ships is the one
that runs; its fake is exact: a kernel that writes its outputs into arguments
declares them mutated in the schema and returns nothing (functionalization
carries the writes), and one that returns a new tensor returns what its C++
allocates (``at::empty(x.sizes(), x.options())``: contiguous, x's shape,
dtype and device). The contracts, with their sources, are ``CONTRACTS``.

And a kernel package's ops that have no fake at all while their schemas
are true (an image's fused MoE kernels, ``moe_ops::moe_forward_full``):
a trace stops at them ("Operator does not support running with fake
tensors"). Each gets an exact fake on the op itself (``KERNEL_FAKES``), not
a vLLM op around it: the image splits its compiled graph at these ops by
name (its ``vllm/platforms/xpu.py`` splitting_ops), so the graph must keep
them. A fake is registered only where the op has none and its live schema
is the one the fake was written for; otherwise the op is left as it is,
and a warning says so.

Nothing here imports IPEX or a native extension when it is imported.
"""

import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from vllm.logger import init_logger
from vllm.platforms import current_platform

try:
    from vllm.utils.torch_utils import direct_register_custom_op
except ImportError:  # vLLM < 0.11.1
    from vllm.utils import direct_register_custom_op  # type: ignore

logger = init_logger(__name__)

# callee -> (op name, parameters, mutated parameters, returns): returns is ""
# (nothing) or "new_like <param>" (a new contiguous tensor like that param).
# Sources: intel/llm-scaler vllm_for_multi_arc.patch@b5571c3 csrc/xpu/
# xpu_ops.h; intel/intel-extension-for-pytorch@v2.8.10+xpu
# transformers/models/xpu/fusions/activation_fusion.py, mha_fusion.py,
# csrc/gpu/aten/operators/{Rope,RMSNorm,AddNormFusion,TripleOps}.cpp, and
# RMSNormVllm.cpp@v2.10.10+xpu; intel/llm-scaler@b18beee
# vllm/custom-esimd-kernels-vllm/csrc/xpu/ (the ESIMD ops).
CONTRACTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], str]] = {
    "vllm._C.ops.rotary_embedding": (
        "xpu_c_rotary_embedding",
        (
            "Tensor positions",
            "Tensor query",
            "Tensor key",
            "int head_size",
            "Tensor cos_sin_cache",
            "bool is_neox",
        ),
        ("query", "key"),
        "",
    ),
    "vllm._C.ops.rms_norm": (
        "xpu_c_rms_norm",
        ("Tensor out", "Tensor input", "Tensor weight", "float epsilon"),
        ("out",),
        "",
    ),
    "vllm._C.ops.fused_add_rms_norm": (
        "xpu_c_fused_add_rms_norm",
        ("Tensor input", "Tensor residual", "Tensor weight", "float epsilon"),
        ("input", "residual"),
        "",
    ),
    "intel_extension_for_pytorch.llm.functional.silu_and_mul": (
        "ipex_silu_and_mul",
        ("Tensor x", "Tensor out"),
        ("out",),
        "",
    ),
    "intel_extension_for_pytorch.llm.functional.gelu_and_mul": (
        "ipex_gelu_and_mul",
        ("Tensor x", "Tensor out"),
        ("out",),
        "",
    ),
    "intel_extension_for_pytorch.llm.functional.gelu_quick": (
        "ipex_gelu_quick",
        ("Tensor x", "Tensor out"),
        ("out",),
        "",
    ),
    "intel_extension_for_pytorch.llm.functional.rotary_embedding_batched": (
        "ipex_rotary_embedding_batched",
        (
            "Tensor positions",
            "Tensor query",
            "Tensor key",
            "int head_size",
            "Tensor cos_sin_cache",
            "bool is_neox",
            "int rot_dim",
            "Tensor? offsets=None",
        ),
        ("query", "key"),
        "",
    ),
    "intel_extension_for_pytorch.llm.functional.rms_norm": (
        "ipex_rms_norm",
        ("Tensor input", "Tensor weight", "float epsilon"),
        (),
        "new_like input",
    ),
    "intel_extension_for_pytorch.llm.functional.add_rms_norm": (
        "ipex_add_rms_norm",
        (
            "Tensor residual",
            "Tensor x",
            "Tensor weight",
            "Tensor? bias",
            "float eps",
            "bool add_back",
        ),
        ("residual",),
        "new_like x",
    ),
    "intel_extension_for_pytorch.llm.functional.bgmv_shrink": (
        "ipex_bgmv_shrink",
        (
            "Tensor inputs",
            "Tensor lora_a_weights",
            "Tensor output_tensor",
            "Tensor lora_indices_tensor",
            "float scaling",
        ),
        ("output_tensor",),
        "",
    ),
    "intel_extension_for_pytorch.llm.functional.bgmv_expand": (
        "ipex_bgmv_expand",
        (
            "Tensor inputs",
            "Tensor lora_b_weights",
            "Tensor output_tensor",
            "Tensor lora_indices_tensor",
            "bool add_inputs",
        ),
        ("output_tensor",),
        "",
    ),
    "intel_extension_for_pytorch.llm.functional.bgmv_expand_slice": (
        "ipex_bgmv_expand_slice",
        (
            "Tensor inputs",
            "Tensor lora_b_weights",
            "Tensor output_tensor",
            "Tensor lora_indices_tensor",
            "int slice_offset",
            "int slice_size",
            "bool add_inputs",
        ),
        ("output_tensor",),
        "",
    ),
    "torch.ops.torch_ipex.rms_norm_vllm": (
        "ipex_rms_norm_vllm",
        ("Tensor out", "Tensor input", "Tensor weight", "float epsilon"),
        ("out",),
        "",
    ),
    "torch.ops.torch_ipex.fused_add_rms_norm_vllm": (
        "ipex_fused_add_rms_norm_vllm",
        ("Tensor input", "Tensor residual", "Tensor weight", "float epsilon"),
        ("input", "residual"),
        "",
    ),
    "torch.ops.torch_ipex.rotary_embedding": (
        "ipex_rotary_embedding",
        (
            "Tensor positions",
            "Tensor query",
            "Tensor key",
            "int head_size",
            "Tensor cos_sin_cache",
            "bool is_neox",
            "int? rot_dim=None",
        ),
        ("query", "key"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_fused_add_rms_norm": (
        "esimd_fused_add_rms_norm",
        ("Tensor hidden_states", "Tensor residual", "Tensor weight", "float eps"),
        ("hidden_states", "residual"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_fused_add_rms_norm_batched": (
        "esimd_fused_add_rms_norm_batched",
        ("Tensor hidden_states", "Tensor residual", "Tensor weight", "float eps"),
        ("hidden_states", "residual"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_fused_scaled_add_rms_norm": (
        "esimd_fused_scaled_add_rms_norm",
        (
            "Tensor hidden_states",
            "Tensor residual",
            "Tensor weight",
            "float eps",
            "float scalar",
        ),
        ("hidden_states", "residual"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemm_fp8_blockscale": (
        "esimd_gemm_fp8_blockscale",
        (
            "Tensor input",
            "Tensor weight",
            "Tensor weight_scale",
            "Tensor output",
            "int block_n",
            "int block_k",
        ),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemm_fp8_pert": (
        "esimd_gemm_fp8_pert",
        ("Tensor input", "Tensor weight", "Tensor weight_scale", "Tensor output"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemm_int4_pgrp": (
        "esimd_gemm_int4_pgrp",
        ("Tensor input", "Tensor weight", "Tensor weight_scale", "Tensor output"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemv_fp16": (
        "esimd_gemv_fp16",
        ("Tensor input", "Tensor weight", "Tensor output"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_pert": (
        "esimd_gemv_fp8_pert",
        ("Tensor input", "Tensor weight", "Tensor weight_scale", "Tensor output"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_pert_fused2": (
        "esimd_gemv_fp8_pert_fused2",
        (
            "Tensor input",
            "Tensor w0",
            "Tensor s0",
            "Tensor o0",
            "Tensor w1",
            "Tensor s1",
            "Tensor o1",
        ),
        ("o0", "o1"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemv_int4": (
        "esimd_gemv_int4",
        ("Tensor input", "Tensor weight", "Tensor weight_scale", "Tensor output"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemv_int4_fused2": (
        "esimd_gemv_int4_fused2",
        (
            "Tensor input",
            "Tensor w0",
            "Tensor s0",
            "Tensor o0",
            "Tensor w1",
            "Tensor s1",
            "Tensor o1",
        ),
        ("o0", "o1"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_moe_gelu_tanh_mul": (
        "esimd_moe_gelu_tanh_mul",
        (
            "Tensor input",
            "Tensor output",
            "int N_gate_up",
            "int N_half",
            "int total_rows",
        ),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_moe_topk": (
        "esimd_moe_topk",
        ("Tensor router_logits", "Tensor top_values", "Tensor top_indices", "int T"),
        ("top_values", "top_indices"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_norm_add_norm": (
        "esimd_norm_add_norm",
        (
            "Tensor h2_raw",
            "Tensor h1",
            "Tensor w1",
            "Tensor w2",
            "Tensor out",
            "float eps1",
            "float eps2",
        ),
        ("h1", "out"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_norm_gemv_fp8_pert": (
        "esimd_norm_gemv_fp8_pert",
        (
            "Tensor x",
            "Tensor z",
            "Tensor norm_weight",
            "Tensor gemv_weight",
            "Tensor gemv_scale",
            "Tensor output",
            "int HV",
            "int V",
            "float eps",
        ),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_norm_gemv_int4_pert": (
        "esimd_norm_gemv_int4_pert",
        (
            "Tensor x",
            "Tensor z",
            "Tensor norm_weight",
            "Tensor gemv_weight",
            "Tensor gemv_scale",
            "Tensor output",
            "int HV",
            "int V",
            "float eps",
        ),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_norm_gemv_norm_fp16": (
        "esimd_norm_gemv_norm_fp16",
        (
            "Tensor residual",
            "Tensor scale_with_root",
            "Tensor proj_w",
            "Tensor pre_ff_w",
            "Tensor router_logits",
            "Tensor moe_input",
            "float eps",
        ),
        ("router_logits", "moe_input"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_resadd_norm_gemv_fp8_pert": (
        "esimd_resadd_norm_gemv_fp8_pert",
        (
            "Tensor hidden_states",
            "Tensor residual",
            "Tensor norm_weight",
            "Tensor gemv_weight",
            "Tensor gemv_scale",
            "Tensor output",
            "Tensor normed_out",
            "float eps",
        ),
        ("residual", "output", "normed_out"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_resadd_norm_gemv_int4_pert": (
        "esimd_resadd_norm_gemv_int4_pert",
        (
            "Tensor hidden_states",
            "Tensor residual",
            "Tensor norm_weight",
            "Tensor gemv_weight",
            "Tensor gemv_scale",
            "Tensor output",
            "Tensor normed_out",
            "float eps",
        ),
        ("residual", "output", "normed_out"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_rms_norm": (
        "esimd_rms_norm",
        ("Tensor input", "Tensor output", "Tensor weight", "float eps"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_rms_norm_gated": (
        "esimd_rms_norm_gated",
        ("Tensor x", "Tensor z", "Tensor weight", "Tensor output", "float eps"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused": (
        "esimd_gdn_conv_fused",
        (
            "Tensor qkvz",
            "Tensor conv_state",
            "Tensor conv_weight",
            "Tensor conv_bias",
            "Tensor conv_state_indices",
            "Tensor A_log",
            "Tensor dt_bias",
            "Tensor ba",
            "Tensor ssm_state",
            "Tensor ssm_state_indices",
            "Tensor output",
            "Tensor z_out",
            "int N",
            "int H",
            "int HV",
            "int K",
            "int V",
            "float scale",
        ),
        ("conv_state", "ssm_state", "output", "z_out"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused_seq": (
        "esimd_gdn_conv_fused_seq",
        (
            "Tensor qkvz",
            "Tensor conv_state",
            "Tensor conv_weight",
            "Tensor conv_bias",
            "Tensor conv_state_indices",
            "Tensor A_log",
            "Tensor dt_bias",
            "Tensor ba",
            "Tensor ssm_state",
            "Tensor ssm_state_indices",
            "Tensor output",
            "Tensor z_out",
            "int N",
            "int H",
            "int HV",
            "int K",
            "int V",
            "float scale",
        ),
        ("conv_state", "ssm_state", "output", "z_out"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_blockscale_fp16_fused2": (
        "esimd_gemv_fp8_blockscale_fp16_fused2",
        (
            "Tensor input",
            "Tensor w0",
            "Tensor s0",
            "Tensor o0",
            "Tensor w1",
            "Tensor o1",
            "int block_n",
            "int block_k",
        ),
        ("o0", "o1"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_norm_gemv_fp8_blockscale": (
        "esimd_norm_gemv_fp8_blockscale",
        (
            "Tensor x",
            "Tensor z",
            "Tensor norm_weight",
            "Tensor gemv_weight",
            "Tensor gemv_scale",
            "Tensor output",
            "int HV",
            "int V",
            "float eps",
        ),
        ("output",),
        "",
    ),
    "torch.ops.moe_ops.moe_forward_full_fp8_block": (
        "moe_ops_moe_forward_full_fp8_block",
        (
            "Tensor x",
            "Tensor logits",
            "Tensor output",
            "Tensor gate_up_weight",
            "Tensor gate_up_scale",
            "Tensor shared_gate_up_weight",
            "Tensor shared_gate_up_scale",
            "Tensor down_weight",
            "Tensor down_scale",
            "Tensor shared_down_weight",
            "Tensor shared_down_scale",
            "Tensor shared_expert_gate_weight",
            "int top_k",
            "int num_shared_experts",
            "int n_routed_experts",
        ),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_qkv_split_norm_rope": (
        "esimd_qkv_split_norm_rope",
        (
            "Tensor qkv_state",
            "Tensor q_out",
            "Tensor gate_out",
            "Tensor k_out",
            "Tensor v_out",
            "Tensor norm_wq",
            "Tensor norm_wk",
            "Tensor positions",
            "int q_heads",
            "int kv_heads",
            "bool attn_output_gate",
            "int rotary_dim",
            "Tensor cos_sin_cache",
        ),
        ("q_out", "gate_out", "k_out", "v_out"),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gemv_fp16_gelu_mul": (
        "esimd_gemv_fp16_gelu_mul",
        ("Tensor input", "Tensor weight", "Tensor output"),
        ("output",),
        "",
    ),
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused_seq_spec": (
        "esimd_gdn_conv_fused_seq_spec",
        (
            "Tensor qkvz",
            "Tensor conv_state",
            "Tensor conv_weight",
            "Tensor conv_bias",
            "Tensor spec_state_indices",
            "Tensor A_log",
            "Tensor dt_bias",
            "Tensor ba",
            "Tensor ssm_state",
            "Tensor output",
            "Tensor z_out",
            "Tensor token_indx",
            "Tensor num_accepted_tokens",
            "int num_spec_decodes",
            "int num_spec_tokens",
            "int H",
            "int HV",
            "int K",
            "int V",
            "float scale",
        ),
        ("conv_state", "ssm_state", "output", "z_out"),
        "",
    ),
}

# callee -> what it gives its caller: "" nothing, a parameter's name (that
# argument, as given), "query, key" (a tuple of them), "result" (its result).
CALLEE_RETURNS: dict[str, str] = {
    "vllm._C.ops.rotary_embedding": "",
    "vllm._C.ops.rms_norm": "",
    "vllm._C.ops.fused_add_rms_norm": "",
    "intel_extension_for_pytorch.llm.functional.silu_and_mul": "out",
    "intel_extension_for_pytorch.llm.functional.gelu_and_mul": "out",
    "intel_extension_for_pytorch.llm.functional.gelu_quick": "out",
    "intel_extension_for_pytorch.llm.functional.rotary_embedding_batched": "query, key",
    "intel_extension_for_pytorch.llm.functional.rms_norm": "result",
    "intel_extension_for_pytorch.llm.functional.add_rms_norm": "result",
    "intel_extension_for_pytorch.llm.functional.bgmv_shrink": "",
    "intel_extension_for_pytorch.llm.functional.bgmv_expand": "",
    "intel_extension_for_pytorch.llm.functional.bgmv_expand_slice": "",
    "torch.ops.torch_ipex.rms_norm_vllm": "",
    "torch.ops.torch_ipex.fused_add_rms_norm_vllm": "",
    "torch.ops.torch_ipex.rotary_embedding": "",
    "custom_esimd_kernels_vllm.esimd_fused_add_rms_norm": "hidden_states",
    "custom_esimd_kernels_vllm.esimd_fused_add_rms_norm_batched": "hidden_states",
    "custom_esimd_kernels_vllm.esimd_fused_scaled_add_rms_norm": "hidden_states",
    "custom_esimd_kernels_vllm.esimd_gemm_fp8_blockscale": "output",
    "custom_esimd_kernels_vllm.esimd_gemm_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_gemm_int4_pgrp": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp16": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_pert_fused2": "o0",
    "custom_esimd_kernels_vllm.esimd_gemv_int4": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_int4_fused2": "o0",
    "custom_esimd_kernels_vllm.esimd_moe_gelu_tanh_mul": "output",
    "custom_esimd_kernels_vllm.esimd_moe_topk": "top_values",
    "custom_esimd_kernels_vllm.esimd_norm_add_norm": "",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_int4_pert": "output",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_norm_fp16": "",
    "custom_esimd_kernels_vllm.esimd_resadd_norm_gemv_fp8_pert": "output",
    "custom_esimd_kernels_vllm.esimd_resadd_norm_gemv_int4_pert": "output",
    "custom_esimd_kernels_vllm.esimd_rms_norm": "output",
    "custom_esimd_kernels_vllm.esimd_rms_norm_gated": "output",
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused": "output",
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused_seq": "output",
    "custom_esimd_kernels_vllm.esimd_gemv_fp8_blockscale_fp16_fused2": "o0",
    "custom_esimd_kernels_vllm.esimd_norm_gemv_fp8_blockscale": "output",
    "torch.ops.moe_ops.moe_forward_full_fp8_block": "output",
    "custom_esimd_kernels_vllm.esimd_qkv_split_norm_rope": "q_out",
    "custom_esimd_kernels_vllm.esimd_gemv_fp16_gelu_mul": "output",
    "custom_esimd_kernels_vllm.esimd_gdn_conv_fused_seq_spec": "output",
}

_TYPES = {
    "Tensor": torch.Tensor,
    "Tensor?": torch.Tensor | None,
    "int": int,
    "int?": int | None,
    "float": float,
    "bool": bool,
}
_DEFAULTS = {"None": None}
_callees: dict[str, Callable] = {}


def callee(name: str) -> Callable:
    """The function a dotted name names, looked up when first called (IPEX
    and a build's extensions exist only on the XPU host)."""
    if name not in _callees:
        parts = name.split(".")
        found: Any = None
        for i in range(len(parts) - 1, 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for part in parts[i:]:
                found = getattr(found, part)
            break
        if found is None:
            raise ImportError(f"cannot import {name}")
        _callees[name] = found
    return _callees[name]


def _signature(params: tuple[str, ...]) -> inspect.Signature:
    parameters = []
    for param in params:
        kind, _, rest = param.partition(" ")
        name, _, default = rest.partition("=")
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=_TYPES[kind],
                default=_DEFAULTS[default] if default else inspect.Parameter.empty,
            )
        )
    return inspect.Signature(parameters, return_annotation=None)


def _impl(name: str, returns: str, signature: inspect.Signature) -> Callable:
    optional = sum(
        p.default is None for p in signature.parameters.values()
    )  # trailing parameters that default to None

    def impl(*args):
        # what the call left out stays left out (a kernel release may not
        # have that parameter: IPEX 2.10's rotary_embedding has no rot_dim)
        given = list(args)
        for _ in range(optional):
            if given and given[-1] is None:
                given.pop()
        result = callee(name)(*given)
        return result if returns else None

    impl.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=torch.Tensor if returns else None
    )
    impl.__name__ = f"_{CONTRACTS[name][0]}_impl"
    return impl


def _fake(name: str, returns: str, signature: inspect.Signature) -> Callable:
    like = list(signature.parameters).index(returns.split()[1]) if returns else None

    def fake(*args):
        if like is None:
            return None
        x = args[like]
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    fake.__signature__ = signature  # type: ignore[attr-defined]
    fake.__name__ = f"_{CONTRACTS[name][0]}_fake"
    return fake


def as_custom_op(op: str, original: Callable | None) -> Callable | None:
    """The function a tree keeps in place of a callee of CONTRACTS (its op
    named): each call is a call of ``torch.ops.vllm.<op>``, whose
    implementation calls ``original``, and gives the caller what the callee
    does (CALLEE_RETURNS). None (a package without it) stays None. The tree
    calls it once its kernel package is loaded: the package's ops without a
    fake get theirs here (KERNEL_FAKES)."""
    register_kernel_fakes()
    if original is None:
        return None
    name = next(c for c, contract in CONTRACTS.items() if contract[0] == op)
    _callees.setdefault(name, original)
    return _ROUTED[op]


def routed(op: str) -> Callable:
    """What a call of a callee of CONTRACTS whose result the caller uses
    calls instead (``routed("<op>")(...)``): ``torch.ops.vllm.<op>``, the
    caller given what the callee returns (CALLEE_RETURNS). The callee itself
    is looked up when the op runs."""
    return _ROUTED[op]


def _caller(name: str) -> Callable:
    op = CONTRACTS[name][0]
    signature = _signature(CONTRACTS[name][1])
    returns = CALLEE_RETURNS[name]
    picked = [] if returns in ("", "result") else returns.split(", ")

    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        result = getattr(torch.ops.vllm, op)(*bound.arguments.values())
        if returns == "result":
            return result
        given = [bound.arguments[p] for p in picked]
        return given[0] if len(given) == 1 else tuple(given) or None

    call.__name__ = call.__qualname__ = op
    call.__doc__ = f"{op} as torch.ops.vllm.{op}"
    return call


# op -> the function that calls it as its callee would be called, made once
_ROUTED: dict[str, Callable] = {
    contract[0]: _caller(name) for name, contract in CONTRACTS.items()
}


# ---------------------------------------------------------------------------
# Fakes of kernel ops that have none (their schemas are true)
# ---------------------------------------------------------------------------


def _moe_forward_full_fake(
    x,
    logits,
    gate_up_weight,
    gate_up_scale,
    shared_gate_up_weight,
    shared_gate_up_scale,
    down_weight,
    down_scale,
    shared_down_weight,
    shared_down_scale,
    shared_expert_gate_weight,
    top_k,
    num_shared_experts,
    n_routed_experts,
):
    # s_final_output (torch::empty({an, hidden_size}, kHalf) on x's device,
    # an >= n_tokens) narrowed to its first n_tokens rows: x.size(0) rows of
    # x.size(1), float16, row-major (ensure_moe_buffers[_v2], the return of
    # moe_forward_full[_v2])
    return torch.empty((x.shape[0], x.shape[1]), dtype=torch.float16, device=x.device)


def _moe_prefill_gather_forward_v2_fake(selected_experts, num_experts):
    # expert_offsets, expert_tokens, pair_to_perm, rows_for_experts: int32 on
    # selected_experts' device, {num_experts}, {numel}, {numel}, {num_experts}
    pairs = selected_experts.numel()
    return [
        selected_experts.new_empty((n,), dtype=torch.int32)
        for n in (num_experts, pairs, pairs, num_experts)
    ]


def _moe_forward_gelu_tanh_int4_decode_fake(
    x,
    logits,
    w13_qweight_s4,
    w13_scales,
    w2_qweight_s4,
    w2_scales,
    per_expert_scale,
    top_k,
    n_routed_experts,
):
    # torch::empty({n_tokens, hidden_out}, kHalf) on x's device, hidden_out
    # = w2_qweight_s4.size(1)
    return torch.empty(
        (x.shape[0], w2_qweight_s4.shape[1]), dtype=torch.float16, device=x.device
    )


def _moe_forward_tiny_int4_shared_from_logits_fake(
    x,
    logits,
    w13_qweight_s4,
    w13_scales,
    w2_qweight_s4,
    w2_scales,
    shared_gate_up_weight,
    shared_down_weight,
    shared_expert_gate_weight,
    top_k,
    num_shared_experts,
    n_routed_experts,
):
    # a ring buffer torch::empty({cap, hidden_size}, kHalf), cap >= n_tokens,
    # hidden_size = x.size(1), narrowed to its first n_tokens rows
    return torch.empty((x.shape[0], x.shape[1]), dtype=torch.float16, device=x.device)


def _moe_router_forward_fake(x, weight, scale):
    # torch::empty({n_tokens, num_experts}, kHalf), num_experts =
    # weight.size(0)
    return torch.empty(
        (x.shape[0], weight.shape[0]), dtype=torch.float16, device=x.device
    )


def _moe_router_forward_int4_fake(x, weight, scale, use_ggml_layout):
    # torch::empty({n_tokens, num_experts}, kHalf); num_experts is
    # weight.size(0) in the GGML layout (a uint8 weight viewed as int32
    # keeps its rows), weight.numel() / (hidden / 8) in IPEX's
    experts = (
        weight.shape[0] if use_ggml_layout else weight.numel() // (x.shape[1] // 8)
    )
    return torch.empty((x.shape[0], experts), dtype=torch.float16, device=x.device)


def _moe_forward_cutlass_nmajor_int4_full_fake(
    x,
    logits,
    w13,
    w13_scales,
    w2,
    w2_scales,
    shared_gu_w,
    shared_d_w,
    shared_gate_w,
    top_k,
    num_shared_experts,
    n_routed_experts,
):
    # either path: {M, H} kHalf, M, H = x.size(0), x.size(1) (the tiny
    # path's ring entry narrowed, or torch::empty({M, H}))
    return torch.empty((x.shape[0], x.shape[1]), dtype=torch.float16, device=x.device)


# op -> (the schema its fake is exact for, the kernel package's module that
# defines the op, the fake). Sources: intel/llm-scaler b18beee and 25095b4
# (0.21.0-b3.1) vllm/custom-esimd-kernels-vllm/csrc/moe_batch/moe.sycl
# (m.def 2457, 2459; ensure_moe_buffers 1478-1498 and _v2 1954-1975;
# returns 1939, 2439) and csrc/moe_prefill/moe_prefill_int4.sycl (m.def 997,
# moe_prefill_gather_forward_v2 457-487), csrc/moe_batch/moe_int4.sycl (m.def
# 3906, 3913; moe_forward_gelu_tanh_int4_decode 3832-3893;
# moe_forward_tiny_cutlass_nmajor_int4_full_fp16_shared[_from_logits]
# 2684-2794, 2795-2866, the ring 1408-1444; moe_router_forward_int4
# 171-230; moe_forward_cutlass_nmajor_int4_full 3702: the tiny path or
# torch::empty({M, H})), and moe.sycl moe_router_forward (302-320); the same
# at 0a85564 (moe.sycl:272, moe_int4.sycl:170, 3561).
_MOE_FULL = (
    "(Tensor x, Tensor logits, Tensor gate_up_weight, Tensor gate_up_scale, "
    "Tensor shared_gate_up_weight, Tensor shared_gate_up_scale, "
    "Tensor down_weight, Tensor down_scale, Tensor shared_down_weight, "
    "Tensor shared_down_scale, Tensor shared_expert_gate_weight, int top_k, "
    "int num_shared_experts, int n_routed_experts) -> Tensor"
)
_GATHER = "(Tensor selected_experts, int num_experts) -> Tensor[]"
_INT4_DECODE = (
    "(Tensor x, Tensor logits, Tensor w13_qweight_s4, Tensor w13_scales, "
    "Tensor w2_qweight_s4, Tensor w2_scales, Tensor per_expert_scale, "
    "int top_k, int n_routed_experts) -> Tensor"
)
_INT4_TINY = (
    "(Tensor x, Tensor logits, Tensor w13_qweight_s4, Tensor w13_scales, "
    "Tensor w2_qweight_s4, Tensor w2_scales, Tensor shared_gate_up_weight, "
    "Tensor shared_down_weight, Tensor shared_expert_gate_weight, int top_k, "
    "int num_shared_experts, int n_routed_experts) -> Tensor"
)
_ROUTER = "(Tensor x, Tensor weight, Tensor scale) -> Tensor"
_ROUTER_INT4 = "(Tensor x, Tensor weight, Tensor scale, bool use_ggml_layout) -> Tensor"
_INT4_FULL = (
    "(Tensor x, Tensor logits, Tensor w13, Tensor w13_scales, Tensor w2, "
    "Tensor w2_scales, Tensor shared_gu_w, Tensor shared_d_w, "
    "Tensor shared_gate_w, int top_k, int num_shared_experts, "
    "int n_routed_experts) -> Tensor"
)
KERNEL_FAKES: dict[str, tuple[str, str, Callable]] = {
    "moe_ops::moe_router_forward": (
        "moe_ops::moe_router_forward" + _ROUTER,
        "custom_esimd_kernels_vllm.moe_ops",
        _moe_router_forward_fake,
    ),
    "moe_int4_ops::moe_router_forward_int4": (
        "moe_int4_ops::moe_router_forward_int4" + _ROUTER_INT4,
        "custom_esimd_kernels_vllm.moe_int4_ops",
        _moe_router_forward_int4_fake,
    ),
    "moe_int4_ops::moe_forward_cutlass_nmajor_int4_full": (
        "moe_int4_ops::moe_forward_cutlass_nmajor_int4_full" + _INT4_FULL,
        "custom_esimd_kernels_vllm.moe_int4_ops",
        _moe_forward_cutlass_nmajor_int4_full_fake,
    ),
    "moe_ops::moe_forward_full": (
        "moe_ops::moe_forward_full" + _MOE_FULL,
        "custom_esimd_kernels_vllm.moe_ops",
        _moe_forward_full_fake,
    ),
    "moe_ops::moe_forward_full_v2": (
        "moe_ops::moe_forward_full_v2" + _MOE_FULL,
        "custom_esimd_kernels_vllm.moe_ops",
        _moe_forward_full_fake,
    ),
    "moe_int4_prefill_ops::moe_prefill_gather_forward_v2": (
        "moe_int4_prefill_ops::moe_prefill_gather_forward_v2" + _GATHER,
        "custom_esimd_kernels_vllm.moe_int4_prefill_ops",
        _moe_prefill_gather_forward_v2_fake,
    ),
    "moe_int4_ops::moe_forward_gelu_tanh_int4_decode": (
        "moe_int4_ops::moe_forward_gelu_tanh_int4_decode" + _INT4_DECODE,
        "custom_esimd_kernels_vllm.moe_int4_ops",
        _moe_forward_gelu_tanh_int4_decode_fake,
    ),
    "moe_int4_ops::moe_forward_tiny_cutlass_nmajor_int4_full_fp16_shared_from_logits": (
        "moe_int4_ops::moe_forward_tiny_cutlass_nmajor_int4_full_fp16_shared_from_logits"
        + _INT4_TINY,
        "custom_esimd_kernels_vllm.moe_int4_ops",
        _moe_forward_tiny_int4_shared_from_logits_fake,
    ),
}
# op -> what register_kernel_fakes() did: "ours" (our fake registered),
# "theirs" (it had one: kept), "differs: <live schema>" (left as it is),
# "failed: <why>", "absent" (the kernels of this process do not have it:
# tried again at the next call)
kernel_fakes: dict[str, str] = {}


def _live_op(op: str, module: str) -> torch._ops.OpOverload | None:
    namespace, _, name = op.partition("::")
    package = module.partition(".")[0]
    if not hasattr(getattr(torch.ops, namespace), name) and package in sys.modules:
        try:  # the loaded package's module that defines it (a model loads
            # it late: Gemma 4's moe_int4_prefill_ops)
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - not this build's
            return None
    packet = getattr(getattr(torch.ops, namespace), name, None)
    return getattr(packet, "default", None)


def _has_fake(op: str) -> bool:
    """Whether the op has a fake (torch.library's) or a Meta kernel."""
    from torch._library.simple_registry import singleton

    if singleton.find(op).fake_impl.kernel is not None:
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, "Meta")


def register_kernel_fakes() -> dict[str, str]:
    """Give each op of KERNEL_FAKES that exists and has no fake its fake, if
    its live schema is the one the fake is written for; returns what was
    done to each (``kernel_fakes``). Never raises."""
    for op, (schema, module, fake) in KERNEL_FAKES.items():
        if kernel_fakes.get(op, "absent") != "absent":
            continue
        live = _live_op(op, module)
        if live is None:
            kernel_fakes[op] = "absent"
            continue
        if str(live._schema) != schema:
            kernel_fakes[op] = f"differs: {live._schema}"
            logger.warning(
                "Not registering a fake for %s: its schema is %r, the fake "
                "was written for %r; the op keeps what it has, and a "
                "compiled forward that calls it may fail",
                op,
                str(live._schema),
                schema,
            )
            continue
        if _has_fake(op):  # the tree's (a later registration would win)
            kernel_fakes[op] = "theirs"
            continue
        try:
            torch.library.register_fake(op, fake)
            kernel_fakes[op] = "ours"
        except RuntimeError as e:  # never break vLLM's start-up
            kernel_fakes[op] = f"failed: {e}"
            logger.warning("Could not register a fake for %s: %s", op, e)
    return dict(kernel_fakes)


def register_opaque_calls() -> None:
    """Register every op of CONTRACTS (once)."""
    for name, (op, params, mutates, returns) in CONTRACTS.items():
        if hasattr(torch.ops.vllm, op):
            continue
        signature = _signature(params)
        direct_register_custom_op(
            op_name=op,
            op_func=_impl(name, returns, signature),
            mutates_args=list(mutates),
            fake_impl=_fake(name, returns, signature),
            dispatch_key=current_platform.dispatch_key,
        )


register_opaque_calls()
