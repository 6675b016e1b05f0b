"""The image's kernel ops that have no fake at all (issue 50): on
intel/llm-scaler's 0.21.0 images (b18beee, 0.21.0-b3.1) Qwen3-Next's fused
MoE decode calls `moe_ops::moe_forward_full[_v2]`, Gemma 4's expert-grouped
MoE `moe_int4_prefill_ops::moe_prefill_gather_forward_v2`, their int4 MoE
paths two `moe_int4_ops` kernels, and neither the tree's
esimd_fake_ops.py nor the fix gave them a fake: compiling stopped there
("Operator does not support running with fake tensors"), before and after
`make apply`.

The fix (vllm/_xpu_opaque_calls.py KERNEL_FAKES, registered once the tree
loads its kernel package) gives each its fake on the op itself -- the image
splits its compiled graph at moe_ops::moe_forward_full[_v2] by name, so the
graph must keep the op -- and only where the op has none and its live
schema is the one the fake is written for.

Here: each op defined on a CPU with the image's schema (data/
esimd_schemas.toml, read from the image's C++; not KERNEL_FAKES) and a CPU
kernel that allocates its result as the C++ does (written from the C++
here: a buffer of capacity rows narrowed, a ring entry, new int32 tensors;
the values are not the point), in a forked process. A compiled call fails
before the fix (the negative control) and traces after it, with the fake's
shape, strides and dtype those of the kernel's result. A live schema the
fake is not written for (a trailing defaulted argument, a renamed one) gets
no fake of ours; a fake the tree registered is kept. And the static audit
sees it: the calls fail the audit of the image's tree as it is, not after
apply, and again where the fix's entry is missing or written for another
schema."""

import re
import tomllib

import pytest
from test_do_no_harm import _b31_applied, _cached
from test_opaque_calls import _ops_module, _traced, b6_patched  # noqa: F401

from support import images
from xpufakes.common import paths
from xpufakes.proof.static import schematruth
from xpufakes.trees import tree

IMAGE = "25095b4"  # 0.21.0-b3.1
ESIMD = tomllib.loads((paths.DATA / "esimd_schemas.toml").read_text())
N, H, E, K = 3, 16, 8, 2  # tokens, hidden, experts, top-k

OPS = (
    "moe_ops::moe_forward_full",
    "moe_ops::moe_forward_full_v2",
    "moe_int4_prefill_ops::moe_prefill_gather_forward_v2",
    "moe_int4_ops::moe_forward_gelu_tanh_int4_decode",
    "moe_int4_ops::moe_forward_tiny_cutlass_nmajor_int4_full_fp16_shared_from_logits",
    "moe_ops::moe_router_forward",
    "moe_int4_ops::moe_router_forward_int4",
    "moe_int4_ops::moe_forward_cutlass_nmajor_int4_full",
)
# an op that marks its writes and returns nothing: torch makes its fake
ONYX = "custom_esimd_kernels_vllm::esimd_qkv_split_norm_rope_onyx"


def _schema(op: str) -> str:
    return ESIMD[IMAGE]["ops"][op]["schema"]


