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

Each such call becomes a call of one custom op here (``torch.ops.vllm.<op>``,
registered with ``direct_register_custom_op``). Its implementation calls the
same callee, looked up when it runs, so the kernel the image ships is the one
that runs; its fake is exact: a kernel that writes its outputs into arguments
declares them mutated in the schema and returns nothing (functionalization
carries the writes), and one that returns a new tensor returns what its C++
allocates (``at::empty(x.sizes(), x.options())``: contiguous, x's shape,
dtype and device). The contracts, with their sources, are ``CONTRACTS``.

Nothing here imports IPEX or a native extension when it is imported.
"""

import importlib
import inspect
from collections.abc import Callable

import torch

from vllm.platforms import current_platform

try:
    from vllm.utils.torch_utils import direct_register_custom_op
except ImportError:  # vLLM < 0.11.1
    from vllm.utils import direct_register_custom_op

# callee -> (op name, parameters, mutated parameters, returns): returns is ""
# (nothing) or "new_like <param>" (a new contiguous tensor like that param).
# Sources: intel/llm-scaler vllm_for_multi_arc.patch@b5571c3 csrc/xpu/
# xpu_ops.h; intel/intel-extension-for-pytorch@v2.8.10+xpu
# transformers/models/xpu/fusions/activation_fusion.py, mha_fusion.py,
# csrc/gpu/aten/operators/{Rope,RMSNorm,AddNormFusion,TripleOps}.cpp, and
# RMSNormVllm.cpp@v2.10.10+xpu.
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
        found = None
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

    impl.__signature__ = signature.replace(
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

    fake.__signature__ = signature
    fake.__name__ = f"_{CONTRACTS[name][0]}_fake"
    return fake


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
