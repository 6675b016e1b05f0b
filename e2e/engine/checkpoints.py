"""Tiny Llama checkpoints with random weights, written locally (no hub).

Run inside an engine venv (torch, safetensors). One set of bf16 weights
(seeded; std 0.2, large enough that greedy continuations vary: with the
default 0.02 a random model repeats one token), saved as is for online fp8
and, quantized, in each checkpoint format under test:

* ``gptq`` / ``awq``: AutoGPTQ / AutoAWQ int4 (group 64), which vLLM 0.14.1
  runs on an XPU through IPEX's WOQ linear module;
* ``ct-fp8-dynamic``: compressed-tensors fp8, per-tensor weights, dynamic
  per-token activations (W8A8);
* ``ct-w4a16``: compressed-tensors int4 pack-quantized, group 64, with zero
  points (asymmetric; vLLM's XPU wNa16 kernel moves a symmetric layer's
  constant zero point to device "xpu" while loading, which a CPU cannot);
* ``ct-mxfp4``: compressed-tensors MXFP4 (e2m1 values, e8m0 scales per 32).

The int4 packing helpers are the reference kernels' (the same module the
plugin's stand-ins are), loaded from the checkout.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 1024, 256, 512, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
STD = 0.2
GROUP = 64
FORMATS = ("bf16", "gptq", "awq", "ct-fp8-dynamic", "ct-w4a16", "ct-mxfp4")

LINEARS = {
    "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
    "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
    "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
    "mlp.up_proj": (INTERMEDIATE, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTERMEDIATE),
}


def _reference(repo: Path):
    """The reference kernels, loaded once by the checkout's tool's helper
    (under the name the tool loads them by)."""
    if str(repo / "scripts") not in sys.path:
        sys.path.insert(0, str(repo / "scripts"))
    from xpufakes.common import bypath

    path = repo / "vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py"
    return bypath.load("xpu_gemm_reference", path)


def config(quantization: dict | None) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if quantization is not None:
        cfg["quantization_config"] = quantization
    return cfg


def base_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return (torch.randn(*shape, generator=g) * STD).to(torch.bfloat16)

    weights = {
        "model.embed_tokens.weight": normal(VOCAB, HIDDEN),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": normal(VOCAB, HIDDEN),
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        weights[prefix + "input_layernorm.weight"] = torch.ones(HIDDEN).bfloat16()
        weights[prefix + "post_attention_layernorm.weight"] = torch.ones(
            HIDDEN
        ).bfloat16()
        for name, shape in LINEARS.items():
            weights[prefix + name + ".weight"] = normal(*shape)
    return weights


def _int4_groups(w: torch.Tensor, symmetric: bool):
    """[N, K] -> codes [N, K] in 0..15, scales [N, K/G], zeros [N, K/G]."""
    n, k = w.shape
    groups = w.float().reshape(n, k // GROUP, GROUP)
    if symmetric:
        scale = groups.abs().amax(-1).clamp(min=1e-8) / 7
        zero = torch.full_like(scale, 8)
    else:
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-8)
        zero = torch.round(-low / scale).clamp(0, 15)
    codes = torch.round(groups / scale.unsqueeze(-1)) + zero.unsqueeze(-1)
    return codes.clamp(0, 15).reshape(n, k).long(), scale, zero.long()


def _awq_pack(values: torch.Tensor, ref) -> torch.Tensor:
    """[R, C] codes -> [R, C/8] int32 in AutoAWQ's column order."""
    rows, cols = values.shape
    order = torch.tensor(ref.AWQ_ORDER).repeat(cols // 8) + torch.arange(
        0, cols, 8
    ).repeat_interleave(8)
    return ref.pack_int4_rows(values[:, order].t().contiguous()).t().contiguous()


