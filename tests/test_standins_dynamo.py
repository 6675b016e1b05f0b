"""The stand-ins look to Dynamo as the real things do (scripts/xpufakes/
proof/xpu): a trace through each fails the way it fails on an
XPU host, and the stand-ins used before (or registered the wrong way) are
the negative controls that show why each detail matters.

Forked: the stand-ins define torch_ipex ops and hook the import system.
"""

import importlib.util
import sys
import types

import pytest
import torch

from xpufakes.proof.xpu import extensions, packages
from xpufakes.proof.xpu import ipex as ipex_standin
from xpufakes.trees import natives

pytestmark = pytest.mark.forked


class _Traced(Exception):
    """Raised by the backend: Dynamo traced the whole function (nothing is
    run afterwards; the stand-ins of XPU kernels cannot run on the CPU)."""


def _trace_only(gm, example_inputs):
    raise _Traced


def _compile_error(function, *args, dynamic=None) -> str:
    """'traced', or the error of Dynamo's fullgraph trace."""
    torch._dynamo.reset()
    try:
        torch.compile(function, fullgraph=True, backend=_trace_only, dynamic=dynamic)(
            *args
        )
    except Exception as e:  # noqa: BLE001 - the message is the result
        if isinstance(getattr(e, "inner_exception", None), _Traced):
            return "traced"
        return f"{type(e).__name__}: {' '.join(str(e).split())}"
    raise AssertionError("the backend was not called")


def _tree(tmp_path, text: str):
    """A tree whose vllm/downstream.py is `text`, its native modules stood in."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / "vllm" / "downstream.py").write_text(text)
    extensions.stub_vllm_extensions(tmp_path)
    sys.path.insert(0, str(tmp_path))
    import vllm.downstream

    return vllm.downstream


DOWNSTREAM = """
import vllm._C.ops
from vllm._C import cache_ops
from vllm._C.ops import fused_add_rms_norm


def rope(positions, q, k, cache):
    vllm._C.ops.rotary_embedding(positions, q, k, 4, cache, True)
    return q, k


def swap(a, b):
    cache_ops.swap_blocks(a, b)
"""


def test_native_function_is_a_pybind11_builtin_dynamo_refuses(tmp_path):
    tree = _tree(tmp_path, DOWNSTREAM)
    ops = sys.modules["vllm._C.ops"]
    assert isinstance(ops, types.ModuleType)
    # `from vllm._C import cache_ops` then `cache_ops.swap_blocks`: a module
    assert isinstance(tree.cache_ops, types.ModuleType)
    for function in (ops.rotary_embedding, tree.fused_add_rms_norm):
        assert type(function) is types.BuiltinFunctionType
    assert ops.rotary_embedding.__qualname__ == "PyCapsule.rotary_embedding"
    assert ops.rotary_embedding.__module__ == "vllm._C.ops"
    assert tree.fused_add_rms_norm is ops.fused_add_rms_norm

    # eager: the reference math (a rotation keeps each pair's norm)
    cache = torch.cat((torch.ones(8, 2), torch.zeros(8, 2)), -1)  # angle 0
    q, k = torch.randn(3, 8), torch.randn(3, 8)
    q0 = q.clone()
    tree.rope(torch.arange(3), q, k, cache)
    torch.testing.assert_close(q, q0)
    with pytest.raises(RuntimeError, match="vllm._C.cache_ops.swap_blocks is a"):
        tree.swap(q, k)

    error = _compile_error(tree.rope, torch.arange(3), q, k, cache)
    assert "Unsupported: Attempted to call function marked as skipped" in error
    assert "vllm._C.ops.PyCapsule.rotary_embedding" in error
    assert "C/C++ Python extension (perhaps created with pybind)" in error


def test_the_old_stand_in_did_not_fail_as_the_xpu_does():
    """Negative control: a native function as a callable module (the
    stand-in before issue 22) fails a trace too, but not as the XPU host's
    pybind11 function does: Dynamo names a module, not the builtin, and a
    test of the report's error could not have matched it."""

    class OldStandIn(types.ModuleType):
        def __call__(self, positions, q, k, *args):
            q.mul_(1)

    old = OldStandIn("vllm._C.ops.rotary_embedding")

    def rope(positions, q, k):
        old(positions, q, k, 4, None, True)
        return q + 1

    error = _compile_error(rope, torch.arange(3), torch.randn(3, 8), None)
    assert "<module 'vllm._C.ops.rotary_embedding'>" in error, error
    assert "marked as skipped" not in error and "pybind" not in error


