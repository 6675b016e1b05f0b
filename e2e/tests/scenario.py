"""One release's whole sequence, run once per test session: the venv state
changes in a fixed order (unpatched, patched, reverted, recipe path, serve),
each step's results are kept, and the tests assert on them.

1. the venv as built (else ``make revert`` and check again);
2. the plugin: this project's vLLM plugin installed from its wheel (``make
   plugin``, ``pip install``) into the unpatched venv, every case compiled
   in one engine process (``cases.PLUGIN_SERVE``: also vllm serve with
   TP=2), ``pip uninstall``; vLLM's files and RECORD compared with the
   build before and after;
3. unpatched: every case compiled and eager, in one engine process (after
   the plugin's uninstall: where the release breaks, the error is back);
4. ``make apply`` (VLLM= or PYTHON=, ``cases.APPLY_FORM``); the status;
5. patched: every case eager and compiled, one process; in the same process
   the case of ``cases.WRONG_STANDIN`` compiled with a stand-in that
   disagrees with its fake, and (0.14.1) the serve case at TP=2;
6. ``make revert``; the venv compared with its build, byte for byte;
7. recipe path (``cases.RECIPE``): a downstream patch of our own on the
   installed ``vllm/``, ``make apply`` (recipes + proof), the case eager and
   compiled, ``make revert`` (the downstream bytes back), the patch undone,
   the venv compared with its build;
8. serve (``cases.SERVE``): ``make apply``, the OpenAI server on loopback with
   ``--tensor-parallel-size 2``, requests with token ids, ``make revert``.

A step that fails records why and the later steps that need it are skipped;
the venv is reverted whatever happens. ``XPUFAKES_E2E_STOP_AFTER=plugin``
stops each sequence after step 2 (to run the plugin's tests alone: ``make
e2e ARGS="-k plugin"``); the tests of the later steps skip.
"""

import json
import os
import subprocess
import time
import traceback

import cases
import downstream
import engine
import server
from engine import MAX_TOKENS, PROMPTS, SEQUENCES, Engine, engine_env, timed

SERVE_TP = server.TP
TP2_BINDING = server.TP2_BINDING

STOP_AFTER = "XPUFAKES_E2E_STOP_AFTER"
FRONT_END = engine.REPO / "e2e" / "engine" / "front_end.py"
# The plugin's line as the plugin logged it before say.py (the negative
# control), and the line of vLLM's the front end logs after its set-up.
CONTROL_LINE = "vllm-xpu-fakes: CONTROL, logged as before say.py"
NEXT_LINE = "front end: vLLM's next line"
# The check a user tries (issue 41), and after it the plugin's line logged as
# the plugin logged it before say.py (the negative control)
ONE_LINE = (
    "import vllm; from vllm.plugins import load_general_plugins; load_general_plugins()"
)
ONE_LINE_CONTROL = (
    f"import logging; logging.getLogger('vllm.vllm_xpu_fakes').info({CONTROL_LINE!r})"
)


def _case_runs(selected, modes):
    return [
        {
            "name": f"{c.name}/{mode}",
            "format": c.format,
            "mode": mode,
            "llm": c.llm,
        }
        for c in selected
        for mode in modes
    ]


