"""The vLLM plugin changes nothing for IPEX's other callers, proven against
the real Intel Extension for PyTorch CPU build (issue 41, item 1): the ipex
proof venv (e2e/pins.toml [proofs.ipex]: torch 2.8.0, IPEX 2.8.0), vLLM
0.14.1's sdist on the path, the plugin's wheel unpacked and loaded by vLLM's
own ``load_general_plugins()`` with ``VLLM_XPU_FAKES_ANY_PLATFORM=1``.

One process per plugin (``e2e/engine/ipex_calls.py``): none (the
reference), this checkout's wheel (``make plugin``) and the wheel as it was
at ``OLD_PLUGIN``, the negative control, which must fail (a), (c) and (d)
where issue 41 measured it (and (b) through IPEX's own fusions module):

a. every documented call form of each function the plugin rebinds in
   ``intel_extension_for_pytorch.llm.functional`` gives what it gives
   without the plugin: the exception, or the result's type, dtype, shape,
   strides and bytes, which argument it is, and every tensor argument after
   the call (the writes);
b. the same calls through IPEX's own module ``llm.functional.fusions``, and
   IPEX's modules (``ipex.llm.modules.*``) and its other functional APIs;
c. register() rebinds nothing outside vLLM's modules but the callees
   themselves (and ``IPEXWeightOnlyQuantizedLinear.from_weight``, the WOQ
   step's wrapper, which (d) checks): every other module's globals and its
   classes' attributes, by id; a third party's copies taken before the
   plugin loaded (``e2e/engine/ipex_thirdparty.py``) stay IPEX's and give
   what they gave;
d. IPEX's WOQ linear module made by a caller outside vLLM is IPEX's class
   (isinstance holds) and computes the same.

The reference run is checked too (it could otherwise hide everything): the
calls that must succeed do, the two forms IPEX refuses raise there.
The comparison is plain Python over exact descriptions (sha256 of bytes).
"""

import io
import json
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import engine
import pytest

sys.path.insert(0, str(engine.REPO / "scripts"))
from xpufakes.trees import fetch, pins  # noqa: E402

pytestmark = pytest.mark.xdist_group("e2e-ipex")

VENV = "ipex"  # e2e/pins.toml [proofs.ipex]
SCRIPT = engine.REPO / "e2e" / "engine" / "ipex_calls.py"
# the plugin before issue 41: its wrapper returns the op's result, calls
# the op when a defaulted parameter is left out, sweeps every module
OLD_PLUGIN = "f0e3fc5e721d76c1a00ef9f00a1c352521c97993"
WHEELS = ("new", "old")

FUNCTIONAL = "intel_extension_for_pytorch.llm.functional"
FUSIONS = f"{FUNCTIONAL}.fusions"
THIRD_PARTY = ("ipex_thirdparty", "ipex_thirdparty.Kernels")
CALLEES = (
    "rms_norm",
    "add_rms_norm",
    "bgmv_shrink",
    "bgmv_expand",
    "bgmv_expand_slice",
)
FROM_WEIGHT = (
    "intel_extension_for_pytorch.llm.quantization.woq_linear:"
    "IPEXWeightOnlyQuantizedLinear.from_weight"
)
# the forms IPEX 2.8's CPU build refuses (ipex_calls.forms), and how
REFUSED = {
    "a bias (IPEX's CPU path refuses it)": "AssertionError",
    "keywords of vLLM's contract (not IPEX's)": "TypeError",
}
WOQ_CLASS = (
    "intel_extension_for_pytorch.llm.quantization.woq_linear."
    "IPEXWeightOnlyQuantizedLinear"
)
WOQ_OP = "vllm_xpu_fakes._ipex_woq_linear.IPEXWoqLinearOp"
VLLM_NAMED = "a function of a module named vllm."  # ipex_calls.VLLM_CALLER_LABEL


# ---------------------------------------------------------------------------
# The runs
# ---------------------------------------------------------------------------


