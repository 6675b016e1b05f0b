"""The stand-ins for a vLLM build's native modules (natives.NATIVE_MODULES),
which the proof and `make audit` load a tree's fakes with: every native
module name of the pinned sdists is one, every import form works, and the
tree's own Python is never hidden behind one. (The trees themselves, the
report's image among them, are in tests/test_trees.py.)"""

import os
import re
import subprocess
import sys

from support import releases, tool
from xpufakes.proof.xpu import extensions

_EXTENSION = re.compile(r'CMakeExtension\(\s*(?:name\s*=\s*)?"([\w.]+)"')
_TARGET = re.compile(r"define_extension_target\(\s*(\w+)")


def _build_names(root) -> set[str]:
    """The native modules a release's build makes: setup.py's extensions
    and the CMake targets (vllm.<target>); for a release published only as
    a wheel (0.15.x), the extension modules its RECORD lists."""
    if not (root / "setup.py").is_file():
        (record,) = root.glob("vllm-*.dist-info/RECORD")
        return {
            m.group(1).replace("/", ".")
            for m in re.finditer(
                r"^(vllm/[\w/]+?)\.[\w.-]*so,", record.read_text(), re.M
            )
        }
    names = set(_EXTENSION.findall((root / "setup.py").read_text()))
    cmake = [root / "CMakeLists.txt", *(root / "cmake").rglob("*.cmake")]
    for path in cmake:
        names |= {f"vllm.{t}" for t in _TARGET.findall(path.read_text())}
    return names


def test_every_native_module_of_the_releases_is_stood_in():
    seen = set()
    for version in releases.representative():
        names = _build_names(releases.pristine(version))
        assert "vllm._C" in names, version  # the patterns find what they should
        seen |= names
    missing = sorted(n for n in seen if not extensions.is_native(n))
    assert not missing, missing
    assert {"vllm._moe_C", "vllm._flashmla_C", "vllm.cumem_allocator"} <= seen


IMPORTS = """
import sys
from xpufakes.proof.xpu import extensions

extensions.stub_vllm_extensions()
sys.path.insert(0, sys.argv[1])

import vllm._C.ops
from vllm._C import ops
from vllm._C.ops import paged_attention_v1, rms_norm
import vllm._moe_C as moe
from vllm.vllm_flash_attn import _vllm_fa2_C
import vllm.cumem_allocator
import vllm._downstream_xpu_C

assert ops is vllm._C.ops and rms_norm is vllm._C.ops.rms_norm
assert isinstance(moe, extensions.NativeStandIn)
assert not hasattr(vllm._C, "__file__")
assert type(rms_norm) is type(len) and rms_norm.__module__ == "vllm._C.ops"
try:
    paged_attention_v1(1, 2)
except RuntimeError as e:
    print("call:", e)
import vllm.third_party.triton_kernels as kernels
print("own package:", kernels.REAL)
try:
    import vllm._own_C
except SyntaxError as e:
    print("own module:", type(e).__name__, e.filename.rsplit("/", 1)[1])
try:
    import vllm.utlis
except ModuleNotFoundError as e:
    print("missing:", e)
import importlib.util
# an optional package a build copies in, which vLLM probes for (find_spec,
# then its __file__): absent from this tree, it must not be found
print("probe:", importlib.util.find_spec("vllm.third_party.deep_gemm"))
"""


def test_every_import_form_and_nothing_else(tmp_path):
    """Each import form of a native module is answered, a built `.so` that
    cannot load here is not loaded, and the tree's own Python is imported
    for real: a package of a native name runs, a module with a native-style
    name and a syntax error raises it, a missing Python module stays
    missing."""
    vllm = tmp_path / "vllm"
    (vllm / "vllm_flash_attn").mkdir(parents=True)
    (vllm / "third_party" / "triton_kernels").mkdir(parents=True)
    for package in ("", "vllm_flash_attn", "third_party"):
        (vllm / package / "__init__.py").write_text("")
    (vllm / "third_party" / "triton_kernels" / "__init__.py").write_text("REAL = 1\n")
    (vllm / "_C.abi3.so").write_bytes(b"\x7fELF not loadable here")
    (vllm / "_own_C.py").write_text("def broken(:\n")
    result = subprocess.run(
        [sys.executable, "-c", IMPORTS, str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS)),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "call: vllm._C.ops.paged_attention_v1 is a stand-in for vLLM's native "
        "extension "
        "(not loaded here): the tree calls it while it is imported",
        "own package: 1",
        "own module: SyntaxError _own_C.py",
        "missing: No module named 'vllm.utlis'",
        "probe: None",
    ]