def _quantize_linear(fmt: str, w: torch.Tensor, ref) -> dict[str, torch.Tensor]:
    n, k = w.shape
    if fmt == "gptq":  # symmetric, zero point 8 (stored as 7: GPTQ v1)
        codes, scale, _ = _int4_groups(w, symmetric=True)
        sevens = torch.full((k // GROUP, n), 7, dtype=torch.long)
        return {
            "qweight": ref.pack_int4_rows(codes.t().contiguous()),  # [K/8, N]
            "qzeros": ref.pack_int4_rows(sevens.t().contiguous()).t().contiguous(),
            "scales": scale.t().contiguous().half(),  # [K/G, N]
            "g_idx": (torch.arange(k) // GROUP).to(torch.int32),
        }
    if fmt == "awq":
        codes, scale, zero = _int4_groups(w, symmetric=False)
        return {
            "qweight": _awq_pack(codes.t().contiguous(), ref),  # [K, N/8]
            "qzeros": _awq_pack(zero.t().contiguous(), ref),  # [K/G, N/8]
            "scales": scale.t().contiguous().half(),  # [K/G, N]
        }
    if fmt == "ct-w4a16":
        codes, scale, zero = _int4_groups(w, symmetric=False)
        return {
            "weight_packed": ref.pack_int4_rows(codes.t().contiguous())
            .t()
            .contiguous(),  # [N, K/8]
            "weight_scale": scale.bfloat16(),  # [N, K/G]
            "weight_zero_point": ref.pack_int4_rows(zero),  # [N/8, K/G]
            "weight_shape": torch.tensor([n, k], dtype=torch.int64),
        }
    if fmt == "ct-fp8-dynamic":
        finfo = torch.finfo(torch.float8_e4m3fn)
        scale = w.float().abs().amax().clamp(min=1e-8) / finfo.max
        return {
            "weight": (w.float() / scale).to(torch.float8_e4m3fn),
            "weight_scale": scale.reshape(1),  # per tensor, float32
        }
    if fmt == "ct-mxfp4":
        from xpufakes_e2e_plugin.standins import mxfp4_quantize

        packed = torch.empty(n, k // 2, dtype=torch.uint8)
        scale = torch.empty(n, k // 32)
        mxfp4_quantize(w, packed, scale, 32, 1e-10)
        exponent = torch.log2(scale).round().to(torch.int32) + 127
        return {"weight_packed": packed, "weight_scale": exponent.to(torch.uint8)}
    raise ValueError(fmt)


def _ct_config(fmt: str) -> dict:
    if fmt == "ct-fp8-dynamic":
        groups = {
            "weights": {
                "num_bits": 8,
                "type": "float",
                "strategy": "tensor",
                "symmetric": True,
                "dynamic": False,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "symmetric": True,
                "dynamic": True,
            },
        }
        format_ = "float-quantized"
    elif fmt == "ct-w4a16":
        groups = {
            "weights": {
                "num_bits": 4,
                "type": "int",
                "strategy": "group",
                "group_size": GROUP,
                "symmetric": False,
                "dynamic": False,
            }
        }
        format_ = "pack-quantized"
    else:  # ct-mxfp4
        groups = {
            "weights": {
                "num_bits": 4,
                "type": "float",
                "strategy": "group",
                "group_size": 32,
                "symmetric": True,
                "dynamic": False,
            },
            "input_activations": {
                "num_bits": 4,
                "type": "float",
                "strategy": "group",
                "group_size": 32,
                "symmetric": True,
                "dynamic": True,
            },
        }
        format_ = "mxfp4-pack-quantized"
    return {
        "quant_method": "compressed-tensors",
        "format": format_,
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": dict(groups, targets=["Linear"])},
    }


def quantization_config(fmt: str) -> dict | None:
    if fmt == "bf16":
        return None
    if fmt == "gptq":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": GROUP,
            "desc_act": False,
            "sym": True,
        }
    if fmt == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": GROUP,
            "zero_point": True,
            "version": "gemm",
        }
    return _ct_config(fmt)


def write(fmt: str, out: Path, repo: Path, seed: int = 0) -> Path:
    """Write the checkpoint `fmt` to `out` (a directory); returns it."""
    ref = _reference(repo)
    weights = base_weights(seed)
    if fmt != "bf16":
        for name in list(weights):
            stem = name.removesuffix(".weight")
            if any(stem.endswith(linear) for linear in LINEARS):
                w = weights.pop(name)
                for key, value in _quantize_linear(fmt, w, ref).items():
                    weights[f"{stem}.{key}"] = value
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(config(quantization_config(fmt)), indent=1)
    )
    save_file(
        {k: v.contiguous() for k, v in weights.items()}, out / "model.safetensors"
    )
    return out
