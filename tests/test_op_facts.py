"""One source per op fact: data/fakes.toml (which ops have a fake of ours,
their era, their fake, the kernels release that first has them, the
in-place test's shared regions) and data/op_schemas.toml (their schemas,
verbatim from the kernels' sources). Nothing else writes one by hand:

* generated (`make ops`, changes/opfacts.py, also run by `make refresh`):
  the reference kernels' tables (schemas, the release that first has an
  op), make e2e's plugin's list, the vLLM plugin's WRAPPER_FAKES (vLLM's
  wrapper ops: common/ops.py WRAPPERS, op_schemas.toml [vllm]), the docs'
  `<!-- ops:KEY -->` figures.
  Every generated place must hold what the generator writes;
* read at run time: the tool's lists (common/ops.py: the GEMMs, the
  in-place cut's shared test regions), the kernels patch header's op list
  (the `{ops}` of data/dep3_headers.toml, filled by changes/recipes.py);
* written with the fake or the reference kernel, and checked here: the
  fake module's decorators and its kernels' feature gates
  (``_KERNEL_FEATURES``), the reference's kernel functions, its opcheck
  grid (``CASE_SPACE``), the in-place test's regions, the patch headers'
  names of the ops.

Whether a fake is right is tests/test_fakes_contract.py's: it runs each
op's real fake through its grid.

Besides the generator's own output, every copy is also checked against the
data directly (a second reading, so a wrong generator fails too). Each
check reads the files as text (AST, nothing imported), so the negative
controls below change one fact in a copy and see the check name it."""

import ast
import dataclasses
import re
import tomllib

import pytest

from support import tool
from xpufakes.changes import opfacts, recipes
from xpufakes.common import ops, pluginsource
from xpufakes.proof.model import models
from xpufakes.staging import inplace, upstream
from xpufakes.trees import pinfacts, pins

REPO = tool.SCRIPTS.parent
DATA = tool.SCRIPTS / "xpufakes" / "data"
FAKES_MODULE = "vllm_overlay/vllm/_xpu_gemm_fakes.py"
REFERENCE = "vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py"
E2E_STANDINS = "e2e/plugin/xpufakes_e2e_plugin/standins.py"
PLUGIN = pluginsource.module_source()
INPLACE_TEST = opfacts.INPLACE_TEST
CONTRIBUTORS = "docs/contributors.md"
TRACED_PATH = "docs/traced-path.md"
HEADERS = "scripts/xpufakes/data/dep3_headers.toml"
# Ours, but not a GEMM of a kernel package: vLLM's op around IPEX's WOQ
# module (vllm_overlay/vllm/_ipex_woq_linear.py), with its own test.
WOQ_OP = ops.IPEX_WOQ_OP


def _table() -> list[dict]:
    return tomllib.loads((DATA / "fakes.toml").read_text())["op"]


def _schemas() -> dict[str, str]:
    """qualified op -> its schema as torch prints it."""
    data = tomllib.loads((DATA / "op_schemas.toml").read_text())
    return {
        f"{ns}::{name}": f"{ns}::{schema}"
        for ns, ops in data.items()
        for name, schema in ops.items()
    }


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _assigned(text: str, name: str):
    """The literal value of a module-level assignment."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return ast.literal_eval(node.value)
    raise AssertionError(f"no module-level {name}")


def _sources() -> dict[str, str]:
    return {
        path: (REPO / path).read_text()
        for path in (
            FAKES_MODULE,
            REFERENCE,
            E2E_STANDINS,
            PLUGIN,
            INPLACE_TEST,
            HEADERS,
            CONTRIBUTORS,
            TRACED_PATH,
        )
    }


# ---------------------------------------------------------------------------
# The checks: each returns the disagreements it finds
# ---------------------------------------------------------------------------


def fake_module_disagrees(text: str) -> list[str]:
    """The fake module's decorated fakes are the table's, under the table's
    names, for the schemas of op_schemas.toml, in their era's table."""
    tables = {"kernels": "XPU_GEMM_FAKES", "ipex": "IPEX_GEMM_FAKES"}
    want = {op["name"]: op for op in _table()}
    schemas = _schemas()
    found, problems = {}, []
    for node in ast.parse(text).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for d in node.decorator_list:
            if isinstance(d, ast.Call) and ast.unparse(d.func) == "_fake_of":
                schema = ast.literal_eval(d.args[1])
                found[schema.partition("(")[0]] = (node.name, d.args[0].id, schema)
    if set(found) != set(want):
        problems.append(f"fakes for {sorted(found)}, the table has {sorted(want)}")
    for op, (function, table, schema) in found.items():
        if op not in want:
            continue
        if function != want[op]["fake"]:
            problems.append(f"{op}: fake {function}, the table says {want[op]['fake']}")
        if table != tables[want[op]["era"]]:
            problems.append(f"{op}: entered in {table}")
        if schema != schemas.get(op):
            problems.append(
                f"{op}: schema {schema!r}, op_schemas.toml {schemas.get(op)!r}"
            )
    return problems


