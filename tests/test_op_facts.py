"""One source per op fact: data/fakes.toml (which ops have a fake of ours,
their era, their fake, the kernels release that first has them) and
data/op_schemas.toml (their schemas, verbatim from the kernels' sources).
Every other copy must agree with them. The copies live in files that must
stay self-contained (the overlay files go into a vLLM tree; the e2e plugin
is installed into an engine venv), so they are read here, not generated:

* the fake module's decorators (``@_fake_of(TABLE, schema)``) and its
  kernels' feature gates (``_KERNEL_FEATURES``);
* the in-tree test's reference kernels (schemas, the release that first
  has an op, the release that first performs a check);
* make e2e's plugin (the ops whose fakes it checks, by era);
* the tool's lists (common/ops.py reads the table; the in-place cut's
  shared test regions).

Each check reads the files as text (AST, nothing imported), so the negative
controls below change one fact in a copy and see the check name it."""

import ast
import re
import tomllib

import pytest

from support import tool

REPO = tool.SCRIPTS.parent
DATA = tool.SCRIPTS / "xpufakes" / "data"
FAKES_MODULE = "vllm_overlay/vllm/_xpu_gemm_fakes.py"
REFERENCE = "vllm_overlay/tests/kernels/quantization/xpu_gemm_reference.py"
E2E_STANDINS = "e2e/plugin/xpufakes_e2e_plugin/standins.py"
INPLACE = "scripts/xpufakes/staging/inplace.py"
HEADERS = "scripts/xpufakes/data/dep3_headers.toml"
# Ours, but not a GEMM of a kernel package: vLLM's op around IPEX's WOQ
# module (vllm_overlay/vllm/_ipex_woq_linear.py), with its own test.
WOQ_OP = "vllm::ipex_woq_linear"


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
        for path in (FAKES_MODULE, REFERENCE, E2E_STANDINS, INPLACE, HEADERS)
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


def tool_disagrees(inplace: str) -> list[str]:
    """The in-place cut's shared test regions name the table's GEMMs."""
    gemms = {op["name"].partition("::")[2] for op in _table() if op["era"] == "kernels"}
    return [
        f"in-place tag {tag}: {op} is no GEMM of the table"
        for tag, ops in _assigned(inplace, "SHARED_TEST_TAGS").items()
        for op in ops
        if op not in gemms
    ]


def header_disagrees(headers: str) -> list[str]:
    """The kernels-era patch's header (its PR text) names each GEMM of the
    table, and the IPEX-era one the IPEX op."""
    texts = tomllib.loads(headers)
    return [
        f"the {era} patch's header does not name {op['name']}"
        for op in _table()
        for era in [op["era"]]
        if not re.search(
            rf"\b{op['name'].partition('::')[2].split('.')[0]}\b",
            " ".join(texts[era].split()),
        )
    ]


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


def test_the_tools_lists_agree_with_the_table():
    from xpufakes.common import ops

    table = _table()
    assert (
        tuple(op["name"].partition("::")[2] for op in table if op["era"] == "kernels")
        == ops.XPU_C_GEMMS
    )
    assert tool_disagrees(_sources()[INPLACE]) == []
    assert header_disagrees(_sources()[HEADERS]) == []
    schemas = _schemas()
    assert all(op["name"] in schemas for op in table), "an op without a schema"


# ---------------------------------------------------------------------------
# Negative controls: one fact changed in one copy is named
# ---------------------------------------------------------------------------


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
            INPLACE,
            '("int4_gemm_w4a16", "int4_gemm_w4a8")',
            '("int4_gemm_w4a16", "int4_gemm_w4a4")',
            "int4_gemm_w4a4 is no GEMM",
        ),
        (
            HEADERS,
            "fp8_gemm_w8a16, fp4_gemm, int4_gemm_w4a16 and",
            "fp8_gemm_w8a16, fp4_gemm and",
            "does not name _xpu_C::int4_gemm_w4a16",
        ),
    ],
    ids=[
        "fake-schema",
        "fake-name",
        "fake-gate",
        "reference-since",
        "reference-schema",
        "e2e-op",
        "inplace-tag",
        "patch-header",
    ],
)
def test_a_disagreeing_copy_is_named(path, old, new, expected):
    sources = _sources()
    assert old in sources[path], "the control no longer matches its file"
    sources[path] = sources[path].replace(old, new, 1)
    found = (
        fake_module_disagrees(sources[FAKES_MODULE])
        + reference_disagrees(sources[REFERENCE], sources[FAKES_MODULE])
        + e2e_disagrees(sources[E2E_STANDINS])
        + tool_disagrees(sources[INPLACE])
        + header_disagrees(sources[HEADERS])
    )
    assert any(expected in problem for problem in found), found
