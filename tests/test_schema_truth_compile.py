"""Why schema truth fails the audit, on CPU with torch.compile (aot_eager):
stand-in ops with the lying schemas of classes (a) and (b), called as the
trees call them, give compiled != eager; the same kernels under the
contract data/schema_contracts.toml gives (the writes marked, nothing
returned, the caller given the argument the kernel returned) give compiled
== eager. `-> Tensor(a!)`, the alias declared, is no way out: functionalization
refuses a custom op whose output has an alias annotation. The stand-ins are
torch ops of this test's own library (nothing XPU is needed for the
mechanism); ~5 s."""

import pytest
import torch

LIB = torch.library.Library("schema_truth_probe", "DEF")
SCHEMAS = {
    # (b): llm-scaler's GEMMs, vllm::sparse_attn_indexer
    "lie_b": "lie_b(Tensor(a!) buf, Tensor x) -> Tensor",
    "alias_b": "alias_b(Tensor(a!) buf, Tensor x) -> Tensor(a!)",
    # (a): the write hidden, the result dropped (esimd_gemm_fp8_blockscale)
    "lie_a": "lie_a(Tensor x, Tensor out) -> Tensor",
    # the contract: the write marked, nothing returned
    "contract": "contract(Tensor x, Tensor(a!) out) -> ()",
}
for _schema in SCHEMAS.values():
    LIB.define(_schema)


def _b(buf, x):
    buf.copy_(x * 3)
    return buf


def _a(x, out):
    out.copy_(x * 3)
    return out


def _contract(x, out):
    out.copy_(x * 3)


LIB.impl("lie_b", _b, "CPU")
LIB.impl("alias_b", _b, "CPU")
LIB.impl("lie_a", _a, "CPU")
LIB.impl("contract", _contract, "CPU")
torch.library.register_fake("schema_truth_probe::lie_b", lambda buf, x: buf, lib=LIB)
torch.library.register_fake("schema_truth_probe::alias_b", lambda buf, x: buf, lib=LIB)
torch.library.register_fake(
    "schema_truth_probe::lie_a", lambda x, out: torch.empty_like(out), lib=LIB
)
torch.library.register_fake(
    "schema_truth_probe::contract", lambda x, out: None, lib=LIB
)
OPS = torch.ops.schema_truth_probe


def _by_contract(buf, x):
    """The contract's wrapper: the op returns nothing, the caller gets the
    argument the kernel returns (callee_returns = "buf")."""
    OPS.contract(x, buf)
    return buf


def _result_then_write(op):
    def program(buf, x):
        out = op(buf, x)
        buf.add_(1)  # a later write the result aliases in eager
        return out * 2

    return program


def _result_dropped(op):
    def program(x):
        out = torch.zeros(4)
        op(x, out)
        return out

    return program


def _both(program, *make):
    eager = program(*(m() for m in make))
    torch._dynamo.reset()
    compiled = torch.compile(program, backend="aot_eager", fullgraph=True)
    return eager, compiled(*(m() for m in make))


def _zeros():
    return torch.zeros(4)


def _x():
    return torch.arange(4.0)


@pytest.mark.filterwarnings("ignore:.*must not also be an input")
def test_b_an_undeclared_alias_differs_compiled_and_the_contract_does_not():
    eager, compiled = _both(_result_then_write(OPS.lie_b), _zeros, _x)
    assert eager.tolist() == [2.0, 8.0, 14.0, 20.0]  # the result is buf, +1
    assert compiled.tolist() == [0.0, 6.0, 12.0, 18.0]  # a copy taken before
    eager, compiled = _both(_result_then_write(_by_contract), _zeros, _x)
    assert torch.equal(eager, compiled), (eager, compiled)
    with pytest.raises(Exception, match="output has alias annotations"):
        _both(_result_then_write(OPS.alias_b), _zeros, _x)


def test_a_a_hidden_write_is_lost_compiled_and_the_contract_keeps_it():
    eager, compiled = _both(_result_dropped(OPS.lie_a), _x)
    assert eager.tolist() == [0.0, 3.0, 6.0, 9.0]
    assert compiled.tolist() == [0.0, 0.0, 0.0, 0.0]  # the call was dead code
    eager, compiled = _both(_result_dropped(OPS.contract), _x)
    assert torch.equal(eager, compiled), (eager, compiled)
