# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Schema truth on a device: does an image's kernel do what ``make audit``
says its schema hides? (docs/schema-truth.md; the cases: schemacases.py.)

For each op with a case that exists in this process: its arguments made
from the case (outputs filled with NaN, so that any write shows), then

* ``torch.library.opcheck(op, args, test_utils=("test_schema",))``: torch's
  SchemaCheckMode, which fails an op that writes an argument its schema does
  not mark, or returns an argument without an alias annotation (it names the
  first it meets);
* one call of the op on a fresh copy of the same arguments, to see each
  finding: which arguments changed (their bytes), which results share an
  argument's storage.

A finding is "seen" or "not seen"; one the schema here already declares
(another build of the package) is "declared here". The op is ``confirmed``
when test_schema fails it and every finding is seen, ``confirmed by the
call alone`` when test_schema cannot run on the op (said: torch cannot
normalise a parameter named ``lambda``, or compare FP8 tensors),
``partly confirmed``, ``not confirmed`` (test_schema passes: the kernel did
not do it with this case), ``error`` (the kernel refused the case: said),
``declared here``, ``no case`` (why), ``not here`` (the op is not loaded).

Standard library only when imported (``make verify-xpu`` loads this file by
its path); torch is imported by the functions that run.
"""

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field

NAN = float("nan")
DTYPES = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "i64": "int64",
    "i32": "int32",
    "u8": "uint8",
    "fp8e4m3": "float8_e4m3fn",
    "fp8bits": "uint8",  # an FP8 E4M3 value's bits
}
SPEC = re.compile(r"^(?P<dtype>\w+)\[(?P<dims>[^\]]*)\](?P<t>\.t)?(?P<rest>.*)$")
FLAGGED = (
    "not defined as mutable but was mutated",
    "not defined to alias output but was aliasing",
    "not allowed to directly return inputs",
)
SEEN, NOT_SEEN, DECLARED = "seen", "NOT seen", "declared here"


@dataclass
class Result:
    op: str
    findings: dict[str, list[str]]
    status: str
    test_schema: str = ""  # "fails: ...", "passes", "cannot run: ..."
    seen: dict[str, str] = field(default_factory=dict)  # "(a) output" -> SEEN
    also: list[str] = field(default_factory=list)  # done, and not a finding
    note: str = ""  # why no case; the error; where the shapes are from
    cited: str = ""  # the finding's evidence

    @property
    def confirmed(self) -> bool:
        return self.status.startswith("confirmed")


def label(kind: str, argument: str) -> str:
    return f"({kind}) {argument}" if argument else f"({kind})"


# ---------------------------------------------------------------------------
# The arguments
# ---------------------------------------------------------------------------


def size(text: str, sizes: dict[str, int]) -> int:
    """A dimension: the sizes' names, integers, + - * and exact /."""

    def value(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in sizes:
            return sizes[node.id]
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Div) and right and left % right == 0:
                return left // right
        raise ValueError(f"not a size: {text!r} (sizes {sizes})")

    return value(ast.parse(text.strip(), mode="eval").body)


def _is_size(text: str, sizes: dict[str, int]) -> bool:
    try:
        size(text, sizes)
    except (ValueError, SyntaxError):
        return False
    return True


def make_args(case: tuple, device: str, seed: int = 0) -> list:
    """The case's arguments on `device` (random values from `seed`, made on
    the CPU: the same on every device)."""
    import torch

    sizes, specs, _ = case
    generator = torch.Generator().manual_seed(seed)
    args = []
    for spec in specs:
        if not isinstance(spec, str) or not SPEC.match(spec):
            is_size = isinstance(spec, str) and _is_size(spec, sizes)
            args.append(size(spec, sizes) if is_size else spec)
            continue
        args.append(_tensor(spec, sizes, device, generator))
    return args