def reference_disagrees(reference: str, fakes: str) -> list[str]:
    """The reference kernels define the table's ops with op_schemas.toml's
    schemas, from the table's releases; the fake module and the reference
    gate the same checks on the same releases."""
    schemas, table = _schemas(), _table()
    problems = []
    defined = {
        f"_xpu_C::{name}": f"_xpu_C::{s}"
        for name, s in _assigned(reference, "XPU_C_SCHEMAS").items()
    } | {
        f"torch_ipex::{name}": f"torch_ipex::{s}"
        for name, s in _assigned(reference, "TORCH_IPEX_SCHEMAS").items()
    }
    names = {op["name"] for op in table}
    if set(defined) != names:
        problems.append(
            f"reference defines {sorted(defined)}, the table {sorted(names)}"
        )
    for op, schema in defined.items():
        if op in names and schema != schemas.get(op):
            problems.append(f"{op}: reference schema {schema!r}")
    since = _assigned(reference, "XPU_C_OP_SINCE")
    for op in table:
        if op["era"] != "kernels":
            continue
        gemm = op["name"].partition("::")[2]
        got = since.get(gemm, (0, 1, 0))
        if got != _version(op["since"]):
            problems.append(f"{op['name']}: reference since {got}, table {op['since']}")
    tree = ast.parse(reference)
    make = next(n for n in tree.body if getattr(n, "name", "") == "make_xpu_c_kernels")
    kernels = {
        "_xpu_C": {n.name for n in make.body if isinstance(n, ast.FunctionDef)},
        "torch_ipex": {
            ast.literal_eval(k)
            for k in opfacts._assignment(tree, "TORCH_IPEX_KERNELS").keys
        },
    }
    where = {"_xpu_C": "make_xpu_c_kernels", "torch_ipex": "TORCH_IPEX_KERNELS"}
    for op in sorted(names):
        namespace, _, name = op.partition("::")
        if name not in kernels[namespace]:
            problems.append(f"{op}: no reference kernel in {where[namespace]}")
    space = opfacts._assignment(tree, "CASE_SPACE")
    graded = {
        "::".join(ast.literal_eval(k)[:2])
        + ("" if ast.literal_eval(k)[0] == "_xpu_C" else f".{ast.literal_eval(k)[2]}")
        for k in space.keys
    }
    for op in sorted(names - graded):
        problems.append(f"{op}: no opcheck grid in CASE_SPACE")
    checks = _assigned(reference, "XPU_C_CHECK_SINCE")
    gates = {k: since for k, (since, _) in _assigned(fakes, "_KERNEL_FEATURES").items()}
    if checks != gates:
        problems.append(f"check releases: reference {checks}, fake module {gates}")
    return problems


def e2e_disagrees(text: str) -> list[str]:
    """make e2e checks fakes of the table's ops, each in its era."""
    era = {op["name"]: op["era"] for op in _table()} | {WOQ_OP: "ipex"}
    return [
        f"e2e checks {op} in the {checked_era} era"
        for checked_era, ops in _assigned(text, "CHECKED_OPS").items()
        for op in ops
        if era.get(op) != checked_era
    ]


def plugin_disagrees(text: str) -> list[str]:
    """The vLLM plugin's WRAPPER_FAKES: each of vLLM's wrapper ops
    (op_schemas.toml [vllm]) with its schema there and the table's fake of
    the GEMM it returns (common/ops.py WRAPPER_OPS)."""
    wrappers = tomllib.loads((DATA / "op_schemas.toml").read_text())["vllm"]
    fake_of = {op["name"]: op["fake"] for op in _table()}
    schemas = _schemas()
    found = _assigned(text, "WRAPPER_FAKES")
    problems = []
    if set(found) != {f"vllm::{name}" for name in wrappers}:
        problems.append(f"the plugin's wrapper ops {sorted(found)}, [vllm] {wrappers}")
    for op, (schema, fake) in found.items():
        if schema != schemas.get(op):
            problems.append(f"{op}: the plugin's schema {schema!r}")
        want = fake_of.get(ops.WRAPPER_OPS.get(op, ""))
        if fake != want:
            problems.append(f"{op}: the plugin's fake {fake}, the table's {want}")
    return problems


