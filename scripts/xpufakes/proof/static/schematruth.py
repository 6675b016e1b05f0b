"""Schema truth, the static part of `make audit` that asks of every op a
tree calls: does its schema say what its kernel does? Under torch.compile
functionalization believes the schema: a write it does not declare is
lost when the call's result is not used (the call is dead code), a
return that is an argument without an alias annotation is taken for a new
tensor, a fake that returns a new tensor where the kernel returns its
argument gives the compiled graph a different tensor than eager.

The schemas: data/op_schemas.toml (vllm-xpu-kernels', IPEX's),
data/esimd_schemas.toml (intel/llm-scaler's `custom_esimd_kernels_vllm`,
by image commit, chosen by the tree's release), and what the tree defines
itself (treeops.py: `direct_register_custom_op`, `custom_op`, with their
`mutates_args`). What the kernels do: the C++ read for that data
(esimd_schemas.toml's `returns` / `writes`, data/xpu_c_writes.toml), and
for the tree's own ops, what their implementation passes its parameters
to. The calls: treeops.py, each placed by reach.py (whether the traced
forward reaches it, in which configuration) and under the conditions on
the way (pathconditions.py: token count, weight shape, an env var).

An op lies if it (a) writes an argument it does not mark (evidence: its C++
writes or returns it, its implementation passes it to a write, or a call
drops the result and reads the argument after), (b) returns an argument
without an alias annotation, (c) is `-> ()` and marks nothing, (d) has a
fake in the tree that returns a new tensor where the kernel returns an
argument. A lie that a traced call reaches fails the audit. Source text
and data only, no torch."""

import ast
import re
import time
import tomllib
from dataclasses import dataclass, field

from xpufakes.common import opschema, paths
from xpufakes.proof.static import pathconditions, reach, treeops
from xpufakes.trees import images
from xpufakes.trees.pysource import SourceTree, statements

SCHEMAS = paths.DATA / "op_schemas.toml"
ESIMD = paths.DATA / "esimd_schemas.toml"
XPU_C_WRITES = paths.DATA / "xpu_c_writes.toml"
# traced lies the fix does not cover yet: warned of, not failed on
KNOWN_LIES = paths.DATA / "known_lies.toml"
ESIMD_PACKAGE = "custom_esimd_kernels_vllm"

KINDS = {
    "a": "writes an argument it does not mark",
    "b": "returns an argument without an alias annotation",
    "c": "returns nothing and marks nothing",
    "d": "its fake returns a new tensor where the kernel returns an argument",
    "e": "its fake returns an argument (or a view of one) the schema does not "
    "declare as an alias",
}


@dataclass
class Facts:
    """An op's schema and what its kernel returns and writes."""

    op: str
    schema: opschema.Schema
    text: str  # the schema as given
    where: str  # where the schema is from
    returns: list[dict] = field(default_factory=list)  # {param, how, at}
    writes: list[dict] = field(default_factory=list)
    own: "treeops.Registration | None" = None


@dataclass
class Lie:
    kind: str
    argument: str
    evidence: list[str]


@dataclass
class Site:
    call: treeops.Call
    configurations: list[str]
    entry: str
    note: str
    when: str  # under which conditions the traced path takes it
    split: str = ""  # where vLLM splits the compiled graph at the op by default

    @property
    def reached(self) -> bool:
        return bool(self.configurations)


@dataclass
class Routing:
    """The fix, where it is (issue 42, item 2): callees whose calls run as
    vLLM ops of vllm/_xpu_opaque_calls.py, callee -> (op, params, mutates,
    returns) (its CONTRACTS). `in_tree`: the series' module in the tree, whose
    calls name the op (`torch.ops.vllm.<op>(...)`, `as_custom_op("<op>", f)`);
    else the installed plugin's copy, which rebinds the callee at start-up
    (read from its files, not run)."""

    contracts: dict[str, tuple]
    by: str
    in_tree: bool
    # the fakes it registers on kernel ops that have none (KERNEL_FAKES):
    # op -> the schema each is written for (registered only for that one)
    kernel_fakes: dict[str, str] = field(default_factory=dict)


@dataclass
class OpTruth:
    facts: Facts
    lies: list[Lie]
    sites: list[Site]  # the calls of the op itself
    # the calls that reach it through the fix's vLLM op, and what that op
    # does not declare of what the kernel does (a gap fails where traced)
    fixed: list[Site] = field(default_factory=list)
    fixed_by: str = ""
    gaps: list[str] = field(default_factory=list)
    # the tree is one `make apply` patched: a known lie the series fixes is
    # no longer excused there (its edit did not take)
    patched: bool = False

    @property
    def op(self) -> str:
        return self.facts.op

    @property
    def reached(self) -> bool:
        return any(s.reached for s in self.sites)

    @property
    def traced(self) -> bool:
        """A lie that a traced call reaches (of the op itself, or through a
        vLLM op that does not declare all it does)."""
        gap = bool(self.gaps) and any(s.reached for s in self.fixed)
        return bool(self.lies) and (self.reached or gap)

    @property
    def fixed_on_path(self) -> bool:
        """Traced calls reach it only through the fix's vLLM op, which
        declares what it does."""
        return not self.traced and any(s.reached for s in self.fixed)

    @property
    def known(self) -> str:
        """Why, if data/known_lies.toml lists this op with exactly the kinds
        of lie found; else ''."""
        entry = known_lies().get(self.op)
        if entry is None or sorted({lie.kind for lie in self.lies}) != sorted(
            entry["kinds"]
        ):
            return ""
        if self.patched and entry.get("fixed", "").startswith("the series"):
            return ""  # the series' fix should have removed it
        return entry["why"]

    @property
    def known_fix(self) -> str:
        """What fixes a listed lie elsewhere (data/known_lies.toml `fixed`:
        the series, not the plugin), or "not fixed yet"."""
        entry = known_lies().get(self.op) if self.known else None
        if entry and entry.get("fixed"):
            return f"fixed by {entry['fixed']}, not applied to this tree"
        return "not fixed yet"

    @property
    def failing(self) -> bool:
        return self.traced and not self.known


