"""vllm::ipex_woq_linear, as the patched IPEX-era trees define it: what it
holds and what a traced graph holds.

* A wrapped IPEX WOQ module is freed once its layer is gone (the old design,
  a process-wide list of modules, kept every one alive).
* A compiled graph names no module by a process-order number: two models
  built in one process in either order trace to the same graph, and a graph
  compiled for one model, run with another model's inputs (what reusing
  vLLM's compile cache does), calls that model's modules.

Each test imports the tree's vllm/_ipex_woq_linear.py in a forked process,
with the reference torch_ipex WOQ kernels.
"""

import gc
import weakref

import pytest
import torch

from support import releases, standins
from xpufakes.proof.xpu import reference as reference_kernels

pytestmark = pytest.mark.forked

RELEASES = ("0.10.2", "0.14.1")  # the first and last IPEX-era series
K, N, GROUP = 128, 64, 32


def _load(release: str):
    return standins.import_ipex_woq_linear(releases.patched(release), release)


def _module(seed: int, k: int = K, n: int = N):
    """A reference IPEX WOQ module (GPTQ, oneDNN layout) with weights from
    `seed`."""
    ref = reference_kernels.reference()
    torch.manual_seed(seed)
    pack = ref.pack_int4_rows
    return ref.ReferenceWOQLinear.from_weight(
        pack(torch.randint(0, 16, (k, n))),
        (torch.rand(k // GROUP, n) / 8).to(torch.float16),
        pack(torch.randint(0, 16, (n, k // GROUP))).t().contiguous(),
        k,
        n,
        bias=None,
        group_size=GROUP,
        g_idx=None,
        quant_method=0,
        engine="onednn",
        w4a8=False,
    )


class _Layer(torch.nn.Module):
    """A linear layer as the IPEX methods leave it: ipex_qlinear is the
    wrapped module."""

    def __init__(self, wrap, module, out_features):
        super().__init__()
        self.ipex_qlinear = wrap(module, out_features)

    def forward(self, x):
        return self.ipex_qlinear(x)


class _Model(torch.nn.Module):
    def __init__(self, wrap, seed: int):
        super().__init__()
        self.up = _Layer(wrap, _module(seed), N)
        self.down = _Layer(wrap, _module(seed + 1, k=N, n=K), K)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(x)))


class _OldListWrapper(torch.nn.Module):
    """The design this replaced, for the negative controls: the op took the
    module's index in a process-wide list."""

    MODULES: list = []

    def __init__(self, module, out_features):
        super().__init__()
        self.module = module
        self.handle = len(self.MODULES)
        self.out_features = out_features
        self.MODULES.append(module)

    def forward(self, x):
        return torch.ops.woq_old_design.linear(x, self.handle, self.out_features)


@torch.library.custom_op("woq_old_design::linear", mutates_args=())
def _old_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return _OldListWrapper.MODULES[handle](x)


@_old_linear.register_fake
def _(x, handle, out_features):
    return x.new_empty((*x.shape[:-1], out_features))


def _freed_after_layer_is_gone(wrap) -> bool:
    module = _module(0)
    alive = weakref.ref(module)
    layer = _Layer(wrap, module, N)
    del module
    if not isinstance(layer.ipex_qlinear, _OldListWrapper):
        x = torch.randn(3, K, dtype=torch.float16)
        assert layer(x).shape == (3, N)
    del layer
    gc.collect()
    return alive() is None


@pytest.mark.parametrize("woq_release", RELEASES)
def test_a_wrapped_module_is_freed_with_its_layer(woq_release):
    libraries, woq = _load(woq_release)  # noqa: F841
    assert _freed_after_layer_is_gone(woq.opaque_ipex_woq_linear)
    assert len(woq._MODULES) == 0


def test_the_old_list_design_keeps_it_alive():
    """Negative control: the same check fails on the old design."""
    assert not _freed_after_layer_is_gone(_OldListWrapper)


def _call(model, x):
    # vLLM compiles the model's forward with the model an input (its
    # buffers become graph inputs); so does this.
    return model(x)


def _captured(model, x):
    """Trace model(x) with Dynamo; return the FX graph, its example inputs,
    and the Inductor-compiled graph."""
    from torch._inductor.compile_fx import compile_fx

    seen = {}

    def backend(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, list(example_inputs)
        seen["compiled"] = compile_fx(gm, example_inputs)
        return seen["compiled"]

    torch._dynamo.reset()
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        torch.compile(_call, backend=backend, fullgraph=True)(model, x)
    return seen["gm"], seen["inputs"], seen["compiled"]


def _inputs_for(other, model, inputs, keys: int = 2):
    """`inputs` (captured from `model`) with model's tensors replaced by the
    same tensors of `other`: what a cached graph is called with for another
    model."""
    mine = dict(model.named_buffers()) | dict(model.named_parameters())
    theirs = dict(other.named_buffers()) | dict(other.named_parameters())
    by_id = {id(t): theirs[name] for name, t in mine.items()}
    assert sum(id(t) in by_id for t in inputs) == keys
    return [by_id.get(id(t), t) for t in inputs]


def _two_orders(wrap, keys: int) -> tuple[bool, list[bool]]:
    """Build models A, B, then B, A (the same weights per name); compile A's
    first graph. Whether A's two graphs have the same code, and for each
    model whether A's compiled graph, run with that model's inputs, gives
    that model's result."""
    x = torch.randn(5, K, dtype=torch.float16)
    a1, b1 = _Model(wrap, 10), _Model(wrap, 20)
    b2, a2 = _Model(wrap, 20), _Model(wrap, 10)
    with torch.no_grad():
        assert not torch.allclose(a1(x), b1(x))  # the models differ
    gm1, inputs1, compiled1 = _captured(a1, x)
    gm2, _, _ = _captured(a2, x)
    own = []
    for model in (a1, b1, b2, a2):
        with torch.no_grad():
            expected = model(x)
        (got,) = compiled1(*_inputs_for(model, a1, inputs1, keys))
        own.append(torch.allclose(got, expected, rtol=1e-3, atol=1e-3))
    return gm1.code == gm2.code, own


@pytest.mark.parametrize("woq_release", RELEASES)
def test_models_built_in_either_order_trace_alike_and_call_their_own_modules(
    woq_release,
):
    libraries, woq = _load(woq_release)  # noqa: F841
    same_code, own = _two_orders(woq.opaque_ipex_woq_linear, keys=2)
    # no process-order number in the graph: the same code either way
    assert same_code
    assert own == [True, True, True, True]


def test_the_old_design_bakes_in_process_order_and_calls_the_wrong_module():
    """Negative control: with the old list design A's graphs differ by the
    order the models were built in, and A's graph calls A's modules for B."""
    library = reference_kernels.reference().define_torch_ipex_woq_kernels()  # noqa: F841
    same_code, own = _two_orders(_OldListWrapper, keys=0)
    assert not same_code
    assert own == [True, False, False, True]
