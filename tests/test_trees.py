"""`apply` on the trees users really have, built here from the pinned
sdists: a release plus a downstream patch near our anchors, a dev-version
relabel, an installed wheel with a `+xpu` version, an unreleased checkout
whose code moved around every anchor, and a mixed-era tree. Each is applied
(by the series or by recipe, with the proof), audited, re-applied (a no-op)
and reverted byte for byte. Negative controls: an anchor removed and a
recipe whose result does not conform are refused, the tree unchanged."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import releases, small_tree, tool
from xpufakes.changes import base
from xpufakes.common import ops
from xpufakes.trees import tree

IPEX_RELEASE, KERNELS_RELEASE = "0.14.1", "0.33.0"
QUANT = "vllm/model_executor/layers/quantization"


def _replace(path, old: str, new: str, count: int = 1) -> None:
    """Edit a file, asserting the edit happened (the fixture is what it says)."""
    text = path.read_text()
    assert text.count(old) >= count, (path, old)
    path.write_text(
        text.replace(old, new) if count == -1 else text.replace(old, new, count)
    )


def _relabel(root, version: str) -> None:
    """Say `version` wherever the tree says which vLLM it is."""
    version_file = root / "vllm" / "_version.py"
    text = version_file.read_text()
    old = text.split("__version__ = version = '", 1)[1].split("'", 1)[0]
    version_file.write_text(text.replace(f"'{old}'", f"'{version}'"))
    for info in [root / "PKG-INFO", *root.glob("*.dist-info/METADATA")]:
        if info.is_file():
            _replace(info, f"Version: {old}\n", f"Version: {version}\n")


# ---------------------------------------------------------------------------
# The trees
# ---------------------------------------------------------------------------

DOWNSTREAM_WOQ = '''\
# SPDX-License-Identifier: Apache-2.0
"""A downstream int4 method that makes its own IPEX WOQ module."""

import torch

from vllm.model_executor.layers.linear import LinearMethodBase


class DownstreamWoqLinearMethod(LinearMethodBase):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        import intel_extension_for_pytorch as ipex

        woq = ipex.llm.quantization.woq_linear
        layer.ipex_qlinear = woq.IPEXWeightOnlyQuantizedLinear.from_weight(
            layer.qweight,
            layer.scales,
            layer.qzeros,
            in_features=layer.input_size_per_partition,
            out_features=layer.output_size_per_partition,
            group_size=128,
        )

    def apply(self, layer, x, bias=None):
        return layer.ipex_qlinear(x)
'''


def downstream_ipex(root):
    """0.14.1 plus an image builder's patch: new imports, a function next to
    the IPEX import, a changed line next to the WOQ anchor, a class moved,
    and a new quantization method that makes its own IPEX WOQ module."""
    releases.copy_of(IPEX_RELEASE, root)
    ops = root / "vllm" / "_ipex_ops.py"
    _replace(ops, "\nimport torch\n", "\nimport functools\n\nimport torch\n")
    _replace(
        ops,
        '    logger.debug("Import error msg: %s", e.msg)\n',
        '    logger.debug("Import error msg: %s", e.msg)\n\n\n'
        "@functools.cache\ndef _downstream_has_ipex() -> bool:\n"
        '    return "ipex" in globals()\n',
    )
    quant = root / QUANT / "ipex_quant.py"
    _replace(
        quant,
        "from vllm._ipex_ops import ipex_ops as ops\n",
        "from vllm._ipex_ops import ipex_ops as ops\n"
        "from vllm.model_executor.layers.quantization.downstream_woq import (\n"
        "    DownstreamWoqLinearMethod,  # noqa: F401\n)\n",
    )
    _replace(
        quant,
        "layer.ipex_output_size = layer.qweight.shape[-1]\n",
        "layer.ipex_output_size = int(layer.qweight.shape[-1])  # downstream\n",
    )
    _replace(
        quant,
        "            )\n        )\n\n    def apply(",
        "            )\n        )\n"
        '        layer.downstream_kind = "gptq"\n\n    def apply(',
    )
    text = quant.read_text()  # move XPUFp8LinearMethod above the GPTQ method
    start = text.index("class XPUFp8LinearMethod(")
    end = text.index("class XPUFp8MoEMethod(")
    moved, text = text[start:end], text[:start] + text[end:]
    at = text.index("class IPEXGPTQLinearMethod(")
    quant.write_text(text[:at] + moved + text[at:])
    (root / QUANT / "downstream_woq.py").write_text(DOWNSTREAM_WOQ)
    return root


def dev_relabel(root):
    """0.10.2's files, built as 0.10.3.dev0+g01efc7ef7 (the bug report's)."""
    releases.copy_of("0.10.2", root)
    _relabel(root, "0.10.3.dev0+g01efc7ef7")
    return root


# Every form in which a tree imports a vLLM build's native modules, at module
# level (an image builder's vllm/_ipex_ops.py does `import vllm._C.ops`).
NATIVE_IMPORTS = """
import vllm._C
import vllm._C.ops
import vllm._C.ops as native_ops
import vllm._moe_C
import vllm._flashmla_C
import vllm.cumem_allocator
from vllm import cumem_allocator  # noqa: F401
from vllm._C import ops  # noqa: F401
from vllm._C.ops import fused_add_rms_norm, rms_norm  # noqa: F401
from vllm.vllm_flash_attn import _vllm_fa2_C  # noqa: F401