def known_lies() -> dict:
    return tomllib.loads(KNOWN_LIES.read_text())


@dataclass
class Truth:
    ops: list[OpTruth]  # the ops that lie
    checked: int  # ops with a schema the tree calls or defines
    unknown: list[treeops.Call]  # traced calls of ops without a known schema
    sources: list[str]  # which schema data, which image commit
    warnings: list[str]
    # traced calls of kernel ops whose schema returns an alias (Tensor(a!)),
    # which functionalization refuses for a custom op: compiling them fails
    refused: list[treeops.Call] = field(default_factory=list)
    # where those traced calls are (the contracts' sites), and each op's facts
    refused_sites: list["Site"] = field(default_factory=list)
    alias_facts: dict[str, Facts] = field(default_factory=dict)
    # traced calls of a kernel package's ops that have no fake (the tree's,
    # the fix's for the op's schema): compiling stops at them ("Operator
    # does not support running with fake tensors"), each with why
    unfaked: list[tuple[treeops.Call, str]] = field(default_factory=list)
    seconds: float = 0.0  # wall clock
    cpu_seconds: float = 0.0  # this process's CPU time

    @property
    def failing(self) -> list[OpTruth]:
        return [o for o in self.ops if o.failing]

    @property
    def known(self) -> list[OpTruth]:
        """Traced lies the fix does not cover yet (data/known_lies.toml)."""
        return [o for o in self.ops if o.traced and o.known]


# ---------------------------------------------------------------------------
# The facts
# ---------------------------------------------------------------------------


def _parse(text: str) -> opschema.Schema | None:
    try:
        return opschema.parse(text)
    except ValueError:
        return None


def load_data() -> dict[str, dict]:
    """The schema data: op_schemas.toml, xpu_c_writes.toml, esimd_schemas.toml."""
    return {
        "op_schemas": tomllib.loads(SCHEMAS.read_text()),
        "xpu_c_writes": tomllib.loads(XPU_C_WRITES.read_text()),
        "esimd": tomllib.loads(ESIMD.read_text()) if ESIMD.is_file() else {},
    }


def kernel_facts(
    texts: dict[str, str],
    version: str,
    given: dict[str, dict] | None = None,
    image: images.Recognition | None = None,
) -> tuple[dict[str, Facts], dict[str, treeops.Wrapper], list[str], list[str]]:
    """(op -> Facts, wrapper name -> Wrapper, the sources said, warnings)
    for the kernel packages a tree of that release may load (`given`: the
    data, as load_data() reads it; `image`: the image the tree is)."""
    given = given if given is not None else load_data()
    facts: dict[str, Facts] = {}
    data = given["op_schemas"]
    evidence = given["xpu_c_writes"]
    for ns, ops in data.items():
        for name, text in ops.items():
            schema = _parse(text)
            if schema is None:
                continue
            op = f"{ns}::{name.split('.')[0]}"
            found = evidence.get(op, {})
            facts.setdefault(
                op,
                Facts(
                    op,
                    schema,
                    text,
                    "data/op_schemas.toml",
                    found.get("returns", []),
                    found.get("writes", []),
                ),
            )
    sources = [
        "data/op_schemas.toml (vllm-xpu-kernels, IPEX), evidence: "
        "data/xpu_c_writes.toml"
    ]
    warnings: list[str] = []
    wrappers: dict[str, treeops.Wrapper] = {}
    # the fix's own module (ROUTING_MODULE) names the package in its
    # contracts: the tree loads it only if one of its own files does
    if any(ESIMD_PACKAGE in t for p, t in texts.items() if p != ROUTING_MODULE):
        commits = given["esimd"]
        short, said = choose_commit(commits, version, image)
        if short is None:
            warnings.append(
                f"the tree loads {ESIMD_PACKAGE} and data/esimd_schemas.toml has "
                "no image commit: its ops' schemas are not checked"
            )
        else:
            sources.append(f"data/esimd_schemas.toml: llm-scaler {short} ({said})")
            by_image = image is not None and image.image == short
            if commits[short].get("vllm") != version and not by_image:
                warnings.append(
                    f"{ESIMD_PACKAGE}: no image commit of the data builds vLLM "
                    f"{version}; checked against {short}'s package"
                )
            commit = commits[short]
            for op, entry in commit.get("ops", {}).items():
                schema = _parse(entry["schema"])
                if schema is None:
                    continue
                facts[op] = Facts(
                    op,
                    schema,
                    entry["schema"],
                    f"llm-scaler {short} {entry['defined']}",
                    entry.get("returns", []),
                    entry.get("writes", []),
                )
            for name, entry in commit.get("wrappers", {}).items():
                wrapper = treeops.Wrapper(
                    entry["op"],
                    tuple(entry["params"]),
                    tuple(entry["args"]),
                    entry["returns_op"],
                    f"llm-scaler {short} {entry['at']}",
                )
                wrappers[f"{ESIMD_PACKAGE}.{name}"] = wrapper
                wrappers[f"{ESIMD_PACKAGE}.ops.{name}"] = wrapper
    return facts, wrappers, sources, warnings


