"""IPEX's MoE experts, `intel_extension_for_pytorch.llm.modules.GatedMLPMOE`,
stood in with their math on the CPU: what the IPEX-era trees' MoE methods
make while the weights load (vLLM 0.10.2's fused_moe/layer.py:360 16-bit,
quantization/ipex_quant.py:401 online fp8) and run inside vLLM's opaque
`vllm::moe_forward`, eagerly, compiled or not. No fake, no op: a module, as
IPEX's is.

The math is IPEX's XPU path (SOURCES), small: the router's softmax in fp32
over the router logits, each token's top_k experts (the larger
probability first, the lower expert where equal), their probabilities as
the weights (fp32; renormalize: divided by their sum, where it is > 0);
each chosen expert's gate_up = x @ W13[e]^T and down = silu(gate) * up @
W2[e]^T, each GEMM accumulated in fp32 and rounded to x's dtype (fp8
weights: times the expert's one fp32 scale), the activation in fp32
rounded once (gate the first half of gate_up, up the second); the output
the weighted sum of a token's experts, fp32, rounded to x's dtype, a new
[tokens, hidden] tensor. Nothing given is written, but for IPEX's prepack
at the first forward: the weights transposed to [E, H, 2I] / [E, I, H]
and given to the layer's parameters as their data (`W13.data = ...`).

Which IPEX: the image pins 2.8.10.post0+xpu, which no public tag holds;
vLLM 0.10.2's llm-scaler patch passes it `experts_start_id`, `is_int4`,
`is_mxfp4`, which 2.8.10 lacks and 2.9.10 has (intel/intel-extension-for-
pytorch 7259fd8, tag v2.9.10+xpu, the first tag with all three; its MoE
files are those of 3484cc0, the commit that brought the last), so the
sources read are 2.9.10's. What 2.8.10 (09505bb) does differently, which
no forward whose probabilities are distinct sees: its router takes the
top_k of the logits, then their softmax (MoeOps.cpp@09505bb:106-166).
Which GEMM the post0 wheel runs is not known. 2.9.10's persistent GEMM (an
XPU with XMX) checks `n_experts % 8 == 0` (moe_gemm.cpp@7259fd8:212),
which the catalog's tiny 4-expert models would fail on the device (the
real ones have 128 experts); its native loop (IPEX_MOE_GEMM_NATIVE=1, or no
XMX) would give fp8 weights to torch.mm, vLLM 0.10.2 passing no `is_fp8`.
The stand-in computes what the persistent GEMM computes, and refuses
neither.

What no catalog model reaches raises NoCPUReference, naming it: int4 and
mxfp4 experts (their marlin shuffle), biases, a separate W3, expert
parallelism (experts_start_id, or router logits for more experts than the
layer holds), grouped top-k, a custom routing function, an activation
other than silu. What IPEX refuses (its TORCH_CHECKs and asserts) raises
what IPEX raises."""

import torch

from xpufakes.proof.xpu.uncomputed import NoCPUReference

# where each fact is (intel/intel-extension-for-pytorch at 7259fd8, tag
# v2.9.10+xpu, unless another commit is named)
SOURCES = {
    "constructor and forward": "intel_extension_for_pytorch/llm/modules/"
    "linear_fusion.py:403-536 (the XPU module made at the first forward, "
    ":521-522 -> init_on_device :486)",
    "prepack": "intel_extension_for_pytorch/transformers/models/xpu/fusions/"
    "linear_fusion.py:96 (W13 [E, 2I, H] -> [E, H, 2I], W2 [E, H, I] -> "
    "[E, I, H], contiguous :126-132; the parameters' data replaced :161-165)",
    "router": "fusions/linear_fusion.py:300-317 (topk_softmax, renormalize "
    "False: the gather renormalizes; grouped top-k :319-330); "
    "csrc/gpu/aten/operators/MoeOps.cpp: softmax in fp32 :22-98, :377-395, "
    "the top_k the larger first, the lower expert where equal :169, :440",
    "experts": "fusions/linear_fusion.py:210-265 (moe_gemm, silu_and_mul, "
    "moe_gemm); intel_extension_for_pytorch/xpu/intrinsic/__init__.py:412-533 "
    "(matrix_a_scale_inv refused :442; the persistent GEMM :482-488); "
    "csrc/gpu/aten/operators/transformers/moe_gemm.cpp:188-310 (fp8 where a "
    "scale is given :223, one fp32 scale per expert :243)",
    "activation": "csrc/gpu/aten/operators/TripleOps.cpp:58-62 (silu(a) * b "
    "in the accumulate type, fp32 for 16-bit, rounded once)",
    "gather": "fusions/linear_fusion.py:357-366; MoeOps.cpp:1509-1631 "
    "(renormalize if the sum > 0 :1560-1571, fp32 sum :1607, rounded :1614; "
    "top_k 1, 2, 4, 6, 8 :1824-1830; hidden a multiple of 16 bytes / element "
    "and at most 256 experts :1772-1777; a new [tokens, hidden] :2189)",
}

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_TOP_K = (1, 2, 4, 6, 8)  # MoeOps.cpp@7259fd8:1824-1830
_GROUP_WORK_ITEM = 256  # MoEGather's work-group: experts at most this