def test_used_as_modules_follows_the_tree():
    texts = {
        "vllm/a.py": "from vllm._C import ops\nops.rms_norm(1)\n",
        "vllm/b.py": "from vllm._C import cache_ops\ncache_ops(1)\n",
        "vllm/c.py": "import vllm._moe_C\nvllm._moe_C.topk(1)\n",
    }
    assert natives.used_as_modules(texts) == {"vllm._C", "vllm._C.ops", "vllm._moe_C"}


@pytest.fixture
def ipex():
    library = ipex_standin.define_torch_ipex_ops()  # noqa: F841 - kept alive
    yield ipex_standin.install_ipex()
    for name in [n for n in sys.modules if n.startswith("intel_extension")]:
        del sys.modules[name]


@pytest.mark.parametrize("dynamic", [False, True])
def test_ipex_python_api_fails_under_fake_tensors(ipex, dynamic):
    def act(x):
        out = torch.empty(4, 8)
        ipex.llm.functional.silu_and_mul(x, out)
        return out + 1

    error = _compile_error(act, torch.randn(4, 16), dynamic=dynamic)
    assert "Operator does not support running with fake tensors" in error, error
    assert "torch_ipex.silu_and_mul.xpu" in error


def test_with_a_fake_the_same_trace_passes(ipex):
    """Negative control: the failure is the missing fake, nothing else of
    the stand-in: with one registered (as a fix may), the trace passes."""
    torch.library.register_fake(
        "torch_ipex::silu_and_mul.xpu", lambda x, out: torch.empty_like(out)
    )

    def act(x):
        out = torch.empty(4, 8)
        ipex.llm.functional.silu_and_mul(x, out)
        return out + 1

    assert _compile_error(act, torch.randn(4, 16), dynamic=True) == "traced"


def test_composite_implicit_op_fails_on_the_data_pointer(ipex):
    def norm(x, w):
        out = torch.empty_like(x)
        torch.ops.torch_ipex.rms_norm_vllm(out, x, w, 1e-6)
        return out

    error = _compile_error(norm, torch.randn(4, 8), torch.ones(8))
    assert "Cannot access data pointer of Tensor" in error, error
    # eager on the CPU: CompositeImplicitAutograd runs the reference
    x = torch.randn(4, 8)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x, torch.ones(8)), expected)
    # negative control: the same math in torch traces
    assert (
        _compile_error(
            lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
            torch.randn(4, 8),
            torch.ones(8),
        )
        == "traced"
    )


def test_the_stand_in_modules_make_each_name_once_and_it_raises_when_used():
    """torchvision (not installed in .venv) and a downstream kernel package:
    a name asked of the module is made once and kept, and using it raises,
    naming it. Negative control: a module that made a new name at every
    look-up fails the `is`, one whose names did nothing the raises."""
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: no stand-in")
    assert packages.install_torchvision()
    assert packages.install_downstream_packages() == ["custom_esimd_kernels_vllm"]
    import custom_esimd_kernels_vllm.ops as ops
    import torchvision.transforms.v2 as v2

    assert v2.InterpolationMode is v2.InterpolationMode
    assert v2.InterpolationMode.__module__ == "torchvision.transforms.v2"
    with pytest.raises(RuntimeError, match=r"v2\.Resize is a torchvision stand-in"):
        v2.Resize(8)
    assert ops.fused_rms_norm is ops.fused_rms_norm
    with pytest.raises(
        RuntimeError,
        match=r"^custom_esimd_kernels_vllm\.ops\.fused_rms_norm is a stand-in",
    ):
        ops.fused_rms_norm(torch.zeros(1))