def choose_commit(
    commits: dict[str, dict],
    version: str,
    image: images.Recognition | None = None,
) -> tuple[str | None, str]:
    """The image commit whose package a tree of `version` loads: the image
    the tree is (`image`, trees/images.py; a modified one too), if the data
    has its package; else the newest that builds that release, else the
    newest of all (said, with why the image did not decide)."""
    if not commits:
        return None, ""
    if image is not None and image.image in commits:
        what = image.name if image.exact else f"a modified {image.name}"
        return image.image, f"the tree is {what}: data/images.toml"
    if image is None:
        why = ""
    elif image.image is None:
        why = "the tree is no image data/images.toml knows; "
    else:
        why = f"the tree is {image.name}, whose package the data lacks; "
    by_date = sorted(commits, key=lambda c: commits[c].get("date", ""))
    same = [c for c in by_date if commits[c].get("vllm") == version]
    if same:
        return same[-1], f"{why}the newest image of the data that builds vLLM {version}"
    return by_date[-1], f"{why}the newest in the data"


# ---------------------------------------------------------------------------
# The fix
# ---------------------------------------------------------------------------

ROUTING_MODULE = "vllm/_xpu_opaque_calls.py"
# a tree `make apply` patched: the plugin does nothing there
PATCHED_MODULE = "vllm/_xpu_gemm_fakes.py"


def contracts_of(text: str) -> dict[str, tuple]:
    """vllm/_xpu_opaque_calls.py's CONTRACTS (the series' or the plugin's
    copy), read from its source; {} if it has none."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return {}
    for node in body:
        target = (
            getattr(node, "target", None)
            or (getattr(node, "targets", None) or [None])[0]
        )
        if isinstance(target, ast.Name) and target.id == "CONTRACTS":
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return {}
    return {}


def _string(node: ast.AST, strings: dict[str, str]) -> str | None:
    """A string literal, a module-level string constant by name, or a sum
    of those; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left, strings), _string(node.right, strings)
        return None if left is None or right is None else left + right
    return None


def kernel_fakes_of(text: str) -> dict[str, str]:
    """vllm/_xpu_opaque_calls.py's KERNEL_FAKES (the series' or the
    plugin's copy), read from its source: op -> the schema its fake is
    written for (a key or schema not spelled as strings is left out)."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return {}
    strings: dict[str, str] = {}
    found: dict[str, str] = {}
    for node in body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if not isinstance(target, ast.Name) or node.value is None:
                continue
            value = _string(node.value, strings)
            if value is not None:
                strings[target.id] = value
            elif target.id == "KERNEL_FAKES" and isinstance(node.value, ast.Dict):
                for key, entry in zip(node.value.keys, node.value.values, strict=True):
                    op = _string(key, strings) if key is not None else None
                    schema = (
                        _string(entry.elts[0], strings)
                        if isinstance(entry, ast.Tuple) and entry.elts
                        else None
                    )
                    if op is not None and schema is not None:
                        found[op] = schema
    return found


def _routed_schema(op: str, params, mutates, returns: str) -> str:
    marked = []
    for i, param in enumerate(params):
        kind, _, rest = param.partition(" ")
        if rest.split("=")[0] in mutates:
            kind = kind.replace("Tensor", f"Tensor(a{i}!)", 1)
        marked.append(f"{kind} {rest}")
    return f"{op}({', '.join(marked)}) -> {'Tensor' if returns else '()'}"


def _kernel_op(callee: str, wrappers: dict[str, treeops.Wrapper]) -> str:
    """The op a callee of a contract runs: a package wrapper's, or
    `torch.ops.<ns>.<op>`'s; '' for another callee."""
    if callee in wrappers:
        return wrappers[callee].op
    parts = callee.split(".")
    if parts[:2] == ["torch", "ops"] and len(parts) == 4:
        return f"{parts[2]}::{parts[3]}"
    return ""


def _gaps(truth: "OpTruth", contract: tuple) -> list[str]:
    """What the kernel does that the vLLM op around it does not declare."""
    op, params, mutates, returns = contract
    gaps = [
        f"(a) `{x.argument}` is written and vllm::{op} does not mark it"
        for x in truth.lies
        if x.kind == "a" and x.argument not in mutates
    ]
    if returns:
        gaps += [
            f"({x.kind}) vllm::{op} returns a tensor: the kernel's alias stays hidden"
            for x in truth.lies
            if x.kind in ("b", "d")
        ][:1]
    gaps += [
        f"`{name}` is marked in the kernel's schema and vllm::{op} does not mark it"
        for name in truth.facts.schema.marked
        if name not in mutates
    ]
    if not mutates and any(x.kind == "c" for x in truth.lies):
        gaps.append(f"(c) vllm::{op} marks nothing")
    return gaps