def _refused(what: str):
    raise NoCPUReference(
        f"GatedMLPMOE (IPEX's MoE) with {what}: no CPU reference (no catalog "
        "model reaches it); proof/xpu/ipex_moe.py"
    )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)  # as TORCH_CHECK raises (c10::Error)


def route(router_logits: torch.Tensor, top_k: int):
    """IPEX's topk_softmax: (weights [tokens, top_k] fp32, expert ids
    [tokens, top_k] int32), the larger probability first, the lower expert
    where equal; not renormalized."""
    probabilities = router_logits.float().softmax(-1)
    ids = torch.sort(probabilities, dim=-1, descending=True, stable=True).indices
    ids = ids[:, :top_k]
    return probabilities.gather(-1, ids), ids.to(torch.int32)


def _gemm(a: torch.Tensor, b: torch.Tensor, scale) -> torch.Tensor:
    """a [M, K] @ b [K, N] (times the expert's scale: fp8), fp32, rounded
    to a's dtype."""
    weight = b.float() if scale is None else b.float() * scale.float()
    return (a.float() @ weight).to(a.dtype)


def _silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    half = gate_up.size(-1) // 2
    gate, up = gate_up[:, :half].float(), gate_up[:, half:].float()
    return (gate / (1.0 + torch.exp(-gate)) * up).to(gate_up.dtype)


def experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scales,
    w2_scales,
    weights: torch.Tensor,
    ids: torch.Tensor,
    renormalize: bool,
) -> torch.Tensor:
    """The experts and the gather: w13 [E, H, 2I] and w2 [E, I, H] as the
    prepack lays them out (scales [E] fp32 for fp8, else None); returns a
    new [tokens, hidden] tensor of hidden_states' dtype."""
    weights = weights.float()
    if renormalize:
        total = weights.sum(-1, keepdim=True)
        weights = torch.where(total > 0, weights / total, weights)
    out = torch.zeros(hidden_states.shape, dtype=torch.float32)
    for e in ids.unique().tolist():
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        gate_up = _gemm(
            hidden_states[tokens], w13[e], None if w13_scales is None else w13_scales[e]
        )
        down = _gemm(
            _silu_and_mul(gate_up), w2[e], None if w2_scales is None else w2_scales[e]
        )
        out.index_add_(0, tokens, down.float() * weights[tokens, slots].unsqueeze(-1))
    return out.to(hidden_states.dtype)