def inplace_disagrees(text: str) -> list[str]:
    """The in-place test's regions: one per GEMM of the table it has cases
    for (`op-<gemm>`, holding that op's `@_cases`), the shared regions the
    table names (fakes.toml's shared_test_region), the wrapper's."""
    gemms = {op["name"].partition("::")[2] for op in _table() if op["era"] == "kernels"}
    shared = {op["shared_test_region"] for op in _table() if "shared_test_region" in op}
    tags = set(re.findall(r"# xpufakes: (\S+) begin", text))
    problems = [
        f"in-place region {tag}: no GEMM of the table, no shared region"
        for tag in sorted(tags - {f"op-{g}" for g in gemms} - shared)
        if tag != inplace.WRAPPER_TAG
    ]
    problems += [f"in-place region {tag}: missing" for tag in sorted(shared - tags)]
    drop_all = tags - shared
    for tag in sorted(tags & {f"op-{g}" for g in gemms}):
        try:
            alone = upstream.strip_regions(text, drop_all - {tag})
        except ValueError as error:  # a begin without its end
            return [*problems, f"in-place regions: {error}"]
        found = set(opfacts._inplace_cases(alone))
        if found != {f"_xpu_C::{tag.removeprefix('op-')}"}:
            problems.append(f"in-place region {tag} enters cases of {sorted(found)}")
    return problems


def generated_disagrees(path: str, text: str) -> list[str]:
    """The places `make ops` writes hold what it writes (each named)."""
    problems = []
    for name, value in opfacts.python_values().get(path, {}).items():
        if _assigned(text, name) != value:
            problems.append(f"{path}: {name} is not what `make ops` writes")
    if path in opfacts.DOCUMENTS:
        known = opfacts.doc_facts(REPO)
        problems += [
            f"{path}: ops:{m.group(1)} is not what `make ops` writes"
            for m in opfacts.MARKED.finditer(text)
            if m.group(2) != known.get(m.group(1))
        ]
    if path in opfacts.MODEL_DOCUMENTS:
        known = opfacts.model_facts()
        problems += [
            f"{path}: models:{m.group(1)} is not what `make ops` writes"
            for m in pinfacts.marked("models").finditer(text)
            if m.group(2) != known.get(m.group(1))
        ]
    rewrite = opfacts.expected(REPO).get(path)
    if not problems and rewrite and rewrite(text) != text:
        problems.append(f"{path}: not as `make ops` lays it out")
    return problems


def header_disagrees(headers: str, table: list[dict] | None = None) -> list[str]:
    """The kernels-era patch's header (its PR text), as the series carries
    it (recipes.with_ops fills its `{ops}` from the table), names each GEMM
    of the table, and the IPEX-era one the IPEX op; the kernels header
    names no op by hand (it has the `{ops}` place)."""
    texts = tomllib.loads(headers)
    table = _table() if table is None else table
    gemms = [op["name"].partition("::")[2] for op in table if op["era"] == "kernels"]
    rendered = {**texts, "kernels": recipes.with_ops(texts["kernels"], gemms)}
    problems = [
        f"the {era} patch's header does not name {op['name']}"
        for op in table
        for era in [op["era"]]
        if not re.search(
            rf"\b{op['name'].partition('::')[2].split('.')[0]}\b",
            " ".join(rendered[era].split()),
        )
    ]
    if "{ops}" not in texts["kernels"]:
        problems.append("the kernels patch's header lists its ops by hand, no {ops}")
    return problems


# ---------------------------------------------------------------------------
# Every copy agrees
# ---------------------------------------------------------------------------


def test_the_fake_module_agrees_with_the_table():
    assert fake_module_disagrees(_sources()[FAKES_MODULE]) == []


def test_the_reference_kernels_agree_with_the_table():
    sources = _sources()
    assert reference_disagrees(sources[REFERENCE], sources[FAKES_MODULE]) == []