def _unfaked(calls, facts, fakes_of, routings, aliasing, wrappers) -> list:
    """The calls of a kernel package's ops (an image's, esimd_schemas.toml)
    that no fake covers: the op has none in the tree, and the fix's
    (KERNEL_FAKES) is absent or written for another schema: (call, why)."""
    found = []
    for call in calls:
        f = facts.get(call.op)
        if (
            f is None
            or f.own is not None
            or not f.where.startswith("llm-scaler")
            or call.op in fakes_of
            or call in aliasing
            or _routed_by_plugin(call, routings, wrappers)
            # torch makes the fake of an op that marks what it writes and
            # returns nothing (torch/_library/utils.py
            # can_generate_trivial_fake_impl)
            or (f.schema.marked and f.schema.returns_nothing)
        ):
            continue
        ours = [
            (r.by, r.kernel_fakes[call.op])
            for r in routings
            if call.op in r.kernel_fakes
        ]
        exact = [by for by, schema in ours if schema.partition("::")[2] == f.text]
        if exact:
            continue
        if ours:
            by, schema = ours[0]
            why = (
                f"{by} has a fake of it written for {schema}, which the image's "
                f"schema is not ({f.where}: {f.text}): not registered"
            )
        else:
            why = "neither the tree nor the fix registers a fake of it"
        found.append((call, why))
    return found


def _routed_by_plugin(call: treeops.Call, routings, wrappers) -> bool:
    """Whether the installed plugin routes this call (its callee rebound to
    a vLLM op of its contracts; the series' routes show as calls of
    torch.ops.vllm.<op> instead)."""
    for routing in routings:
        if routing.in_tree:
            continue
        for callee, contract in routing.contracts.items():
            if (call.target == callee or call.via == callee) and _fits(
                call, contract[1]
            ):
                return _kernel_op(callee, wrappers) == call.op
    return False


def _fits(call: treeops.Call, params) -> bool:
    """Whether the plugin's wrapper routes the call (it passes every
    parameter the contract requires; else it is the original's call)."""
    required = {p.split()[1] for p in params if "=" not in p}
    return required <= set(call.args)


# ---------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------


