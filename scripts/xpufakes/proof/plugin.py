"""This project's vLLM plugin (plugin/, the package `vllm_xpu_fakes`) where
a tree has it installed: whether it is, which version, whether vLLM will
load it (VLLM_PLUGINS), and vLLM's compile cache made before it was
installed. No torch: data and files only (the audit's dynamic part runs the
plugin's register(): verify.py, model/cli.py)."""

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from xpufakes.common import pluginsource
from xpufakes.common.errors import Refusal


@dataclass(frozen=True)
class Installed:
    directory: Path  # the site-packages (or directory) holding the package
    version: str  # "" if no .dist-info says
    installed_at: float  # the package's files' newest modification time

    def describe(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"vllm-xpu-fakes{version} in {self.directory}"


def find(root: Path, given: str = "") -> Installed | None:
    """The plugin installed next to the tree's vllm/ (an installed vLLM's
    site-packages), or in `given` (a directory holding it: --plugin)."""
    directory = Path(given).resolve() if given else root
    name = pluginsource.package()
    package = directory / name
    if not (package / "__init__.py").is_file():
        if given:
            raise Refusal(
                f"no {name}/ in {directory} (--plugin names the "
                "directory the plugin is installed in)"
            )
        return None
    version = ""
    for info in sorted(directory.glob(f"{name}-*.dist-info")):
        version = info.name.removeprefix(f"{name}-").removesuffix(".dist-info")
    newest = max(p.stat().st_mtime for p in package.glob("*.py"))
    return Installed(directory, version, newest)


def loaded_by_vllm(environ: dict[str, str] | None = None) -> str:
    """'' if vLLM loads the plugin, else why not (VLLM_PLUGINS is an
    allow-list of entry point names)."""
    value = (environ if environ is not None else os.environ).get("VLLM_PLUGINS")
    if value is None:
        return ""
    names = [n.strip() for n in value.split(",") if n.strip()]
    entry_point = pluginsource.entry_point()[0]
    if entry_point in names:
        return ""
    return (
        f"VLLM_PLUGINS={value!r} does not name {entry_point!r}: vLLM will not "
        f"load the plugin (add it: VLLM_PLUGINS={','.join([*names, entry_point])})"
    )


def compile_cache(environ: dict[str, str] | None = None) -> Path:
    """vLLM's compile cache directory (VLLM_CACHE_ROOT, else
    $XDG_CACHE_HOME/vllm or ~/.cache/vllm; torch_compile_cache below it)."""
    env = environ if environ is not None else os.environ
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm"
    )
    return Path(root) / "torch_compile_cache"


def stale_cache(installed: Installed, environ: dict[str, str] | None = None) -> str:
    """'' or what in vLLM's compile cache was made before the plugin was
    installed: a cache hit reuses a graph compiled with the fakes vLLM had
    then (docs/plugin.md: what was measured)."""
    cache = compile_cache(environ)
    if not cache.is_dir():
        return ""
    older = [
        entry
        for entry in cache.iterdir()
        if entry.stat().st_mtime < installed.installed_at
    ]
    if not older:
        return ""
    when = datetime.fromtimestamp(installed.installed_at, UTC).strftime(
        "%Y-%m-%d %H:%M"
    )
    return (
        f"vLLM's compile cache {cache} has {len(older)} entr"
        f"{'y' if len(older) == 1 else 'ies'} made before the plugin was installed "
        f"({when} UTC): a start-up that hits one reuses what was compiled "
        f"with vLLM's own fakes; remove them (rm -rf {cache}) or start once "
        "with VLLM_DISABLE_COMPILE_CACHE=1"
    )
