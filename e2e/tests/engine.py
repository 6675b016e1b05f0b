"""The e2e tests' hands: an engine venv, the tool driven as users drive it
(make / bin/xpufakes, never its Python modules), and the driver that runs
vLLM in that venv."""

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "e2e"))

import venvs  # noqa: E402

DRIVER = REPO / "e2e" / "engine" / "driver.py"

# Fixed sequences for the teacher-forced comparison and prompts for greedy
# decoding: random token ids (the models are random too), seeded.
_rng = random.Random(20261201)
SEQUENCES = [[_rng.randrange(3, 1024) for _ in range(32)] for _ in range(4)]
PROMPTS = [seq[:8] for seq in SEQUENCES[:3]]
MAX_TOKENS = 12

# Every process of the engine: the plugin finds the reference kernels in this
# checkout; vLLM's KV cache small (0.14.1 reads VLLM_CPU_KVCACHE_SPACE, GiB;
# later releases gpu_memory_utilization). Caches that would reuse a graph
# compiled with another fake are off: vLLM's compile cache (a hit skips
# Dynamo, and with it every fake; its key does not cover the fake module) and
# Inductor's FX-graph and AOTAutograd caches (their key does not cover what a
# custom op's fake says about its output's strides: measured, a fake with the
# wrong strides reused the code compiled with the right one). Inductor's C++
# code cache stays on: keyed by the generated source, it cannot mask a fake.
ENGINE_ENV = {
    "XPUFAKES_E2E_REPO": str(REPO),
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_DISABLE_COMPILE_CACHE": "1",
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # collective_rpc(inspect_worker)
    "VLLM_NO_USAGE_STATS": "1",
    # 0.14.1's TP=2 workers otherwise poll their message queue in a busy
    # loop whenever they wait (later releases block after 1 s): an idle
    # `vllm serve` then takes both cores from everything else (measured: the
    # model inspection of another worker's engine, 12 s alone, took 154 s)
    "VLLM_SLEEP_WHEN_IDLE": "1",
    # this project's vLLM plugin acts on the CPU platform (it is installed
    # into the venv only for the plugin step: scenario.py)
    "VLLM_XPU_FAKES_ANY_PLATFORM": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

TIMINGS: list[dict] = []  # what took how long, for the summary

PLUGIN_DIST = "vllm-xpu-fakes"  # the plugin's distribution, as pip names it
_WHEEL: list[Path] = []


def plugin_wheel() -> Path:
    """This project's vLLM plugin, built by `make plugin` once per session
    (per pytest-xdist worker) into the cache directory."""
    if not _WHEEL:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        dist = venvs.cache_dir() / "e2e" / "plugin-dist" / worker
        for old in dist.glob("*.whl"):
            old.unlink()
        start = time.monotonic()
        subprocess.run(
            ["make", "--no-print-directory", "-C", str(REPO), "plugin", f"DIST={dist}"],
            check=True,
            capture_output=True,
        )
        (wheel,) = dist.glob("vllm_xpu_fakes-*-py3-none-any.whl")
        timed("make plugin", time.monotonic() - start)
        _WHEEL.append(wheel)
    return _WHEEL[0]


def timed(what: str, seconds: float, **extra) -> None:
    TIMINGS.append({"what": what, "s": round(seconds, 1), **extra})


def worker_cores() -> str | None:
    """The cores of this pytest-xdist worker, as VLLM_CPU_OMP_THREADS_BIND
    takes them ("0", or "0,1"): the machine's cores split among the workers.
    Each engine process of a worker keeps its OpenMP threads on its own
    cores. With vLLM's automatic binding an engine of 0.14.1 put a thread on
    each of the 2 cores (its log: "OMP tid: ..., core 0", "..., core 1"), so
    the engines of the two workers shared both, and OpenMP threads that
    share a core spin at every parallel region (docs/testing.md). None
    outside xdist, or with more workers than cores: vLLM's own binding."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if not worker.startswith("gw") or count < 2 or len(cores) < count:
        return None
    share = len(cores) // count
    index = int(worker[2:])
    return ",".join(str(c) for c in cores[index * share : (index + 1) * share])


def engine_env(tmp: Path, release: str, **extra: str) -> dict:
    env = dict(os.environ, **ENGINE_ENV)
    cores = worker_cores()
    if cores and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores  # TP=2 runs give their own
    cache = venvs.cache_dir() / "e2e"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor" / release)
    # vLLM's own cache (model-class inspection; its compile cache is off)
    env["VLLM_CACHE_ROOT"] = str(cache / "vllm" / release)
    env["XPUFAKES_E2E_RECORD_DIR"] = str(tmp)
    env.pop("XPUFAKES_E2E_WRONG_STANDIN", None)
    env.update(extra)
    return env


@dataclass
class Engine:
    release: str
    venv: Path
    models: Path
    work: Path

    @property
    def site_packages(self) -> Path:
        return venvs.site_packages(self.venv)

    @property
    def python(self) -> Path:
        return venvs.python(self.venv)

    # -- the tool, as users run it ------------------------------------------

    def make(self, verb: str, form: str = "VLLM", check: bool = True, **extra):
        """`make <verb> VLLM=<site-packages>` or, form "PYTHON",
        `make <verb> PYTHON=<venv>/bin/python` (no VLLM=)."""
        args = ["make", "--no-print-directory", "-C", str(REPO), verb]
        if form == "VLLM":
            args.append(f"VLLM={self.site_packages}")
        else:
            args.append(f"PYTHON={self.python}")
        args += [f"{k}={v}" for k, v in extra.items()]
        start = time.monotonic()
        done = subprocess.run(args, capture_output=True, text=True)
        timed(f"{self.release}: make {verb} ({form}=)", time.monotonic() - start)
        if check:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def pip(self, *args: str) -> None:
        """pip of the engine venv, as a user of an image runs it."""
        start = time.monotonic()
        venvs._pip(self.python, *args)
        timed(f"{self.release}: pip {args[0]}", time.monotonic() - start)

    def status(self) -> str:
        done = subprocess.run(
            [str(REPO / "bin" / "xpufakes"), "status", str(self.site_packages)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def state(self) -> str:
        lines = [ln for ln in self.status().splitlines() if ln.startswith("state: ")]
        assert lines, self.status()
        return lines[-1].removeprefix("state: ")

    def manifest_diff(self) -> list[str]:
        return venvs.manifest_diff(self.venv)

    def assert_pristine(self) -> None:
        """The venv as built: byte for byte (vllm/ and its dist-info) and
        otherwise untouched."""
        diff = self.manifest_diff()
        assert not diff, f"vllm-cpu {self.release} venv differs from its build:\n" + (
            "\n".join(diff[:40])
        )

    # -- vLLM's engine --------------------------------------------------------

    def run(self, label: str, runs: list[dict], **env: str) -> dict[str, dict]:
        """Run the cases in one engine process; {name: result}."""
        work = self.work / label
        work.mkdir(parents=True, exist_ok=True)
        plan = {
            "repo": str(REPO),
            "models": str(self.models),
            "sequences": SEQUENCES,
            "prompts": PROMPTS,
            "max_tokens": MAX_TOKENS,
            "runs": runs,
        }
        (work / "plan.json").write_text(json.dumps(plan, indent=1))
        out = work / "results.json"
        start = time.monotonic()
        with open(work / "engine.log", "w") as log:
            done = subprocess.run(
                [str(self.python), str(DRIVER), str(work / "plan.json"), str(out)],
                env=engine_env(
                    work, self.release, VLLM_ENABLE_V1_MULTIPROCESSING="0", **env
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=1800,
            )
        seconds = time.monotonic() - start
        assert done.returncode == 0 and out.is_file(), (
            f"the engine process failed ({done.returncode}); see {work}/engine.log:\n"
            + (work / "engine.log").read_text()[-4000:]
        )
        results = json.loads(out.read_text())
        timed(
            f"{self.release}: engine process '{label}' ({len(runs)} runs)",
            seconds,
            import_s=results["import_s"],
            runs={r["name"]: r["startup_s"] for r in results["runs"]},
        )
        return {r["name"]: r for r in results["runs"]}