def check(
    texts: dict[str, str],
    version: str = "",
    parsed: dict | None = None,
    data: dict[str, dict] | None = None,
    plugin: Routing | None = None,
    image: images.Recognition | None = None,
) -> Truth:
    """Schema truth for a tree (texts: path -> source of vllm/; `data`: the
    schema data, as load_data() reads it; `plugin`: the installed plugin's
    contracts, which count on a tree `make apply` has not patched; `image`:
    the image the tree is, trees/images.py, which picks its ESIMD facts)."""
    start, cpu = time.monotonic(), time.process_time()
    facts, wrappers, sources, warnings = kernel_facts(texts, version, data, image)
    routings = []
    if ROUTING_MODULE in texts:
        routings.append(
            Routing(
                contracts_of(texts[ROUTING_MODULE]),
                f"the series' {ROUTING_MODULE}",
                True,
                kernel_fakes_of(texts[ROUTING_MODULE]),
            )
        )
    if plugin is not None and PATCHED_MODULE not in texts:
        routings.append(plugin)
    for routing in (r for r in routings if r.in_tree):
        for op, params, mutates, returns in routing.contracts.values():
            text = _routed_schema(op, params, mutates, returns)
            schema = _parse(text)
            if schema is not None:
                facts[f"vllm::{op}"] = Facts(
                    f"vllm::{op}", schema, text, f"{routing.by} CONTRACTS"
                )
    packages = (ESIMD_PACKAGE,) if wrappers else ()
    source = SourceTree(texts, parsed if parsed is not None else {})
    registering = [
        p
        for p, t in texts.items()
        if "register_custom_op" in t
        or "custom_op(" in t
        or "register_fake" in t
        or "impl_abstract" in t
    ]
    regs, fakes = treeops.registrations(source, registering)
    # an op whose mutates_args the source does not spell out (a name, a
    # call) is not guessed: said, not checked
    unread = [r for r in regs if r.mutates is None]
    regs = [r for r in regs if r.mutates is not None]
    warnings += [
        f"{r.op} ({r.file}:{r.line}): its mutates_args is not a literal: not checked"
        for r in unread
    ]
    # the kernel packages' namespaces: a call of one of their ops the data
    # does not know is a warning (vLLM's own ops are registered in ways the
    # search does not read: not guessed)
    kernel_namespaces = {op.split("::")[0] for op in facts} - {"vllm"}
    for reg in regs:
        facts[reg.op] = Facts(
            reg.op,
            _own_schema(reg, source),
            "mutates_args="
            + (repr(reg.mutates) if reg.mutates_given else "not given, so []"),
            f"{reg.file}:{reg.line} {reg.how}",
            own=reg,
        )
    # the tree's own ops: what their implementations pass their parameters to
    own_functions = {(r.module, r.function) for r in regs}
    known = treeops.Known({op: f.schema for op, f in facts.items()}, wrappers, packages)
    inner = treeops.calls(source, sorted({r.file for r in regs}), known, own_functions)
    for reg in regs:
        _own_evidence(facts[reg.op], source, inner, facts)
    fakes_of: dict[str, list[treeops.Fake]] = {}
    for fake in fakes:
        fakes_of.setdefault(fake.op, []).append(fake)
    # the calls: of every kernel op (a call may be the only evidence), and
    # of the tree's own ops that lie
    own_lying = {
        r.op for r in regs if _lies(facts[r.op], [], fakes_of.get(r.op, []), source)
    }
    wanted = {op: f.schema for op, f in facts.items() if op not in own_functions}
    wanted = {
        op: s for op, s in wanted.items() if facts[op].own is None or op in own_lying
    }
    known = treeops.Known(wanted, wrappers, packages)
    calls = treeops.calls(source, treeops.candidates(source, known), known)
    by_op: dict[str, list[treeops.Call]] = {}
    for call in calls:
        by_op.setdefault(call.op, []).append(call)
    # the calls that reach a kernel op through the fix: kernel op -> (calls,
    # the contract, who routes them)
    fixed: dict[str, tuple[list[treeops.Call], tuple, str]] = {}
    for routing in routings:
        for callee, contract in routing.contracts.items():
            kernel = _kernel_op(callee, wrappers)
            if not kernel:
                continue
            if routing.in_tree:
                routed = by_op.get(f"vllm::{contract[0]}", [])
            else:
                routed = [
                    c
                    for c in by_op.get(kernel, [])
                    if (c.target == callee or c.via == callee) and _fits(c, contract[1])
                ]
                by_op[kernel] = (
                    [c for c in by_op[kernel] if c not in routed]
                    if routed
                    else by_op.get(kernel, [])
                )
            if routed:
                fixed[kernel] = (routed, contract, routing.by)
    lying = []
    checked = 0
    loaded = {
        ns
        for ns in {op.split("::")[0] for op in facts}
        if any(f"ops.{ns}" in t for t in texts.values())
    }
    if packages:  # the package's ops, loaded with it
        loaded |= {w.op.split("::")[0] for w in wrappers.values()}
    for op, f in sorted(facts.items()):
        called = bool(by_op.get(op)) or op in fixed
        if not called and f.own is None and not (f.returns or f.writes):
            continue
        if not called and f.own is None and op.split("::")[0] not in loaded:
            continue  # a package the tree does not load
        checked += 1
        evidence = by_op.get(op, []) + fixed.get(op, ([],))[0]
        lies = _lies(f, evidence, fakes_of.get(op, []), source)
        if lies:
            found = OpTruth(f, lies, [], patched=PATCHED_MODULE in texts)
            if op in fixed:
                found.fixed_by = f"vllm::{fixed[op][1][0]} ({fixed[op][2]})"
                found.gaps = _gaps(found, fixed[op][1])
            lying.append(found)
    unknown = [
        c
        for c in calls
        if c.op not in facts and c.op.split("::")[0] in kernel_namespaces
    ]
    # a kernel op whose schema declares an alias return (`-> Tensor(a!)`):
    # functionalization refuses a custom op with one
    aliasing = [
        c
        for c in calls
        if c.op in facts
        and facts[c.op].own is None
        and facts[c.op].schema.returned_aliases()
        and not _routed_by_plugin(c, routings, wrappers)
    ]
    unfaked = _unfaked(calls, facts, fakes_of, routings, aliasing, wrappers)
    placed = _place(
        lying, by_op, unknown + aliasing + [c for c, _ in unfaked], texts, source, fixed
    )
    reached = [site.call for site in placed]
    split = pathconditions.splitting_ops(texts)
    for o in lying:
        if o.op in split:
            for site in o.sites:
                site.split = pathconditions.split_note(split[o.op], texts)
    unknown = [c for c in unknown if c in reached]
    truth = Truth(lying, checked, unknown, sources, warnings)
    truth.refused = [c for c in aliasing if c in reached]
    truth.refused_sites = [site for site in placed if site.call in aliasing]
    truth.alias_facts = {c.op: facts[c.op] for c in truth.refused}
    truth.unfaked = [(c, why) for c, why in unfaked if c in reached]
    truth.seconds = time.monotonic() - start
    truth.cpu_seconds = time.process_time() - cpu
    return truth


