"""The contracts of the fix for the ops whose schemas lie (issue 42, item 2's
data): for each op that schema truth (schematruth.py) finds lying on a
tree's traced path, what a vLLM custom op that runs it must declare --
its exact `mutates` (what it marks and what it hides), that it returns
nothing, and what the callee returns to its caller (the argument it
returns as it is, or nothing) -- with the C++ and the call sites cited. In
the form of data/opaque_calls.toml, whose `callee_returns` the plugin and
the recipes already use, keyed by what the tree calls: the package's
wrapper (`custom_esimd_kernels_vllm.<f>`, which the tree re-exports) or
the op itself (`torch.ops.<ns>.<op>`).

`make schema-contracts TREES="<tree> ..."` writes data/schema_contracts.toml
from the trees given (a tree's contracts are those its traced path needs;
the same callee with the same contract in several trees is one entry)."""

import json
import tomllib
from pathlib import Path

from xpufakes.common import opschema, paths
from xpufakes.common.errors import Refusal
from xpufakes.proof.static import schematruth
from xpufakes.trees import images, tree

DATA = paths.DATA / "schema_contracts.toml"


def _op_name(op: str) -> str:
    """The vLLM op that runs it: an ESIMD op keeps its name, another
    package's is prefixed by its namespace, a vLLM op of the tree's by xpu_."""
    ns, name = op.split("::")
    if ns == schematruth.ESIMD_PACKAGE:
        return name
    return f"xpu_{name}" if ns == "vllm" else f"{ns}_{name}"


def marked_elsewhere(op: str, schema, data: dict | None = None) -> dict[str, str]:
    """The arguments another image commit's schema of the same op (the same
    parameters) marks as written, each with that commit: the package's own
    later word on what the kernel writes (a writable pointer is not read
    everywhere: llm-scaler 0a85564's `esimd_qkv_split_norm_rope` gives none
    for `gate_out`, `k_out`, `v_out`, which b18beee's schema marks)."""
    found: dict[str, str] = {}
    commits = (data if data is not None else schematruth.load_data())["esimd"]
    for commit, entry in sorted(commits.items()):
        other = entry.get("ops", {}).get(op)
        try:
            parsed = opschema.parse(other["schema"]) if other else None
        except ValueError:
            parsed = None
        if parsed is None or [a.name for a in parsed.args] != [
            a.name for a in schema.args
        ]:
            continue
        for name in parsed.marked:
            found.setdefault(name, f"llm-scaler {commit} {other['defined']}")
    return found


def contracts(truth: schematruth.Truth, label: str) -> dict[str, dict]:
    """callee -> its contract, for each lying op a traced call reaches."""
    found: dict[str, dict] = {}
    for o in (o for o in truth.ops if o.traced):
        if not {x.kind for x in o.lies} & {"a", "b", "c"}:
            continue  # only its fake lies ((d), (e)): no contract of the kernel
        schema = o.facts.schema
        hidden = {x.argument for x in o.lies if x.kind == "a"}
        elsewhere = marked_elsewhere(o.op, schema)
        hidden |= set(elsewhere)
        mutates = [a.name for a in schema.args if a.writes or a.name in hidden]
        returned = list(dict.fromkeys(e["param"] for e in o.facts.returns))
        if returned:
            callee_returns = ", ".join(returned)
        elif schema.returns_tensor:
            callee_returns = "result"
        else:
            callee_returns = ""
        cited = [f"{o.facts.where}: {o.facts.text}"]
        marked_here = {a.name for a in schema.args if a.writes}
        cited += [
            f"`{name}` marked by {where}"
            for name, where in elsewhere.items()
            if name not in marked_here
            and not any(x.kind == "a" and x.argument == name for x in o.lies)
        ]
        for lie in o.lies:
            argument = f" `{lie.argument}`" if lie.argument else ""
            cited.append(
                f"({lie.kind}) {schematruth.KINDS[lie.kind]}{argument}: "
                + "; ".join(lie.evidence[:2])
            )
        reached = [s for s in o.sites if s.reached]
        found.update(
            _by_callee(o.op, schema, mutates, callee_returns, cited, reached, label)
        )
    found.update(_alias_contracts(truth, label))
    return found


def _by_callee(op, schema, mutates, callee_returns, cited, sites, label) -> dict:
    """callee -> the contract of `op` for the traced calls (`sites`) of it."""
    found = {}
    for callee in dict.fromkeys(s.call.target or s.call.via for s in sites):
        found[callee] = {
            "op": _op_name(op),
            "kernel_op": op,
            "params": [_param(a) for a in schema.args],
            "mutates": mutates,
            "returns": "" if callee_returns != "result" else "result",
            "callee_returns": callee_returns,
            "source": " | ".join(cited),
            "trees": [label],
            "sites": [
                f"{s.call.file}:{s.call.line} {s.call.function}: {s.when}"
                for s in sites
                if (s.call.target or s.call.via) == callee
            ],
        }
    return found