def _tensor(spec: str, sizes: dict[str, int], device: str, generator):
    import torch

    match = SPEC.match(spec)
    kind = match["dtype"]
    dtype = getattr(torch, DTYPES[kind])
    dims = [size(d, sizes) for d in match["dims"].split(",") if d.strip()]
    rest = match["rest"].split()
    made = dtype if kind not in ("fp8e4m3", "fp8bits") else torch.float32
    if "nan" in rest:
        t = torch.full(dims, NAN, dtype=made)
    elif any(r.startswith("=") for r in rest):
        number = float(next(r for r in rest if r.startswith("="))[1:])
        t = torch.full(dims, number, dtype=torch.float64).to(made)
    elif "pos" in rest:
        t = (torch.rand(dims, generator=generator) + 0.5).to(made)
    elif made.is_floating_point:
        t = torch.randn(dims, generator=generator).to(made)
    else:
        info = torch.iinfo(dtype)
        low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
        t = torch.randint(low, high, dims, generator=generator, dtype=dtype)
    if kind == "fp8e4m3":
        t = t.to(torch.float8_e4m3fn)
    elif kind == "fp8bits":
        t = t.to(torch.float8_e4m3fn).view(torch.uint8)
    if match["t"]:
        t = t.t()
    return t if "cpu" in rest else t.to(device)


# ---------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------