_NATIVE_RMS_NORM = native_ops.rms_norm  # looked up now, called later
"""


def report_image(root):
    """The bug report's image tree: 0.10.2 plus an image builder's patch
    (`0.10.3.dev0+g01efc7ef7.d20251125.xpu`) whose vllm/_ipex_ops.py imports
    the build's own native modules at module level, in every form, and calls
    them in its methods."""
    releases.copy_of("0.10.2", root)
    _relabel(root, "0.10.3.dev0+g01efc7ef7.d20251125.xpu")
    ops = root / "vllm" / "_ipex_ops.py"
    _replace(
        ops,
        '    logger.warning("Import error msg: %s", e.msg)\n',
        '    logger.warning("Import error msg: %s", e.msg)\n' + NATIVE_IMPORTS,
    )
    _replace(
        ops,
        "        return ipex.llm.functional.rms_norm(input, weight, epsilon)\n",
        "        out = torch.empty_like(input)\n"
        "        vllm._C.ops.rms_norm(out, input, weight, epsilon)\n"
        "        return out\n",
    )
    return root


DOWNSTREAM_FAKE = """\
if hasattr(torch.ops._xpu_C, "downstream_swizzle"):

    @register_fake("_xpu_C::downstream_swizzle")
    def _downstream_swizzle_fake(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)


