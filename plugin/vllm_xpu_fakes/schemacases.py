# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The cases of the schema-truth check on a device (schemacheck.py): for each
op of an image whose schema hides a write or an alias (`make audit`'s schema
truth, docs/schema-truth.md), the finding to confirm and the arguments that
exercise it. Data only.

``FINDINGS``: op -> {kind: [argument, ...]}, the classes of docs/schema-truth.md
that a run of the kernel can show: (a) writes an argument it does not mark,
(b) returns an argument without an alias annotation, (c) returns nothing and
marks nothing ("" for its argument). (d), a fake of the tree, is not the
kernel's: ``make audit`` checks it. tests/test_schema_check.py checks that
these are exactly what schema truth finds in the checkout's data
(data/esimd_schemas.toml at llm-scaler b18beee, data/xpu_c_writes.toml, and
vLLM 0.33.0's own op).

``CASES``: op -> (sizes, arguments in the schema's order, where the shapes
were read). An argument is a tensor ``"<dtype>[<dims>]"`` with the sizes'
names in its dims (``K/128``: an exact division), then what fills it:
``nan`` (an output: any write shows), ``=<number>``, ``pos`` (uniform in
[0.5, 1.5): scales), else random (normal; integers: any bits); ``.t``:
made with its dims, then transposed (a view), ``cpu`` keeps it on the
CPU. ``fp8bits`` is an FP8 E4M3 value as its uint8 bits: the ESIMD kernels
take the weight's ``data_ptr()`` as bytes and tell E5M2 from E4M3 by its
dtype alone (``get_fp8_mode``), and torch cannot compare FP8 tensors on a
CPU (``allclose``), which ``test_schema`` does with every argument. A
name of the sizes is that size (an int argument); anything else is the
argument as it is. Sizes are small, the dims the kernels require (a
multiple of 128, of 512 for the norms' widest vector path, N a multiple of
16).

``NO_CASE``: op -> why it has none.
"""

B18BEEE = "llm-scaler b18beee vllm/custom-esimd-kernels-vllm/"
ESIMD = "custom_esimd_kernels_vllm::"

FINDINGS = {
    ESIMD + "esimd_gemm_fp8_blockscale": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemm_fp8_pert": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemm_int4_pgrp": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemv_fp8_pert": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemv_fp8_pert_fused2": {"a": ["o0", "o1"], "b": ["o0"]},
    ESIMD + "esimd_gemv_int4": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemv_int4_fused2": {"a": ["o0", "o1"], "b": ["o0"]},
    ESIMD + "esimd_gemv_fp16": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_rms_norm": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_rms_norm_gated": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_fused_add_rms_norm": {
        "a": ["hidden_states", "residual"],
        "b": ["hidden_states"],
    },
    ESIMD + "esimd_fused_add_rms_norm_batched": {
        "a": ["hidden_states", "residual"],
        "b": ["hidden_states"],
    },
    ESIMD + "esimd_fused_scaled_add_rms_norm": {
        "a": ["hidden_states", "residual"],
        "b": ["hidden_states"],
    },
    ESIMD + "esimd_norm_add_norm": {"a": ["h1", "out"], "c": [""]},
    ESIMD + "esimd_norm_gemv_norm_fp16": {
        "a": ["moe_input", "router_logits"],
        "c": [""],
    },
    ESIMD + "esimd_norm_gemv_fp8_pert": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_norm_gemv_int4_pert": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_resadd_norm_gemv_fp8_pert": {
        "a": ["normed_out", "output", "residual"],
        "b": ["output"],
    },
    ESIMD + "esimd_resadd_norm_gemv_int4_pert": {
        "a": ["normed_out", "output", "residual"],
        "b": ["output"],
    },
    ESIMD + "esimd_moe_gelu_tanh_mul": {"a": ["output"], "b": ["output"]},
    # not on a compiled path of the trees audited: no case (NO_CASE)
    ESIMD + "esimd_accum_norm_add_norm": {"a": ["h1", "out"], "c": [""]},
    ESIMD + "esimd_gemv_fp16_gelu_mul": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemv_fp8_pern": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemv_fp8_pern_fused2": {"a": ["o0", "o1"], "b": ["o0"]},
    ESIMD + "esimd_gemv_fp8_pern_fused3": {"a": ["o0", "o1", "o2"], "b": ["o0"]},
    ESIMD + "esimd_gemv_fp8_pert_bmg": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_gemv_fp8_pert_fused3": {"a": ["o0", "o1", "o2"], "b": ["o0"]},
    ESIMD + "esimd_moe_gather": {"a": ["final_hidden"], "b": ["final_hidden"]},
    ESIMD + "esimd_moe_gemm_fp8": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_moe_gemm_fp8_pert": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_moe_scatter": {
        "a": ["scattered_hidden", "scattered_weights"],
        "b": ["scattered_hidden"],
    },
    ESIMD + "esimd_moe_scatter_fused": {
        "a": [
            "expert_start",
            "max_tokens_out",
            "scattered_hidden",
            "scattered_weights",
            "topk_ids",
        ],
        "b": ["scattered_hidden"],
    },
    ESIMD + "esimd_moe_silu_mul": {"a": ["output"], "b": ["output"]},
    ESIMD + "esimd_moe_topk": {"a": ["top_indices", "top_values"], "b": ["top_values"]},
    ESIMD + "esimd_resadd_norm_gemv2_fp8_pert": {"a": ["o0", "o1"], "b": ["o0"]},
    ESIMD + "esimd_scaled_resadd_norm_gemv_fp8_pert": {
        "a": ["qkv_out", "residual"],
        "c": [""],
    },
    "esimd_topk_v2::topk_v2": {"a": ["top_indices", "top_values"], "b": ["top_values"]},
    # upstream: vllm-xpu-kernels (data/xpu_c_writes.toml) and vLLM's own op
    "_xpu_C::fp8_gemm_out": {"b": ["out"]},
    "_xpu_C::topk_topp_sampler": {"a": ["logits_to_return"]},
    "_xpu_C::cutlass_grouped_gemm_interface": {"a": ["ptr_D"], "b": ["ptr_D"]},
    "vllm::xpu_topk_topp_sampler": {
        "a": ["logits", "logits_to_return", "random_sampled", "seeds"],
        "c": [""],
    },
}

# where the evidence of each finding is (the C++ the data cites)
EVIDENCE = {
    "custom_esimd_kernels_vllm": B18BEEE + " (data/esimd_schemas.toml)",
    "esimd_topk_v2": B18BEEE + " (data/esimd_schemas.toml)",
    "_xpu_C": "vllm-xpu-kernels 4543b58 (data/xpu_c_writes.toml)",
    "vllm": "vLLM 0.33.0 vllm/_xpu_ops.py (mutates_args not given: [])",
}

# the lines of the C++ each op's findings cite (the data's `at`)
WHERE = {
    "custom_esimd_kernels_vllm::esimd_gemm_fp8_blockscale": [
        "csrc/xpu/esimd_kernel_gemm.sycl:129",
        "csrc/xpu/esimd_kernel_gemm.sycl:138",
    ],
    "custom_esimd_kernels_vllm::esimd_gemm_fp8_pert": [
        "csrc/xpu/esimd_kernel_gemm.sycl:39",
        "csrc/xpu/esimd_kernel_gemm.sycl:48",
    ],
    "custom_esimd_kernels_vllm::esimd_gemm_int4_pgrp": [
        "csrc/xpu/esimd_kernel_gemm.sycl:82",
        "csrc/xpu/esimd_kernel_gemm.sycl:90",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp8_pert": [
        "csrc/xpu/esimd_kernel.sycl:94",
        "csrc/xpu/esimd_kernel.sycl:97",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp8_pert_fused2": [
        "csrc/xpu/esimd_kernel.sycl:162",
        "csrc/xpu/esimd_kernel.sycl:163",
        "csrc/xpu/esimd_kernel.sycl:170",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_int4": [
        "csrc/xpu/esimd_kernel.sycl:206",
        "csrc/xpu/esimd_kernel.sycl:209",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_int4_fused2": [
        "csrc/xpu/esimd_kernel.sycl:221",
        "csrc/xpu/esimd_kernel.sycl:222",
        "csrc/xpu/esimd_kernel.sycl:229",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp16": [
        "csrc/xpu/esimd_kernel.sycl:127",
        "csrc/xpu/esimd_kernel.sycl:129",
    ],
    "custom_esimd_kernels_vllm::esimd_rms_norm": [
        "csrc/xpu/esimd_kernel.sycl:498",
        "csrc/xpu/esimd_kernel.sycl:501",
    ],
    "custom_esimd_kernels_vllm::esimd_rms_norm_gated": [
        "csrc/xpu/esimd_kernel.sycl:482",
        "csrc/xpu/esimd_kernel.sycl:485",
    ],
    "custom_esimd_kernels_vllm::esimd_fused_add_rms_norm": [
        "csrc/xpu/esimd_kernel.sycl:514",
        "csrc/xpu/esimd_kernel.sycl:515",
        "csrc/xpu/esimd_kernel.sycl:519",
    ],
    "custom_esimd_kernels_vllm::esimd_fused_add_rms_norm_batched": [
        "csrc/xpu/esimd_kernel.sycl:552",
        "csrc/xpu/esimd_kernel.sycl:553",
        "csrc/xpu/esimd_kernel.sycl:557",
    ],
    "custom_esimd_kernels_vllm::esimd_fused_scaled_add_rms_norm": [
        "csrc/xpu/esimd_kernel.sycl:533",
        "csrc/xpu/esimd_kernel.sycl:534",
        "csrc/xpu/esimd_kernel.sycl:538",
    ],
    "custom_esimd_kernels_vllm::esimd_norm_add_norm": [
        "csrc/xpu/esimd_kernel.sycl:624",
        "csrc/xpu/esimd_kernel.sycl:627",
    ],
    "custom_esimd_kernels_vllm::esimd_norm_gemv_norm_fp16": [
        "csrc/xpu/esimd_kernel.sycl:579",
        "csrc/xpu/esimd_kernel.sycl:580",
    ],
    "custom_esimd_kernels_vllm::esimd_norm_gemv_fp8_pert": [
        "csrc/xpu/esimd_kernel.sycl:368",
        "csrc/xpu/esimd_kernel.sycl:372",
    ],
    "custom_esimd_kernels_vllm::esimd_norm_gemv_int4_pert": [
        "csrc/xpu/esimd_kernel.sycl:458",
        "csrc/xpu/esimd_kernel.sycl:462",
    ],
    "custom_esimd_kernels_vllm::esimd_resadd_norm_gemv_fp8_pert": [
        "csrc/xpu/esimd_kernel.sycl:333",
        "csrc/xpu/esimd_kernel.sycl:337",
        "csrc/xpu/esimd_kernel.sycl:338",
        "csrc/xpu/esimd_kernel.sycl:342",
    ],
    "custom_esimd_kernels_vllm::esimd_resadd_norm_gemv_int4_pert": [
        "csrc/xpu/esimd_kernel.sycl:393",
        "csrc/xpu/esimd_kernel.sycl:397",
        "csrc/xpu/esimd_kernel.sycl:398",
        "csrc/xpu/esimd_kernel.sycl:402",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_gelu_tanh_mul": [
        "csrc/xpu/esimd_kernel_moe.sycl:156",
        "csrc/xpu/esimd_kernel_moe.sycl:158",
    ],
    "custom_esimd_kernels_vllm::esimd_accum_norm_add_norm": [
        "csrc/xpu/esimd_kernel.sycl:646",
        "csrc/xpu/esimd_kernel.sycl:649",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp16_gelu_mul": [
        "csrc/xpu/esimd_kernel.sycl:150",
        "csrc/xpu/esimd_kernel.sycl:152",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp8_pern": [
        "csrc/xpu/esimd_kernel.sycl:44",
        "csrc/xpu/esimd_kernel.sycl:47",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp8_pern_fused2": [
        "csrc/xpu/esimd_kernel.sycl:56",
        "csrc/xpu/esimd_kernel.sycl:57",
        "csrc/xpu/esimd_kernel.sycl:64",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp8_pern_fused3": [
        "csrc/xpu/esimd_kernel.sycl:74",
        "csrc/xpu/esimd_kernel.sycl:75",
        "csrc/xpu/esimd_kernel.sycl:76",
        "csrc/xpu/esimd_kernel.sycl:83",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp8_pert_bmg": [
        "csrc/xpu/esimd_kernel.sycl:667",
        "csrc/xpu/esimd_kernel.sycl:669",
    ],
    "custom_esimd_kernels_vllm::esimd_gemv_fp8_pert_fused3": [
        "csrc/xpu/esimd_kernel.sycl:181",
        "csrc/xpu/esimd_kernel.sycl:182",
        "csrc/xpu/esimd_kernel.sycl:183",
        "csrc/xpu/esimd_kernel.sycl:190",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_gather": [
        "csrc/xpu/esimd_kernel_moe.sycl:173",
        "csrc/xpu/esimd_kernel_moe.sycl:175",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_gemm_fp8": [
        "csrc/xpu/esimd_kernel_moe.sycl:191",
        "csrc/xpu/esimd_kernel_moe.sycl:194",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_gemm_fp8_pert": [
        "csrc/xpu/esimd_kernel_moe.sycl:284",
        "csrc/xpu/esimd_kernel_moe.sycl:287",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_scatter": [
        "csrc/xpu/esimd_kernel_moe.sycl:100",
        "csrc/xpu/esimd_kernel_moe.sycl:102",
        "csrc/xpu/esimd_kernel_moe.sycl:99",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_scatter_fused": [
        "csrc/xpu/esimd_kernel_moe.sycl:124",
        "csrc/xpu/esimd_kernel_moe.sycl:125",
        "csrc/xpu/esimd_kernel_moe.sycl:126",
        "csrc/xpu/esimd_kernel_moe.sycl:127",
        "csrc/xpu/esimd_kernel_moe.sycl:128",
        "csrc/xpu/esimd_kernel_moe.sycl:132",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_silu_mul": [
        "csrc/xpu/esimd_kernel_moe.sycl:143",
        "csrc/xpu/esimd_kernel_moe.sycl:145",
    ],
    "custom_esimd_kernels_vllm::esimd_moe_topk": [
        "csrc/xpu/esimd_kernel_moe.sycl:80",
        "csrc/xpu/esimd_kernel_moe.sycl:81",
        "csrc/xpu/esimd_kernel_moe.sycl:83",
    ],
    "custom_esimd_kernels_vllm::esimd_resadd_norm_gemv2_fp8_pert": [
        "csrc/xpu/esimd_kernel.sycl:427",
        "csrc/xpu/esimd_kernel.sycl:430",
        "csrc/xpu/esimd_kernel.sycl:434",
    ],
    "custom_esimd_kernels_vllm::esimd_scaled_resadd_norm_gemv_fp8_pert": [
        "csrc/xpu/esimd_kernel.sycl:602",
        "csrc/xpu/esimd_kernel.sycl:606",
    ],
    "esimd_topk_v2::topk_v2": [
        "csrc/xpu/esimd_kernel_topk_v2.sycl:31",
        "csrc/xpu/esimd_kernel_topk_v2.sycl:46",
    ],
    "_xpu_C::fp8_gemm_out": [
        "csrc/xpu/onednn/onednn_matmul.cpp:138",
        "csrc/xpu/onednn/onednn_matmul.cpp:161",
    ],
    "_xpu_C::topk_topp_sampler": ["csrc/xpu/sampler/topk_topp_sampler.cpp:62"],
    "_xpu_C::cutlass_grouped_gemm_interface": [
        "csrc/xpu/grouped_gemm/grouped_gemm_interface.cpp:26"
    ],
}

# what each op's report cites
CITED = {
    op: EVIDENCE[op.split("::")[0]]
    + (f": {', '.join(WHERE[op])}" if op in WHERE else "")
    for op in FINDINGS
}

GEMM_SHAPES = "csrc/xpu/esimd_kernel_gemm.sycl"
NORM_SHAPES = "csrc/xpu/esimd_kernel.sycl"
SAMPLER = "vLLM 0.33.0 vllm/v1/sample/ops/topk_topp_sampler.py:201-217 (xpu_sample)"
SAMPLER_ARGS = [
    "i64[B] =-1",  # random_sampled: integers cannot hold NaN
    "f32[B,V] nan",  # logits_to_return (a processed logprobs mode)
    "f32[B,V]",  # logits
    "i64[B] =8",  # k, as int64 (xpu_sample casts it)
    "f32[B] =0.9",  # p
    "processed_logits",  # logprobs_mode
    "i64[2] =0 cpu",  # seeds: [seed, offset], on the CPU
    1.0,  # lambda
]

CASES = {
    ESIMD + "esimd_gemm_fp8_blockscale": (
        {"M": 16, "N": 256, "K": 384},
        [
            "f16[M,K]",
            "fp8bits[N,K]",
            "f32[N/128,K/128] pos",
            "f16[M,N] nan",
            128,
            128,
        ],
        f"{GEMM_SHAPES}:97-138 (its TORCH_CHECKs: 128x128 blocks, K % 128 == 0)",
    ),
    ESIMD + "esimd_gemm_fp8_pert": (
        {"M": 16, "N": 256, "K": 512},
        ["f16[M,K]", "fp8bits[N,K]", "f32[1] pos", "f16[M,N] nan"],
        f"{GEMM_SHAPES}:30-48 (input [M, K], weight [N, K], output [M, N])",
    ),
    ESIMD + "esimd_gemm_int4_pgrp": (
        {"M": 16, "N": 256, "K": 512},
        ["f16[M,K]", "u8[N,K/2]", "f16[N,K/128] pos", "f16[M,N] nan"],
        f"{GEMM_SHAPES}:55-90 (its TORCH_CHECKs: N % 16, K % 128)",
    ),
    ESIMD + "esimd_gemv_fp8_pert": (
        {"N": 256, "K": 512},
        ["f16[1,K]", "fp8bits[N,K]", "f32[1] pos", "f16[1,N] nan"],
        f"{NORM_SHAPES}:88-97 (N, K from the weight)",
    ),
    ESIMD + "esimd_gemv_fp8_pert_fused2": (
        {"N0": 256, "N1": 128, "K": 512},
        [
            "f16[1,K]",
            "fp8bits[N0,K]",
            "f32[1] pos",
            "f16[1,N0] nan",
            "fp8bits[N1,K]",
            "f32[1] pos",
            "f16[1,N1] nan",
        ],
        f"{NORM_SHAPES}:155-170",
    ),
    ESIMD + "esimd_gemv_int4": (
        {"N": 256, "K": 512},
        ["f16[1,K]", "u8[N,K/2]", "f16[N,K/128] pos", "f16[1,N] nan"],
        f"{NORM_SHAPES}:197-209 (input [1, K], weight [N, K/2], scale [N, K/128])",
    ),
    ESIMD + "esimd_gemv_int4_fused2": (
        {"N0": 256, "N1": 128, "K": 512},
        [
            "f16[1,K]",
            "u8[N0,K/2]",
            "f16[N0,K/128] pos",
            "f16[1,N0] nan",
            "u8[N1,K/2]",
            "f16[N1,K/128] pos",
            "f16[1,N1] nan",
        ],
        f"{NORM_SHAPES}:214-229",
    ),
    ESIMD + "esimd_gemv_fp16": (
        {"M": 1, "N": 256, "K": 512},
        ["f16[M,K]", "f16[N,K]", "f16[M,N] nan"],
        f"{NORM_SHAPES}:100-129 (its TORCH_CHECKs)",
    ),
    ESIMD + "esimd_gemv_fp16_gelu_mul": (
        {"N": 256, "K": 512},
        ["f16[1,K]", "f16[2*N,K]", "f16[1,N] nan"],
        f"{NORM_SHAPES}:132-145 (its TORCH_CHECKs: one row, weight [2N, K], "
        "output [1, N]; 133-146 in llm-scaler 25095b4)",
    ),
    ESIMD + "esimd_rms_norm": (
        {"K": 512},
        ["f16[1,K]", "f16[1,K] nan", "f16[K]", 1e-6],
        f"{NORM_SHAPES}:488-501",
    ),
    ESIMD + "esimd_rms_norm_gated": (
        {"R": 4, "V": 128},
        ["f16[R,V]", "f16[R,V]", "f16[V]", "f16[R,V] nan", 1e-6],
        f"{NORM_SHAPES}:467-485 (x, z, output [rows, V])",
    ),
    ESIMD + "esimd_fused_add_rms_norm": (
        {"K": 512},
        ["f16[1,K]", "f16[1,K]", "f16[K]", 1e-6],
        f"{NORM_SHAPES}:504-519 (hidden_states, residual in and out)",
    ),
    ESIMD + "esimd_fused_add_rms_norm_batched": (
        {"R": 4, "K": 512},
        ["f16[R,K]", "f16[R,K]", "f16[K]", 1e-6],
        f"{NORM_SHAPES}:541-557",
    ),
    ESIMD + "esimd_fused_scaled_add_rms_norm": (
        {"K": 512},
        ["f16[1,K]", "f16[1,K]", "f16[K]", 1e-6, 0.5],
        f"{NORM_SHAPES}:522-538",
    ),
    ESIMD + "esimd_norm_add_norm": (
        {"K": 512},
        ["f16[1,K]", "f16[1,K]", "f16[K]", "f16[K]", "f16[1,K] nan", 1e-6, 1e-6],
        f"{NORM_SHAPES}:611-629 (h1 in and out)",
    ),
    ESIMD + "esimd_norm_gemv_norm_fp16": (
        {"N": 128, "K": 512},
        [
            "f16[1,K]",
            "f16[K]",
            "f16[N,K]",
            "f16[K]",
            "f16[1,N] nan",
            "f16[1,K] nan",
            1e-6,
        ],
        f"{NORM_SHAPES}:561-582",
    ),
    ESIMD + "esimd_norm_gemv_fp8_pert": (
        {"HV": 4, "V": 128, "N": 256},
        [
            "f16[HV,V]",
            "f16[HV,V]",
            "f16[V]",
            "fp8bits[N,HV*V]",
            "f32[1] pos",
            "f16[1,N] nan",
            "HV",
            "V",
            1e-6,
        ],
        f"{NORM_SHAPES}:347-372 (K = HV*V)",
    ),
    ESIMD + "esimd_norm_gemv_int4_pert": (
        {"HV": 4, "V": 128, "N": 256},
        [
            "f16[HV,V]",
            "f16[HV,V]",
            "f16[V]",
            "i32[N,HV*V/8]",
            "f16[N,HV*V/128] pos",
            "f16[1,N] nan",
            "HV",
            "V",
            1e-6,
        ],
        f"{NORM_SHAPES}:439-462 (weight [N, K/8] int32, scale [N, K/128])",
    ),
    ESIMD + "esimd_resadd_norm_gemv_fp8_pert": (
        {"N": 128, "K": 512},
        [
            "f16[1,K]",
            "f16[1,K]",
            "f16[K]",
            "fp8bits[N,K]",
            "f32[1] pos",
            "f16[1,N] nan",
            "f16[1,K] nan",
            1e-6,
        ],
        f"{NORM_SHAPES}:315-342",
    ),
    ESIMD + "esimd_resadd_norm_gemv_int4_pert": (
        {"N": 128, "K": 512},
        [
            "f16[1,K]",
            "f16[1,K]",
            "f16[K]",
            "i32[N,K/8]",
            "f16[N,K/128] pos",
            "f16[1,N] nan",
            "f16[1,K] nan",
            1e-6,
        ],
        f"{NORM_SHAPES}:377-402 (weight [N, K/8] int32, scale [N, K/128])",
    ),
    ESIMD + "esimd_moe_gelu_tanh_mul": (
        {"R": 4, "H": 256},
        ["f16[R,2*H]", "f16[R,H] nan", "2*H", "H", "R"],
        "csrc/xpu/esimd_kernel_moe.sycl:148-158, esimd_kernels/moe_ops.h:731 "
        "(input [total_rows, N_gate_up], output [total_rows, N_half])",
    ),
    ESIMD + "esimd_moe_topk": (
        {"T": 2},
        ["f16[T,128]", "f16[T,8] nan", "i32[T,8] =-1", "T"],
        "csrc/xpu/esimd_kernel_moe.sycl:71-83, esimd_kernels/moe_ops.h:278-375 "
        "(router_logits [T, 128] fp16: 128 experts, top 8 fixed; top_values "
        "[T, 8] fp16, top_indices [T, 8] int32)",
    ),
    "_xpu_C::fp8_gemm_out": (
        {"M": 16, "N": 256, "K": 384},
        ["bf16[M,N] nan", "fp8e4m3[M,K]", "fp8e4m3[N,K].t", None, None, None, None],
        "the opcheck grid's fp8_gemm_out case (xpu_gemm_reference.py "
        "_fp8_gemm_out_args: out [M, N], A [M, K], B [K, N] as a transposed "
        "[N, K])",
    ),
    "_xpu_C::topk_topp_sampler": ({"B": 4, "V": 1024}, SAMPLER_ARGS, SAMPLER),
    "vllm::xpu_topk_topp_sampler": ({"B": 4, "V": 1024}, SAMPLER_ARGS, SAMPLER),
}

_NOT_COMPILED = (
    "no traced call of it on the trees audited (data/schema_contracts.toml "
    "lists none): no case written"
)
NO_CASE = {
    **{
        op: _NOT_COMPILED
        for op in FINDINGS
        if op not in CASES and op.startswith(("custom_esimd", "esimd_topk"))
    },
    "_xpu_C::cutlass_grouped_gemm_interface": (
        "its arguments (rows sorted by expert, rows_per_expert, CUTLASS "
        "layouts) are not derived here; it runs inside the opaque "
        "vllm::moe_forward, not compiled"
    ),
}