def _own_schema(reg: treeops.Registration, source: SourceTree) -> opschema.Schema:
    """The schema torch infers for a tree's own op, as far as this search
    needs it: the parameters' types (from their annotations; none: taken
    for a tensor) and defaults, which are marked (mutates_args), whether it
    returns a tensor."""
    module = source.module(reg.module)
    function = module.functions.get(reg.function) if module else None
    marked = set(reg.mutates or [])
    annotations, defaults = {}, {}
    if function is not None:
        a = function.args
        positional = a.posonlyargs + a.args
        for arg in positional + a.kwonlyargs:
            annotations[arg.arg] = ast.unparse(arg.annotation) if arg.annotation else ""
        for arg, value in zip(positional[::-1], a.defaults[::-1], strict=False):
            defaults[arg.arg] = ast.unparse(value)
        for arg, value in zip(a.kwonlyargs, a.kw_defaults, strict=False):
            if value is not None:
                defaults[arg.arg] = ast.unparse(value)
    args = []
    for i, name in enumerate(reg.params):
        kind = _schema_type(annotations.get(name, ""))
        if name in marked and kind.startswith("Tensor"):
            kind = kind.replace("Tensor", f"Tensor(a{i}!)", 1)
        args.append(opschema.Arg(kind, name, defaults.get(name, "")))
    returns = ()
    if function is not None:
        kinds = [k for k, _ in treeops.returns_of(function)]
        note = ast.unparse(function.returns) if function.returns else ""
        if any(k != "none" for k in kinds) or "Tensor" in note:
            returns = (opschema.Arg("Tensor", "_0"),)
    return opschema.Schema(reg.op.split("::")[1], tuple(args), returns)


def _schema_type(annotation: str) -> str:
    """The schema type torch infers from a Python annotation (the common
    ones; none: a tensor)."""
    text = annotation.replace("torch.", "").replace(" ", "")
    optional = "|None" in text or text.startswith("Optional[")
    text = text.replace("|None", "").removeprefix("Optional[").rstrip("]")
    base = {"": "Tensor", "Tensor": "Tensor", "list[Tensor": "Tensor[]"}.get(text)
    if base is None:
        base = {"int": "int", "float": "float", "bool": "bool", "str": "str"}.get(
            text, "int[]" if text == "list[int" else annotation
        )
    return f"{base}?" if optional and base != annotation else base


def _own_evidence(f: Facts, source: SourceTree, calls, facts) -> None:
    """What a tree's own op writes and returns of its parameters: what its
    implementation passes them to (an op's write), in-place methods on
    them, a return of one."""
    reg = f.own
    module = source.module(reg.module)
    function = module.functions.get(reg.function) if module else None
    if function is None:
        return
    params = set(reg.params)
    for call in calls:
        if call.module != reg.module or call.function != reg.function:
            continue
        inner = facts.get(call.op)
        if inner is None:
            continue
        # what the inner op's schema marks counts where the op returns
        # nothing (its writes are all it does); a kernel's schema may mark
        # what it only reads (_xpu_C::deepseek_scaling_rope marks its inputs
        # and returns new tensors)
        written = {}
        if f.schema.returns_nothing:
            written = {
                p: f"marked in {call.op}'s schema ({inner.where})"
                for p in inner.schema.marked
            }
        for e in inner.writes + inner.returns:
            written.setdefault(e["param"], f"{call.op}'s kernel writes it ({e['at']})")
        for param, text in call.args.items():
            if text in params and param in written:
                f.writes.append(
                    {
                        "param": text,
                        "how": f"passed as `{param}` of {call.op}, {written[param]}",
                        "at": f"{call.file}:{call.line}",
                    }
                )
    for node in statements(function):
        for inner in ast.walk(node) if isinstance(node, ast.Expr) else ():
            if (
                isinstance(inner, ast.Call)
                and isinstance(inner.func, ast.Attribute)
                and isinstance(inner.func.value, ast.Name)
                and inner.func.value.id in params
                and re.fullmatch(r"[a-z]\w*[a-z0-9]_", inner.func.attr)
            ):
                f.writes.append(
                    {
                        "param": inner.func.value.id,
                        "how": f"in-place {inner.func.attr}",
                        "at": f"{reg.file}:{inner.lineno}",
                    }
                )
    for kind, line in treeops.returns_of(function):
        if kind.startswith("param:"):
            f.returns.append(
                {"param": kind[6:], "how": "returned", "at": f"{reg.file}:{line}"}
            )