"""


def wheel_xpu(root):
    """An installed wheel (site-packages) built as 0.33.0+xpu, whose
    _xpu_ops.py has a new import, a fake of its own between vLLM's and
    imports the build's native modules (NATIVE_IMPORTS; the wheel has their
    `.so` files, which cannot be loaded here)."""
    root.mkdir()
    shutil.copytree(releases.pristine(KERNELS_RELEASE) / "vllm", root / "vllm")
    info = root / "vllm-0.33.0+xpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n"
    )
    _relabel(root, "0.33.0+xpu")
    ops = root / "vllm" / "_xpu_ops.py"
    _replace(
        ops,
        "from collections.abc import Callable\n",
        "import functools  # noqa: F401\nfrom collections.abc import Callable\n",
    )
    _replace(
        ops,
        'if hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"):',
        DOWNSTREAM_FAKE + 'if hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"):',
    )
    _replace(
        ops,
        "\nlogger = init_logger(__name__)\n",
        NATIVE_IMPORTS + "\n" + "import vllm._C_stable_libtorch\nimport vllm.fs_io_C\n"
        "from vllm.spinloop import spin  # noqa: F401\n\n"
        "logger = init_logger(__name__)\n",
    )
    for name in ("_C", "_moe_C", "_flashmla_C", "cumem_allocator"):
        (root / "vllm" / f"{name}.abi3.so").write_bytes(b"\x7fELF not loadable here")
    return root


def _block(text: str, op: str) -> str:
    start = text.index(f'if hasattr(torch.ops._xpu_C, "{op}"):')
    end = text.index("\n\n\n", start) + 3
    return text[start:end]


def unreleased_checkout(root):
    """A git checkout two commits after v0.33.0, no _version.py, where vLLM
    moved code around every anchor: the GEMM fake blocks reordered, one moved
    to the end of the file, code between them, a new import."""
    releases.copy_of(KERNELS_RELEASE, root)
    for generated in ("vllm/_version.py", "PKG-INFO"):
        (root / generated).unlink()
    shutil.rmtree(root / "vllm.egg-info", ignore_errors=True)
    env = tool.git_env("t")

    def git(*args):
        subprocess.run(["git", *args], cwd=root, check=True, env=env)

    git("init", "-q")
    git("config", "gc.auto", "0")
    git("add", "-A")
    git("commit", "-q", "-m", "v0.33.0")
    git("tag", "v0.33.0")
    ops = root / "vllm" / "_xpu_ops.py"
    text = ops.read_text()
    int4 = _block(text, "int4_gemm_w4a16")
    fp4 = _block(text, "fp4_gemm")
    text = text.replace(int4, "").replace(fp4, "")
    text = text.replace(
        'if hasattr(torch.ops._xpu_C, "fp8_gemm"):',
        int4 + "def _unreleased_helper() -> int:\n    return 1\n\n\n"
        'if hasattr(torch.ops._xpu_C, "fp8_gemm"):',
    )
    text = text.rstrip("\n") + "\n\n\n" + fp4.rstrip("\n") + "\n"
    text = text.replace("import torch\n", "import torch\nimport torch.nn\n", 1)
    ops.write_text(text)
    git("commit", "-q", "-am", "move things around")
    (root / "README.unreleased").write_text("x\n")
    git("add", "-A")
    git("commit", "-q", "-m", "another")
    return root


def mixed_era(root):
    """An IPEX-era dev build (0.14.2.dev3) whose fp8 linear moved onto
    torch.ops._xpu_C.fp8_gemm_w8a16."""
    releases.copy_of(IPEX_RELEASE, root)
    _relabel(root, "0.14.2.dev3+gdeadbee")
    _replace(
        root / QUANT / "ipex_quant.py",
        "torch.ops.torch_ipex.fp8_gemm_w8a16(\n"
        "            x, weight, True, weight_scale, bias\n        )",
        "torch.ops._xpu_C.fp8_gemm_w8a16(x, weight.t(), weight_scale, bias)",
    )
    return root


# ---------------------------------------------------------------------------
# The round trip
# ---------------------------------------------------------------------------


def _mtimes(root) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def _audit_ours(target, *args: str) -> dict[str, str]:
    """op -> verdict for the ops of ours that `make audit` sees in the tree."""
    result = tool.run("audit", str(target), "--json", *args)
    report = json.loads(result.stdout)
    return {
        op["op"]: op["verdict"]
        for op in report["ops"]
        if ops.is_ours(op["op"]) and op["verdict"] != "not traced"
    }


def _hashes(root) -> dict[str, str]:
    """sha256 of every file of the tree (git's own files aside)."""
    return {
        path: digest
        for path, digest in releases.file_hashes(root).items()
        if not path.startswith(".git/")
    }


def _round_trip(root, target, *expected: str, static: bool = False) -> str:
    before = _hashes(root)
    result = tool.run("apply", str(target))
    assert result.returncode == 0, result.stdout + result.stderr
    for text in expected:
        assert text in result.stdout, result.stdout

    verdicts = _audit_ours(target)
    assert verdicts, "the audit saw none of our ops"
    assert all(v == "ok" for v in verdicts.values()), verdicts
    if static:  # without loading them, the fakes are seen in the source
        found = _audit_ours(target, "--static")
        assert found.keys() == verdicts.keys(), found
        # (a wrapped IPEX WOQ module is "ok": its op's fake is ours by name)
        assert "unverified fake" in found.values(), found
        assert set(found.values()) <= {"unverified fake", "ok"}, found

    mtimes = _mtimes(root)
    again = tool.run("apply", str(target))
    assert again.returncode == 0 and "already applied" in again.stdout, again
    assert _mtimes(root) == mtimes

    result = tool.run("revert", str(target))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _hashes(root) == before
    return verdicts


def test_downstream_patched_release(tmp_path):
    root = downstream_ipex(tmp_path / "tree")
    # negative control: unpatched, the audit finds unwrapped WOQ modules,
    # among them the downstream method's
    static = json.loads(tool.run("audit", str(root), "--json", "--static").stdout)
    woq = next(op for op in static["ops"] if op["op"].endswith("Linear.forward"))
    assert woq["verdict"].startswith("FAIL")
    assert any("downstream_woq.py" in s["file"] for s in woq["sites"])

    verdicts = _round_trip(
        root,
        root,
        "its files are modified: applying by recipe",
        "proof: every op of ours",
        f"{QUANT}/downstream_woq.py: changed by recipe",
    )
    assert set(verdicts) >= {
        "torch_ipex::fp8_gemm_w8a16",
        "torch_ipex::WeightOnlyQuantizedLinear.forward",
    }


def test_dev_relabel_takes_the_series_of_its_base(tmp_path):
    root = dev_relabel(tmp_path / "tree")
    _round_trip(
        root,
        root,
        "vLLM 0.10.3.dev0+g01efc7ef7 (vllm/_version.py) is a dev/local build: "
        "assuming base 0.10.2",
        "-> series ipex-0.10.2",
    )


def test_installed_wheel_with_local_version(tmp_path):
    root = wheel_xpu(tmp_path / "site-packages")
    _round_trip(
        root,
        root / "vllm",
        "vLLM 0.33.0+xpu (vllm/_version.py) is a dev/local build: assuming base "
        "0.33.0, its release",
        "vllm/_xpu_ops.py: changed by recipe",
    )


def test_report_image_with_native_imports(tmp_path):
    root = report_image(tmp_path / "tree")
    _round_trip(
        root,
        root,
        "vLLM 0.10.3.dev0+g01efc7ef7.d20251125.xpu (vllm/_version.py) is a "
        "dev/local build: assuming base 0.10.2",
        "proof: every op of ours",
        "vllm/_ipex_ops.py: changed by recipe",
    )


# The stand-in for vLLM's compiled extensions before issue 16: a plain empty
# module for names like vllm._C (the negative control).
TODAYS_STUB = """
import importlib.abc, importlib.machinery, re, sys, types
from xpufakes import cli
from xpufakes.proof.xpu import extensions

class Stubs(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if re.fullmatch(r"vllm\\._(\\w+_)?C", fullname):
            return importlib.machinery.ModuleSpec(fullname, self)
    def create_module(self, spec):
        return types.ModuleType(spec.name)
    def exec_module(self, module):
        pass

extensions.stub_vllm_extensions = lambda *a: sys.meta_path.append(Stubs())
sys.exit(cli.main(sys.argv[1:]))
"""


def test_report_image_is_refused_by_the_old_stand_in(tmp_path):
    """Negative control: with the stand-in the proof and audit used before,
    the report's image tree cannot be loaded."""
    root = report_image(tmp_path / "tree")
    result = subprocess.run(
        [sys.executable, "-c", TODAYS_STUB, "verify-xpu", "--vllm", str(root)]
        + ["--standins", "intel-extension-for-pytorch xpu", "--quick"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS)),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "No module named 'vllm._C.ops'; 'vllm._C' is not a package" in (
        result.stderr
    )


@pytest.mark.parametrize(
    ("module", "error"),
    [
        ("def rms_norm(x:\n    return x\n", "SyntaxError: '(' was never closed"),
        (
            "from vllm.utlis import cdiv  # a typo\n",
            "ModuleNotFoundError: No module named 'vllm.utlis'",
        ),
    ],
    ids=["syntax-error", "missing-module"],
)
def test_report_image_whose_own_python_is_broken_is_refused(tmp_path, module, error):
    """The stand-ins answer for native modules only: an error in the tree's
    own Python still fails the proof and the audit, naming the file."""
    root = report_image(tmp_path / "tree")
    (root / "vllm" / "downstream_norms.py").write_text(module)
    _replace(
        root / "vllm" / "_ipex_ops.py",
        "import vllm._C\n",
        "import vllm._C\nimport vllm.downstream_norms  # noqa: F401\n",
    )
    where = "vllm/downstream_norms.py, line 1: "
    _refused_unchanged(
        root,
        ("apply", str(root)),
        "the proof could not run",
        f"vllm._ipex_ops cannot be imported: {where}",
        error,
        "nothing changed",
    )
    result = tool.run("audit", str(root))
    assert result.returncode == 1, result.stdout
    assert result.stderr.strip().splitlines() == [
        "error: cannot load the tree's fakes against the stand-ins: "
        f"vllm._ipex_ops cannot be imported: {where}{error}"
    ]


def test_unreleased_checkout_with_code_moved(tmp_path):
    root = unreleased_checkout(tmp_path / "tree")
    verdicts = _round_trip(
        root,
        root,
        "vLLM 0.33.0 (git describe --tags) is unreleased (2 commit(s) after "
        "v0.33.0): assuming base 0.33.0",
        "vllm/_xpu_ops.py: changed by recipe",
    )
    assert {"_xpu_C::fp4_gemm", "_xpu_C::int4_gemm_w4a16"} <= set(verdicts)
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
    )
    assert status.stdout == ""


