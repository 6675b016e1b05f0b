"""vllm::sparse_attn_indexer of a tree, run eager and compiled (aot_eager,
Inductor, and Inductor with torch's aliasing check strict), on this CPU:
does a compiled call return the buffer the op writes, with the values
eager gives? (`make stage PR=indexer`'s validation, before and after.)

The tree's module registers the op as it is (its schema, its fake, its
registration). What cannot run here is the implementation's body (the
indexer's CUDA/ROCm/XPU kernels): its innermost function's code is replaced
by a stand-in that writes the buffer (the row-wise argsort of
hidden_states, as int32) and returns it, as the real implementation
returns it. The caller is the one the tree's callers are: it returns the
op's result where the schema returns a tensor, else calls the op and
returns the buffer it passed (what changes/indexerop.py makes of them).

    python -m xpufakes.proof.indexercompile TREE MODULE IMPL --json-out FILE

Needs torch; run in a process of its own, the tree first on sys.path
(registrations are global).
"""

import argparse
import importlib
import json
import os
import sys
import warnings
from pathlib import Path

OP = "sparse_attn_indexer"
BUFFER = "topk_indices_buffer"
STRICT = "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING"
ROWS, COLUMNS = 4, 8
# (name, torch.compile backend, torch's aliasing check strict)
RUNS = (
    ("aot_eager", "aot_eager", False),
    ("inductor", "inductor", False),
    ("inductor, strict", "inductor", True),
)


def _stand_in(index: int):
    """A function without closure whose code writes args[index]."""
    namespace: dict = {}
    exec(  # noqa: S102 - a fixed text; its only variable is an int
        "def stand_in(*args, **kwargs):\n"
        f"    buffer = args[{int(index)}]\n"
        "    order = args[0][:, : buffer.shape[1]].argsort(dim=-1)\n"
        "    buffer.copy_(order.to(buffer.dtype))\n"
        "    return buffer\n",
        namespace,
    )
    return namespace["stand_in"]


def _replace_body(module, impl: str, index: int) -> None:
    function = getattr(module, impl)
    while hasattr(function, "__wrapped__"):  # through its decorators
        function = function.__wrapped__
    function.__code__ = _stand_in(index).__code__
    function.__defaults__ = function.__kwdefaults__ = None


def _arguments(schema, torch) -> list:
    """A value for each argument without a default: small CPU tensors, the
    buffer int32, None where a tensor is optional."""
    values = []
    for argument in schema.arguments:
        if argument.has_default_value():
            break
        kind = str(argument.type)
        if argument.name == BUFFER:
            values.append(torch.zeros(ROWS, COLUMNS, dtype=torch.int32))
        elif kind.startswith("Optional"):
            values.append(None)
        elif kind == "Tensor":
            values.append(torch.randn(ROWS, 2 * COLUMNS))
        elif kind in ("int", "SymInt"):
            values.append(COLUMNS)
        elif kind == "bool":
            values.append(False)
        elif kind in ("str", "PyObject"):
            values.append("model.layers.0.indexer")
        elif kind == "float":
            values.append(1.0)
        else:
            raise SystemExit(
                f"{argument.name}: no value for an argument of type {kind}"
            )
    return values


def measure(module_name: str, impl: str) -> dict:
    import torch

    module = importlib.import_module(module_name)
    op = getattr(torch.ops.vllm, OP).default
    schema = op._schema
    names = [a.name for a in schema.arguments]
    index = names.index(BUFFER)
    _replace_body(module, impl, index)
    arguments = _arguments(schema, torch)
    returns_nothing = not schema.returns

    def caller(*values):
        out = getattr(torch.ops.vllm, OP)(*values)
        return values[index] if returns_nothing else out

    def fresh():
        return [v.clone() if isinstance(v, torch.Tensor) else v for v in arguments]

    eager_args = fresh()
    eager = caller(*eager_args)
    result = {
        "schema": str(schema),
        "returns": [str(r.type) for r in schema.returns],
        "eager": {
            "buffer": eager.data_ptr() == eager_args[index].data_ptr(),
            "written": bool(eager_args[index].any()),
        },
    }
    for name, backend, strict in RUNS:
        torch._dynamo.reset()
        values = fresh()
        run: dict = {"error": None, "warning": None}
        with (
            torch._functorch.config.patch(error_on_custom_op_aliasing=strict),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            try:
                out = torch.compile(caller, backend=backend, fullgraph=True)(*values)
            except Exception as e:  # noqa: BLE001 - a result: the call fails
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                run["error"] = f"{type(e).__name__}: {(lines or [''])[0][:300]}"
            else:
                run["buffer"] = out.data_ptr() == values[index].data_ptr()
                run["equal"] = bool(
                    torch.equal(out, eager) and torch.equal(values[index], eager)
                )
        for warning in caught:
            text = str(warning.message)
            if "alias" in text:
                run["warning"] = " ".join(text.split())[:300]
        result[name] = run
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufakes.proof.indexercompile")
    parser.add_argument("tree", type=Path)
    parser.add_argument("module", help="the module that registers the op")
    parser.add_argument("impl", help="the implementation's name in that module")
    parser.add_argument("--json-out", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.pop(STRICT, None)  # it would force one mode over both runs
    sys.path.insert(0, str(args.tree.absolute()))
    result = measure(args.module, args.impl)
    args.json_out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
