"""The static scan parses only the modules that may give it something
(scan.scan, lazy): the same call sites and declared fakes as parsing every
module it chooses, on real releases and on the cases the shortcut must not
miss (negative control: the sites are there, found by the full scan)."""

import pytest

from support import releases
from xpufakes.proof.static import scan
from xpufakes.trees import tree


def _sites(result) -> tuple[list, list]:
    sites, declared = result
    found = [
        (op, s.file, s.line, s.function, s.context, s.via)
        for op, op_sites in sites.items()
        for s in op_sites
    ]
    return sorted(found), sorted(declared)


@pytest.mark.parametrize("version", ["0.14.1", "0.20.0", "0.33.0"])
def test_lazy_scan_equals_the_full_scan(version):
    texts = tree.python_sources(releases.pristine(version))
    lazy = _sites(scan.scan(texts))
    assert lazy[0], "the scan found no call site"
    assert lazy == _sites(scan.scan(texts, lazy=False))


HELPER = """
import torch


def fp8_linear(x, w, s):
    return torch.ops._xpu_C.fp8_gemm_w8a16(x, w, s, None)
"""

# Chosen because it mentions the helper's module ("helpers"), parsed only
# because it may call the helper (every part of its name is a word here).
CALLER = """
from vllm.layers.helpers import fp8_linear


class Method:
    def apply(self, layer, x):
        return fp8_linear(x, layer.weight, layer.scale)
"""

# Chosen the same way; gives a site of its own: another namespace's op in
# XPU code, with no namespace of ours in its text.
XPU_OTHER = """
import torch

from vllm.layers import helpers  # noqa: F401


def forward_xpu(x):
    return torch.ops._C.rms_norm(x)
"""


def test_lazy_scan_keeps_helper_calls_and_other_namespaces():
    texts = {
        "vllm/__init__.py": "",
        "vllm/layers/__init__.py": "",
        "vllm/layers/helpers.py": HELPER,
        "vllm/layers/method.py": CALLER,
        "vllm/layers/xpu_norm.py": XPU_OTHER,
        "vllm/layers/unrelated.py": "import helpers_of_mine\n",
    }
    full = _sites(scan.scan(texts, lazy=False))
    ops = {site[0] for site in full[0]}
    assert ops == {"_xpu_C::fp8_gemm_w8a16", "_C::rms_norm"}, full
    via = [site for site in full[0] if site[5]]
    assert [site[1] for site in via] == ["vllm/layers/method.py"]
    assert _sites(scan.scan(texts)) == full
