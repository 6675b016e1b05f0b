"""What IPEX's callers get in one process of the ipex proof venv (the real
Intel Extension for PyTorch CPU build), with or without the vLLM plugin:

    <venv>/bin/python ipex_calls.py TREE PLUGIN_DIR|- OUT.json

TREE: vLLM's sdist tree (its modules on the path, for vLLM's own
``vllm.plugins.load_general_plugins()``); PLUGIN_DIR: a plugin wheel
unpacked (its entry point found there by vLLM), or ``-`` for none. In order:

1. import IPEX, vLLM's modules the plugin imports (vllm._ipex_ops,
   vllm.platforms, vllm.utils.torch_utils) and a third party's module that
   took IPEX's functions by name (ipex_thirdparty.py);
2. snapshot every loaded module's globals and its classes' attributes, by
   id, except vLLM's (``vllm``, ``vllm.*``);
3. vLLM's load_general_plugins() (the plugin's register(), if present);
4. the snapshot again: what was rebound, removed or added;
5. every call form of forms() (IPEX's documented forms of
   the functions the plugin rebinds) through IPEX's ``llm.functional``,
   IPEX's own ``llm.functional.fusions`` and the third party's copies; IPEX's
   modules (``ipex.llm.modules.*``) and its other functional APIs; IPEX's WOQ
   linear module made by the third party and by this script.

Each call is described exactly, for a comparison across processes (by the
test, in plain Python): the exception it raised, or its result's type, and
for a tensor its dtype, shape, strides, the sha256 of its bytes and which
argument it is or shares storage with; and every tensor argument after the
call (the writes). Inputs are made afresh for each call from a fixed seed;
OMP_NUM_THREADS=1 keeps IPEX's CPU kernels deterministic.
"""

import hashlib
import json
import sys
import time
import warnings
import zlib