def test_mixed_era_registers_both_families(tmp_path):
    root = mixed_era(tmp_path / "tree")
    static = json.loads(tool.run("audit", str(root), "--json", "--static").stdout)
    fp8 = next(op for op in static["ops"] if op["op"] == "_xpu_C::fp8_gemm_w8a16")
    assert fp8["verdict"] == "FAIL: no fake"  # negative control

    verdicts = _round_trip(
        root,
        root,
        "mixed tree: IPEX era, and its code calls the _xpu_C GEMMs",
        "vllm/_ipex_ops.py: changed by recipe",
        static=True,
    )
    assert verdicts["_xpu_C::fp8_gemm_w8a16"] == "ok"


# ---------------------------------------------------------------------------
# Refusals on the recipe path, status, PATCHES=, the default tree
# ---------------------------------------------------------------------------


def _refused_unchanged(root, args: tuple, *words: str, env=None) -> None:
    """`python -m xpufakes <args>` refuses with one line holding `words`, and
    the tree is unchanged."""
    before = _hashes(root)
    tool.refused(tool.run(*args, env=env), *words)
    assert _hashes(root) == before


def test_anchor_removed_is_refused(tmp_path):
    root = releases.copy_of(KERNELS_RELEASE, tmp_path / "kernels")
    _replace(
        root / "vllm" / "_xpu_ops.py",
        'hasattr(torch.ops._xpu_C, "',
        'hasattr(torch.ops._xpu_C, "renamed_',
        count=-1,
    )
    _refused_unchanged(
        root,
        ("apply", str(root)),
        "vllm/_xpu_ops.py",
        'no `if hasattr(torch.ops._xpu_C, "<gemm>"):` block',
        "0001-xpu-use-exact-fakes-for-xpu-c-gemms.patch",
    )

    root = releases.copy_of(IPEX_RELEASE, tmp_path / "ipex")
    for path in ("ipex_quant.py", "kernels/mixed_precision/xpu.py"):
        _replace(root / QUANT / path, ".from_weight(", ".from_weights(", count=-1)
    _refused_unchanged(
        root,
        ("apply", str(root)),
        "IPEXWeightOnlyQuantizedLinear.from_weight(...)",
        "0002-xpu-run-ipex-woq-linear-as-one-opaque-op.patch",
    )