def _lies(f: Facts, calls, fakes, source) -> list[Lie]:
    schema = f.schema
    marked = set(schema.marked)
    lies: list[Lie] = []
    cxx: dict[str, list[str]] = {}
    # a kernel's output buffer is the argument it returns; a Python
    # implementation may return an argument it did not write
    for e in f.writes + (f.returns if f.own is None else []):
        how = "returns it" if e["how"].startswith("returned") else e["how"]
        cxx.setdefault(e["param"], []).append(f"{how} ({e['at']})")
    # a call that drops the result and reads the argument after
    dropped: dict[str, list[str]] = {}
    for call in calls if schema.returns_tensor or not marked else ():
        if call.result_used and schema.returns_tensor:
            continue
        for param, line in call.read_after.items():
            dropped.setdefault(param, []).append(
                f"{call.file}:{call.line} drops the result and reads "
                f"`{call.args[param]}` after (line {line})"
            )
    for arg in schema.args:
        if arg.name in marked or not arg.tensor:
            continue
        evidence = list(cxx.get(arg.name, []))
        if evidence:
            evidence += dropped.get(arg.name, [])
        elif dropped.get(arg.name) and f.own is None and not (f.writes or f.returns):
            # no word from the kernel: the calls are the evidence
            evidence = dropped[arg.name]
        if evidence:
            lies.append(Lie("a", arg.name, evidence))
    aliases = set(schema.returned_aliases())
    for e in f.returns:
        if e["param"] not in aliases and not any(
            x.kind == "b" and x.argument == e["param"] for x in lies
        ):
            lies.append(Lie("b", e["param"], [f"{e['how']} ({e['at']})"]))
    if schema.returns_nothing and not marked and any(a.tensor for a in schema.args):
        lies.append(Lie("c", "", [f"{f.text} ({f.where})"]))
    returned = [e["param"] for e in f.returns]
    own_fakes = list(fakes)
    if f.own is not None and f.own.fake:
        module = source.module(f.own.module)
        function = module.functions.get(f.own.fake) if module else None
        if function is not None:
            own_fakes.append(
                treeops.Fake(
                    f.op, f.own.file, function.lineno, [], treeops.returns_of(function)
                )
            )
    for fake in own_fakes if returned else ():
        for kind, line in fake.returns:
            if kind == "fresh" or (
                kind.startswith("param:") and kind[6:] not in returned
            ):
                lies.append(
                    Lie(
                        "d",
                        returned[0],
                        [
                            f"the fake at {fake.file}:{line} returns "
                            + ("a new tensor" if kind == "fresh" else f"`{kind[6:]}`")
                            + f"; the kernel returns `{returned[0]}` "
                            + f"({f.returns[0]['at']})"
                        ],
                    )
                )
                break
    aliased = set(schema.returned_aliases())
    for fake in own_fakes:
        for kind, line in fake.returns:
            for name, view in _fake_aliases(kind):
                if name in aliased or any(
                    x.kind == "e" and x.argument == name for x in lies
                ):
                    continue
                what = f"a view of `{name}`" if view else f"`{name}`"
                evidence = [
                    f"the fake at {fake.file}:{line} returns {what}; the schema "
                    f"declares no alias ({f.text})"
                ]
                if name not in returned and (f.writes or f.returns):
                    evidence.append(
                        "the kernel does not return it"
                        + (f" (it returns `{returned[0]}`)" if returned else "")
                    )
                lies.append(Lie("e", name, evidence))
    return lies


def _fake_aliases(kind: str) -> list[tuple[str, bool]]:
    """The arguments a fake's return (treeops.returns_of) gives back as
    they are or as views: (name, is a view)."""
    if kind.startswith("tuple(") and kind.endswith(")"):
        return [x for part in kind[6:-1].split(", ") for x in _fake_aliases(part)]
    if kind.startswith("param:"):
        return [(kind[6:], False)]
    if kind.startswith("view:"):
        return [(kind[5:], True)]
    return []


# ---------------------------------------------------------------------------
# Where the calls are, and when the traced path takes them
# ---------------------------------------------------------------------------