class Scenario:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.release = engine.release
        self.cases = cases.of(self.release)
        self.form = cases.APPLY_FORM[self.release]
        self.steps: dict[str, object] = {}
        self.errors: dict[str, str] = {}

    # -- bookkeeping ---------------------------------------------------------

    def _step(self, name: str, function, *args, **kwargs):
        try:
            self.steps[name] = function(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the tests report it
            self.errors[name] = traceback.format_exc()
        return self.steps.get(name)

    def need(self, name: str):
        import pytest

        if name in self.errors:
            pytest.fail(
                f"step '{name}' of vllm-cpu {self.release} failed:\n"
                + self.errors[name]
            )
        if name not in self.steps:
            failed = "\n".join(f"{k}:\n{v}" for k, v in self.errors.items())
            if failed:
                pytest.fail(f"step '{name}' did not run; failed before it:\n{failed}")
            pytest.skip(f"step '{name}' did not run")
        return self.steps[name]

    # -- the sequence --------------------------------------------------------

    def run(self) -> "Scenario":
        e = self.engine
        if not self._step("pristine_at_start", self._pristine_at_start):
            return self
        self._step("plugin", self._plugin)
        if self.errors.get("plugin") and self.engine.manifest_diff():
            return self  # the venv is not as built: nothing else can run
        if os.environ.get(STOP_AFTER) == "plugin":
            return self  # the later steps' tests skip ("did not run")
        # eager first: an eager LLM built after a compiled start-up that
        # failed in the same process is not the same as a fresh one (measured:
        # 0.07 nats apart on 0.14.1), after one that worked it is
        self._step(
            "unpatched",
            e.run,
            "unpatched",
            _case_runs(self.cases, ("eager",)) + _case_runs(self.cases, ("compiled",)),
        )
        try:
            if self._step("apply", self._apply, self.form) is None:
                return self
            self._step(
                "patched",
                e.run,
                "patched",
                _case_runs(self.cases, ("eager", "compiled")) + self._extra_runs(),
                XPUFAKES_E2E_WRONG_STANDIN=f"{self.wrong.fake}@{cases.GATE_UP}",
            )
        finally:
            self._step("revert", self._revert, self.form)
        if self.release in cases.RECIPE and "revert" in self.steps:
            self._step("recipe", self._recipe)
        if self.release in cases.SERVE and not self.errors.get("recipe"):
            self._step("serve", self._serve)
        return self

    @property
    def wrong(self):
        return cases.named(self.release, cases.WRONG_STANDIN[self.release])

    def _extra_runs(self) -> list[dict]:
        """In the patched process, after the cases: the wrong stand-in's run
        (its knob armed for the process, active only during this run), and
        the TP=2 reference of vllm serve where it needs one."""
        runs = [
            {
                "name": f"{self.wrong.name}/compiled-wrong-standin",
                "format": self.wrong.format,
                "mode": "compiled",
                "llm": self.wrong.llm,
                "env": {"XPUFAKES_E2E_WRONG_NOW": "1"},
            }
        ]
        if cases.SERVE_REFERENCE_TP.get(self.release) == SERVE_TP:
            case = cases.named(self.release, cases.SERVE[self.release])
            runs.append(
                {
                    "name": f"{case.name}/compiled-tp{SERVE_TP}",
                    "format": case.format,
                    "mode": "compiled",
                    "llm": dict(
                        case.llm,
                        tensor_parallel_size=SERVE_TP,
                        distributed_executor_backend="mp",
                    ),
                    "env": {"VLLM_CPU_OMP_THREADS_BIND": TP2_BINDING},
                }
            )
        return runs

    def _plugin(self) -> dict:
        """The plugin into the unpatched venv by pip, as the person running
        an image installs it; its runs; pip uninstall. The venv's vllm/ and
        vLLM's .dist-info are byte-identical throughout (what pip adds is
        the plugin's own package and .dist-info only)."""
        e = self.engine
        wheel = engine.plugin_wheel()
        e.pip("install", "--no-deps", "--force-reinstall", str(wheel))
        result: dict = {"wheel": wheel.name}
        try:
            result["installed"] = e.manifest_diff()
            runs = _case_runs(self.cases, ("compiled",))
            result["runs"] = e.run("plugin", runs)
            if self.release in cases.PLUGIN_SERVE:
                case = cases.named(self.release, cases.PLUGIN_SERVE[self.release])
                result["serve"] = self._serve_patched(case, "serve-plugin")
            if self.release in cases.PLUGIN_FRONT_END:
                result["front_end"] = self._front_end()
        finally:
            e.pip("uninstall", "-y", engine.PLUGIN_DIST)
            result["after_uninstall"] = e.manifest_diff()
        return result

    def _front_end(self) -> dict:
        """Where vLLM's front end sets up logging after it loads the plugins:
        that front end up to where it would start the engine
        (e2e/engine/front_end.py), and the issue's one-line check with the
        plugin's line logged as before say.py after it (the control); each
        process's log, in vLLM's format with each line's pid
        (server.PID_PREFIX)."""
        e = self.engine
        work = e.work / "front-end"
        work.mkdir(parents=True, exist_ok=True)
        case = cases.named(self.release, cases.PLUGIN_FRONT_END[self.release])
        env = engine_env(work, self.release, VLLM_LOGGING_PREFIX=server.PID_PREFIX)
        found: dict = {}
        out = work / "front-end.json"
        runs = {
            "probe": [
                str(FRONT_END),
                str(e.models / case.format),
                str(out),
                CONTROL_LINE,
                NEXT_LINE,
            ],  # fmt: skip
            "one_line": ["-c", ONE_LINE + "; " + ONE_LINE_CONTROL],
        }
        for name, args in runs.items():
            start = time.monotonic()
            done = subprocess.run(
                [str(e.python), *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            timed(f"{self.release}: front end ({name})", time.monotonic() - start)
            assert done.returncode == 0, (
                name,
                done.stdout[-3000:],
                done.stderr[-3000:],
            )
            (work / f"{name}.log").write_text(done.stdout + done.stderr)
            found[name] = {"log": done.stdout, "stderr": done.stderr}
        found["probe"]["result"] = json.loads(out.read_text())
        return found

    def _pristine_at_start(self) -> dict:
        """The venv as built. If not (a session that died while it was
        patched, or a revert that left a file changed): make revert, then the
        vllm .dist-info files put back from the build's copy; said in the
        summary (the revert test of the session that caused it failed)."""
        diff = self.engine.manifest_diff()
        found = {"found": diff}
        if any(line.startswith("added: vllm_xpu_fakes") for line in diff):
            self.engine.pip("uninstall", "-y", engine.PLUGIN_DIST)  # left installed
            diff = self.engine.manifest_diff()
        if diff:
            found["revert"] = self.engine.make("revert", check=False).stdout
            diff = self.engine.manifest_diff()
        if diff:
            found["restored"] = engine.venvs.restore_dist_info(self.engine.venv, diff)
        if found["found"]:
            timed(
                f"{self.release}: the venv was not as built at the start; repaired",
                0,
                **found,
            )
        self.engine.assert_pristine()
        return found

    def _apply(self, form: str) -> dict:
        done = self.engine.make("apply", form)
        root = self.engine.site_packages
        owner = next(root.glob("vllm_cpu-*.dist-info"))
        added = {
            rel: engine.venvs.sha256_record(root / rel)
            for rel in ("vllm/_xpu_gemm_fakes.py", "vllm/_ipex_woq_linear.py")
            if (root / rel).is_file()
        }
        return {
            "output": done.stdout,
            "status": self.engine.status(),
            "owner_record": (owner / "RECORD").read_text(),
            "added": added,
        }

    def _revert(self, form: str) -> dict:
        done = self.engine.make("revert", form, check=False)
        return {
            "returncode": done.returncode,
            "output": done.stdout + done.stderr,
            "state": self.engine.state(),
            "diff": self.engine.manifest_diff(),
        }

    def _recipe(self) -> dict:
        e = self.engine
        root = e.site_packages
        case = cases.named(self.release, cases.RECIPE[self.release])
        saved = downstream.apply(self.release, root)
        result: dict = {}
        try:
            edited = downstream.changed_bytes(root, saved)
            done = e.make("apply", "VLLM", check=False)
            result["apply"] = {
                "returncode": done.returncode,
                "output": done.stdout + done.stderr,
            }
            result["status"] = e.status()
            if done.returncode == 0:
                result["runs"] = e.run(
                    "recipe", _case_runs([case], ("eager", "compiled"))
                )
            done = e.make("revert", "VLLM", check=False)
            result["revert"] = {
                "returncode": done.returncode,
                "output": done.stdout + done.stderr,
            }
            result["downstream_bytes_back"] = (
                downstream.changed_bytes(root, saved) == edited
            )
        finally:
            downstream.undo(root, saved)
            result["diff"] = e.manifest_diff()
        return result

    # -- vllm serve ----------------------------------------------------------

    def _serve(self) -> dict:
        e = self.engine
        case = cases.named(self.release, cases.SERVE[self.release])
        e.make("apply", self.form)
        try:
            return self._serve_patched(case)
        finally:
            done = e.make("revert", self.form, check=False)
            self.steps["serve_revert"] = {
                "returncode": done.returncode,
                "diff": e.manifest_diff(),
            }

    def _serve_patched(self, case, label: str = "serve") -> dict:
        e = self.engine
        work = e.work / label
        work.mkdir(parents=True, exist_ok=True)
        model = e.models / case.format
        assert (model / "model.safetensors").exists(), model
        port = server.free_port()
        cmd = server.command(
            self.release, e.venv, e.python, model, server.args(port, case.llm)
        )
        env = engine_env(
            work,
            self.release,
            VLLM_CPU_OMP_THREADS_BIND=TP2_BINDING,
            VLLM_LOGGING_PREFIX=server.PID_PREFIX,
        )
        log = open(work / "server.log", "w")  # noqa: SIM115 - closed in finally
        start = time.monotonic()
        process = server.start(cmd, env, log)
        result: dict = {"cmd": cmd, "port": port, "pid": process.pid}
        try:
            url = f"http://127.0.0.1:{port}"
            server.wait_healthy(url, process, work / "server.log", timeout=600)
            result["startup_s"] = round(time.monotonic() - start, 1)
            result["prompt_logprobs"] = []
            for seq in SEQUENCES:
                choice = server.complete(
                    url, str(model), seq, max_tokens=1, prompt_logprobs=0
                )
                result["prompt_logprobs"].append(
                    [
                        None if d is None else d[str(tok)]["logprob"]
                        for tok, d in zip(seq, choice["prompt_logprobs"], strict=True)
                    ][1:]
                )
            result["greedy"] = []
            for prompt in PROMPTS:
                choice = server.complete(
                    url, str(model), prompt, max_tokens=MAX_TOKENS, logprobs=2
                )
                result["greedy"].append(
                    {
                        "tokens": choice["token_ids"],
                        "top2": [
                            sorted(step.values(), reverse=True)[:2]
                            for step in choice["logprobs"]["top_logprobs"]
                        ],
                    }
                )
        finally:
            server.stop(process)
            log.close()
            timed(
                f"{self.release}: vllm serve TP={SERVE_TP} ({label})",
                time.monotonic() - start,
            )
        result["records"] = [
            json.loads(p.read_text()) for p in sorted(work.glob("plugin-*.json"))
        ]
        result["said"] = server.plugin_lines((work / "server.log").read_text())
        (work / "results.json").write_text(json.dumps(result, indent=1))
        return result
