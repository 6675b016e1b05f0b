"""Whether vLLM compiles the model on XPU in a tree older than the first
release this tool patches (0.10.2), read from the tree's
vllm/platforms/xpu.py. Such a tree is either not affected (nothing on XPU
is traced) or refused; from 0.10.2 on, torch.compile is on on XPU (off only
with LoRA, up to 0.17.1).

What the releases do, read from their sdists:

* 0.10.0 - 0.10.1.1: `XPUPlatform.check_and_update_config` sets
  `compilation_config.level = CompilationLevel.NO_COMPILATION` (a "FIXME:
  Temporarily forcing eager mode", vllm/platforms/xpu.py lines 93-98):
  torch.compile is off on XPU.
* 0.9.2: XPU runs on vLLM's V1 engine (`XPUPlatform.supports_v1` returns
  True), and `VllmConfig.__post_init__` sets the compilation level to
  PIECEWISE (vllm/config.py lines 4558-4564) before it calls the platform's
  `check_and_update_config` (line 4624), whose `enforce_eager = True`
  (vllm/platforms/xpu.py lines 94-98) then turns off CUDA graphs, not
  compilation: the model is compiled. Affected, and not pinned.
* 0.9.1 and older: XPU has no V1 support (no `supports_v1` in
  vllm/platforms/xpu.py), so it runs on the V0 engine, whose compilation
  level is NO_COMPILATION unless the user asks for one (`-O`).
"""

import re
from pathlib import Path

from xpufakes.trees import pins

XPU_PLATFORM = "vllm/platforms/xpu.py"
_FORCED_OFF = re.compile(
    r"compilation_config\.level\s*=\s*CompilationLevel\.NO_COMPILATION"
)
_SUPPORTS_V1 = re.compile(r"^\s*def supports_v1\(", re.M)

FORCED_OFF = "torch.compile is off on XPU in this release"
V0_ONLY = (
    "XPU runs on vLLM's V0 engine in this release, which compiles nothing "
    "unless asked to with -O"
)
NO_XPU = "this release has no XPU platform"


def off_on_xpu(root: Path, release: tuple[int, ...]) -> str | None:
    """Why nothing on XPU is traced in this tree (one phrase), or None: it
    compiles on XPU, or it is not older than the first patched release."""
    if release >= pins.FIRST_PATCHED:
        return None
    platform = root / XPU_PLATFORM
    if not platform.is_file():
        return NO_XPU
    text = platform.read_text(errors="replace")
    if _FORCED_OFF.search(text):
        return FORCED_OFF
    if not _SUPPORTS_V1.search(text):
        return V0_ONLY
    return None
