"""An op's schema string, as torch reads it, taken apart: its arguments
with their alias annotations and its returns. Text only, no torch.

    "fp8_gemm_out(Tensor(a!) out, Tensor A, ...) -> Tensor"

`Tensor(a!)` and `Tensor!` mark an argument the op writes; `Tensor(a)` and
`Tensor(a!)` in the returns say a result is that argument (an alias). An
argument without `!` is one the op promises not to write; a return
without an alias set is one it promises is a new tensor."""

import re
from dataclasses import dataclass

_ALIAS = re.compile(r"\((\w+)(!?)\)")


@dataclass(frozen=True)
class Arg:
    type: str  # as written, e.g. "Tensor(a!)?", "int", "Tensor[]"
    name: str
    default: str = ""  # as written after `=`

    @property
    def plain(self) -> str:
        """The type without its alias annotation ("Tensor(a!)?" -> "Tensor?")."""
        return _ALIAS.sub("", self.type).replace("!", "")

    @property
    def tensor(self) -> bool:
        return self.type.startswith("Tensor")

    @property
    def alias(self) -> str:
        """The alias set ("a" of `Tensor(a!)`), or ""."""
        found = _ALIAS.search(self.type)
        return found.group(1) if found else ""

    @property
    def writes(self) -> bool:
        """Marked as written: `Tensor(a!)`, `Tensor!`."""
        return "!" in self.type


@dataclass(frozen=True)
class Schema:
    name: str  # with its overload, if any
    args: tuple[Arg, ...]
    returns: tuple[Arg, ...]  # () for "-> ()"

    @property
    def marked(self) -> list[str]:
        """The arguments marked as written."""
        return [a.name for a in self.args if a.writes]

    @property
    def returns_nothing(self) -> bool:
        return not self.returns

    @property
    def returns_tensor(self) -> bool:
        return any(r.tensor for r in self.returns)

    def returned_aliases(self) -> list[str]:
        """The arguments a return is declared to alias."""
        sets = {r.alias for r in self.returns if r.alias}
        return [a.name for a in self.args if a.alias and a.alias in sets]

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.args if a.name == name), None)

    def names(self) -> list[str]:
        return [a.name for a in self.args]


def _split(text: str) -> list[str]:
    """Top-level comma-separated parts (not inside parentheses or brackets)."""
    parts, depth, start = [], 0, 0
    for i, character in enumerate(text):
        if character in "([":
            depth += 1
        elif character in ")]":
            depth -= 1
        elif character == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _arg(text: str, position: int) -> Arg | None:
    """One argument or return ("Tensor(a!) out", "int k=1", "Tensor");
    None for the keyword-only marker `*`."""
    text, _, default = (part.strip() for part in text.partition("="))
    if text == "*":
        return None
    # the type may hold spaces inside its parentheses: "Tensor(a! -> *)"
    depth, cut = 0, len(text)
    for i, character in enumerate(text):
        if character in "([":
            depth += 1
        elif character in ")]":
            depth -= 1
        elif character == " " and depth == 0:
            cut = i
            break
    kind, name = text[:cut], text[cut:].strip()
    return Arg(kind, name or f"_{position}", default)


def parse(schema: str) -> Schema:
    """The schema taken apart. Raises ValueError if it is not one."""
    text = " ".join(schema.split())
    head, arrow, tail = text.rpartition("->")
    if not arrow or "(" not in head:
        raise ValueError(f"not an op schema: {schema!r}")
    name, _, rest = head.partition("(")
    inner = rest.rstrip()
    if not inner.endswith(")"):
        raise ValueError(f"not an op schema: {schema!r}")
    args = [_arg(p, i) for i, p in enumerate(_split(inner[:-1]))]
    tail = tail.strip()
    if tail.startswith("(") and tail.endswith(")"):
        returns = [_arg(p, i) for i, p in enumerate(_split(tail[1:-1]))]
    else:
        returns = [_arg(tail, 0)]
    return Schema(
        name.strip(),
        tuple(a for a in args if a is not None),
        tuple(r for r in returns if r is not None),
    )
