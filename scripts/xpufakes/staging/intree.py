"""The tests the series adds to vLLM's tests/ tree, and the one pytest
command that runs them (`make test-tree`, and stage's validation)."""

import os
from pathlib import Path

# off XPU, the in-tree tests run only when asked to use the CPU reference
CPU_REFERENCE = "VLLM_XPU_FAKES_CPU_REFERENCE"


def command(python: str, tests: list[str]) -> list[str]:
    """pytest on the in-tree tests, without vLLM's conftest.py (its fixtures
    need a whole vLLM install) and without a cache in the tree."""
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest"] + [
        *tests
    ]


def environment(root: Path, base: dict[str, str]) -> dict[str, str]:
    """`base` with the tree first on the Python path and, unless `base`
    says otherwise, the CPU reference kernels asked for."""
    env = dict(base)
    env.setdefault(CPU_REFERENCE, "1")
    paths = [str(root), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
