"""Why schema truth fails the audit, on CPU with torch.compile (aot_eager):
stand-in ops with the lying schemas of classes (a) and (b), called as the
trees call them, give compiled != eager; the same kernels under the
contract data/schema_contracts.toml gives (the writes marked, nothing
returned, the caller given the argument the kernel returned) give compiled
== eager. `-> Tensor(a!)`, the alias declared, is no way out: functionalization
refuses a custom op whose output has an alias annotation. The stand-ins are
torch ops of this test's own library (nothing XPU is needed for the
mechanism); ~5 s. Then the fix itself: the generated module and the
recipe's output, compiled (aot_eager, Inductor) against the tree as it is
(below; forked, ~15 s); and the fused GEMV's o1, which an op marking o0
only loses under Inductor (forked, ~12 s); the compiler's traps for the
fix's form (PyTorch #198031's clone beside its source, a reused buffer;
forked, ~6 s)."""

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


# ---------------------------------------------------------------------------
# The fix itself (issue 42, item 2), at op level: the real generated
# vllm/_xpu_opaque_calls.py (the overlay's, loaded into a pinned vLLM's
# package, with vLLM's own direct_register_custom_op) and the real recipe
# output of a tree's code, an ESIMD-like tree's (tests/support/downstream.py),
# compiled with aot_eager and Inductor. Stubbed: the image's ESIMD package
# (XPU-only): support/esimd_standin.py, its block-FP8 GEMM with the real
# schema, whose CPU kernel really writes its output buffer. Forked: it
# registers ops and modules. ~15 s (the vLLM import and the overlay's ops
# ~8 s, Inductor ~3 s).
# ---------------------------------------------------------------------------


def _overlay_in_vllm():
    """The overlay's vllm/_xpu_opaque_calls.py as vllm._xpu_opaque_calls of
    a pinned release's package (its ops registered for the CPU platform)."""
    import importlib.util
    import sys

    from support import downstream, releases
    from xpufakes.changes import recipes
    from xpufakes.common import paths

    sys.path.insert(0, str(releases.pristine(downstream.ESIMD_BASE)))
    import vllm

    name = "vllm._xpu_opaque_calls"
    spec = importlib.util.spec_from_file_location(
        name, paths.OVERLAY / recipes.OPAQUE_MODULE
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    vllm._xpu_opaque_calls = module
    return module


def _module(name: str, text: str):
    import sys
    import types

    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(text, name, "exec"), module.__dict__)
    return module


@pytest.mark.forked
def test_the_fix_compiled_equals_eager_and_the_tree_unpatched_does_not():
    from support import downstream, esimd_standin
    from xpufakes.changes import recipes

    ran: list = []
    lib = esimd_standin.define(ran)  # noqa: F841 - kept alive
    calls = _overlay_in_vllm()
    assert calls.CONTRACTS["custom_esimd_kernels_vllm.esimd_gemm_fp8_blockscale"][
        2
    ] == ("output",)
    a, b, scales = esimd_standin.block_inputs()
    gemm = esimd_standin.BLOCK_GEMM

    def results(utils_text: str) -> dict:
        _module("vllm.model_executor.layers.esimd_utils", utils_text)
        block = _module("xpu_block_esimd", downstream.ESIMD_BLOCK_TEXT)
        assert recipes.edit_opaque_calls(downstream.ESIMD_BLOCK_TEXT) == (
            downstream.ESIMD_BLOCK_TEXT
        )  # the caller is left as it is: its name comes from esimd_utils
        ran.clear()
        found = {"eager": (block.apply_block_scaled_mm(a, b, scales, 128, 128), ran[:])}
        for backend in ("aot_eager", "inductor"):
            torch._dynamo.reset()
            ran.clear()
            compiled = torch.compile(
                block.apply_block_scaled_mm, backend=backend, fullgraph=True
            )
            found[backend] = (compiled(a, b, scales, 128, 128), ran[:])
        return found

    # negative control: the tree as it is: compiled, the kernel never runs
    # (its call is dead code) and the caller gets the empty buffer
    unpatched = results(downstream.ESIMD_UTILS_TEXT)
    eager, kernels = unpatched["eager"]
    assert eager.shape == (2, 320) and kernels == [gemm]
    for backend in ("aot_eager", "inductor"):
        compiled, kernels = unpatched[backend]
        assert kernels == [], backend
        assert not torch.equal(compiled, eager), backend
    # the fix: the recipe's output, the same call through vllm::<op>
    patched_text = recipes.edit_opaque_calls(downstream.ESIMD_UTILS_TEXT)
    assert 'as_custom_op(\n        "esimd_gemm_fp8_blockscale"' in patched_text
    patched = results(patched_text)
    for backend in ("eager", "aot_eager", "inductor"):
        result, kernels = patched[backend]
        assert kernels == [gemm], backend
        assert torch.equal(result, eager), backend