BROKEN_FAKE = """

def _broken_fp8_gemm_w8a16_fake(A, B, B_scale, bias):
    return A.new_empty(A.shape[:-1] + (B.size(1) + 1,))  # one column too many


XPU_GEMM_FAKES["_xpu_C::fp8_gemm_w8a16"] = XPU_GEMM_FAKES[
    "_xpu_C::fp8_gemm_w8a16"
]._replace(fake=_broken_fp8_gemm_w8a16_fake)
"""


def test_result_that_does_not_conform_is_refused(tmp_path):
    overlay = tmp_path / "overlay"
    shutil.copytree(tool.SCRIPTS.parent / "vllm_overlay", overlay)
    with open(overlay / "vllm" / "_xpu_gemm_fakes.py", "a") as f:
        f.write(BROKEN_FAKE)
    root = wheel_xpu(tmp_path / "site-packages")
    _refused_unchanged(
        root,
        ("apply", str(root)),
        "the edited tree fails the proof",
        "_xpu_C::fp8_gemm_w8a16: FAIL: fake does not conform",
        "nothing changed",
        env={"VLLM_XPU_FAKES_OVERLAY": str(overlay)},
    )


def test_proof_that_cannot_run_is_refused(tmp_path):
    """A proof Python that runs nothing (here /bin/false) proves nothing:
    refused, the tree unchanged."""
    root = downstream_ipex(tmp_path / "tree")
    _refused_unchanged(
        root,
        ("apply", str(root)),
        "the proof could not run (/bin/false",
        "nothing changed",
        env={"VLLM_XPU_FAKES_PROOF_PYTHON": "/bin/false"},
    )


