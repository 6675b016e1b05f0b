"""vLLM's `logger.<level>_once(...)` on the traced path (intel/llm-scaler
#699: a `logger.info_once` in the traced sym_int4 `apply()` stops every
compiled mode): the audit's search finds it (proof/static/reach.py,
trees/logonce.py), the recipe path's edit guards it
(changes/traceablelogs.py), the plugin has Dynamo skip it; compiled with
fullgraph, with the real vllm/logger.py of a pinned release, it fails
before and passes after, compiled = eager. Each with its negative control.
"""

import json
import subprocess
import sys
import textwrap

from support import releases
from xpufakes.changes import recipes, traceablelogs
from xpufakes.common import paths
from xpufakes.proof.static import reach

QUANT = "vllm/model_executor/layers/quantization/sym_int4.py"
SYM_INT4 = """\
import torch

from vllm.logger import init_logger

logger = init_logger(__name__)


class SymInt4LinearMethod:
    def create_weights(self, layer):
        logger.info_once("sym_int4: creating weights")

    def apply(self, layer, x, bias=None):
        out = self._gemm(layer, x)
        return out if bias is None else out + bias

    def _gemm(self, layer, x):
        logger.info_once("Using sym_int4 GEMM for %s", "xpu")
        return x @ layer.weight.t()
"""
GUARDED = """\
    def _gemm(self, layer, x):
        if not torch.compiler.is_compiling():
            logger.info_once("Using sym_int4 GEMM for %s", "xpu")
        return x @ layer.weight.t()
"""


def _texts(quant: str) -> dict[str, str]:
    return {
        "vllm/__init__.py": "",
        "vllm/logger.py": "def init_logger(name):\n    pass\n",
        QUANT: quant,
    }


def _once(findings) -> list[reach.Finding]:
    return [f for f in findings if f.kind == reach.LOGGER_ONCE and f.reached]


def test_the_audit_finds_a_logger_once_in_a_traced_apply_and_the_edit_guards_it():
    (finding,) = _once(reach.find(_texts(SYM_INT4)))
    assert str(finding.site) == f"{QUANT}:17 SymInt4LinearMethod._gemm"
    assert finding.callee == "logger.info_once (vllm.logger)"
    assert finding.configurations == [reach.DEFAULT]
    assert finding.entry == "SymInt4LinearMethod.apply (a quantization method's)"
    assert [str(s) for s in finding.chain] == [
        f"{QUANT}:13 SymInt4LinearMethod.apply",
        f"{QUANT}:17 SymInt4LinearMethod._gemm",
    ]
    # the edit guards the traced call only (not create_weights')
    edited = traceablelogs.edit(SYM_INT4)
    assert GUARDED in edited
    assert edited.count("is_compiling") == 1
    assert _once(reach.find(_texts(edited))) == []
    assert traceablelogs.edit(edited) == edited  # nothing left to guard
    # negative control: without the call, nothing found, nothing edited
    without = SYM_INT4.replace(
        '        logger.info_once("Using sym_int4 GEMM for %s", "xpu")\n', ""
    )
    assert _once(reach.find(_texts(without))) == []
    assert traceablelogs.edit(without) == without


def test_a_call_that_is_a_whole_if_body_has_the_guard_joined_to_the_if():
    """The trees' ruff refuses an `if` whose whole body is another `if`
    (SIM102: llm-scaler b3.1's gemma4.py:717-718 `if not
    self._esimd_shape_ok: logger.warning_once(...)`, which the nested guard
    failed in tests/test_tree_checks_of_apply.py): the guard joins the test
    (an `or` in parentheses); where the joined line would pass 88 columns,
    or the `if` has an else, the guard nests (negative controls)."""
    body = '        logger.info_once("Using sym_int4 GEMM for %s", "xpu")\n'
    call = '            logger.info_once("Using sym_int4 GEMM for %s", "xpu")\n'
    joined = SYM_INT4.replace(body, f"        if x.ndim == 2 or bias:\n{call}")
    edited = traceablelogs.edit(joined)
    assert (
        "        if (x.ndim == 2 or bias) and not torch.compiler.is_compiling():\n"
        + call
    ) in edited
    assert _once(reach.find(_texts(edited))) == []
    assert traceablelogs.edit(edited) == edited
    long = SYM_INT4.replace(body, f"        if {'x.ndim == 2 and ' * 4}bias:\n{call}")
    nested = "    if not torch.compiler.is_compiling():\n"
    assert nested in traceablelogs.edit(long)
    with_else = joined.replace(call, call + "        else:\n            pass\n")
    assert nested in traceablelogs.edit(with_else)


