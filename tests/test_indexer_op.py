"""The edit that makes vllm::sparse_attn_indexer's schema return nothing
(changes/indexerop.py), on the pinned releases' own files, and what it
changes under torch.compile.

vLLM registers the op with mutates_args=["topk_indices_buffer", ...] and a
function that returns that buffer as a plain Tensor: an undeclared alias
(docs/schema-truth.md, kind (b)). The compile test registers a miniature of
the op through the real direct_register_custom_op (its source read from the
pinned 0.33.0, run as it is), unedited and edited."""

import ast
import dataclasses
import re

import pytest

from support import releases
from xpufakes.changes import authoring, indexerop, recipes
from xpufakes.common import paths
from xpufakes.common.errors import Refusal
from xpufakes.trees import pins


def _with_the_patch() -> list[str]:
    """The first release of each series that carries the indexer's patch
    (its diffs differ from series to series)."""
    seen, chosen = set(), []
    for version, pin in pins.load().releases.items():
        listing = paths.PATCHES / pin.series / "series"
        if pin.series not in seen and recipes.INDEXER_PATCH in listing.read_text():
            seen.add(pin.series)
            chosen.append(version)
    return chosen


VARIANTS = _with_the_patch()


def _sources(version: str) -> dict[str, str]:
    root = releases.pristine(version)
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted((root / "vllm").rglob("*.py"))
        if indexerop.mentions(p.read_text())
    }


@pytest.mark.parametrize("version", VARIANTS)
def test_the_edit_on_each_release(version):
    """Where the release registers the op, the registration takes the two
    functions that return nothing, whose parameters are the impl's; every
    call of the op becomes the call, then a return of the buffer it passed.
    Negative control: the unedited file returns the op's result."""
    edited = 0
    for path, text in _sources(version).items():
        new = indexerop.edit(text)
        if new == text:
            continue
        edited += 1
        before, after = ast.parse(text), ast.parse(new)
        calls = [c for c, _ in indexerop._calls(after)]
        assert len(calls) == len(indexerop._calls(before))
        for call in indexerop._calls(before):
            assert isinstance(call[1], ast.Return)  # the negative control
        for node in ast.walk(after):
            if isinstance(node, ast.Return) and node.value in calls:
                raise AssertionError(f"{path}: the op's result is still returned")
        lines = new.splitlines()
        for call in calls:
            following = lines[call.end_lineno].strip()
            assert following.startswith("return ") and following.endswith(
                "topk_indices_buffer"
            ), (path, following)
        found = indexerop._registration(after)
        if found is None:
            continue
        named = {k.arg: ast.unparse(k.value) for k in found[1].keywords}
        impl = named["op_func"]
        assert impl.endswith("_op") and named["fake_impl"] == f"{impl}_fake"
        functions = {s.name: s for s in after.body if isinstance(s, ast.FunctionDef)}
        original = functions[impl.removesuffix("_op")]
        for name in (impl, f"{impl}_fake"):
            stand_in = functions[name]
            assert ast.unparse(stand_in.args) == ast.unparse(original.args)
            assert ast.unparse(stand_in.returns) == "None"
        # the impl itself is unchanged: its Python callers get the buffer
        assert ast.unparse(original) == ast.unparse(
            next(
                s
                for s in before.body
                if isinstance(s, ast.FunctionDef) and s.name == original.name
            )
        )
        assert indexerop.edit(text) == new  # the same each time
        assert indexerop.edit(new) == new  # and nothing more on its own result
    assert edited


def test_every_release_with_the_op_has_the_patch():
    """Of make test's releases, those whose files register or call the op
    are exactly those whose series carry the patch (0.10.2 has no op, and
    no empty patch)."""
    chosen = releases.representative()
    having = {v for v in chosen if _sources(v)}
    carrying = {
        v
        for v in chosen
        if recipes.INDEXER_PATCH
        in (paths.PATCHES / pins.load().get(v).series / "series").read_text()
    }
    assert having == carrying and "0.10.2" not in having and "0.11.0" in having


def test_a_file_the_recipe_does_not_name_stops_the_refresh():
    """make refresh refuses a release with a file the edit changes that the
    recipe does not name (the series would leave that caller returning
    None): the newest pin's kimi_k3 indexer stage. Negative control: the
    recipe as it is passes."""
    tree = releases.pristine(releases.newest())
    recipe = next(
        r for r in recipes.RECIPES["kernels"] if r.name.endswith(recipes.INDEXER_PATCH)
    )
    (edit,) = recipe.edits
    authoring._refuse_missed_files(tree, recipe, edit)
    stage = "specialized_decode/cutedsl/dsa/indexer_stage.py"
    short = dataclasses.replace(
        edit, optional=tuple(p for p in edit.optional if not p.endswith(stage))
    )
    with pytest.raises(Refusal, match=re.escape(stage)):
        authoring._refuse_missed_files(tree, recipe, short)


CALLER = """\
    def forward(self, x):
        {statement}torch.ops.vllm.sparse_attn_indexer(
            x, self.topk_indices_buffer{more}
        ){tail}
"""


