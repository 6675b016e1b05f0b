# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vllm-xpu-fakes: torch.compile for Intel XPU quantized models in vLLM,
as a vLLM plugin.

vLLM loads its ``vllm.general_plugins`` entry points in every process it
starts (the engine core, each worker, the API server) before a model is
built, and calls ``register()``. It makes the same fix the patch series
makes to vLLM's files, in memory, from the same modules (``plugin.py`` says
what and how). It never raises: a step that fails is undone and logged,
and vLLM runs as it would without that step.
"""


def register() -> None:
    """The entry point (``vllm.general_plugins``); idempotent. The plugin's
    register() never raises (each step undoes itself if it fails); what can
    fail here is loading the plugin's module, before anything changed."""
    import sys

    try:
        from vllm_xpu_fakes import plugin
    except Exception as e:  # noqa: BLE001 - never stop vLLM's start-up
        from vllm_xpu_fakes.say import say

        say(
            f"vllm-xpu-fakes: the plugin cannot be loaded ({type(e).__name__}: "
            f"{e}); nothing was changed: vLLM runs without the plugin's fix",
            warning=True,
        )
        return
    plugin.register(caller=sys._getframe(1).f_code.co_name)


def state() -> dict:
    """What register() did in this process (see plugin.state)."""
    from vllm_xpu_fakes import plugin

    return plugin.state()