class GatedMLPMOE(torch.nn.Module):
    """ipex.llm.modules.GatedMLPMOE: the constructor keeps what it is given
    (IPEX's front end does; the layer's parameters become this module's, as
    there); the first forward prepacks, every forward computes."""

    def __init__(
        self,
        W13,
        W2,
        W3=None,
        use_prepack=True,
        w1_scale_inv=None,
        w2_scale_inv=None,
        a1_scale_inv=None,
        a2_scale_inv=None,
        w13_bias=None,
        w2_bias=None,
        is_mxfp4=False,
        is_fp8=False,
        is_int4=False,
        experts_start_id=0,
    ):
        super().__init__()
        self.W13, self.W2, self.W3 = W13, W2, W3
        self.use_prepack = use_prepack
        self.w1_scale_inv, self.w2_scale_inv = w1_scale_inv, w2_scale_inv
        self.a1_scale_inv, self.a2_scale_inv = a1_scale_inv, a2_scale_inv
        self.w13_bias, self.w2_bias = w13_bias, w2_bias
        self.is_mxfp4, self.is_fp8, self.is_int4 = is_mxfp4, is_fp8, is_int4
        self.experts_start_id = experts_start_id
        self.packed = None  # (w13 [E, H, 2I], w2 [E, I, H]) after the first forward

    def _form(self) -> None:
        """Refuse what no catalog model reaches, naming it; and what IPEX
        refuses, as it does."""
        if self.is_int4 or self.is_mxfp4:
            _refused("int4 or mxfp4 experts (is_int4, is_mxfp4)")
        if self.W3 is not None:
            _refused("a separate W3")
        if self.w13_bias is not None or self.w2_bias is not None:
            _refused("biases")
        if self.experts_start_id != 0:
            _refused(f"expert parallelism (experts_start_id {self.experts_start_id})")
        assert self.a1_scale_inv is None and self.a2_scale_inv is None, (
            "matrix_a_scale_inv is not supported now"
        )  # xpu/intrinsic/__init__.py@7259fd8:442
        scales = (self.w1_scale_inv, self.w2_scale_inv)
        fp8 = self.W13.dtype in _FP8
        if fp8 and any(s is None for s in scales):
            _refused("fp8 weights without their scales")
        if any(s is not None for s in scales):
            _check(
                fp8,
                "Error in moegemm: run into Unsupported data type for matrix_b, "
                "only support float8_e4m3fn and float8_e5m2 now. ",
            )
            if any(s.numel() != self.W2.size(0) for s in scales):
                _refused("fp8 scales other than one per expert (blocks, channels)")

    def _prepack(self) -> tuple:
        """IPEX's XPU module made: the weights transposed, contiguous, and
        the given parameters' data replaced by them."""
        w13 = torch.transpose(self.W13, 1, 2).contiguous()
        w2 = torch.transpose(self.W2, 1, 2).contiguous()
        self.W13.data = w13
        self.W2.data = w2
        return w13, w2

    def forward(
        self,
        hidden_states: torch.Tensor,
        use_grouped_topk: bool,
        top_k: int,
        router_logits: torch.Tensor,
        renormalize: bool,
        topk_group=None,
        num_expert_group=None,
        custom_routing_function=None,
        scoring_func: str = "softmax",
        activation: str = "silu",
        e_score_correction_bias=None,
    ) -> torch.Tensor:
        # scoring_func and e_score_correction_bias: read by grouped top-k
        # only (fusions/linear_fusion.py@7259fd8:319-330)
        self._form()
        if custom_routing_function is not None:
            _refused("a custom routing function")
        if use_grouped_topk:
            _refused("grouped top-k")
        if activation != "silu":
            _refused(f"the activation {activation!r}")
        num_tokens, hidden_dim = hidden_states.shape
        if self.packed is None:
            self.packed = self._prepack()
        w13, w2 = self.packed
        experts_held = w2.size(0)
        if router_logits.size(-1) != experts_held:
            _refused(
                f"expert parallelism ({router_logits.size(-1)} experts routed, "
                f"{experts_held} held)"
            )
        _check(top_k in _TOP_K, f"error: not support topk=%d,\n{top_k}")
        _check(
            experts_held <= _GROUP_WORK_ITEM,
            "MoEScatter::GroupWorkItem is expected to be larger than num_expert",
        )
        _check(
            hidden_dim % (16 // hidden_states.element_size()) == 0,
            "n_channels is expected to be aligned to Kernel::ElemsPerItem",
        )
        weights, ids = route(router_logits, top_k)
        out = experts(
            hidden_states, w13, w2, self.w1_scale_inv, self.w2_scale_inv,
            weights, ids, renormalize,
        )  # fmt: skip
        return out.reshape(num_tokens, hidden_dim)
