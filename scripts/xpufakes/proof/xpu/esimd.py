"""intel/llm-scaler's ESIMD kernel package (`custom_esimd_kernels_vllm`,
vllm/custom-esimd-kernels-vllm/ of the image), stood in from data: its ops
defined with the schemas its C++ registers (data/esimd_schemas.toml, the
image commit whose Dockerfile builds the tree's vLLM release), lies
included, each with a CPU kernel that computes (esimd_kernels.py: the
buffers the C++ writes, the value it returns) or, for an op no catalog model
reaches, one that raises naming it; and its Python wrappers (ops.py: the
parameters, the op, whether the result is returned), as the package exports
them. No fake: the tree's own (esimd_fake_ops.py) are what a compile of the
tree uses, as on the XPU. What cannot be here is the device: the kernels
are XPU-only ESIMD code; the stand-ins compute on the CPU."""

import importlib.abc
import importlib.machinery
import keyword
import sys
import tomllib
import types
from pathlib import Path

from xpufakes.common import paths
from xpufakes.proof.static.schematruth import ESIMD_PACKAGE, choose_commit
from xpufakes.proof.xpu import defining, esimd_kernels
from xpufakes.proof.xpu.packages import _DownstreamName
from xpufakes.proof.xpu.uncomputed import NoCPUReference
from xpufakes.trees import images

DATA = paths.DATA / "esimd_schemas.toml"
# the truthful control's ops: a namespace of their own, so that the tree's
# fakes (registered for the image's ops) are not theirs
TRUTHFUL = "xpufakes_esimd_truthful"
# the fix's contracts of the ops whose schemas lie (what each writes, what
# its callee gives the caller): the truthful control's schemas
CONTRACTS = paths.DATA / "schema_contracts.toml"


def commit_for(version: str, root: Path | None = None) -> tuple[str | None, dict]:
    """The image commit of the data for a tree of that vLLM release (the
    image the tree at `root` is, trees/images.py, else the one whose image
    builds that release, else the newest) and its entry."""
    commits = tomllib.loads(DATA.read_text())
    image = images.recognise(root) if root is not None else None
    short, _ = choose_commit(commits, version, image)
    return short, commits.get(short, {})


def truthful_contracts() -> dict[str, dict]:
    """op ("ns::name") -> its contract (data/schema_contracts.toml) for the
    ESIMD ops whose schemas lie: the control in which each declares what
    it writes (`Tensor(a!)`) and returns nothing, as the fix's op does."""
    contracts = tomllib.loads(CONTRACTS.read_text())
    return {
        c["kernel_op"]: c
        for c in contracts.values()
        if c["kernel_op"].startswith(f"{ESIMD_PACKAGE}::") and not c["returns"]
    }


def truthful_schema(name: str, contract: dict) -> str:
    """name(<params, the written ones marked (a!), (b!), ...>) -> ()."""
    marks = iter("abcdefghijklmnopqrstuvwxyz")
    params = []
    for param in contract["params"]:
        kind, _, pname = param.rpartition(" ")
        if pname in contract["mutates"]:
            kind = f"{kind}({next(marks)}!)"
        params.append(f"{kind} {pname}")
    return f"{name}({', '.join(params)}) -> ()"


def _kernel(op: str, returns_nothing: bool = False):
    """The CPU kernel of an op: its reference, or one that raises
    (`returns_nothing`: the truthful control's, whose schema returns ())."""
    name = op.partition("::")[2]
    reference = esimd_kernels.REFERENCES.get(name)
    if reference is not None:
        if not returns_nothing:
            return reference

        def writes_only(*args):
            reference(*args)

        return writes_only

    def unavailable(*args, **kwargs):
        raise NoCPUReference(
            f"{op}: the ESIMD stand-in has no CPU reference kernel (the "
            "references are of the ops that lie on b18beee's traced path); "
            "proof/xpu/esimd_kernels.py"
        )

    return unavailable