def test_what_is_not_the_traced_xpu_path_is_neither_found_nor_edited():
    """A call another platform's branch holds, one already guarded, one in
    the else of `if is_compiling()` (runs only while tracing: found), and a
    module the forward never runs."""
    cuda = SYM_INT4.replace(
        '        logger.info_once("Using sym_int4 GEMM for %s", "xpu")\n',
        "        if x.is_cuda:\n"
        '            logger.warning_once("cuda")\n'
        "        if torch.compiler.is_compiling():\n"
        "            pass\n"
        "        else:\n"
        '            logger.debug_once("eager")\n',
    )
    assert _once(reach.find(_texts(cuda))) == []
    assert traceablelogs.edit(cuda) == cuda
    tracing_only = cuda.replace("if torch.compiler.is_compiling()", "if not x.ndim")
    (found,) = _once(reach.find(_texts(tracing_only)))
    assert found.callee == "logger.debug_once (vllm.logger)"
    # logged only under a variable a user sets: said, not counted
    env = SYM_INT4.replace(
        '        logger.info_once("Using sym_int4 GEMM for %s", "xpu")\n',
        "        layout = envs.VLLM_SYM_INT4_LAYOUT\n"
        "        if layout is not None:\n"
        '            logger.info_once("layout %s", layout)\n',
    )
    (said,) = [f for f in reach.find(_texts(env)) if f.site.line == 19]
    assert not said.reached
    assert (
        said.note == "reached (default) only with VLLM_SYM_INT4_LAYOUT set: not counted"
    )
    assert traceablelogs.traced_module(QUANT)
    assert not traceablelogs.traced_module("vllm/v1/sample/ops/topk_topp_sampler.py")


def test_no_pinned_release_has_a_site_the_recipe_changes():
    """The recipe changes nothing of a pinned release (so none is taken off
    its series): every file, on the first release of each era, the last
    pinned (releases.newest()) and 0.28.0 (whose multimodal processor's
    apply logs once)."""
    for version in ("0.10.2", "0.21.0", "0.28.0", releases.newest()):
        texts = _sources(version)
        changed = [
            p
            for p, t in texts.items()
            if recipes.LOGS_EDIT.anywhere_if(t)
            and recipes.LOGS_EDIT.where(p)
            and recipes.LOGS_EDIT.edit(t) != t
        ]
        assert changed == [], version


def _sources(version: str) -> dict[str, str]:
    from xpufakes.trees import tree

    return tree.python_sources(releases.pristine(version))


COMPILE = r"""
import importlib.util, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import torch
import vllm.logger  # the release's own

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 16), requires_grad=False)

def run(module):
    method, layer, x = module.SymInt4LinearMethod(), Layer(), torch.randn(3, 16)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(method.apply, fullgraph=True, backend="aot_eager")
        out = compiled(layer, x)
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return "equal" if torch.equal(out, method.apply(layer, x)) else "differs"

results = {}
before = load("vllm.sym_int4_before", sys.argv[3])
results["before"] = run(before)
results["edited"] = run(load("vllm.sym_int4_edited", sys.argv[4]))
from vllm_xpu_fakes import plugin
journal = plugin._Journal()
results["plugin"] = (plugin._ignore_log_once_while_tracing(journal), run(before))
journal.rollback()
results["plugin undone"] = run(before)
print(json.dumps(results))
"""


def test_compiled_whole_it_fails_before_and_passes_after(tmp_path):
    """With the real vllm/logger.py of 0.21.0 (the llm-scaler b3.1 image's
    base) and torch of .venv: Dynamo refuses the call ("logging.Logger
    method not supported for non-export cases"); the edited module and
    the plugin's step compile whole, compiled = eager; the plugin's step
    undone fails again (negative control)."""
    before, edited = tmp_path / "before.py", tmp_path / "edited.py"
    before.write_text(SYM_INT4)
    edited.write_text(traceablelogs.edit(SYM_INT4))
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(COMPILE),
            str(releases.pristine("0.21.0")),
            str(paths.REPO / "plugin"),
            str(before),
            str(edited),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    refused = "Unsupported: logging.Logger method not supported for non-export cases"
    assert results == {
        "before": refused,
        "edited": "equal",
        "plugin": ["done", "equal"],
        "plugin undone": refused,
    }


B31_SITES = [
    "vllm/model_executor/models/gemma4.py:718 Gemma4MoE._esimd_can_run",
    "vllm/model_executor/models/qwen3_next.py:595 "
    "Qwen3NextSparseMoeBlock._forward_esimd_moe_block",
]


def test_the_b31_images_own_calls_found_and_guarded():
    """llm-scaler 0.21.0-b3.1 (vLLM 0.21.0 + its patch): its MoE fast paths
    log once inside the traced forward (the two modules, searched alone:
    each call's chain stays in its file). Edited by the recipe, none is
    left; negative control: 0.21.0's own modules have none."""
    from support import images

    models = [site.split(":")[0] for site in B31_SITES]

    def found(root, edit=False):
        texts = {p: (root / p).read_text() for p in models}
        if edit:
            texts = {p: recipes.LOGS_EDIT.edit(t) for p, t in texts.items()}
        return [str(f.site) for f in _once(reach.find(texts, upwards=False))]

    b31 = images.b31_cached()
    assert found(b31) == B31_SITES
    assert found(b31, edit=True) == []
    assert found(releases.pristine("0.21.0")) == []