def _old_wheel(tmp: Path) -> Path:
    """The plugin's wheel as OLD_PLUGIN built it, from git (nothing of the
    checkout is touched)."""
    archive = subprocess.run(
        [
            "git",
            "-C",
            str(engine.REPO),
            "archive",
            OLD_PLUGIN,
            "plugin",
            "vllm_overlay/vllm",
        ],
        capture_output=True,
    )
    assert archive.returncode == 0, (
        f"the negative control needs commit {OLD_PLUGIN} in this checkout's "
        f"history: {archive.stderr.decode()[-500:]}"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp / "src", filter="data")
    built = subprocess.run(
        [
            sys.executable,
            str(tmp / "src" / "plugin" / "vllm_xpu_fakes_build.py"),
            str(tmp),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(built.stdout.strip())


def _unpacked(wheel: Path, where: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(where)
    return where


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"none" | "new" | "old": what ipex_calls.py wrote}, each run once."""
    venv = engine.venvs.ensure(VENV)
    release = engine.venvs.proofs()[VENV]["vllm"]
    tree = fetch.fetch(pins.load().get(release))
    tmp = tmp_path_factory.mktemp("ipex")
    plugins = {
        "none": "-",
        "new": str(_unpacked(engine.plugin_wheel(), tmp / "new")),
        "old": str(_unpacked(_old_wheel(tmp / "old-build"), tmp / "old")),
    }
    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            out = tmp / f"{name}.json"
            start = time.monotonic()
            proc = subprocess.run(
                [str(engine.venvs.python(venv)), str(SCRIPT), str(tree), plugins[name]]
                + [str(out)],
                capture_output=True,
                text=True,
                timeout=600,
                env=dict(engine.ENGINE_ENV, PATH="/usr/bin:/bin", OMP_NUM_THREADS="1"),
            )
            engine.timed(
                f"ipex proof: the process with plugin '{name}'",
                time.monotonic() - start,
            )
            assert proc.returncode == 0 and out.is_file(), (proc.stdout + proc.stderr)[
                -4000:
            ]
            done[name] = json.loads(out.read_text())
            done[name]["log"] = proc.stdout + proc.stderr
            done[name]["plugin_dir"] = plugins[name]
        return done[name]

    return get


# ---------------------------------------------------------------------------
# The comparison (plain Python)
# ---------------------------------------------------------------------------


def _exact(description):
    """A description without what is only there for messages."""
    if isinstance(description, dict):
        return {k: _exact(v) for k, v in description.items() if k != "head"}
    if isinstance(description, list):
        return [_exact(v) for v in description]
    return description


def _said(record: dict | None) -> str:
    if record is None:
        return "no such call"
    if record.get("raised"):
        return f"raises {record['raised']}"
    result = record.get("result") or {}
    said = result.get("type", "?")
    if "shape" in result:
        said += f"{tuple(result['shape'])} {result['dtype']}"
        said += f", is {result['is'][0]}" if result["is"] else ", a new tensor"
    elif "items" in result:
        said += f" of {len(result['items'])}"
    return "returns " + said


def differences(reference: dict, got: dict, prefix: str) -> list[str]:
    """Every call under `prefix` whose description differs between the
    process without the plugin and the one with it."""
    keys = sorted(k for k in reference.keys() | got.keys() if k.startswith(prefix))
    out = []
    for key in keys:
        a, b = reference.get(key), got.get(key)
        if _exact(a) != _exact(b):
            what = _said(a) + " -> " + _said(b)
            if _said(a) == _said(b):
                what += " (other values or writes)"
            out.append(f"{key}: without the plugin {what} with it")
    return out


def _ids(calls: dict, prefix: str) -> list[str]:
    return sorted(
        k.removeprefix(prefix + ".") for k in calls if k.startswith(prefix + ".")
    )


def _repeatable(records: dict) -> None:
    """IPEX gave the same twice in the reference process (else an exact
    comparison across processes would blame the plugin for IPEX's noise)."""
    noisy = sorted(k for k, v in records.items() if not v["repeatable"])
    assert not noisy, f"IPEX gives different results for the same call: {noisy}"


def _check_reference(reference: dict, prefix: str) -> None:
    """The reference run is what IPEX does: a form raises there only where
    IPEX refuses it (else a broken venv would compare equal to itself)."""
    calls = {k: v for k, v in reference["calls"].items() if k.startswith(prefix + ".")}
    assert len(calls) > 50, sorted(calls)
    _repeatable(calls)
    for key, record in calls.items():
        refused = [kind for label, kind in REFUSED.items() if label in key]
        if refused:
            assert (record["raised"] or "").startswith(refused[0] + ":"), (key, record)
        else:
            assert record["raised"] is None, (key, record)
            assert record["result"]["type"] == "torch.Tensor", (key, record)
    for name in CALLEES:
        assert any(f".{name}:" in k and not v["raised"] for k, v in calls.items()), name


# ---------------------------------------------------------------------------
# a. the functions the plugin rebinds
# ---------------------------------------------------------------------------


def test_the_plugin_rebinds_the_callees_and_is_vllms_own_plugin_load(runs):
    """What the other tests compare is a plugin that did its work: the five
    callees of this IPEX build are rebound (both wheels), found by vLLM's
    own load_general_plugins() in the unpacked wheel; without a plugin
    nothing is."""
    assert "state" not in runs("none")
    for wheel in WHEELS:
        got = runs(wheel)
        assert got["torch"].startswith("2.8.0") and got["ipex"].startswith("2.8.0"), got
        assert sorted(got["state"]["rebound"]) == sorted(
            f"{FUNCTIONAL}.{n}" for n in CALLEES
        ), got["state"]
        assert "vllm-xpu-fakes: " in got["log"], got["log"][-2000:]
        assert got["plugin_file"].startswith(got["plugin_dir"] + "/"), got
        for name in CALLEES:
            assert not got["still the original"][f"{FUNCTIONAL}.{name}"], name
    # each from its own wheel: the old one has no steps in its state
    assert runs("new")["plugin_dir"] != runs("old")["plugin_dir"]
    assert "steps" in runs("new")["state"] and "steps" not in runs("old")["state"]


@pytest.mark.parametrize("wheel", WHEELS)
def test_a_every_call_form_returns_what_ipex_returns(runs, wheel):
    reference, got = runs("none"), runs(wheel)
    _check_reference(reference, FUNCTIONAL)
    diff = differences(reference["calls"], got["calls"], FUNCTIONAL + ".")
    diff = [d for d in diff if not d.startswith(FUSIONS)]
    if wheel == "new":
        assert not diff, "\n".join(diff)
        return
    # the negative control: where issue 41 measured the old wheel
    text = "\n".join(diff)
    for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
        assert f"{FUNCTIONAL}.{name}:positional" in text, text
        assert any(
            line.startswith(f"{FUNCTIONAL}.{name}:positional")
            and "-> returns NoneType" in line
            for line in diff
        ), text
    assert (
        f"{FUNCTIONAL}.add_rms_norm:add_back left out/bf16: without the plugin "
        "returns torch.Tensor(2, 5, 64) torch.bfloat16, a new tensor -> raises "
        "RuntimeError: vllm::ipex_add_rms_norm() is missing value for argument "
        "'add_back'"
    ) in text, text


# ---------------------------------------------------------------------------
# b. IPEX's own callers and modules
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("wheel", WHEELS)
def test_b_ipex_own_module_and_modules_give_what_they_gave(runs, wheel):
    reference, got = runs("none"), runs(wheel)
    _check_reference(reference, FUSIONS)
    modules = reference["modules"]
    assert len(modules) >= 18 and not [k for k, v in modules.items() if v["raised"]], (
        modules
    )
    _repeatable(modules)
    diff = differences(reference["calls"], got["calls"], FUSIONS + ".")
    diff += differences(modules, got["modules"], "")
    if wheel == "new":
        assert not diff, "\n".join(diff)
        return
    # the negative control: the old sweep rebound IPEX's own module's names
    text = "\n".join(diff)
    assert f"{FUSIONS}.add_rms_norm:add_back left out/bf16" in text, text
    assert f"{FUSIONS}.bgmv_shrink:positional" in text, text


def test_b_the_comparison_sees_one_ulp(runs):
    """The negative control of the comparison itself: one bit of one module's
    output changed is a difference."""
    modules = runs("none")["modules"]
    key = "ipex.llm.modules.RMSNorm"
    changed = json.loads(json.dumps(modules))
    digest = changed[key]["result"]["sha256"]
    changed[key]["result"]["sha256"] = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    assert differences(modules, changed, "") == [
        f"{key}: without the plugin returns torch.Tensor(2, 5, 64) torch.bfloat16, "
        "a new tensor -> returns torch.Tensor(2, 5, 64) torch.bfloat16, a new "
        "tensor (other values or writes) with it"
    ]
    assert differences(modules, json.loads(json.dumps(modules)), "") == []


# ---------------------------------------------------------------------------
# c. nothing outside vLLM's modules is rebound
# ---------------------------------------------------------------------------

# what a plugin may change outside vLLM's modules: the callees (the fix) and
# from_weight (the WOQ step: vLLM's callers only, test_d)
ALLOWED = {f"{FUNCTIONAL}.{n}" for n in CALLEES} | {FROM_WEIGHT}


def _added_is_harmless(key: str, kind: str) -> bool:
    """A new global that rebinds nothing: a submodule imported, warnings'
    registry, an op namespace of torch.ops looked up."""
    return (
        kind == "builtins.module"
        or key.endswith(".__warningregistry__")
        or (key.startswith("torch.ops.") and kind == "torch._ops._OpNamespace")
    )


@pytest.mark.parametrize("wheel", WHEELS)
def test_c_nothing_outside_vllm_is_rebound(runs, wheel):
    reference, got = runs("none"), runs(wheel)
    assert reference["changes"]["rebound"] == [], reference["changes"]
    changed = got["changes"]
    outside = sorted(set(changed["rebound"]) - ALLOWED)
    outside += [f"removed: {k}" for k in changed["removed"]]
    outside += [
        f"added: {k} ({kind})"
        for k, kind in changed["added"].items()
        if not _added_is_harmless(k, kind)
    ]
    kept = {
        k: v
        for k, v in got["still the original"].items()
        if k.startswith(THIRD_PARTY) or k.startswith(FUSIONS)
    }
    assert len(kept) == 3 * len(CALLEES), kept
    lost = sorted(k for k, v in kept.items() if not v)
    calls = []
    for holder in THIRD_PARTY:
        calls += differences(reference["calls"], got["calls"], holder + ".")
    if wheel == "new":
        assert {f"{FUNCTIONAL}.{n}" for n in CALLEES} <= set(changed["rebound"])
        assert not outside, outside
        assert not lost, lost
        assert not calls, "\n".join(calls)
        return
    # the negative control: the old sweep rebound IPEX's fusions module and
    # the third party's copies (module globals and class attributes)
    for name in CALLEES:
        for holder in (FUSIONS, "ipex_thirdparty"):
            assert f"{holder}.{name}" in outside, outside
        assert f"ipex_thirdparty:Kernels.{name}" in outside, outside
        assert f"ipex_thirdparty.{name}" in lost, lost
    assert any("ipex_thirdparty.add_rms_norm:add_back left out" in c for c in calls)


# ---------------------------------------------------------------------------
# d. IPEX's WOQ linear module for a caller outside vLLM
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("wheel", WHEELS)
def test_d_from_weight_outside_vllm_is_ipex_class(runs, wheel):
    reference, got = runs("none"), runs(wheel)
    assert len(reference["woq"]) == 6, reference["woq"]
    for key, made in reference["woq"].items():
        assert made["raised"] is None, (key, made)
        assert made["type"] == WOQ_CLASS, (key, made)
        assert made["isinstance IPEXWeightOnlyQuantizedLinear"], (key, made)
        assert made["forward"]["result"]["shape"] == [3, 32], (key, made)
        assert made["forward"]["repeatable"], (key, made)
    outside = {k: v for k, v in got["woq"].items() if not k.startswith(VLLM_NAMED)}
    assert len(outside) == 4, sorted(got["woq"])
    wrong = {
        key: made.get("type") or made.get("raised")
        for key, made in outside.items()
        if _exact(made) != _exact(reference["woq"][key])
    }
    # the wrapper is in place: a caller in vLLM's modules (emulated, by
    # its module's name) gets the op, which computes what IPEX's module does
    for key, made in got["woq"].items():
        if key.startswith(VLLM_NAMED):
            assert made["type"] == WOQ_OP, (key, made)
            assert not made["isinstance IPEXWeightOnlyQuantizedLinear"], (key, made)
            assert _exact(made["forward"]) == _exact(reference["woq"][key]["forward"])
    if wheel == "new":
        assert not wrong, wrong
        return
    # the negative control: the old wrapper gave every caller its own op
    assert set(wrong) == set(outside), wrong
    for key in wrong:
        assert got["woq"][key]["type"] == WOQ_OP, got["woq"][key]
        assert not got["woq"][key]["isinstance IPEXWeightOnlyQuantizedLinear"]
        # the output is the same (issue 41): only the class differs
        forward = got["woq"][key]["forward"]
        assert _exact(forward) == _exact(reference["woq"][key]["forward"]), key
