"""The IPEX weight-only-quantized (int4 AWQ / GPTQ) linear of the IPEX-era
releases: vLLM's own apply() with IPEX replaced by the reference kernels,
which ops it reaches, and whether torch.compile can compile it before and
after the series; the vllm::ipex_woq_linear op's fake over the weight
formats, in each patched tree.

The vLLM-level probe (support/woq_probe.py) imports the release's
ipex_quant.py, which needs vLLM's dependencies: it runs with .venv-tree's
Python, which `make test` sets up.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from support import plugin as plugin_support
from support import releases, standins
from xpufakes.common import paths
from xpufakes.proof.xpu import reference as reference_kernels
from xpufakes.trees.pins import version_tuple

TREE_PYTHON = paths.REPO / ".venv-tree" / "bin" / "python"
PROBE = Path(__file__).parent / "support" / "woq_probe.py"

# what IPEX's XPU forward calls, per format (docs/ipex-woq-ops.md §5)
EXPECTED_OPS = {
    "onednn": ["mm_int4"],
    "xetla": ["int4x8_dequantize", "mm_common"],
}


def _probe(tree: Path, cases: list[str], out: Path, plugin: Path | None = None) -> dict:
    """{"METHOD:ENGINE": result} of support/woq_probe.py's cases on a tree
    (one process: the tree is imported once); `plugin`: the directory the
    vLLM plugin is installed in, registered first."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if plugin:
        env.update(XPUFAKES_PROBE_PLUGIN=str(plugin), VLLM_XPU_FAKES_ANY_PLATFORM="1")
    done = subprocess.run(
        [str(TREE_PYTHON), str(PROBE), str(tree), str(out), *cases],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert out.is_file(), done.stderr[-3000:]
    return json.loads(out.read_text())


needs_tree_python = pytest.mark.skipif(
    not TREE_PYTHON.exists(), reason="no .venv-tree (make venv-tree sets it up)"
)


# vLLM's three IPEX int4 paths, each on one of IPEX's two layouts (the
# layout only changes which torch_ipex ops IPEX's forward calls).
PATHS = [
    ("gptq", "onednn"),
    ("gptq-act-order", "xetla"),
    ("awq", "onednn"),
    ("awq", "xetla"),
    ("wna16", "onednn"),
]


def _paths_of(release: str) -> list[str]:
    return [
        f"{method}:{engine}"
        for method, engine in PATHS
        if method != "wna16" or version_tuple(release) >= (0, 13, 0)
    ]


@pytest.fixture(scope="module")
def woq_probes(tmp_path_factory):
    """(release, "pristine" or "patched") -> the probe's results of every
    path of that tree, run once (one process per tree)."""
    found = {}

    def get(release: str, kind: str) -> dict:
        if (release, kind) not in found:
            tree = (releases.pristine if kind == "pristine" else releases.patched)(
                release
            )
            out = tmp_path_factory.mktemp("woq") / f"{release}-{kind}.json"
            found[release, kind] = _probe(tree, _paths_of(release), out)
        return found[release, kind]

    return get


@needs_tree_python
@pytest.mark.parametrize("method,engine", PATHS)
def test_vllm_apply_reaches_the_woq_ops_and_compiles_only_patched(
    ipex_sample_release, method, engine, woq_probes
):
    ipex_release = ipex_sample_release
    if method == "wna16" and version_tuple(ipex_release) < (0, 13, 0):
        pytest.skip("XPUwNa16LinearKernel arrived in vLLM 0.13.0")
    case = f"{method}:{engine}"
    unpatched = woq_probes(ipex_release, "pristine")[case]
    assert unpatched["ops_met"] == EXPECTED_OPS[engine], unpatched
    assert "Cannot access data pointer" in unpatched["compile"], unpatched["compile"]

    patched = woq_probes(ipex_release, "patched")[case]
    assert patched["module"] == "IPEXWoqLinearOp"
    assert patched["ops_met"] == EXPECTED_OPS[engine]
    assert patched["compile"] == "ok", patched["compile"]


@needs_tree_python
def test_the_plugin_compiles_every_int4_path_of_the_unpatched_release(
    woq_probes, tmp_path
):
    """The vLLM plugin on unpatched 0.14.1: vLLM's own AWQ / GPTQ / wNa16
    apply() reach IPEX's WOQ ops through the wrapped module and compile
    (the unpatched release without it: the test above, "Cannot access data
    pointer")."""
    site = plugin_support.installed(tmp_path / "plugin")
    release = "0.14.1"
    found = _probe(
        releases.pristine(release), _paths_of(release), tmp_path / "out.json", site
    )
    unpatched = woq_probes(release, "pristine")
    for case, result in found.items():
        assert "Cannot access data pointer" in unpatched[case]["compile"], case
        assert result["module"] == "IPEXWoqLinearOp", (case, result)
        assert result["ops_met"] == EXPECTED_OPS[case.split(":")[1]], result
        assert result["compile"] == "ok", (case, result["compile"])
    assert len(found) == len(PATHS)


def _load(release: str):
    return standins.import_ipex_woq_linear(releases.patched(release), release)


@pytest.mark.forked
def test_woq_op_fake_matches_every_format(ipex_release):
    """opcheck of vllm::ipex_woq_linear, as the tree defines it, over the
    formats the AWQ / GPTQ paths produce: oneDNN and XeTLA layouts, bias,
    act-order g_idx, W4A8 compute; one row (XeTLA's mm_low_bits) and more."""
    libraries, woq = _load(ipex_release)  # noqa: F841
    ref = reference_kernels.reference()
    failures = {}
    count = 0
    k, n, group = 128, 64, 32
    for method in ("gptq", "awq"):
        for engine, bias, act_order, w4a8, rows, dtype in [
            ("onednn", False, False, False, 5, torch.float16),
            ("onednn", True, True, False, 1, torch.bfloat16),
            ("onednn", True, False, True, 5, torch.bfloat16),
            ("onednn", False, True, True, 1, torch.float16),
            ("xetla", False, False, False, 1, torch.float16),
            ("xetla", True, True, False, 5, torch.float16),
            ("xetla", True, False, False, 5, torch.bfloat16),
            ("xetla", False, True, False, 1, torch.bfloat16),
        ]:
            if method == "awq" and act_order:
                continue
            module = _module(
                ref, method, engine, bias, act_order, w4a8, dtype, k, n, group
            )
            op = woq.opaque_ipex_woq_linear(module, n)
            x = torch.randn(rows, k, dtype=dtype)
            ref.WOQ_CALLS.clear()
            torch.testing.assert_close(op(x), module(x))
            case = f"{method}-{engine}-{bias}-{act_order}-{w4a8}-{rows}x{dtype}"
            try:
                torch.library.opcheck(
                    torch.ops.vllm.ipex_woq_linear.default,
                    (x, op.key, n),
                    test_utils=(
                        "test_faketensor",
                        "test_aot_dispatch_dynamic",
                        "test_schema",
                    ),
                )
            except Exception as e:  # noqa: BLE001 - collected
                failures[case] = str(e).splitlines()[0]
            count += 1
    assert count == 12 and failures == {}


def _module(ref, method, engine, bias, act_order, w4a8, dtype, k, n, group):
    torch.manual_seed(0)
    pack = ref.pack_int4_rows
    if method == "gptq":
        qweight = pack(torch.randint(0, 16, (k, n)))
    else:
        qweight = pack(torch.randint(0, 16, (n, k))).t().contiguous()
    return ref.ReferenceWOQLinear.from_weight(
        qweight,
        (torch.rand(k // group, n) / 8).to(dtype),
        pack(torch.randint(0, 16, (n, k // group))).t().contiguous(),
        k,
        n,
        bias=torch.randn(n, dtype=dtype) if bias else None,
        group_size=group,
        g_idx=(torch.arange(k) // group)[torch.randperm(k)].int()
        if act_order
        else None,
        quant_method=0 if method == "gptq" else 1,
        engine=engine,
        w4a8=w4a8,
    )


@pytest.mark.forked
def test_a_wrong_woq_fake_is_caught(ipex_release):
    """Negative control: the same opcheck with a fake that gets the rank
    wrong (flattened) or the dtype (fp32) fails."""
    libraries, woq = _load(ipex_release)  # noqa: F841
    ref = reference_kernels.reference()
    module = _module(
        ref, "gptq", "onednn", False, False, False, torch.float16, 128, 64, 32
    )
    op = woq.opaque_ipex_woq_linear(module, 64)
    torch.library.register_fake(  # this process only (forked)
        "vllm::ipex_woq_linear",
        lambda x, key, n: x.new_empty((*x.shape[:-1], n), dtype=torch.float32),
    )
    with pytest.raises(Exception, match="test_faketensor"):
        torch.library.opcheck(
            torch.ops.vllm.ipex_woq_linear.default,
            (torch.randn(3, 128, dtype=torch.float16), op.key, 64),
            test_utils=("test_faketensor",),
        )