NOT_VLLM = "vllm"
FUNCTIONAL = "intel_extension_for_pytorch.llm.functional"
FUSIONS = "intel_extension_for_pytorch.llm.functional.fusions"
NAMES = ("rms_norm", "add_rms_norm", "bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
EPS = 1e-6


# ---------------------------------------------------------------------------
# The call forms: (id, function, args, kwargs) made afresh for each call
# ---------------------------------------------------------------------------


def _gen(form: str):
    import torch

    return torch.Generator().manual_seed(zlib.crc32(form.encode()))


def _norm_inputs(form: str, dtype):
    import torch

    g = _gen(form)
    res = torch.randn(2, 5, 64, generator=g).to(dtype)
    x = torch.randn(2, 5, 64, generator=g).to(dtype)
    w = torch.rand(64, generator=g).to(dtype) + 0.5
    return res, x, w


def _lora_inputs(form: str, dtype, out_width: int):
    import torch

    g = _gen(form)
    # no -1 (no LoRA for that token): IPEX 2.8's bf16 CPU kernel leaves
    # uninitialized memory in that row (measured: two identical calls differ)
    idx = torch.tensor([0, 1, 1, 0])
    shrink = (
        torch.randn(4, 64, generator=g).to(dtype),
        torch.randn(2, 8, 64, generator=g).to(dtype),
        torch.randn(4, 8, generator=g).to(dtype),
        idx,
    )
    expand = (
        torch.randn(4, 8, generator=g).to(dtype),
        torch.randn(2, 64, 8, generator=g).to(dtype),
        torch.randn(4, out_width, generator=g).to(dtype),
        idx,
    )
    return shrink, expand


def forms() -> list[tuple]:
    """(form id, function name, make) with make() -> (args, kwargs): IPEX
    2.8's documented call forms (llm/functional/fusions.py's signatures,
    its parameter names, its defaults), and the forms that raise there."""
    import torch

    out = []
    bf16, f32 = torch.bfloat16, torch.float32

    def add(fid, name, make):
        out.append((f"{name}:{fid}", name, make))

    for dt, tag in ((bf16, "bf16"), (f32, "f32")):

        def norm(fid, dt=dt, tag=tag):
            return _norm_inputs(f"norm:{fid}:{tag}", dt)

        add(f"positional/{tag}", "rms_norm", lambda n=norm: ((*n("p")[1:], EPS), {}))
        add(
            f"keywords/{tag}",
            "rms_norm",
            lambda n=norm: (
                (),
                dict(
                    zip(("hidden_states", "weight"), n("k")[1:], strict=True), eps=EPS
                ),
            ),
        )
        add(
            f"mixed/{tag}",
            "rms_norm",
            lambda n=norm: ((n("m")[1],), {"weight": n("m")[2], "eps": EPS}),
        )
        for add_back in (False, True):
            add(
                f"positional, add_back={add_back}/{tag}",
                "add_rms_norm",
                lambda n=norm, a=add_back: ((*n(f"p{a}"), None, EPS, a), {}),
            )
            add(
                f"keywords, add_back={add_back}/{tag}",
                "add_rms_norm",
                lambda n=norm, a=add_back: (
                    (),
                    dict(
                        zip(("residual", "x", "weight"), n(f"k{a}"), strict=True),
                        bias=None,
                        eps=EPS,
                        add_back=a,
                    ),
                ),
            )
            add(
                f"residual None, add_back={add_back}/{tag}",
                "add_rms_norm",
                lambda n=norm, a=add_back: ((None, *n(f"n{a}")[1:], None, EPS, a), {}),
            )
        add(
            f"add_back left out/{tag}",
            "add_rms_norm",
            lambda n=norm: ((*n("d"), None, EPS), {}),
        )
        add(
            f"keywords, add_back left out/{tag}",
            "add_rms_norm",
            lambda n=norm: (
                (),
                dict(
                    zip(("residual", "x", "weight"), n("kd"), strict=True),
                    bias=None,
                    eps=EPS,
                ),
            ),
        )
        add(
            f"residual None, add_back left out/{tag}",
            "add_rms_norm",
            lambda n=norm: ((None, *n("nd")[1:], None, EPS), {}),
        )
        add(
            f"residual keyword None, add_back left out/{tag}",
            "add_rms_norm",
            lambda n=norm: (
                (),
                dict(
                    residual=None, x=n("knd")[1], weight=n("knd")[2], bias=None, eps=EPS
                ),
            ),
        )

    def bias_given():  # IPEX's CPU path asserts bias is None
        res, x, w = _norm_inputs("norm:bias", bf16)
        return (res, x, w, torch.ones(64, dtype=bf16), EPS, False), {}

    add("a bias (IPEX's CPU path refuses it)", "add_rms_norm", bias_given)

    ipex_names = ("input", "lora_weights", "output", "token_lora_mapping")
    # the names of vLLM's contract (_xpu_opaque_calls.py), which IPEX's
    # functions do not have: the original raises TypeError
    contract_names = {
        "bgmv_shrink": (
            "inputs",
            "lora_a_weights",
            "output_tensor",
            "lora_indices_tensor",
        ),
        "bgmv_expand": (
            "inputs",
            "lora_b_weights",
            "output_tensor",
            "lora_indices_tensor",
        ),
        "bgmv_expand_slice": (
            "inputs",
            "lora_b_weights",
            "output_tensor",
            "lora_indices_tensor",
        ),
    }
    tails = {
        "bgmv_shrink": [("scaling=0.5", (0.5,), {"scaling": 0.5})],
        "bgmv_expand": [
            (f"add_inputs={a}", (a,), {"add_inputs": a}) for a in (True, False)
        ],
        "bgmv_expand_slice": [
            (
                f"slice 32:96, add_inputs={a}",
                (32, 64, a),
                {"slice_offset": 32, "slice_size": 64, "add_inputs": a},
            )
            for a in (True, False)
        ],
    }
    for dt, tag in ((bf16, "bf16"), (f32, "f32")):
        for name, variants in tails.items():
            width = 128 if name == "bgmv_expand_slice" else 64

            def tensors(fid, name=name, dt=dt, width=width):
                shrink, expand = _lora_inputs(f"{name}:{fid}", dt, width)
                return shrink if name == "bgmv_shrink" else expand

            for label, pos, kw in variants:
                add(
                    f"positional, {label}/{tag}",
                    name,
                    lambda t=tensors, p=pos, lb=label: ((*t(f"p{lb}"), *p), {}),
                )
                add(
                    f"keywords, {label}/{tag}",
                    name,
                    lambda t=tensors, k=kw, lb=label: (
                        (),
                        dict(zip(ipex_names, t(f"k{lb}"), strict=True), **k),
                    ),
                )
                add(
                    f"mixed, {label}/{tag}",
                    name,
                    lambda t=tensors, k=kw, lb=label: (
                        t(f"m{lb}")[:2],
                        dict(zip(ipex_names[2:], t(f"m{lb}")[2:], strict=True), **k),
                    ),
                )
            label, pos, kw = variants[0]
            add(
                f"keywords of vLLM's contract (not IPEX's), {label}/{tag}",
                name,
                lambda t=tensors, k=kw, n=contract_names[name], lb=label: (
                    (),
                    dict(zip(n, t(f"c{lb}"), strict=True), **k),
                ),
            )
    return out


# ---------------------------------------------------------------------------
# Describing a call exactly
# ---------------------------------------------------------------------------


def _tensor(t, args: dict) -> dict:
    import torch

    plain = t.detach()
    data = plain.contiguous().view(torch.uint8) if plain.numel() else plain
    same = [n for n, a in args.items() if a is t]
    storage = t.untyped_storage().data_ptr() if t.numel() else None
    shares = [
        n
        for n, a in args.items()
        if isinstance(a, torch.Tensor)
        and a is not t
        and a.numel()
        and a.untyped_storage().data_ptr() == storage
    ]
    return {
        "type": f"{type(t).__module__}.{type(t).__qualname__}",
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "sha256": hashlib.sha256(data.numpy().tobytes()).hexdigest(),
        "is": same,
        "shares_storage_with": shares,
        "head": [float(v) for v in plain.flatten()[:3].float()],  # for messages
    }


def describe(value, args: dict):
    import torch

    if isinstance(value, torch.Tensor):
        return _tensor(value, args)
    if isinstance(value, tuple | list):
        return {
            "type": type(value).__name__,
            "items": [describe(v, args) for v in value],
        }
    if value is None or isinstance(value, bool | int | float | str):
        return {"type": type(value).__name__, "value": value}
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}


