"""The in-tree tests are safe in any vLLM test process: off XPU they skip
unless VLLM_XPU_FAKES_CPU_REFERENCE=1, and even then the stand-in ops (and
the fakes registered for them) exist only while the module's tests run.

Each check runs in a fresh process on a minimal tree: vllm/ with the fake
modules (and small equivalents of the vLLM helpers they import), tests/ with
the overlay's tests and a tests/kernels/utils.py whose opcheck is vLLM's
(torch's, with an fp8-capable allclose). Negative control: the overlay as it
was before (main's commit that defined the ops at import) leaves ops behind."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xpufakes.common import ops, paths

QUANT = "tests/kernels/quantization"
FILES = (
    "vllm/_xpu_gemm_fakes.py",
    "vllm/_ipex_woq_linear.py",
    f"{QUANT}/xpu_gemm_reference.py",
    f"{QUANT}/test_xpu_gemm_fakes.py",
    f"{QUANT}/test_ipex_woq_linear.py",
)
# The commit before the set-up/teardown fixtures (ops defined at import).
UNSAFE_COMMIT = "b878c97"

# Prints which _xpu_C / torch_ipex ops and fakes exist in this process.
LEFTOVERS = f"XPU_C_GEMMS = {list(ops.XPU_C_GEMMS)!r}\n" + textwrap.dedent(
    """
    import json, torch
    from torch._library import simple_registry
    NAMES = {
        "_xpu_C": XPU_C_GEMMS,
        "torch_ipex": ["fp8_gemm_w8a16", "mm_int4", "mm_common"],
    }

    def leftovers():
        ops = [f"{ns}::{n}" for ns, names in NAMES.items() for n in names
               if hasattr(getattr(torch.ops, ns), n)]
        fakes = [q for q in (f"{ns}::{n}" for ns, names in NAMES.items()
                              for n in names)
                 if simple_registry.singleton.find(q).fake_impl.kernel is not None]
        return {"ops": ops, "fakes": fakes}
    """
)

PLUGIN = LEFTOVERS + textwrap.dedent(
    """
    import os

    def pytest_sessionfinish(session, exitstatus):
        with open(os.environ["LEFTOVERS_OUT"], "w") as f:
            json.dump(leftovers(), f)
    """
)


# vLLM's tests/kernels/utils.py opcheck: torch's, with torch.allclose taking
# fp8 tensors on the CPU
KERNEL_UTILS = textwrap.dedent(
    """
    import unittest.mock

    import torch


    def fp8_allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
        return bool(
            torch._refs.allclose(
                a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=equal_nan
            )
        )


    def opcheck(*args, **kwargs):
        with unittest.mock.patch("torch.allclose", new=fp8_allclose):
            return torch.library.opcheck(*args, **kwargs)
    """
)

VLLM_PLATFORMS = textwrap.dedent(
    """
    class _Platform:
        dispatch_key = "CPU"


    current_platform = _Platform()
    """
)

VLLM_UTILS = textwrap.dedent(
    """
    import torch

    _LIB = torch.library.Library("vllm", "FRAGMENT")


    def direct_register_custom_op(
        op_name, op_func, mutates_args=(), fake_impl=None, dispatch_key="CPU"
    ):
        schema = torch.library.infer_schema(op_func, mutates_args=mutates_args)
        _LIB.define(op_name + schema)
        _LIB.impl(op_name, op_func, dispatch_key)
        if fake_impl is not None:
            _LIB._register_fake(op_name, fake_impl)
    """
)


def _minimal_tree(root: Path, read) -> Path:
    for rel in FILES:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(read(rel))
    for package in ("vllm", "tests", "tests/kernels", QUANT):
        (root / package / "__init__.py").touch()
    (root / "tests/kernels/utils.py").write_text(KERNEL_UTILS)
    # what vllm/_ipex_woq_linear.py takes from vLLM: the platform's dispatch
    # key and vLLM's op registration (vllm::ipex_woq_linear is not an op of
    # the namespaces checked here)
    (root / "vllm/platforms").mkdir(exist_ok=True)
    (root / "vllm/platforms/__init__.py").write_text(VLLM_PLATFORMS)
    (root / "vllm/utils").mkdir(exist_ok=True)
    (root / "vllm/utils/__init__.py").write_text(VLLM_UTILS)
    (root / "leftovers_plugin.py").write_text(PLUGIN)
    return root


def _current(rel: str) -> str:
    return (paths.OVERLAY / rel).read_text()


def _at_unsafe_commit(rel: str) -> str:
    return subprocess.run(
        ["git", "-C", str(paths.REPO), "show", f"{UNSAFE_COMMIT}:vllm_overlay/{rel}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _env(root: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_XPU_FAKES_CPU_REFERENCE"}
    env["PYTHONPATH"] = str(root)
    env.update(extra)
    return env


def _import_then_leftovers(root: Path, module: str) -> dict:
    code = LEFTOVERS + f"\nimport {module}\nprint(json.dumps(leftovers()))\n"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


def _pytest_then_leftovers(root: Path, test: str, *args: str, **env: str):
    out = root / "leftovers.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--noconftest",
            "-p",
            "leftovers_plugin",
            "-rs",
            test,
            *args,
        ],
        cwd=root,
        env=_env(root, LEFTOVERS_OUT=str(out), **env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return result, json.loads(out.read_text())


NOTHING = {"ops": [], "fakes": []}
TESTS = [f"{QUANT}/test_xpu_gemm_fakes.py", f"{QUANT}/test_ipex_woq_linear.py"]


@pytest.mark.parametrize("test", TESTS, ids=lambda t: Path(t).stem)
def test_importing_the_test_module_defines_no_op(test, tmp_path):
    root = _minimal_tree(tmp_path, _current)
    module = test.removesuffix(".py").replace("/", ".")
    assert _import_then_leftovers(root, module) == NOTHING


def test_the_old_test_module_left_ops_behind(tmp_path):
    """Negative control: the module that defined the ops at import."""
    root = _minimal_tree(tmp_path, _at_unsafe_commit)
    found = _import_then_leftovers(root, TESTS[0].removesuffix(".py").replace("/", "."))
    assert "_xpu_C::fp8_gemm" in found["ops"], found
    assert "_xpu_C::fp8_gemm" in found["fakes"], found


@pytest.mark.parametrize("test", TESTS, ids=lambda t: Path(t).stem)
def test_off_xpu_the_tests_skip_and_leave_nothing(test, tmp_path):
    root = _minimal_tree(tmp_path, _current)
    result, found = _pytest_then_leftovers(root, test)
    assert result.returncode == 0, result.stdout[-2000:]
    assert " skipped" in result.stdout and " passed" not in result.stdout
    assert "VLLM_XPU_FAKES_CPU_REFERENCE=1" in result.stdout
    assert found == NOTHING


def test_with_cpu_reference_the_ops_exist_only_during_the_tests(tmp_path):
    root = _minimal_tree(tmp_path, _current)
    result, found = _pytest_then_leftovers(
        root,
        TESTS[0],
        "-k",
        "fp8_gemm_w8a16-2d-float16-float8_e4m3fn-nt or rejects or registration",
        VLLM_XPU_FAKES_CPU_REFERENCE="1",
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout
    assert found == NOTHING


def test_with_cpu_reference_the_old_module_left_ops_behind(tmp_path):
    """Negative control for the session check above."""
    root = _minimal_tree(tmp_path, _at_unsafe_commit)
    result, found = _pytest_then_leftovers(
        root, TESTS[0], "-k", "registration", VLLM_XPU_FAKES_CPU_REFERENCE="1"
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "_xpu_C::fp8_gemm" in found["ops"], found