def _alias_contracts(truth: schematruth.Truth, label: str) -> dict[str, dict]:
    """callee -> its contract, for each op whose schema returns a declared
    alias (`-> Tensor(a!)`) a traced call reaches: functionalization refuses
    a custom op with one (compiling fails), so it runs as the lying ops do,
    behind a vLLM op that marks its writes and returns nothing, the caller
    given the argument the kernel returns (issue 50)."""
    found: dict[str, dict] = {}
    for op, facts in sorted(truth.alias_facts.items()):
        schema = facts.schema
        written = {e["param"] for e in facts.writes} | set(marked_elsewhere(op, schema))
        mutates = [a.name for a in schema.args if a.writes or a.name in written]
        aliased = schema.returned_aliases()
        cited = [
            f"{facts.where}: {facts.text}",
            f"returns a declared alias `{', '.join(aliased)}`: functionalization "
            "refuses a custom op whose output has an alias annotation",
        ]
        cited += [
            f"writes `{e['param']}`: {e['how']} ({e['at']})"
            for e in facts.writes
            if not any(a.name == e["param"] and a.writes for a in schema.args)
        ]
        sites = [s for s in truth.refused_sites if s.call.op == op]
        found.update(
            _by_callee(op, schema, mutates, ", ".join(aliased), cited, sites, label)
        )
    return found


def _param(arg) -> str:
    default = f"={arg.default}" if arg.default else ""
    return f"{arg.plain} {arg.name}{default}"


def label_of(found: tree.Tree, truth: schematruth.Truth) -> str:
    try:
        version = tree.detect_version(found)[0]
    except Refusal:
        version = "?"
    image = [s for s in truth.sources if "llm-scaler" in s]
    if image:
        return f"vLLM {version} + " + image[0].split(": ", 1)[1].split(" (")[0]
    return f"vLLM {version}"


def merged(each: list[dict[str, dict]]) -> dict[str, dict]:
    """One entry per callee and contract; the trees that need it listed."""
    found: dict[str, dict] = {}
    for contracts_of_tree in each:
        for callee, entry in contracts_of_tree.items():
            key, n = callee, 1
            while key in found:
                same = all(
                    found[key][k] == entry[k]
                    for k in ("op", "params", "mutates", "returns", "callee_returns")
                )
                if same:
                    found[key]["trees"] += entry["trees"]
                    found[key]["sites"] += [
                        s for s in entry["sites"] if s not in found[key]["sites"]
                    ]
                    break
                n += 1
                key = f"{callee}#{n}"
            else:
                found[key] = entry
    return found


HEADER = """\
# The contracts of the fix for the ops whose schemas lie about what their
# kernel writes or returns, on a tree's traced path (issue 42, item 2), and
# for those whose schemas return a declared alias, which functionalization
# refuses (`-> Tensor(a!)`: compiling fails; issue 50): each
# such op run as a vLLM custom op that declares exactly what it writes and
# returns nothing, its caller getting what the callee returned. The form of
# data/opaque_calls.toml, keyed by the callee the tree calls:
#
#   op              the vLLM op to register (torch.ops.vllm.<op>)
#   kernel_op       the op whose schema lies
#   params          its parameters, in order (its schema's, without marks)
#   mutates         what it writes: the arguments its schema marks, and
#                   those it hides (schema truth's (a))
#   returns         "": the vLLM op returns nothing; "result": the kernel
#                   also returns a new tensor (not seen so far)
#   callee_returns  what the callee gives its caller: "" nothing, a
#                   parameter's name (that argument, as given), "result"
#   source          the schema and the evidence (the C++, file:line)
#   trees, sites    the trees whose traced path reaches it, and where
#
# A callee whose contract differs between trees (another release's
# parameters) has one entry per contract: "<callee>#2", ...
#
# Written by `make schema-contracts TREES="<tree> ..."`
# (proof/schemacontracts.py) from schema truth on those trees; do not edit.
"""


def render(found: dict[str, dict]) -> str:
    lines = [HEADER]
    for callee, entry in found.items():
        lines.append(f"[{json.dumps(callee)}]")
        for key, value in entry.items():
            if isinstance(value, list) and value and key in ("sites", "trees"):
                inner = "".join(f"    {json.dumps(v)},\n" for v in value)
                lines.append(f"{key} = [\n{inner}]")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write(trees: list[str]) -> tuple[Path, int]:
    each = []
    for given in trees:
        found = tree.locate(given)
        texts = tree.python_sources(found.root)
        try:
            version = tree.detect_version(found)[0]
        except Refusal:
            version = ""  # the release only picks the image's package
        image = images.recognise(found.root)  # picks the image's ESIMD facts
        truth = schematruth.check(texts, version, image=image)
        each.append(contracts(truth, label_of(found, truth)))
    found = merged(each)
    text = render(found)
    tomllib.loads(text)  # it reads back
    DATA.write_text(text)
    return DATA, len(found)