def test_status_and_revert_of_a_tree_applied_by_recipe(tmp_path):
    root = wheel_xpu(tmp_path / "site-packages")
    ops = root / "vllm" / "_xpu_ops.py"
    original = ops.read_bytes()
    before = _hashes(root)
    result = tool.run("check", str(root), "--no-proof")
    assert result.returncode == 0, result.stderr
    assert "vllm/_xpu_ops.py: would change by recipe" in result.stdout
    assert _hashes(root) == before  # check changes nothing
    result = tool.run("apply", str(root), "--no-proof")
    assert result.returncode == 0, result.stderr
    assert "NOT proven" in result.stdout
    state = json.loads((root / "vllm" / ".xpufakes-state.json").read_text())
    assert state["base"] == "0.33.0" and state["version"] == "0.33.0+xpu"
    status = tool.run("status", str(root)).stdout
    assert "vllm/_xpu_ops.py: applied by recipe on a modified file" in status
    assert "state: patched by recipe" in status

    patched = ops.read_bytes()
    ops.write_bytes(patched + b"# changed after apply\n")
    fakes = root / "vllm" / "_xpu_gemm_fakes.py"
    fakes.write_bytes(fakes.read_bytes() + b"# also changed\n")
    _refused_unchanged(
        root,
        ("revert", str(root)),
        "changed since apply by recipe",
        "vllm/_xpu_ops.py",
        "vllm/_xpu_gemm_fakes.py",
    )
    assert (
        "state: changed since apply by recipe" in tool.run("status", str(root)).stdout
    )

    ops.write_bytes(patched)
    fakes.write_bytes(fakes.read_bytes().removesuffix(b"# also changed\n"))
    assert tool.run("revert", str(root)).returncode == 0
    assert ops.read_bytes() == original
    assert not (root / "vllm" / ".xpufakes-state.json").exists()


def _small_recipe_tree(path):
    """0.14.1's files the tool reads and writes, one of them changed
    downstream: apply takes the recipe path (without the proof: not what
    these tests are about)."""
    root = small_tree.make(IPEX_RELEASE, path)
    with open(root / "vllm" / "_ipex_ops.py", "a") as f:
        f.write("# a downstream change\n")
    return root


def test_patches_revert_on_a_tree_applied_by_recipe(tmp_path):
    """Revert by recipe restores each file's bytes from before every patch:
    PATCHES= naming only some of those applied is refused with what to do
    instead (before issue 16 it was ignored and every patch reverted)."""
    root = _small_recipe_tree(tmp_path / "tree")
    before = _hashes(root)
    assert tool.run("apply", str(root), "--no-proof").returncode == 0
    _refused_unchanged(
        root,
        ("revert", str(root), "--patches", "0002"),
        "0001-xpu-register-fakes-for-ipex-gemms.patch, "
        "0002-xpu-run-ipex-woq-linear-as-one-opaque-op.patch, "
        "0003-xpu-run-untraceable-kernel-calls-as-custom-ops.patch, "
        "0004-sparse-attn-indexer-register-the-op-to-return-nothing.patch "
        "applied by recipe",
        "to keep 0001-xpu-register-fakes-for-ipex-gemms.patch, "
        "0003-xpu-run-untraceable-kernel-calls-as-custom-ops.patch, "
        "0004-sparse-attn-indexer-register-the-op-to-return-nothing.patch, run "
        "`make revert`, then `make apply PATCHES='0001 0003 0004'`; nothing changed",
    )
    result = tool.run("revert", str(root), "--patches", "0001,0002,0003,0004")
    assert result.returncode == 0, result.stderr
    assert _hashes(root) == before

    assert (
        tool.run("apply", str(root), "--no-proof", "--patches", "0001").returncode == 0
    )
    applied = _hashes(root)
    result = tool.run("revert", str(root), "--patches", "0002")
    assert result.returncode == 0 and "not applied; nothing changed" in result.stdout
    assert _hashes(root) == applied
    assert tool.run("revert", str(root), "--patches", "0001").returncode == 0
    assert _hashes(root) == before


@pytest.mark.parametrize("undo", ["target-checked-out", "added-file-removed"])
def test_apply_on_a_tree_applied_by_recipe_whose_change_is_undone(tmp_path, undo):
    """A changed file back at its pre-apply bytes (`git checkout` of it), or
    an added file removed: the fakes are not all in place, so apply does not
    say `already applied` (it did before issue 16) but refuses, saying what
    to do, status says the tree is partly applied, and revert restores the
    tree as it was before apply."""
    root = _small_recipe_tree(tmp_path / "tree")
    target = root / "vllm" / "_ipex_ops.py"
    pre_apply, before = target.read_bytes(), _hashes(root)
    assert tool.run("apply", str(root), "--no-proof").returncode == 0
    if undo == "target-checked-out":
        target.write_bytes(pre_apply)
        undone = "vllm/_ipex_ops.py"
    else:
        (root / "vllm" / "_xpu_gemm_fakes.py").unlink()
        undone = "vllm/_xpu_gemm_fakes.py"
    _refused_unchanged(
        root,
        ("apply", str(root)),
        f"applied by recipe, but {undone} not: back at the pre-apply bytes or "
        "removed since, so the fakes are not all in place; run `make revert "
        f"VLLM={root}`, then apply again; nothing changed",
    )
    status = tool.run("status", str(root)).stdout
    assert f"  {undone}: not applied" in status
    assert f"state: partly applied by recipe ({undone}: not applied)" in status
    result = tool.run("revert", str(root))
    assert result.returncode == 0, result.stderr
    assert _hashes(root) == before