def test_make_e2e_checks_the_tables_ops():
    assert e2e_disagrees(_sources()[E2E_STANDINS]) == []


def test_the_plugins_wrapper_fakes_agree_with_the_table():
    assert plugin_disagrees(_sources()[PLUGIN]) == []


def test_the_in_place_tests_regions_agree_with_the_table():
    assert inplace_disagrees(_sources()[INPLACE_TEST]) == []


@pytest.mark.parametrize(
    "path", [REFERENCE, E2E_STANDINS, PLUGIN, CONTRIBUTORS, TRACED_PATH]
)
def test_every_generated_place_holds_what_make_ops_writes(path):
    assert generated_disagrees(path, _sources()[path]) == []


def test_the_catalogs_figures_are_the_catalogs():
    """A second count of docs/traced-path.md's catalog figures: the models
    as the proof loads them, each by the architecture its config names.
    Negative control: the figure it had (13 architectures for 12) fails."""
    catalog = models.load()
    architectures = {m.config["architectures"][0] for m in catalog.values()}
    text = _sources()[TRACED_PATH]
    found = {m.group(1): m.group(2) for m in pinfacts.marked("models").finditer(text)}
    assert found == {
        "entries": str(len(catalog)),
        "architectures": str(len(architectures)),
    }
    wrong = text.replace(
        f"<!-- models:architectures -->{len(architectures)}<",
        f"<!-- models:architectures -->{len(architectures) + 1}<",
    )
    assert wrong != text
    assert generated_disagrees(TRACED_PATH, wrong) == [
        f"{TRACED_PATH}: models:architectures is not what `make ops` writes"
    ]


def test_the_docs_figures_of_the_in_place_test_are_the_cuts():
    """A second count of the marked figures: the in-place cut's own test
    text (staging/inplace.py) for the release's ops with cases."""
    known = opfacts.doc_facts(REPO)
    cases = opfacts._inplace_cases(_sources()[INPLACE_TEST])
    release = {
        op["name"]
        for op in _table()
        if op["era"] == "kernels"
        and _version(op["since"])
        <= _version(pins.load().get(opfacts.DOC_RELEASE).kernels.split()[-1])
    }
    gemms = [op.partition("::")[2] for op in cases if op in release]
    text = inplace.test_text(gemms, wrappers=True)
    assert known["inplace_test_lines"] == str(len(text.splitlines()))
    assert known["inplace_ops"] == str(len(gemms) + len(ops.WRAPPERS))


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        (REFERENCE, '"fp8_bmm": (0, 1, 11),', '"fp8_bmm": (0, 1, 12),'),
        (PLUGIN, '"fp8_bmm_fake",', '"fp8_gemm_fake",'),
    ],
    ids=["reference", "plugin"],
)
def test_make_ops_writes_back_what_a_hand_changed(path, old, new):
    """The generator restores a place changed by hand, and leaves the rest
    of the file byte for byte."""
    text = _sources()[path]
    changed = text.replace(old, new, 1)
    assert changed != text
    assert opfacts.expected(REPO)[path](changed) == text


def test_the_tools_lists_agree_with_the_table():
    table = _table()
    assert (
        tuple(op["name"].partition("::")[2] for op in table if op["era"] == "kernels")
        == ops.XPU_C_GEMMS
    )
    assert header_disagrees(_sources()[HEADERS]) == []
    schemas = _schemas()
    assert all(op["name"] in schemas for op in table), "an op without a schema"
    # vLLM's wrapper ops: each has a schema, and delegates to the table's
    # fake of the GEMM it returns
    fake_of = {op["name"]: op["fake"] for op in table}
    for op, wrapper in ops.WRAPPERS.items():
        assert op in schemas, f"{op}: no schema"
        assert wrapper.canonical == fake_of[ops.WRAPPER_OPS[op]], op


# ---------------------------------------------------------------------------
# Negative controls: one fact changed in one copy is named
# ---------------------------------------------------------------------------

# the docs' figure of the in-place test's cases, as make ops writes it (an op
# given cases changes it)
_CASES = opfacts.doc_facts(REPO)["inplace_cases"]


def replace_once(text: str, old: str, new: str) -> str:
    """`text` with the first match of `old` replaced by `new`, whatever the
    whitespace between old's words in the text (a file re-wrapped or
    re-indented still matches; leading and trailing whitespace of both
    ignored)."""
    pattern = r"\s+".join(re.escape(word) for word in old.split())
    match = re.search(pattern, text)
    assert match, f"the control no longer matches its file: {old!r}"
    return text[: match.start()] + new.strip() + text[match.end() :]