@pytest.mark.parametrize(
    ("statement", "more", "tail", "why"),
    [
        ("out = ", "", "", "not a return statement's value"),
        ("return 1 + ", "", "", "not a return statement's value"),
        ("return ", ", topk_indices_buffer", "", "2 argument(s) naming"),
        ("return ", "", ".clone()", "not a return statement's value"),
    ],
)
def test_a_call_it_cannot_rewrite_is_refused(statement, more, tail, why):
    text = "import torch\n\n\nclass Indexer:\n" + CALLER.format(
        statement=statement, more=more, tail=tail
    )
    with pytest.raises(indexerop.Refused, match=re.escape(why)):
        indexerop.edit(text)
    good = "import torch\n\n\nclass Indexer:\n" + CALLER.format(
        statement="return ", more="", tail=""
    )
    assert "        return self.topk_indices_buffer\n" in indexerop.edit(good)


# -- under torch.compile ------------------------------------------------------

MINIATURE = """\
import torch

from registering import direct_register_custom_op, LIB


def sparse_attn_indexer(
    hidden_states: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
) -> torch.Tensor:
    topk_indices_buffer.copy_(hidden_states.argsort(dim=-1).to(torch.int32))
    return topk_indices_buffer


def sparse_attn_indexer_fake(
    hidden_states: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
) -> torch.Tensor:
    return topk_indices_buffer


direct_register_custom_op(
    op_name="sparse_attn_indexer",
    op_func=sparse_attn_indexer,
    mutates_args=["topk_indices_buffer"],
    fake_impl=sparse_attn_indexer_fake,
    target_lib=LIB,
    dispatch_key="CPU",
)


class Indexer(torch.nn.Module):
    def __init__(self, buffer):
        super().__init__()
        self.topk_indices_buffer = buffer

    def forward(self, hidden_states):
        return torch.ops.vllm.sparse_attn_indexer(
            hidden_states,
            self.topk_indices_buffer,
        )
"""


def _real_register_function() -> str:
    """direct_register_custom_op as the pinned 0.33.0 writes it."""
    path = releases.pristine("0.33.0") / "vllm/utils/torch_utils.py"
    text = path.read_text()
    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.FunctionDef)
            and node.name == "direct_register_custom_op"
        ):
            return ast.get_source_segment(text, node)
    raise AssertionError("no direct_register_custom_op in 0.33.0")


RUN = """\
import json, sys, types, warnings
from collections.abc import Callable

import torch
from torch.library import Library, infer_schema

registering = types.ModuleType("registering")
registering.__dict__.update(
    torch=torch, Library=Library, infer_schema=infer_schema, Callable=Callable,
    LIB=Library("vllm", "FRAGMENT"),
)
exec(sys.argv[1], registering.__dict__)
sys.modules["registering"] = registering
miniature = types.ModuleType("miniature")
exec(sys.argv[2], miniature.__dict__)

schema = str(torch.ops.vllm.sparse_attn_indexer.default._schema)
x = torch.randn(8, 16)
said = {"schema": schema}
for backend in ("eager", "aot_eager", "inductor"):
    torch._dynamo.reset()
    buffer = torch.zeros(8, 16, dtype=torch.int32)
    module = miniature.Indexer(buffer)
    run = module if backend == "eager" else torch.compile(module, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = run(x)
        except RuntimeError as e:  # torch's aliasing check, in its error mode
            said[backend] = {"error": str(e)[:300]}
            continue
    said[backend] = {
        "error": "",
        "out": out.tolist(),
        "buffer": buffer.tolist(),
        "out_is_buffer": out.data_ptr() == buffer.data_ptr(),
        "deprecated": [
            str(w.message)[:200] for w in caught if "deprecated" in str(w.message)
        ],
    }
print(json.dumps(said))
"""


# torch's check of a custom op's output aliasing an input: an error where
# the variable is 1 (torch's default where CI is set), else a warning
STRICT = "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING"


def _compiled(text: str, strict: bool) -> dict:
    import json
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", RUN, _real_register_function(), text],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **{STRICT: "1" if strict else "0"}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_edited_op_returns_nothing_and_compiles_as_eager():
    """Edited: the schema returns nothing and marks the buffer; eager, aot_eager
    and Inductor give the same buffer and return the buffer itself, with
    torch's aliasing check as an error (as where CI is set) and nothing said
    deprecated. Negative control, unedited: the schema returns a plain Tensor;
    compiled, torch's check fails it in its error mode, and otherwise warns
    that the output aliasing an input is deprecated (aot_eager gives a copy,
    not the buffer)."""
    edited = indexerop.edit(MINIATURE)
    assert edited != MINIATURE
    after = _compiled(edited, strict=True)
    assert after["schema"].endswith("-> ()"), after["schema"]
    assert re.search(r"Tensor\(a\d*!\) topk_indices_buffer\)", after["schema"])
    eager = after["eager"]
    assert eager["out_is_buffer"] and any(v for row in eager["buffer"] for v in row)
    for backend in ("aot_eager", "inductor"):
        assert not after[backend]["error"], after[backend]
        assert after[backend]["buffer"] == eager["buffer"], backend
        assert after[backend]["out"] == eager["out"], backend
        assert after[backend]["out_is_buffer"], backend
    assert not any(after[b]["deprecated"] for b in ("eager", "aot_eager", "inductor"))

    strict = _compiled(MINIATURE, strict=True)
    assert strict["schema"].endswith("-> Tensor"), strict["schema"]
    assert not strict["eager"]["error"]
    assert any(
        "must not also be an input" in strict[b]["error"]
        for b in ("aot_eager", "inductor")
    ), strict
    lenient = _compiled(MINIATURE, strict=False)
    assert any(lenient[b]["deprecated"] for b in ("aot_eager", "inductor")), lenient
    assert not lenient["aot_eager"]["out_is_buffer"]
    assert lenient["aot_eager"]["buffer"] == lenient["eager"]["buffer"]