def _place(lying: list[OpTruth], by_op, unknown_calls, texts, source, fixed) -> list:
    """Each lying op's calls placed (Site), those through the fix's vLLM op
    apart; the Sites of the other calls given (of ops without a known
    schema, of ops returning an alias) that the traced path reaches."""
    each = {
        o.op: [(c, False) for c in by_op.get(o.op, [])]
        + [(c, True) for c in fixed.get(o.op, ([],))[0]]
        for o in lying
    }
    wanted = {(c.module, c.function) for calls in each.values() for c, _ in calls}
    wanted |= {(c.module, c.function) for c in unknown_calls}
    explained = reach.explain(texts, sorted(wanted), source.parsed)
    for o in lying:
        for call, routed in each[o.op]:
            finding = explained[(call.module, call.function)]
            step = reach.Step(call.file, call.line, call.function)
            steps = [*finding.chain[:-1], step] if finding.chain else [step]
            when = pathconditions.conditions(source, steps) if finding.reached else ""
            configurations, note = list(finding.configurations), finding.note
            if when.startswith(pathconditions.NOT_ON_XPU):
                configurations, note = [], f"another platform's path ({when})"
                when = ""
            placed = Site(call, configurations, finding.entry, note, when)
            (o.fixed if routed else o.sites).append(placed)
    sites = []
    for call in unknown_calls:
        finding = explained[(call.module, call.function)]
        if not finding.reached:
            continue
        step = reach.Step(call.file, call.line, call.function)
        steps = [*finding.chain[:-1], step] if finding.chain else [step]
        when = pathconditions.conditions(source, steps)
        if when.startswith(pathconditions.NOT_ON_XPU):
            continue  # another platform's path
        sites.append(Site(call, list(finding.configurations), finding.entry, "", when))
    return sites


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def lines(truth: Truth) -> list[str]:
    said = [
        "Schema truth (each op's schema against what its kernel writes and "
        "returns; a lie loses writes or aliases under torch.compile):",
        *[f"  schemas: {s}" for s in truth.sources],
    ]
    for o in sorted(
        truth.ops, key=lambda o: (not o.traced, not o.fixed_on_path, not o.sites, o.op)
    ):
        if o.failing and o.gaps:
            verdict = (
                f"FAIL: its schema lies, and a traced call reaches it through "
                f"{o.fixed_by}, which does not declare all it does: "
                + "; ".join(o.gaps)
            )
        elif o.failing:
            verdict = "FAIL: its schema lies, and a traced call reaches it"
            listed = known_lies().get(o.op, {})
            if o.patched and listed.get("fixed", "").startswith("the series"):
                verdict += (
                    f" (data/known_lies.toml: fixed by {listed['fixed']}; this "
                    "tree is patched, and the fix did not take)"
                )
        elif o.traced:
            verdict = (
                "WARN: its schema lies, and a traced call reaches it; known, "
                f"{o.known_fix} (data/known_lies.toml)"
            )
        elif o.fixed_on_path:
            verdict = (
                f"fixed: its schema lies, and the traced calls reach it only "
                f"through {o.fixed_by}, which marks what it writes and returns "
                "nothing"
            )
        elif o.sites:
            verdict = "lies; no call of it is on the traced path"
        else:
            verdict = "lies; the tree does not call it"
        said.append(f"{o.op}: {verdict}")
        said.append(f"  schema ({o.facts.where}): {o.facts.text}")
        for lie in o.lies:
            argument = f" `{lie.argument}`" if lie.argument else ""
            said.append(f"  ({lie.kind}) {KINDS[lie.kind]}{argument}:")
            said += [f"      {e}" for e in lie.evidence[:4]]
            if len(lie.evidence) > 4:
                said.append(f"      (and {len(lie.evidence) - 4} more)")
        placed = [(s, False) for s in o.sites] + [(s, True) for s in o.fixed]
        for site, routed in sorted(
            placed, key=lambda p: (not p[0].reached, p[0].call.file, p[0].call.line)
        ):
            c = site.call
            via = f" via {c.via}" if c.via else ""
            if routed:
                via += f" [through {o.fixed_by.split(' (')[0]}]"
            if site.reached:
                head = "compiled: " + "; ".join(site.configurations)
                said.append(f"    {c.file}:{c.line} {c.function}{via} [{head}]")
                said.append(f"      entry: {site.entry}")
                said.append(f"      taken {site.when}")
                if site.split:
                    said.append(f"      {site.split}")
            else:
                why = site.note or "not on the traced path"
                said.append(
                    f"    {c.file}:{c.line} {c.function}{via} [not compiled: {why}]"
                )
    for call in truth.refused:
        said.append(
            f"warn: {call.op}: called on the traced path ({call.file}:{call.line}) "
            "and its schema returns an alias (Tensor(a!)): functionalization "
            "refuses a custom op whose output has an alias annotation (torch "
            "2.13), so compiling it fails (loud, not wrong)"
        )
    for call, why in truth.unfaked:
        said.append(
            f"FAIL: {call.op}: called on the traced path ({call.file}:{call.line}) "
            f"and has no fake: {why}; compiling stops there (Operator does not "
            "support running with fake tensors)"
        )
    for call in truth.unknown:
        said.append(
            f"warn: {call.op}: called on the traced path ({call.file}:{call.line}) "
            "and its schema is not in the data: not checked"
        )
    said += [f"warn: {w}" for w in truth.warnings]
    if not truth.ops:
        said.append(f"  no op lies ({truth.checked} ops checked)")
    aliasing = [o.op for o in truth.ops if any(x.kind == "e" for x in o.lies)]
    said.append(
        "  fakes that return an argument the schema does not declare as an "
        "alias (e): " + (", ".join(aliasing) if aliasing else "none")
    )
    fixed = [o.op for o in truth.ops if o.fixed_on_path]
    if fixed:
        said.append(
            f"  {len(fixed)} lying op(s) on the traced path run behind a vLLM op "
            "that declares what they do (the fix): " + ", ".join(fixed)
        )
    said.append(f"  ({truth.cpu_seconds:.1f} s of CPU, {truth.seconds:.1f} s wall)")
    return said


def to_json(truth: Truth) -> dict:
    return {
        "sources": truth.sources,
        "checked": truth.checked,
        "seconds": round(truth.seconds, 2),
        "cpu_seconds": round(truth.cpu_seconds, 2),
        "warnings": truth.warnings,
        "unknown": [f"{c.op} {c.file}:{c.line}" for c in truth.unknown],
        "alias_returns_refused": [f"{c.op} {c.file}:{c.line}" for c in truth.refused],
        "no_fake": [f"{c.op} {c.file}:{c.line}: {why}" for c, why in truth.unfaked],
        "ops": [
            {
                "op": o.op,
                "schema": o.facts.text,
                "schema_from": o.facts.where,
                "failing": o.failing,
                "known": o.known,
                "reached": o.reached,
                "lies": [
                    {"kind": x.kind, "argument": x.argument, "evidence": x.evidence}
                    for x in o.lies
                ],
                "fixed_by": o.fixed_by,
                "fixed_on_path": o.fixed_on_path,
                "gaps": o.gaps,
                "fixed_sites": [
                    f"{s.call.file}:{s.call.line}" + (" (traced)" if s.reached else "")
                    for s in o.fixed
                ],
                "sites": [
                    {
                        "file": s.call.file,
                        "line": s.call.line,
                        "function": s.call.function,
                        "via": s.call.via,
                        "args": s.call.args,
                        "result_used": s.call.result_used,
                        "read_after": s.call.read_after,
                        "configurations": s.configurations,
                        "entry": s.entry,
                        "note": s.note,
                        "when": s.when,
                        "split": s.split,
                    }
                    for s in o.sites
                ],
            }
            for o in truth.ops
        ],
    }