def test_patches_selects_part_of_the_series(tmp_path):
    root = releases.copy_of(IPEX_RELEASE, tmp_path / "tree")
    pristine = releases.file_hashes(root)
    _refused_unchanged(
        root,
        ("apply", str(root), "--patches", "0002"),
        "0002-xpu-run-ipex-woq-linear-as-one-opaque-op.patch needs "
        "0001-xpu-register-fakes-for-ipex-gemms.patch",
        "vllm/_xpu_gemm_fakes.py",
    )
    _refused_unchanged(
        root, ("apply", str(root), "--patches", "0009"), "no patch '0009'"
    )

    result = tool.run("apply", str(root), "--patches", "0001")
    assert result.returncode == 0, result.stderr
    status = tool.run("status", str(root)).stdout
    assert "0001-xpu-register-fakes-for-ipex-gemms.patch: applied" in status
    assert "0002-xpu-run-ipex-woq-linear-as-one-opaque-op.patch: not applied" in status
    assert not (root / "vllm" / "_ipex_woq_linear.py").exists()

    assert tool.run("apply", str(root), "--patches", "0002").returncode == 0
    status = tool.run("status", str(root)).stdout
    assert "0003-xpu-run-untraceable-kernel-calls-as-custom-ops.patch: not " in status
    assert tool.run("apply", str(root), "--patches", "0003").returncode == 0
    assert "state: partially patched" in tool.run("status", str(root)).stdout
    assert tool.run("apply", str(root), "--patches", "0004").returncode == 0
    assert "state: patched" in tool.run("status", str(root)).stdout
    assert tool.run("revert", str(root), "--patches", "0003").returncode == 0
    _refused_unchanged(root, ("revert", str(root), "--patches", "0001"), "needs 0001")
    assert tool.run("revert", str(root), "--patches", "0002").returncode == 0
    assert tool.run("revert", str(root)).returncode == 0
    assert releases.file_hashes(root) == pristine


def test_apply_without_vllm_patches_the_vllm_python_imports(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    shutil.copytree(releases.pristine("0.16.0") / "vllm", site / "vllm")
    env = {"PYTHONPATH": f"{tool.SCRIPTS}:{site}"}
    result = tool.run("apply", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no VLLM= given: the vLLM that " in result.stdout
    assert f"imports, {site}" in result.stdout
    assert (site / "vllm" / "_xpu_gemm_fakes.py").is_file()


# ---------------------------------------------------------------------------
# Base detection, in process
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "version", "expected", "why"),
    [
        ("0.10.2", "0.10.3.dev0+g01efc7ef7", "0.10.2", "nearest pinned release below"),
        ("0.21.0", "0.21.1.dev0+gb18beee.d20260101", "0.21.0", "nearest pinned"),
        ("0.22.0", "0.22.0+xpu", "0.22.0", "its release"),
        ("0.16.0", "0.15.0.dev7", "0.16.0", "nearest pinned kernels-era release"),
        (
            releases.newest(),
            releases.newer_than_every_pin(),
            releases.newest(),
            "newer than the newest pinned release",
        ),
    ],
)
def test_detect_base(files, version, expected, why, monkeypatch):
    monkeypatch.setenv("VLLM_VERSION", version)
    found = tree.locate(str(releases.pristine(files)))
    detected = base.detect_base(found)
    assert isinstance(detected, base.Base)
    assert detected.pin.version == expected, detected.reason
    assert why in detected.reason
    assert detected.series_fits and not detected.exact


def test_detect_base_refuses_a_release_we_do_not_pin(monkeypatch):
    monkeypatch.setenv("VLLM_VERSION", "0.14.2")
    with pytest.raises(Exception, match="0.14.2 is not a supported release"):
        base.detect_base(tree.locate(str(releases.pristine("0.16.0"))))


