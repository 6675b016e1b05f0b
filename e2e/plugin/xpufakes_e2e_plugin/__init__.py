"""Test-only vLLM plugin: vLLM's own XPU quantized linear paths on the CPU.

Registered through the ``vllm.general_plugins`` entry point, so vLLM runs
``register()`` in every process it starts (the API server, the engine core,
each worker) before a model is built. It

* defines the XPU kernels as CPU stand-ins with their exact schemas: this
  repository's reference kernels
  (``vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py``) and its
  IPEX stand-in (``tests/support/woq_probe.py``), loaded from the checkout
  named by ``XPUFAKES_E2E_REPO`` (``standins.py``);
* routes vLLM's XPU linear methods and kernels onto them on the CPU platform;
  everything it changes in vLLM, and why, is listed in one place,
  ``overrides.OVERRIDES``;
* imports the vLLM module that registers the XPU fakes, as vLLM does on an
  XPU at start-up. It registers no fake of its own: the fakes Dynamo meets
  are the ones the vLLM tree registers (patched by this project or not), or
  the ones this project's vLLM plugin registers where it is installed
  (``vllm_xpu_fakes``, whose register() it calls once the stand-ins exist).
  ``XPUFAKES_E2E_WRONG_STANDIN`` (``negative.py``) makes one stand-in
  deliberately disagree with its fake, the negative control of the tests'
  output comparison.

With ``XPUFAKES_E2E_RECORD_DIR`` set, each process writes what it did to
``plugin-<pid>.json`` there (the tests check that every worker has it).
Nothing here may be installed outside the e2e venvs that make e2e builds.
"""

import json
import os
import sys
from pathlib import Path

_state: dict = {}


def register() -> None:
    """The entry point; idempotent (vLLM may call it more than once)."""
    if _state:
        return
    from . import overrides, standins

    era, release = standins.vllm_era_and_release()
    _state.update(era=era, release=release, pid=os.getpid())
    _state["standins"], _state["wrong_standin"] = standins.install(era, release)
    _state["overrides"] = overrides.apply(era)
    _state["registering_module"] = standins.import_registering_module(era)
    _state["vllm_xpu_fakes"] = _the_fix_as_a_plugin()
    _state["fakes"] = standins.fake_owners()
    _record()


def _the_fix_as_a_plugin() -> dict | None:
    """This project's vLLM plugin (plugin/, vllm_xpu_fakes), where make e2e
    installed it: its register() once more, now that the stand-ins exist.
    vLLM calls the plugins in an order of its own; on an XPU host the
    kernel packages exist before any plugin runs, here they exist once this
    plugin has made them, and the fix's plugin does only what it could not
    do when it ran first (its steps are idempotent)."""
    try:
        import vllm_xpu_fakes
    except ImportError:
        return None
    vllm_xpu_fakes.register()
    return vllm_xpu_fakes.state()


def state() -> dict:
    """What register() did in this process (JSON-able); the fix's plugin's
    state as it is now (vLLM may have called it again since)."""
    found = dict(_state)
    if found.get("vllm_xpu_fakes") is not None:
        import vllm_xpu_fakes
        from vllm_xpu_fakes import plugin

        # the copies out of reach: a whole-heap search, which register()
        # never runs at start-up; here, for the tests, after the model is made
        getattr(plugin, "unreached", list)()
        found["vllm_xpu_fakes"] = vllm_xpu_fakes.state()
    return found


def _record() -> None:
    directory = os.environ.get("XPUFAKES_E2E_RECORD_DIR")
    if not directory:
        return
    import multiprocessing

    record = dict(
        _state,
        process=multiprocessing.current_process().name,
        argv=sys.argv[:2],
        ppid=os.getppid(),
    )
    path = Path(directory) / f"plugin-{os.getpid()}.json"
    path.write_text(json.dumps(record, indent=1))