def _kernel_and_args(op: str):
    """A CPU kernel allocating what the C++ returns, and arguments."""
    import torch

    half = torch.float16
    x = torch.randn(N, H, dtype=half)
    logits = torch.randn(N, E, dtype=half)
    w = torch.zeros(E, 2 * H, H, dtype=torch.uint8)
    s = torch.ones(E)
    name = op.partition("::")[2]
    if name.startswith("moe_forward_full"):
        # moe.sycl ensure_moe_buffers[_v2]: s_final_output
        # torch::empty({an, hidden}, kHalf), an = max(cached, n) (sticky);
        # returned .narrow(0, 0, n_tokens)
        def kernel(x, *rest):
            return torch.zeros(64, x.shape[1], dtype=half).narrow(0, 0, x.shape[0])

        args = (x, logits, w, s, w[0], s[0], w, s, w[0], s[0], x[:1], K, 1, E)
    elif name == "moe_prefill_gather_forward_v2":
        # moe_prefill_int4.sycl:457: four torch::empty, kInt32:
        # {num_experts}, {numel}, {numel}, {num_experts}
        def kernel(selected, num_experts):
            n = selected.numel()
            return [
                torch.zeros(k, dtype=torch.int32)
                for k in (num_experts, n, n, num_experts)
            ]

        args = (torch.zeros(N, K, dtype=torch.int32), E)
    elif name == "moe_forward_gelu_tanh_int4_decode":
        # moe_int4.sycl:3886: torch::empty({n_tokens, w2_qweight_s4.size(1)})
        def kernel(x, logits, w13, s13, w2, *rest):
            return torch.zeros(x.shape[0], w2.shape[1], dtype=half)

        w2 = torch.zeros(E, 24, H // 2, dtype=torch.uint8)
        args = (x, logits, w, s, w2, s, s, K, E)
    elif name.startswith("moe_forward_tiny"):
        # moe_int4.sycl:1434,2741,2849: a ring entry {cap, hidden} kHalf,
        # returned .narrow(0, 0, n_tokens)
        def kernel(x, *rest):
            return torch.zeros(64, x.shape[1], dtype=half).narrow(0, 0, x.shape[0])

        args = (x, logits, w, s, w, s, x, x, x, K, 1, E)
    elif name == "moe_router_forward":
        # moe.sycl:318: torch::empty({n_tokens, num_experts}, kHalf),
        # num_experts = weight.size(0)
        def kernel(x, weight, scale):
            return torch.zeros(x.shape[0], weight.shape[0], dtype=half)

        args = (x, torch.zeros(E, H, dtype=torch.uint8), s)
    elif name == "moe_router_forward_int4":
        # moe_int4.sycl:171-225: num_experts = weight.size(0) (GGML; a uint8
        # weight viewed as int32) or weight.numel() / (hidden / 8) (IPEX's
        # layout); torch::empty({n_tokens, num_experts}, kHalf)
        def kernel(x, weight, scale, ggml):
            k_packed = x.shape[1] // 8
            if ggml:
                weight = (
                    weight.view(torch.int32) if weight.dtype == torch.uint8 else weight
                )
                experts = weight.shape[0]
            else:
                experts = weight.numel() // k_packed
            return torch.zeros(x.shape[0], experts, dtype=half)

        x = torch.randn(N, 128, dtype=half)
        args = (
            x,
            torch.zeros(128 // 8, E, dtype=torch.int32),
            torch.ones(1, E, dtype=half),
            False,
        )
    elif name == "moe_forward_cutlass_nmajor_int4_full":
        # moe_int4.sycl:3702: M <= 32 with a shared expert: the tiny path (a
        # ring entry {cap, H} narrowed); otherwise torch::empty({M, H}) kHalf
        def kernel(x, logits, w13, s13, w2, s2, sg, sd, sgw, top_k, shared, experts):
            if x.shape[0] <= 32 and shared > 0:
                return torch.zeros(64, x.shape[1], dtype=half).narrow(0, 0, x.shape[0])
            return torch.zeros(x.shape[0], x.shape[1], dtype=half)

        args = (x, logits, w, s, w, s, x, x, x, K, 1, E)
    else:  # esimd_qkv_split_norm_rope_onyx: -> (), writes q_out, k_out, v_out

        def kernel(qkv, q, k, v, *rest):
            q.zero_(), k.zero_(), v.zero_()

        q = torch.empty(N, 4, 8, dtype=half)
        args = (x, q, q.clone(), q.clone(), torch.arange(N), 4, 1, 1.0, x)
    return kernel, args


def _define(op: str, schema: str, kernel):
    import torch

    namespace, _, name = op.partition("::")
    library = torch.library.Library(namespace, "FRAGMENT")
    library.define(schema)
    library.impl(schema.partition("(")[0], kernel, "CPU")
    return library


def _call(op: str):
    import torch

    namespace, _, name = op.partition("::")
    packet = getattr(getattr(torch.ops, namespace), name)

    def f(*args):
        result = packet(*args)
        return result if result is not None else args[1] + 1

    return f


def _meta(result):
    if isinstance(result, list | tuple):
        return [_meta(r) for r in result]
    if result is None:
        return None
    return (tuple(result.shape), result.stride(), result.dtype)


@pytest.mark.forked
def test_each_op_compiles_with_our_fake_only(b6_patched):  # noqa: F811
    """One process for all (each import of the tree costs seconds)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    libraries, calls = _ops_module(b6_patched)  # noqa: F841
    defined = {op: _define(op, _schema(op), _kernel_and_args(op)[0]) for op in OPS}
    cases = {op: _kernel_and_args(op)[1] for op in OPS}
    # negative control: the image as it is (and as apply left it before)
    for op, args in cases.items():
        error = _traced(_call(op), *args)
        assert "fake" in error.lower() and error != "traced", (op, error)
    done = calls.register_kernel_fakes()
    for op, args in cases.items():
        assert done[op] == "ours", (op, done[op])
        assert _traced(_call(op), *args) == "traced", op
        # the fake's result is the kernel's: shape, strides, dtype
        real = _meta(_call(op)(*args))
        with FakeTensorMode() as mode:
            fake = _meta(
                _call(op)(
                    *[
                        mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                        for a in args
                    ]
                )
            )
        assert fake == real, op
    assert defined


def _renamed(schema: str) -> str:
    return re.sub(r"\(Tensor (\w+)", r"(Tensor \1_renamed", schema, count=1)


def _trailing(schema: str) -> str:
    head, _, tail = schema.rpartition(") ->")
    return f"{head}, int extra=0) ->{tail}"


@pytest.mark.forked
def test_an_op_marking_its_writes_and_returning_nothing_needs_no_fake(b6_patched):  # noqa: F811
    """Why the audit does not ask a fake of such an op (muse_glimmer's
    esimd_qkv_split_norm_rope_onyx): torch generates it. Control: the same
    op with its marks dropped does not trace."""
    libraries, calls = _ops_module(b6_patched)  # noqa: F841
    kernel, args = _kernel_and_args(ONYX)
    library = _define(ONYX, _schema(ONYX), kernel)  # noqa: F841
    assert _traced(_call(ONYX), *args) == "traced"
    assert ONYX not in calls.register_kernel_fakes()
    unmarked = ONYX.replace("_onyx", "_onyx_unmarked")
    library = _define(  # noqa: F841
        unmarked,
        re.sub(r"\([abc]!\)", "", _schema(ONYX)).replace("_onyx(", "_onyx_unmarked("),
        kernel,
    )  # noqa: F841
    assert "fake" in _traced(_call(unmarked), *args).lower()


@pytest.mark.forked
@pytest.mark.parametrize("vary", [_renamed, _trailing], ids=["renamed", "trailing"])
def test_a_schema_we_do_not_know_gets_no_fake_of_ours(vary, b6_patched):  # noqa: F811
    from xpufakes.proof.xpu import registering

    libraries, calls = _ops_module(b6_patched)  # noqa: F841
    op = "moe_ops::moe_forward_full"
    kernel, args = _kernel_and_args(op)
    library = _define(op, vary(_schema(op)), kernel)  # noqa: F841
    done = calls.register_kernel_fakes()[op]
    assert done.startswith("differs: ") and vary(_schema(op)) in done
    assert registering.fake_of(op) is None
    assert "fake" in _traced(_call(op), *args).lower()


@pytest.mark.forked
def test_a_fake_the_tree_registered_is_kept(b6_patched):  # noqa: F811
    import torch

    from xpufakes.proof.xpu import registering

    libraries, calls = _ops_module(b6_patched)  # noqa: F841
    op = "moe_int4_prefill_ops::moe_prefill_gather_forward_v2"
    kernel, args = _kernel_and_args(op)
    library = _define(op, _schema(op), kernel)  # noqa: F841

    def theirs(selected, num_experts):
        return [selected.new_empty((num_experts,), dtype=torch.int32)] * 4

    torch.library.register_fake(op, theirs)
    tree_fake = registering.fake_of(op).source
    assert calls.register_kernel_fakes()[op] == "theirs"
    assert registering.fake_of(op).source == tree_fake
    # negative control: registering without asking (torch 2.13 lets a later
    # fake replace the tree's)
    calls.kernel_fakes.clear()
    calls._has_fake = lambda op: False
    assert calls.register_kernel_fakes()[op] == "ours"
    assert registering.fake_of(op).source != tree_fake


# ---------------------------------------------------------------------------
# The static audit
# ---------------------------------------------------------------------------


def _unfaked(root, texts=None) -> dict[str, str]:
    texts = texts if texts is not None else tree.python_sources(root)
    truth = schematruth.check(texts, "0.21.0", image=images_recognise(root))
    return {c.op: why for c, why in truth.unfaked}


def images_recognise(root):
    from xpufakes.trees import images as tree_images

    return tree_images.recognise(root)


def test_the_audit_fails_a_traced_kernel_op_without_a_fake():
    unpatched = _unfaked(images.b31_cached())
    for op in (
        "moe_ops::moe_forward_full",
        "moe_int4_prefill_ops::moe_prefill_gather_forward_v2",
        "moe_int4_ops::moe_forward_gelu_tanh_int4_decode",
    ):
        assert unpatched[op] == "neither the tree nor the fix registers a fake of it"
    # the tree's own fakes count (esimd_fake_ops.py, fakes defined inside
    # its register_esimd_fakes): its fused QKV split + norm + RoPE has one
    assert "custom_esimd_kernels_vllm::esimd_qkv_split_norm_rope" not in unpatched
    applied = _cached("b31-applied", _b31_applied)
    texts = tree.python_sources(applied)
    assert _unfaked(applied, texts) == {}
    # negative controls: the fix's entry gone, or written for another schema
    module = texts[schematruth.ROUTING_MODULE]
    entry = '    "moe_ops::moe_forward_full": (\n'
    assert entry in module
    gone = module.replace(entry, '    "moe_ops::moe_forward_full_gone": (\n')
    found = _unfaked(applied, texts | {schematruth.ROUTING_MODULE: gone})
    assert list(found) == ["moe_ops::moe_forward_full"]
    assert found["moe_ops::moe_forward_full"].startswith("neither")
    other = module.replace("int num_shared_experts", "int num_shared")
    found = _unfaked(applied, texts | {schematruth.ROUTING_MODULE: other})
    # both ops the call may be (`moe_fn = moe_forward_full if ... else _v2`),
    # and the int4 kernel whose schema has the same argument
    assert set(found) == {
        "moe_ops::moe_forward_full",
        "moe_ops::moe_forward_full_v2",
        "moe_int4_ops::moe_forward_tiny_cutlass_nmajor_int4_full_fp16_shared_from_logits",
    }
    assert all("which the image's schema is not" in why for why in found.values())