def test_a_control_matches_its_text_however_it_is_wrapped():
    """Negative control of replace_once: a control's words across a line
    break, re-indented, are found; other words are not."""
    text = "a = [\n    fp8_gemm,\n        fp4_gemm and\n    int4]\n"
    assert replace_once(text, "fp8_gemm, fp4_gemm and int4", "x") == "a = [\n    x]\n"
    with pytest.raises(AssertionError, match="no longer matches"):
        replace_once(text, "fp8_gemm, int4", "x")


@pytest.mark.parametrize(
    ("path", "old", "new", "expected"),
    [
        (
            FAKES_MODULE,
            '"_xpu_C::fp8_gemm_w8a16(Tensor A, Tensor B, Tensor? B_scale_, "',
            '"_xpu_C::fp8_gemm_w8a16(Tensor A, Tensor B, Tensor? B_scale, "',
            "_xpu_C::fp8_gemm_w8a16: schema",
        ),
        (
            FAKES_MODULE,
            "def fp4_gemm_fake(",
            "def fp4_gemm_fake_renamed(",
            "_xpu_C::fp4_gemm: fake fp4_gemm_fake_renamed",
        ),
        (
            FAKES_MODULE,
            '"batched_weights": ((0, 1, 11), True)',
            '"batched_weights": ((0, 1, 12), True)',
            "check releases",
        ),
        (
            REFERENCE,
            '"fp8_bmm": (0, 1, 11),',
            '"fp8_bmm": (0, 1, 12),',
            "_xpu_C::fp8_bmm: reference since",
        ),
        (
            REFERENCE,
            '"int4_gemm_w4a8": "int4_gemm_w4a8(Tensor A_, ',
            '"int4_gemm_w4a8": "int4_gemm_w4a8(Tensor A, ',
            "_xpu_C::int4_gemm_w4a8: reference schema",
        ),
        (
            E2E_STANDINS,
            '"_xpu_C::fp4_gemm",',
            '"_xpu_C::fp4_gemm_w4a4",',
            "e2e checks _xpu_C::fp4_gemm_w4a4",
        ),
        (
            REFERENCE,
            '"fp8_bmm": (0, 1, 11),',
            '"fp8_bmm": (0, 1, 12),',
            f"{REFERENCE}: XPU_C_OP_SINCE is not what `make ops` writes",
        ),
        (
            REFERENCE,
            "    def fp4_gemm(A, B,",
            "    def fp4_gemm_renamed(A, B,",
            "_xpu_C::fp4_gemm: no reference kernel",
        ),
        (
            REFERENCE,
            '("_xpu_C", "fp4_gemm", "default"): (',
            '("_xpu_C", "fp4_gemm_w4a4", "default"): (',
            "_xpu_C::fp4_gemm: no opcheck grid",
        ),
        (
            E2E_STANDINS,
            '"_xpu_C::fp4_gemm",',
            '"_xpu_C::fp4_gemm_w4a4",',
            f"{E2E_STANDINS}: CHECKED_OPS is not what",
        ),
        (
            PLUGIN,
            '"fp8_bmm_fake",',
            '"fp8_gemm_fake",',
            "vllm::xpu_fp8_bmm: the plugin's fake fp8_gemm_fake",
        ),
        (
            PLUGIN,
            '"fp8_bmm_fake",',
            '"fp8_gemm_fake",',
            f"{PLUGIN}: WRAPPER_FAKES is not what `make ops` writes",
        ),
        (
            PLUGIN,
            '"Tensor b_scale, Tensor? bias) -> Tensor",',
            '"Tensor b_scale, Tensor bias) -> Tensor",',
            "vllm::xpu_fp8_bmm: the plugin's schema",
        ),
        (
            INPLACE_TEST,
            "# xpufakes: op-int4 begin",
            "# xpufakes: op-int4x begin",
            "in-place region op-int4x: no GEMM",
        ),
        (
            INPLACE_TEST,
            '@_cases("_xpu_C::fp4_gemm", ',
            '@_cases("_xpu_C::fp8_gemm", ',
            "in-place region op-fp4_gemm enters cases of ['_xpu_C::fp8_gemm']",
        ),
        (
            CONTRIBUTORS,
            f"<!-- ops:inplace_cases -->{_CASES}<!-- /ops --> cases",
            f"<!-- ops:inplace_cases -->{int(_CASES) + 1}<!-- /ops --> cases",
            f"{CONTRIBUTORS}: ops:inplace_cases is not what",
        ),
        (
            PLUGIN,
            '"intel_extension_for_pytorch.llm.functional.bgmv_shrink": "",',
            '"intel_extension_for_pytorch.llm.functional.bgmv_shrink": "out",',
            f"{PLUGIN}: CALLEE_RETURNS is not what `make ops` writes",
        ),
        (
            HEADERS,
            "mirrors their input checks, for {ops}.",
            "mirrors their input checks, for fp8_gemm and fp4_gemm.",
            "the kernels patch's header lists its ops by hand",
        ),
    ],
    ids=[
        "fake-schema",
        "fake-name",
        "fake-gate",
        "reference-since",
        "reference-schema",
        "e2e-op",
        "reference-since-generated",
        "reference-kernel",
        "reference-grid",
        "e2e-op-generated",
        "plugin-fake",
        "plugin-fake-generated",
        "plugin-schema",
        "inplace-region",
        "inplace-cases",
        "doc-figure",
        "plugin-callee-returns",
        "patch-header-by-hand",
    ],
)
def test_a_disagreeing_copy_is_named(path, old, new, expected):
    sources = _sources()
    sources[path] = replace_once(sources[path], old, new)
    found = (
        fake_module_disagrees(sources[FAKES_MODULE])
        + reference_disagrees(sources[REFERENCE], sources[FAKES_MODULE])
        + e2e_disagrees(sources[E2E_STANDINS])
        + plugin_disagrees(sources[PLUGIN])
        + inplace_disagrees(sources[INPLACE_TEST])
        + generated_disagrees(path, sources[path])
        + header_disagrees(sources[HEADERS])
    )
    assert any(expected in problem for problem in found), found