def call(make) -> dict:
    """The call make() -> (function, args, kwargs) describes, made twice
    (inputs afresh): "repeatable" says whether both gave the same."""
    first, second = _call(*make()), _call(*make())
    return first | {"repeatable": first == second}


def _call(function, args: tuple, kwargs: dict) -> dict:
    import torch

    named = {f"arg{i}": a for i, a in enumerate(args)} | dict(kwargs)
    try:
        result = function(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - what the caller gets
        return {"raised": f"{type(e).__name__}: {e}"}
    return {
        "raised": None,
        "result": describe(result, named),
        "arguments after": {
            n: describe(a, {}) for n, a in named.items() if isinstance(a, torch.Tensor)
        },
    }


# ---------------------------------------------------------------------------
# The snapshot of everything but vLLM's modules
# ---------------------------------------------------------------------------

_KEEP: list = []  # what a snapshot saw stays alive: an id is not reused


def _is_vllms(name: str) -> bool:
    return name == NOT_VLLM or name.startswith(NOT_VLLM + ".")


def snapshot() -> dict[str, dict[str, int]]:
    """{module: {global: id}} and {module:Class: {attribute: id}} for every
    loaded module but vLLM's, and every class a module defines."""
    out = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if _is_vllms(name) or not isinstance(namespace, dict):
            continue
        items = list(namespace.items())
        _KEEP.append(items)
        out[name] = {k: id(v) for k, v in items}
        for _, value in items:
            if not isinstance(value, type):
                continue
            try:
                defined = type.__getattribute__(value, "__module__") == name
                attributes = list(vars(value).items())
            except Exception:  # noqa: BLE001 - a class that hides them
                continue
            if defined:
                _KEEP.append(attributes)
                out[f"{name}:{value.__qualname__}"] = {k: id(v) for k, v in attributes}
    return out


def _kind(owner: str, key: str) -> str:
    """The type of what `owner` (a module, or module:Class) now holds at key."""
    module, _, cls = owner.partition(":")
    holder = sys.modules.get(module)
    for part in cls.split(".") if cls else ():
        holder = getattr(holder, part, None)
    value = vars(holder).get(key) if holder is not None else None
    return f"{type(value).__module__}.{type(value).__qualname__}"


def changes(before: dict, after: dict) -> dict:
    """rebound: what holds another object than before; removed; added:
    {new key: the type of its value}."""
    out = {"rebound": [], "removed": [], "added": {}}
    for owner, entries in before.items():
        now = after.get(owner)
        if now is None:
            out["removed"].append(owner)
            continue
        for key, ident in entries.items():
            if key not in now:
                out["removed"].append(f"{owner}.{key}")
            elif now[key] != ident:
                out["rebound"].append(f"{owner}.{key}")
        for key in sorted(now.keys() - entries.keys()):
            out["added"][f"{owner}.{key}"] = _kind(owner, key)
    return out


# ---------------------------------------------------------------------------
# IPEX's modules and its other functional APIs (inputs made afresh)
# ---------------------------------------------------------------------------


def module_cases() -> list[tuple]:
    """(id, make) with make() -> (callable, args, kwargs)."""
    import intel_extension_for_pytorch as ipex
    import torch

    m, fn = ipex.llm.modules, ipex.llm.functional
    bf16 = torch.bfloat16
    cases = []

    def inputs(cid):
        g = _gen(f"module:{cid}")
        return g, torch.randn(2, 5, 64, generator=g).to(bf16)

    def rmsnorm():
        g, x = inputs("RMSNorm")
        w = torch.rand(64, generator=g).to(bf16) + 0.5
        return m.RMSNorm(64, EPS, w), (x,), {}

    def rmsnorm_apply():
        g, x = inputs("RMSNorm.apply_function")
        w = torch.rand(64, generator=g).to(bf16) + 0.5
        return m.RMSNorm.apply_function, (x, w, EPS), {}

    def layernorm():
        g, x = inputs("FastLayerNorm")
        w, b = (
            torch.rand(64, generator=g).to(bf16),
            torch.rand(64, generator=g).to(bf16),
        )
        w, b = torch.nn.Parameter(w), torch.nn.Parameter(b)
        return m.FastLayerNorm(64, 1e-5, w, b), (x,), {}

    def layernorm_apply():
        g, x = inputs("FastLayerNorm.apply_function")
        w, b = (
            torch.rand(64, generator=g).to(bf16),
            torch.rand(64, generator=g).to(bf16),
        )
        return m.FastLayerNorm.apply_function, (x, [64], w, b, 1e-5), {}

    def rope():
        g = _gen("module:RotaryEmbedding")
        q = torch.randn(1, 5, 4, 16, generator=g)
        positions = torch.arange(5).unsqueeze(0)
        module = m.RotaryEmbedding(64, 16, backbone="LlamaForCausalLM")
        return module, (q, positions, 4, 16, 8, 16), {}

    def rope_apply():
        g = _gen("module:RotaryEmbedding.apply_function")
        q, k = torch.randn(5, 4, 16, generator=g), torch.randn(5, 2, 16, generator=g)
        angles = torch.rand(5, 16, generator=g)
        return (
            m.RotaryEmbedding.apply_function,
            (q, k, angles.sin(), angles.cos(), 16, True),
            {},
        )

    def linear(cls, extra: int):
        def make():
            g = _gen(f"module:{cls.__name__}")
            lin = torch.nn.Linear(64, 64).to(bf16)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(64, 64, generator=g) / 8)
                lin.bias.copy_(torch.randn(64, generator=g))
            if cls is m.Linear2SiluMul:
                other = torch.nn.Linear(64, 64).to(bf16)
                with torch.no_grad():
                    other.weight.copy_(torch.randn(64, 64, generator=g) / 8)
                    other.bias.copy_(torch.randn(64, generator=g))
                module = cls(lin, other)
            else:
                module = cls(lin)
            xs = [torch.randn(3, 64, generator=g).to(bf16) for _ in range(1 + extra)]
            return module, tuple(xs), {}

        return make

    def add_layer_norm(add_back):
        def make():
            g, x = inputs(f"add_layer_norm:{add_back}")
            res = torch.randn(2, 5, 64, generator=g).to(bf16)
            w, b = (
                torch.rand(64, generator=g).to(bf16),
                torch.rand(64, generator=g).to(bf16),
            )
            return fn.add_layer_norm, (res, x, w, b, 1e-5, add_back), {}

        return make

    def fast_layer_norm():
        g, x = inputs("fast_layer_norm")
        w, b = (
            torch.rand(64, generator=g).to(bf16),
            torch.rand(64, generator=g).to(bf16),
        )
        return fn.fast_layer_norm, (x, [64], w, b, 1e-5), {}

    def rotary_embedding():
        g = _gen("module:rotary_embedding")
        q, k = torch.randn(5, 4, 16, generator=g), torch.randn(5, 2, 16, generator=g)
        angles = torch.rand(5, 16, generator=g)
        return fn.rotary_embedding, (q, k, angles.sin(), angles.cos(), 16, True), {}

    def sgmv_shrink():
        g = _gen("module:sgmv_shrink")
        x = torch.randn(6, 64, generator=g)
        wa = torch.randn(2, 8, 64, generator=g)
        out = torch.zeros(6, 8)
        seq_lens, idx = torch.tensor([2, 4]), torch.tensor([1, 0])
        starts = torch.tensor([0, 2])
        return fn.sgmv_shrink, (x, wa, out, starts, seq_lens, idx, 2, 4, 0.5), {}

    cases += [
        ("ipex.llm.modules.RMSNorm", rmsnorm),
        ("ipex.llm.modules.RMSNorm.apply_function", rmsnorm_apply),
        ("ipex.llm.modules.FastLayerNorm", layernorm),
        ("ipex.llm.modules.FastLayerNorm.apply_function", layernorm_apply),
        ("ipex.llm.modules.RotaryEmbedding", rope),
        ("ipex.llm.modules.RotaryEmbedding.apply_function", rope_apply),
    ]
    for cls, extra in (
        (m.LinearSilu, 0),
        (m.LinearRelu, 0),
        (m.LinearGelu, 0),
        (m.LinearNewGelu, 0),
        (m.Linear2SiluMul, 0),
        (m.LinearSiluMul, 1),
        (m.LinearMul, 1),
        (m.LinearAdd, 1),
        (m.LinearAddAdd, 2),
    ):
        cases.append((f"ipex.llm.modules.{cls.__name__}", linear(cls, extra)))
    cases += [
        ("ipex.llm.functional.add_layer_norm(add_back=False)", add_layer_norm(False)),
        ("ipex.llm.functional.add_layer_norm(add_back=True)", add_layer_norm(True)),
        ("ipex.llm.functional.fast_layer_norm", fast_layer_norm),
        ("ipex.llm.functional.rotary_embedding", rotary_embedding),
        ("ipex.llm.functional.sgmv_shrink", sgmv_shrink),
    ]
    return cases