def _bits(t):
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _same_storage(a, b) -> bool:
    return (
        a.numel() > 0
        and b.numel() > 0
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def observe(op, args: list) -> tuple[set[str], set[str], bool]:
    """One call of `op`: (the arguments it changed, the arguments a result
    shares storage with, whether it returned nothing)."""
    import torch

    names = [a.name for a in op._schema.arguments]
    before = {
        n: _bits(a).clone()
        for n, a in zip(names, args, strict=True)
        if isinstance(a, torch.Tensor)
    }
    out = op(*args)
    results = out if isinstance(out, (tuple, list)) else (out,)
    written, aliased = set(), set()
    for name, arg in zip(names, args, strict=True):
        if name not in before:
            continue
        if not torch.equal(before[name], _bits(arg)):
            written.add(name)
        for r in results:
            if isinstance(r, torch.Tensor) and _same_storage(r, arg):
                aliased.add(name)
    return written, aliased, out is None


def test_schema(op, args: list) -> str:
    """opcheck's test_schema on `args`: 'fails: <why>', 'passes', or
    'cannot run: <why>' (it failed on something else: torch
    cannot compare FP8 tensors, or normalise a parameter named `lambda`)."""
    import torch

    try:
        torch.library.opcheck(op, args, test_utils=("test_schema",))
    except Exception as e:  # noqa: BLE001 - every outcome is said
        cause = e.__cause__ or e
        message = " ".join(str(cause).split())
        if any(flag in message for flag in FLAGGED):
            return f"fails: {message}"[:200]
        return f"cannot run: {type(cause).__name__}: {message}"[:200]
    return "passes"


def _declared(op) -> tuple[set[str], set[str]]:
    """What the schema here declares: the arguments it marks written, and
    those a result may alias."""
    marked, aliases = set(), set()
    returned = {
        s
        for r in op._schema.returns
        if r.alias_info is not None
        for s in r.alias_info.before_set
    }
    for a in op._schema.arguments:
        info = a.alias_info
        if info is None:
            continue
        if info.is_write:
            marked.add(a.name)
        if set(info.before_set) & returned:
            aliases.add(a.name)
    return marked, aliases


def check(qualname: str, op, findings: dict, case: tuple, device: str) -> Result:
    """The findings of one op, on `device`."""
    sizes = " ".join(f"{k}={v}" for k, v in case[0].items())
    result = Result(qualname, findings, "", note=f"{sizes}; shapes: {case[2]}")
    names = [a.name for a in op._schema.arguments]
    wanted = {a for args in findings.values() for a in args if a}
    if len(names) != len(case[1]) or not wanted <= set(names):
        result.status = "no case"
        result.note = (
            f"the schema here is not the one of the finding: {op._schema} "
            f"(the case gives {len(case[1])} arguments, for {sorted(wanted)})"
        )
        return result
    try:
        written, aliased, nothing = observe(op, make_args(case, device))
    except Exception as e:  # noqa: BLE001 - said
        result.status = "error"
        message = " ".join(str(e).split())
        result.note = f"the case does not run: {type(e).__name__}: {message}"[:300]
        return result
    marked, aliases = _declared(op)
    for kind, arguments in findings.items():
        for argument in arguments:
            if kind == "a":
                done, declared = argument in written, argument in marked
            elif kind == "b":
                done, declared = argument in aliased, argument in aliases
            else:  # c: nothing returned, an unmarked argument written
                done, declared = nothing and bool(written - marked), bool(marked)
            result.seen[label(kind, argument)] = (
                DECLARED if declared else SEEN if done else NOT_SEEN
            )
    result.also = [f"writes {a}" for a in sorted(written - wanted - marked)] + [
        f"returns {a}" for a in sorted(aliased - wanted - aliases)
    ]
    result.test_schema = test_schema(op, make_args(case, device))
    states = set(result.seen.values())
    if states == {DECLARED}:
        result.status = "declared here"
    elif NOT_SEEN not in states:
        result.status = (
            "confirmed"
            if result.test_schema.startswith("fails")
            else "confirmed by the call alone"
            if result.test_schema.startswith("cannot run")
            else "inconsistent"  # test_schema passes what the call shows
        )
    elif SEEN in states:
        result.status = "partly confirmed"
    else:
        result.status = "not confirmed"
    return result


def run(
    findings: dict,
    cases: dict,
    no_case: dict,
    device: str,
    resolve: Callable[[str], object],
    absent: str = "not loaded in this process",
    cited: dict[str, str] | None = None,
) -> list[Result]:
    """Every op of `findings`: checked if `resolve` finds it in this process
    (its OpOverload, else None) and it has a case; `cited`: op -> the
    evidence of its findings, said with it."""
    results = []
    for qualname, found in findings.items():
        op = resolve(qualname)
        if qualname in no_case:
            results.append(Result(qualname, found, "no case", note=no_case[qualname]))
        elif op is None:
            results.append(Result(qualname, found, "not here", note=absent))
        else:
            results.append(check(qualname, op, found, cases[qualname], device))
        results[-1].cited = (cited or {}).get(qualname, "")
    return results


def loaded(qualname: str):
    """The op's default overload if this process has it, else None."""
    import torch

    namespace, _, name = qualname.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return None
    return getattr(packet, "default", None)


def load_image_packages() -> list[str]:
    """Import the image's kernel packages that register the ops of the
    findings (intel/llm-scaler's ESIMD package), where installed; what came
    of each."""
    import importlib
    import importlib.util

    said = []
    for package in ("custom_esimd_kernels_vllm",):
        if importlib.util.find_spec(package) is None:
            said.append(f"{package}: not installed")
            continue
        try:
            importlib.import_module(package)
            said.append(f"{package}: imported")
        except Exception as e:  # noqa: BLE001 - said
            said.append(f"{package}: cannot be imported ({type(e).__name__}: {e})")
    return said


def table(results: list[Result]) -> str:
    """One block per op with a verdict; the ops without one, a line each;
    the counts last."""
    lines = []
    for r in results:
        lines.append(f"{r.op}: {r.status}")
        if r.status in ("no case", "not here", "error"):
            lines[-1] += f" ({r.note})"
            continue
        if r.cited:
            lines.append(f"    evidence: {r.cited}")
        lines.append(f"    case: {r.note}")
        lines.append(f"    test_schema: {r.test_schema}")
        lines.append(
            "    findings: " + "; ".join(f"{k} {v}" for k, v in r.seen.items())
        )
        if r.also:
            lines.append(f"    also done (not a finding): {', '.join(r.also)}")
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    order = ("confirmed", "confirmed by the call alone", "partly confirmed")
    order += ("not confirmed", "inconsistent")
    order += ("declared here", "error", "no case", "not here")
    lines.append(
        f"schema truth: {len(results)} ops: "
        + ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))
    )
    return "\n".join(lines)


def report(results: list[Result], packages: list[str]) -> str:
    """The report on the XPU (make verify-xpu and --verify print it)."""
    head = (
        "schema truth on the XPU: the image's own ops, opcheck test_schema "
        "with outputs filled with NaN (docs/schema-truth.md; a finding "
        "confirmed is the image's, not the fix's: it does not change the "
        "exit status)"
    )
    return "\n".join([head, *(f"  {p}" for p in packages), table(results)])