def define_ops(entry: dict, truthful: dict | None = None) -> tuple[list, list[str]]:
    """Define the commit's ops with their schemas, each with its CPU kernel
    (`truthful`: op -> contract, those ops defined with the truthful schema
    too, in the namespace TRUTHFUL, with a fake that returns nothing).
    Returns (the libraries: keep them referenced, the ops whose schema
    torch refused, with why)."""
    truthful = truthful or {}
    libraries: dict = {}
    refused: list[str] = []  # already defined, or a schema torch refuses
    for op, facts in entry.get("ops", {}).items():
        name = op.partition("::")[2]
        defining.define(libraries, op, facts["schema"], _kernel(op), refused=refused)
        contract = truthful.get(op)
        if contract and defining.define(
            libraries,
            f"{TRUTHFUL}::{name}",
            truthful_schema(name, contract),
            _kernel(op, True),
            refused=refused,
        ):
            libraries[TRUTHFUL]._register_fake(name, lambda *args, **kwargs: None)
    return list(libraries.values()), refused


def _wrapper(name: str, facts: dict, namespace: str, gives: str | None = None):
    """The package's Python wrapper `name` (ops.py), as plain code Dynamo
    inlines: def name(<params>): [return] torch.ops.<ns>.<op>(<args>)
    (`gives`: the truthful control's, which returns that parameter, or
    nothing where it is "")."""
    op = facts["op"].partition("::")[2]
    params, args = facts["params"], facts["args"]
    if any(not p.isidentifier() or keyword.iskeyword(p) for p in params + args):
        return None
    call = f"torch.ops.{namespace}.{op}({', '.join(args)})"
    if gives is not None:
        returned = gives if gives in params else "None"
        body = f"{call}\n    return {returned}"
    else:
        body = f"return {call}" if facts["returns_op"] else f"{call}\n    return None"
    source = f"def {name}({', '.join(params)}):\n    {body}\n"
    import torch

    scope = {"torch": torch}
    exec(compile(source, f"<{ESIMD_PACKAGE} stand-in: {name}>", "exec"), scope)
    return scope[name]


class _Package(types.ModuleType):
    """The package, or one of its modules (ops, moe_ops, ...): its wrappers
    where the data has them, and every other name a stand-in that raises
    when called, naming itself."""

    def __init__(self, name: str, wrappers: dict):
        super().__init__(name)
        self._wrappers = wrappers

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        made = self._wrappers.get(name) or _DownstreamName(f"{self.__name__}.{name}")
        setattr(self, name, made)
        return made


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, wrappers: dict):
        self.wrappers = wrappers

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] == ESIMD_PACKAGE:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Package(spec.name, self.wrappers)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(
    version: str, truthful: bool = False, root: Path | None = None
) -> tuple[list, str]:
    """The stand-in package for a tree of that vLLM release, its ops
    defined. `truthful`: the control, in which the ops whose schemas lie
    (data/schema_contracts.toml) declare what they write and return
    nothing, and their wrappers give what the kernel returned. Returns
    (what to keep referenced, what it is: said in the report's stand-ins;
    `root`: the tree, whose image picks the package's commit)."""
    short, entry = commit_for(version, root)
    if short is None:
        return [], ""
    contracts = truthful_contracts() if truthful else {}
    libraries, refused = define_ops(entry, contracts)
    wrappers = {}
    for name, facts in entry.get("wrappers", {}).items():
        namespace = facts["op"].partition("::")[0]
        contract = contracts.get(facts["op"])
        gives = contract["callee_returns"] if contract else None
        made = _wrapper(name, facts, TRUTHFUL if contract else namespace, gives)
        if made is not None:
            wrappers[name] = made
    for name in [n for n in sys.modules if n.partition(".")[0] == ESIMD_PACKAGE]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Finder(wrappers))
    computed = sorted(esimd_kernels.REFERENCES)
    said = (
        f"{ESIMD_PACKAGE} of llm-scaler {short} (data/esimd_schemas.toml: "
        f"{len(entry.get('ops', {}))} ops with the image's schemas, "
        f"{len(wrappers)} wrappers; CPU references: {', '.join(computed)}; "
        "the others raise when run)"
    )
    if contracts:
        said += (
            f"; TRUTHFUL CONTROL: {len(contracts)} ops with the schemas their "
            "C++ keeps (data/schema_contracts.toml), not the image's"
        )
    if refused:
        said += f"; schemas torch refused: {'; '.join(refused)}"
    return libraries, said