# ---------------------------------------------------------------------------
# IPEX's WOQ linear module (tiny int4 AWQ / GPTQ weights)
# ---------------------------------------------------------------------------


def woq_cases() -> list[tuple]:
    """(method, make) with make() -> (args, kwargs, input): tiny int4
    checkpoints as vLLM 0.14.1's IPEX AWQ / GPTQ methods pass them
    (ipex_quant.py: the same keywords, act_quant_mode per method). AWQ packs
    8 values of a row into an int32 ([in, out / 8]), GPTQ of a column
    ([in / 8, out])."""
    import intel_extension_for_pytorch as ipex
    import torch
    from intel_extension_for_pytorch.llm.quantization.utils import QuantMethod

    size_in, size_out, group = 64, 32, 32
    word = (-(2**31), 2**31 - 1)
    packed = {"awq": (size_in, size_out // 8), "gptq": (size_in // 8, size_out)}
    act = {"awq": "PER_BATCH", "gptq": "PER_BATCH_IC_BLOCK"}

    def make(method):
        def build():
            g = _gen(f"woq:{method}")
            qweight = torch.randint(
                *word, packed[method], generator=g, dtype=torch.int32
            )
            qzeros = torch.randint(
                *word, (size_in // group, size_out // 8), generator=g, dtype=torch.int32
            )
            scales = (torch.rand(size_in // group, size_out, generator=g) / 8).to(
                torch.bfloat16
            )
            qconfig = ipex.quantization.get_weight_only_quant_qconfig_mapping(
                weight_dtype=ipex.quantization.WoqWeightDtype.INT4,
                lowp_mode=ipex.quantization.WoqLowpMode.INT8,
                act_quant_mode=getattr(ipex.quantization.WoqActQuantMode, act[method]),
                group_size=group,
            )
            kwargs = dict(
                qconfig=qconfig,
                bias=None,
                group_size=group,
                quant_method=getattr(QuantMethod, f"{method.upper()}_GEMM"),
                weight_qscheme="asym",
            )
            x = torch.randn(3, size_in, generator=g).to(torch.bfloat16)
            return (qweight, scales, qzeros, size_in, size_out), kwargs, x

        return build

    return [(method, make(method)) for method in ("awq", "gptq")]


# vLLM's call site of from_weight (its IPEX AWQ / GPTQ methods) is in this
# module; importing it needs most of vLLM's dependencies, so the caller is
# emulated: a function whose globals name that module (what tells a caller
# in vLLM's modules from any other)
VLLM_CALLER = "vllm.model_executor.layers.quantization.ipex_quant"
VLLM_CALLER_LABEL = f"a function of a module named {VLLM_CALLER} (emulated)"


def _vllm_named_caller(cls):
    namespace = {"__name__": VLLM_CALLER, "IPEXWeightOnlyQuantizedLinear": cls}
    source = (
        "def make(*args, **kwargs):\n"
        "    return IPEXWeightOnlyQuantizedLinear.from_weight(*args, **kwargs)\n"
    )
    exec(compile(source, f"<{VLLM_CALLER}, emulated>", "exec"), namespace)
    return namespace["make"]


def woq(make_module, build) -> dict:
    from intel_extension_for_pytorch.llm.quantization.woq_linear import (
        IPEXWeightOnlyQuantizedLinear,
    )

    args, kwargs, _ = build()
    try:
        module = make_module(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - what the caller gets
        return {"raised": f"{type(e).__name__}: {e}"}
    return {
        "raised": None,
        "type": f"{type(module).__module__}.{type(module).__qualname__}",
        "isinstance IPEXWeightOnlyQuantizedLinear": isinstance(
            module, IPEXWeightOnlyQuantizedLinear
        ),
        "forward": call(lambda: (module, (build()[2],), {})),
    }


# ---------------------------------------------------------------------------


def main(tree: str, plugin: str, out: str) -> int:
    start = time.monotonic()
    # reading torch.distributed.reduce_op (a snapshot reads every global)
    # warns; set before the snapshots (warnings.catch_warnings would rebind
    # warnings.filters, a change of ours)
    warnings.filterwarnings("ignore", category=FutureWarning)
    sys.path[:0] = ([plugin] if plugin != "-" else []) + [tree]
    import importlib

    import intel_extension_for_pytorch  # noqa: F401
    import ipex_thirdparty
    import torch

    for name in (
        "vllm.plugins",
        "vllm._ipex_ops",
        "vllm.platforms",
        "vllm.utils.torch_utils",
    ):
        importlib.import_module(name)
    functional, fusions = sys.modules[FUNCTIONAL], sys.modules[FUSIONS]
    originals = {n: getattr(functional, n) for n in NAMES}
    result: dict = {
        "torch": torch.__version__,
        "ipex": intel_extension_for_pytorch.__version__,
    }

    before = snapshot()
    import vllm.plugins

    vllm.plugins.load_general_plugins()
    after = snapshot()
    result["changes"] = changes(before, after)
    if "vllm_xpu_fakes" in sys.modules:
        result["state"] = sys.modules["vllm_xpu_fakes"].state()
        result["plugin_file"] = sys.modules["vllm_xpu_fakes"].__file__
    result["still the original"] = {
        f"{where}.{n}": getattr(holder, n) is originals[n]
        for where, holder in (
            (FUNCTIONAL, functional),
            (FUSIONS, fusions),
            ("ipex_thirdparty", ipex_thirdparty),
            ("ipex_thirdparty.Kernels", ipex_thirdparty.Kernels),
        )
        for n in NAMES
    }

    callers = {
        FUNCTIONAL: lambda n: getattr(functional, n),  # looked up at each call
        FUSIONS: lambda n: getattr(fusions, n),
        "ipex_thirdparty": lambda n: getattr(ipex_thirdparty, n),
        "ipex_thirdparty.Kernels": lambda n: getattr(ipex_thirdparty.Kernels, n),
    }
    calls = {}
    for where, get in callers.items():
        for fid, name, make in forms():
            calls[f"{where}.{fid}"] = call(lambda g=get, n=name, m=make: (g(n), *m()))
    result["calls"] = calls

    modules = {}
    for cid, make in module_cases():
        modules[cid] = call(make)
    result["modules"] = modules

    from intel_extension_for_pytorch.llm.quantization.woq_linear import (
        IPEXWeightOnlyQuantizedLinear,
    )

    makers = {
        "ipex_thirdparty.make_woq_linear": ipex_thirdparty.make_woq_linear,
        "IPEXWeightOnlyQuantizedLinear.from_weight (this script)": (
            IPEXWeightOnlyQuantizedLinear.from_weight
        ),
        VLLM_CALLER_LABEL: _vllm_named_caller(IPEXWeightOnlyQuantizedLinear),
    }
    result["woq"] = {
        f"{maker}/{method}": woq(function, build)
        for maker, function in makers.items()
        for method, build in woq_cases()
    }
    result["seconds"] = round(time.monotonic() - start, 1)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
