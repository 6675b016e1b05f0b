"""This project's vLLM plugin (plugin/, the package `vllm_xpu_fakes`) where
a tree has it installed: whether it is, which version, whether vLLM will
load it (VLLM_PLUGINS), and vLLM's compile cache made before it was
installed. No torch: data and files only (the audit's dynamic part runs the
plugin's register(): verify.py, model/cli.py).

What vLLM does with VLLM_PLUGINS and where its compile cache is, the
plugin's own module says (plugin/vllm_xpu_fakes/installed.py, loaded here by
its path): the audit and the plugin's self-check (`python -m
vllm_xpu_fakes`) read one source."""

from dataclasses import dataclass
from pathlib import Path

from xpufakes.common import bypath, paths, pluginsource
from xpufakes.common.errors import Refusal

PACKAGE = pluginsource.package()


def shipped_module(name: str):
    """A module of the plugin's package loaded from the checkout by its path,
    not as part of the package (installed.py, opcheck.py: standard library
    only when imported)."""
    return bypath.load(
        f"_{PACKAGE}_{name}", paths.REPO / "plugin" / PACKAGE / f"{name}.py"
    )


SHARED = shipped_module("installed")


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
    for info in sorted(directory.glob(f"{PACKAGE}-*.dist-info")):
        version = info.name.removeprefix(f"{PACKAGE}-").removesuffix(".dist-info")
    return Installed(directory, version, SHARED.installed_at(package))


def loaded_by_vllm(environ: dict[str, str] | None = None) -> str:
    """'' if vLLM loads the plugin, else why not (VLLM_PLUGINS)."""
    return SHARED.loaded_by_vllm(environ, pluginsource.entry_point()[0])


def stale_cache(installed: Installed, environ: dict[str, str] | None = None) -> str:
    """'' or what in vLLM's compile cache was made before the plugin was
    installed."""
    return SHARED.stale_cache(installed.installed_at, environ)