def test_ipex_recipe_finds_an_import_moved_into_a_block():
    """The IPEX import moved under `if current_platform.is_xpu():`: the fakes
    are registered right after it, inside the block, and nowhere else."""
    import ast

    from xpufakes.changes import recipes

    text = (releases.pristine(IPEX_RELEASE) / "vllm" / "_ipex_ops.py").read_text()
    guard = (
        "try:\n    import intel_extension_for_pytorch as ipex\n"
        "except ImportError as e:\n"
        '    logger.debug("Import error msg: %s", e.msg)\n'
    )
    assert guard in text
    indented = "".join("    " + line for line in guard.splitlines(keepends=True))
    moved = text.replace(guard, "if current_platform.is_xpu():\n" + indented)
    edited = recipes.edit_ipex_ops(moved)
    module = ast.parse(edited)
    block = next(n for n in module.body if isinstance(n, ast.If))
    calls = [ast.unparse(n) for n in block.body if isinstance(n, ast.Expr)]
    assert calls == ["register_ipex_gemm_fakes()"]
    assert isinstance(block.body[0], ast.Try)  # after the import, not before
    assert edited.count("register_ipex_gemm_fakes()") == 1
    with pytest.raises(recipes.RecipeError, match="intel_extension_for_pytorch"):
        recipes.edit_ipex_ops(
            moved.replace("import intel_extension_for_pytorch", "import os")
        )


def test_ctrl_c_during_the_proof_is_an_interruption(tmp_path):
    """Ctrl-C reaches the whole process group, so the proof's subprocess dies
    of it too: the verb says it was interrupted (130), not that the proof
    failed (1), and the tree is unchanged."""
    root = releases.copy_of(KERNELS_RELEASE, tmp_path / "tree")
    with open(root / "vllm" / "_xpu_ops.py", "a") as f:
        f.write("# a downstream change\n")
    before = releases.file_hashes(root)
    env = dict(os.environ, PYTHONPATH=str(tool.SCRIPTS), PYTHONUNBUFFERED="1")
    run = subprocess.Popen(
        [sys.executable, "-m", "xpufakes", "apply", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's job
    )
    assert "applying by recipe" in run.stdout.readline()
    children = Path(f"/proc/{run.pid}/task/{run.pid}/children")
    deadline = time.monotonic() + 120
    while not children.read_text().strip():  # the proof has started
        assert time.monotonic() < deadline and run.poll() is None
        time.sleep(0.05)
    time.sleep(1)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "error: interrupted by SIGINT; nothing changed (every file is as it was)"
    )
    assert releases.file_hashes(root) == before


def test_recipe_apply_that_cannot_be_undone_says_how_to_finish(
    tmp_path, monkeypatch, capsys
):
    """No real fault makes a rename back fail, so os.rename fails on the first
    added overlay file and os.replace on putting vllm/_xpu_ops.py back: exit
    4, and the last line says what is true on the recipe path (the rollback
    removed the state file, so not `make revert`) and where the original is."""
    from xpufakes import cli
    from xpufakes.common import transaction

    root = releases.copy_of(KERNELS_RELEASE, tmp_path / "tree")
    target = root / "vllm" / "_xpu_ops.py"
    with open(target, "a") as f:
        f.write("# a downstream change\n")
    original = target.read_bytes()
    real_rename, real_replace = os.rename, os.replace
    renames, replaces = [], []

    def failing_rename(src, dst):
        renames.append(dst)
        if str(dst).endswith("_xpu_gemm_fakes.py"):
            raise OSError(28, "No space left on device", str(dst))
        return real_rename(src, dst)

    def failing_replace(src, dst):
        replaces.append(dst)
        # the second replace of vllm/_xpu_ops.py: the one that puts it back
        if Path(dst) == target and sum(Path(d) == target for d in replaces) == 2:
            raise OSError(5, "Input/output error", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(transaction.os, "rename", failing_rename)
    monkeypatch.setattr(transaction.os, "replace", failing_replace)
    status = cli.main(["apply", str(root), "--no-proof"])
    monkeypatch.setattr(transaction.os, "rename", real_rename)
    monkeypatch.setattr(transaction.os, "replace", real_replace)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 4, err
    assert "vllm/_xpu_ops.py is changed, its original is kept as" in err
    assert err.endswith(
        "nothing in the tree records the apply, so `make revert` cannot"
    )
    kept = err.split("its original is kept as ", 1)[1].split(" (", 1)[0]
    backup = root / kept
    assert backup.read_bytes() == original
    assert not (root / "vllm" / ".xpufakes-state.json").exists()
