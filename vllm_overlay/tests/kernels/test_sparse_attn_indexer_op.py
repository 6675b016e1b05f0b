# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vllm::sparse_attn_indexer writes topk_indices_buffer and must return
nothing: an op whose schema returns one of its mutated arguments as a plain
Tensor aliases an input undeclared, and a compiled graph that runs it (graph
partition, splitting_ops emptied, or a mode that compiles the model whole)
gets a copy of the buffer, with torch's warning that such an alias is
deprecated and will become an error.

Runs on any platform: it reads the registered schema, nothing runs.

Run: pytest tests/kernels/test_sparse_attn_indexer_op.py
"""

import importlib
import importlib.util

import torch

# where the op is registered: its own module (0.15.0 on), DeepSeek V2's before
MODULES = (
    "vllm.model_executor.layers.sparse_attn_indexer",
    "vllm.model_executor.models.deepseek_v2",
)


def _schema() -> torch.FunctionSchema:
    for name in MODULES:
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name)
        if hasattr(torch.ops.vllm, "sparse_attn_indexer"):
            return torch.ops.vllm.sparse_attn_indexer.default._schema
    raise AssertionError(f"none of {', '.join(MODULES)} registers the op")


def test_sparse_attn_indexer_declares_its_write_and_returns_nothing():
    schema = _schema()
    written = {
        a.name
        for a in schema.arguments
        if a.alias_info is not None and a.alias_info.is_write
    }
    assert "topk_indices_buffer" in written, str(schema)
    assert not schema.returns, str(schema)