def test_the_kernels_header_names_an_op_added_to_the_table():
    """The op list of the kernels patch's header follows the table: with a
    new op in the table it is named last, in a paragraph still wrapped to
    the header's width. Negative control: the header with its op list
    written by hand (the table's ops before) does not name the new op."""
    gemm = "gemm_of_this_test"  # in no table
    table = [*_table(), {"name": f"_xpu_C::{gemm}", "era": "kernels"}]
    assert gemm not in ops.XPU_C_GEMMS
    headers = _sources()[HEADERS]
    assert header_disagrees(headers, table) == []
    gemms = [op["name"].partition("::")[2] for op in table if op["era"] == "kernels"]
    kernels = recipes.with_ops(tomllib.loads(headers)["kernels"], gemms)
    assert f"{gemms[-2]} and {gemm}. A fake is registered" in " ".join(kernels.split())
    paragraph = next(p for p in kernels.split("\n .\n") if gemm in p)
    assert max(len(line) for line in paragraph.splitlines()) <= recipes.HEADER_WIDTH
    by_hand = headers.replace("{ops}", recipes.op_list(list(ops.XPU_C_GEMMS)))
    assert header_disagrees(by_hand, table) == [
        f"the kernels patch's header does not name _xpu_C::{gemm}",
        "the kernels patch's header lists its ops by hand, no {ops}",
    ]


def test_a_registry_change_without_make_ops_is_named(monkeypatch):
    """The other way round: the table changed, the copies not rewritten."""
    changed = [dict(op) for op in ops.FAKES]
    next(op for op in changed if op["name"] == "_xpu_C::fp8_bmm")["since"] = "0.1.12"
    monkeypatch.setattr(ops, "FAKES", changed)
    found = generated_disagrees(REFERENCE, _sources()[REFERENCE])
    assert found == [f"{REFERENCE}: XPU_C_OP_SINCE is not what `make ops` writes"]
    # vLLM's wrapper ops: another fake for one
    wrapper = ops.WRAPPERS["vllm::xpu_fp8_bmm"]
    monkeypatch.setitem(
        ops.WRAPPERS,
        "vllm::xpu_fp8_bmm",
        dataclasses.replace(wrapper, canonical="fp8_gemm_fake"),
    )
    found = generated_disagrees(PLUGIN, _sources()[PLUGIN])
    assert found == [f"{PLUGIN}: WRAPPER_FAKES is not what `make ops` writes"]