# The fused GEMV of b18beee (esimd_gemv_int4_fused2: esimd_kernel.sycl:214,
# int4_GEMV.h's fused host): it writes o0 and o1 and returns o0. Before
# kernelcxx followed the kernels, the contract marked o0 only (issue 51).
FUSED2 = "esimd_gemv_int4_fused2"


def _fused2_inputs():
    generator = torch.Generator().manual_seed(0)
    k, n0, n1 = 256, 32, 16

    def packed(n):
        return torch.randint(0, 256, (n, k // 2), generator=generator).to(torch.uint8)

    def scales(n):
        return (torch.rand(n, k // 128, generator=generator) / 16).half()

    x = torch.randn(1, k, generator=generator).half()
    return x, packed(n0), scales(n0), packed(n1), scales(n1)


def _fused2_caller(op):
    """As the trees call it: fresh output buffers (NaN, as vLLM's
    torch.empty may hold), the result dropped, both outputs read after."""

    def caller(x, w0, s0, w1, s1):
        o0 = torch.full((1, w0.shape[0]), float("nan"), dtype=x.dtype)
        o1 = torch.full((1, w1.shape[0]), float("nan"), dtype=x.dtype)
        op(x, w0, s0, o0, w1, s1, o1)
        return o0 * 1, o1 * 1

    return caller


@pytest.mark.forked
def test_an_undeclared_o1_write_of_the_fused_gemv_is_lost_under_inductor():
    """The overlay's vLLM op of esimd_gemv_int4_fused2 marks o0 and o1:
    compiled with Inductor it equals eager. Negative control: the same
    kernel behind an op that marks o0 only (the old contract): Inductor
    folds the NaN fill of o1 into its read, and o1's values are lost."""
    import sys
    import types

    from xpufakes.proof.static import schematruth
    from xpufakes.proof.xpu import esimd_kernels

    kernel = esimd_kernels.REFERENCES[FUSED2]
    data = schematruth.load_data()["esimd"]["b18beee"]["ops"]
    lib = torch.library.Library(schematruth.ESIMD_PACKAGE, "DEF")  # noqa: F841
    lib.define(data[f"{schematruth.ESIMD_PACKAGE}::{FUSED2}"]["schema"])
    lib.impl(FUSED2, kernel, "CPU")
    package = types.ModuleType(schematruth.ESIMD_PACKAGE)
    package.esimd_gemv_int4_fused2 = getattr(
        torch.ops.custom_esimd_kernels_vllm, FUSED2
    )
    sys.modules[schematruth.ESIMD_PACKAGE] = package
    calls = _overlay_in_vllm()
    assert calls.CONTRACTS[f"{schematruth.ESIMD_PACKAGE}.{FUSED2}"][2] == ("o0", "o1")

    @torch.library.custom_op("o1_probe::marks_o0", mutates_args=("o0",))
    def marks_o0(
        input: torch.Tensor,
        w0: torch.Tensor,
        s0: torch.Tensor,
        o0: torch.Tensor,
        w1: torch.Tensor,
        s1: torch.Tensor,
        o1: torch.Tensor,
    ) -> None:
        kernel(input, w0, s0, o0, w1, s1, o1)

    inputs = _fused2_inputs()

    def both(op):
        eager = _fused2_caller(op)(*inputs)
        torch._dynamo.reset()
        compiled = torch.compile(_fused2_caller(op), backend="inductor", fullgraph=True)
        return eager, compiled(*inputs)

    (e0, e1), (c0, c1) = both(getattr(torch.ops.vllm, FUSED2))
    assert not e0.isnan().any() and not e1.isnan().any()  # the kernel wrote both
    assert torch.equal(c0, e0) and torch.equal(c1, e1)
    (e0, e1), (c0, c1) = both(torch.ops.o1_probe.marks_o0)
    assert torch.equal(c0, e0)
    assert c1.isnan().all() and not e1.isnan().any()  # o1's write lost


# (e): vLLM's own fake of its DeepSeek rope op (vllm/_xpu_ops.py, 0.18 and
# later) returns its arguments (query, key); the kernel returns new tensors
# (vllm-xpu-kernels deepseek_scaling_rope.cpp@4543b58: empty_like).
ROPE_FAKE = "_xpu_ops_deepseek_scaling_rope_fake"
ROPE_SCHEMA = (
    "(Tensor positions, Tensor query, Tensor? key, Tensor? offsets, "
    "Tensor? cos_sin_cache, int rotary_dim, bool is_neox_style) -> (Tensor, Tensor)"
)


def _pinned_function(version: str, path: str, name: str):
    """A module-level function of a pinned release's file, as it is there
    (its source executed alone, with torch)."""
    import ast

    from support import releases

    text = (releases.pristine(version) / path).read_text()
    (node,) = [
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.FunctionDef) and n.name == name
    ]
    namespace = {"torch": torch}
    exec(compile(ast.Module([node], []), path, "exec"), namespace)
    return namespace[name]


@pytest.mark.forked
def test_e_a_fake_that_returns_its_arguments_makes_compiled_differ():
    """The op with vLLM 0.33.0's own fake (its source, from the sdist) and a
    CPU kernel that returns new tensors, as the XPU kernel does: a caller
    that uses the rotated query beside the query gets another sum compiled
    (torch takes the output and the input for one tensor: rotated +
    rotated), with aot_eager and Inductor.
    Negative control: the same kernel with a fake of new tensors."""
    vllm_fake = _pinned_function("0.33.0", "vllm/_xpu_ops.py", ROPE_FAKE)

    def kernel(positions, query, key, offsets, cos_sin_cache, rotary_dim, neox):
        return query * 2 + positions[:, None], key * 3

    def new_tensors(positions, query, key, offsets, cos_sin_cache, rotary_dim, neox):
        return torch.empty_like(query), torch.empty_like(key)

    lib = torch.library.Library("e_probe", "DEF")  # noqa: F841 - kept alive
    for name, fake in (("vllms_fake", vllm_fake), ("exact_fake", new_tensors)):
        lib.define(name + ROPE_SCHEMA)
        lib.impl(name, kernel, "CPU")
        torch.library.register_fake(f"e_probe::{name}", fake, lib=lib)

    def caller(op):
        def f(positions, query, key):
            rotated, _ = op(positions, query, key, None, None, 8, False)
            return rotated + query

        return f

    def run(name: str, backend: str):
        op = getattr(torch.ops.e_probe, name)
        positions, query, key = torch.arange(4.0), torch.ones(4, 8), torch.ones(4, 8)
        eager = caller(op)(positions, query, key)
        torch._dynamo.reset()
        compiled = torch.compile(caller(op), backend=backend, fullgraph=True)
        return eager, compiled(positions, query, key)

    for backend in ("aot_eager", "inductor"):
        eager, compiled = run("vllms_fake", backend)
        rotated = eager - torch.ones(4, 8)  # eager: rotated + query
        assert not torch.equal(eager, compiled), backend
        # compiled, the output and the input are one tensor: rotated + rotated
        assert torch.equal(compiled, rotated * 2), backend
        eager, compiled = run("exact_fake", backend)
        assert torch.equal(eager, compiled), backend


# The compiler's own traps for the fix's form (a vLLM op that marks what it
# writes and returns nothing): PyTorch #198031 (open) reports that
# `y = x.clone(); op(y, x)`, op writing y, can become op(x, x) under
# compile; and an output buffer the model keeps and reuses layer after
# layer. Both on the overlay's vLLM op of esimd_rms_norm (input, output,
# weight, eps: writes output) with its CPU reference, and on a bare probe
# op of the same form.


def _rms_norm_op():
    import sys
    import types

    from xpufakes.proof.static import schematruth
    from xpufakes.proof.xpu import esimd_kernels

    name = "esimd_rms_norm"
    data = schematruth.load_data()["esimd"]["b18beee"]["ops"]
    lib = torch.library.Library(schematruth.ESIMD_PACKAGE, "DEF")
    lib.define(data[f"{schematruth.ESIMD_PACKAGE}::{name}"]["schema"])
    lib.impl(name, esimd_kernels.REFERENCES[name], "CPU")
    package = types.ModuleType(schematruth.ESIMD_PACKAGE)
    package.esimd_rms_norm = getattr(torch.ops.custom_esimd_kernels_vllm, name)
    sys.modules[schematruth.ESIMD_PACKAGE] = package
    calls = _overlay_in_vllm()
    assert calls.CONTRACTS[f"{schematruth.ESIMD_PACKAGE}.{name}"][2] == ("output",)
    return lib, torch.ops.vllm.esimd_rms_norm


@pytest.mark.forked
def test_the_fix_form_keeps_a_clone_beside_its_source_and_a_reused_buffer():
    """Under Inductor and aot_eager: the written clone and its untouched
    source stay two tensors (#198031's pattern), and a buffer written by two
    calls gives each call's values to what read it in between; compiled
    equals eager, on torch 2.13 (pinned here). Negative control: the same
    callers with the op's write undeclared (the lying schema's form) differ
    compiled."""
    lib, rms_norm = _rms_norm_op()  # noqa: F841 - lib kept alive

    @torch.library.custom_op("trap_probe::undeclared", mutates_args=())
    def undeclared(
        input: torch.Tensor, output: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> None:
        output.copy_(
            input * torch.rsqrt(input.pow(2).mean(-1, keepdim=True) + eps) * weight
        )

    undeclared.register_fake(lambda input, output, weight, eps: None)

    def clone_beside(op):
        def f(x, w):
            y = x.clone()
            op(x, y, w, 1e-6)  # y written from x: x must stay as it was
            return y * 1, x * 1

        return f

    def reused(op):
        def f(x1, x2, w):
            buf = torch.full_like(x1, float("nan"))
            op(x1, buf, w, 1e-6)
            first = buf * 1
            op(x2, buf, w, 1e-6)
            return first, buf * 1

        return f

    generator = torch.Generator().manual_seed(0)
    x1, x2 = (torch.randn(1, 128, generator=generator).half() for _ in range(2))
    w = (torch.rand(128, generator=generator) + 0.5).half()
    cases = {clone_beside: (x1, w), reused: (x1, x2, w)}

    def differs(make, op, backend) -> bool:
        args = cases[make]
        eager = make(op)(*[a.clone() for a in args])
        torch._dynamo.reset()
        compiled = torch.compile(make(op), backend=backend, fullgraph=True)
        got = compiled(*[a.clone() for a in args])
        return not all(torch.equal(a, b) for a, b in zip(eager, got, strict=True))

    for backend in ("aot_eager", "inductor"):
        for make in cases:
            assert not differs(make, rms_norm, backend), (make.__name__, backend)
    # the control: the write undeclared, the reused buffer's NaN fill is
    # what Inductor reads
    assert differs(reused, torch.ops.trap_probe.undeclared, "inductor")


@pytest.mark.forked
def test_an_op_returning_a_declared_alias_compiles_through_routed():
    """llm-scaler's esimd_norm_gemv_fp8_blockscale (b18beee's schema:
    `-> Tensor(a!)`, its output): called as its tree calls it, compiling
    fails (functionalization refuses a custom op with an alias annotation on
    its output: the control); through the overlay's `routed(...)`, the
    recipe's form where the result is used (issue 50), compiled equals eager
    with aot_eager and Inductor, the caller given the output buffer itself.
    Stubbed: the kernel (a CPU stand-in that writes output from x and z,
    and returns it; the math is not the point)."""
    import sys
    import types

    from xpufakes.proof.static import schematruth

    name = "esimd_norm_gemv_fp8_blockscale"
    qualified = f"{schematruth.ESIMD_PACKAGE}::{name}"
    schema = schematruth.load_data()["esimd"]["b18beee"]["ops"][qualified]["schema"]
    assert schema.endswith("Tensor(a!) output, int HV, int V, float eps) -> Tensor(a!)")

    def kernel(x, z, norm_weight, gemv_weight, gemv_scale, output, hv, v, eps):
        normed = (x * torch.sigmoid(z)).reshape(1, -1) * norm_weight.reshape(1, -1)
        output.copy_(normed.float() @ gemv_weight.float().t() * gemv_scale.float())
        return output

    lib = torch.library.Library(schematruth.ESIMD_PACKAGE, "DEF")  # noqa: F841
    lib.define(schema)
    lib.impl(name, kernel, "CPU")
    torch.library.register_fake(qualified, lambda *a: a[5], lib=lib)
    package = types.ModuleType(schematruth.ESIMD_PACKAGE)
    setattr(package, name, getattr(torch.ops.custom_esimd_kernels_vllm, name))
    sys.modules[schematruth.ESIMD_PACKAGE] = package
    calls = _overlay_in_vllm()
    contract = calls.CONTRACTS[f"{schematruth.ESIMD_PACKAGE}.{name}"]
    assert contract[2] == ("output",) and contract[3] == ""

    def caller(f):
        def forward(x, z, nw, gw, gs):
            output = torch.empty(1, gw.shape[0])
            out = f(x, z, nw, gw, gs, output, 2, 4, 1e-6)
            return out * 1, out is output

        return forward

    generator = torch.Generator().manual_seed(0)
    x, z = (
        torch.randn(2, 4, generator=generator),
        torch.randn(2, 4, generator=generator),
    )
    nw, gw = torch.rand(8, generator=generator), torch.randn(16, 8, generator=generator)
    gs = torch.tensor(0.5)
    eager, same = caller(calls.routed(name))(x, z, nw, gw, gs)
    assert same and not eager.isnan().any()
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        compiled = torch.compile(
            caller(calls.routed(name)), backend=backend, fullgraph=True
        )
        got, _ = compiled(x, z, nw, gw, gs)
        assert torch.equal(got, eager), backend
    # the control: the kernel op itself, compiled
    torch._dynamo.reset()
    direct = getattr(package, name)
    with pytest.raises(Exception, match="alias"):
        torch.compile(caller(direct), backend="aot_eager", fullgraph=True)(
            x, z, nw, gw, gs
        )
