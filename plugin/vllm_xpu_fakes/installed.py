# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plugin as installed: whether vLLM loads it (``VLLM_PLUGINS``), and
what in vLLM's compile cache was made before it was installed.

The one source of this knowledge: the self-check (``python -m
vllm_xpu_fakes``) imports it, and the checkout's ``make audit``
(scripts/xpufakes/proof/plugin.py) loads this file by its path. So it is
standard library only and imports nothing of its own package.
"""

import os
from datetime import datetime, timezone
from pathlib import Path

GROUP = "vllm.general_plugins"  # the entry point group vLLM loads
ENTRY_POINT = "xpu_fakes"  # the plugin's name in it (plugin/pyproject.toml)


def allow_list(environ: dict | None = None) -> list[str] | None:
    """VLLM_PLUGINS as vLLM reads it (vllm/envs.py: the value split at
    commas, nothing stripped), or None if it is not set (every plugin)."""
    env = os.environ if environ is None else environ
    value = env.get("VLLM_PLUGINS")
    return None if value is None else value.split(",")


def loaded_by_vllm(environ: dict | None = None, name: str = ENTRY_POINT) -> str:
    """'' if vLLM loads the plugin `name`, else why not: VLLM_PLUGINS is an
    allow-list of entry point names, compared as vLLM compares them."""
    names = allow_list(environ)
    if names is None or name in names:
        return ""
    value = ",".join(names)
    kept = [n.strip() for n in names if n.strip() and n.strip() != name]
    spaced = [n for n in names if n != name and n.strip() == name]
    note = f"; vLLM compares the names as written: {spaced[0]!r}" if spaced else ""
    return (
        f"VLLM_PLUGINS={value!r} does not name {name!r}: vLLM will not load "
        f"the plugin (add it: VLLM_PLUGINS={','.join([*kept, name])}){note}"
    )


def compile_cache(environ: dict | None = None) -> Path:
    """vLLM's compile cache directory (VLLM_CACHE_ROOT, else
    $XDG_CACHE_HOME/vllm or ~/.cache/vllm; torch_compile_cache below it)."""
    env = os.environ if environ is None else environ
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm"
    )
    return Path(root) / "torch_compile_cache"


def installed_at(package: Path) -> float:
    """When the plugin in the directory `package` was installed: its
    modules' newest modification time (pip writes them when it installs)."""
    return max(p.stat().st_mtime for p in Path(package).glob("*.py"))


def stale_cache(since: float, environ: dict | None = None) -> str:
    """'' or what in vLLM's compile cache was made before `since` (when the
    plugin was installed): a cache hit reuses a graph compiled with the
    fakes vLLM had then (docs/plugin.md, the compile cache)."""
    cache = compile_cache(environ)
    if not cache.is_dir():
        return ""
    older = [entry for entry in cache.iterdir() if entry.stat().st_mtime < since]
    if not older:
        return ""
    when = datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%d %H:%M")
    return (
        f"vLLM's compile cache {cache} has {len(older)} entr"
        f"{'y' if len(older) == 1 else 'ies'} made before the plugin was installed "
        f"({when} UTC): a start-up that hits one reuses what was compiled "
        f"with vLLM's own fakes; remove them (rm -rf {cache}) or start once "
        "with VLLM_DISABLE_COMPILE_CACHE=1"
    )
