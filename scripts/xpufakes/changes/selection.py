"""PATCHES=: the patches a selection names ("0001", "0001-xpu-...patch",
separated by spaces or commas), and their dependencies (`X-Depends: <number>
(<why>)` in a patch header, `depends` of a recipe)."""

from xpufakes.common.errors import Refusal


def number(name: str) -> str:
    """ "0001" of "0001-xpu-register-fakes-for-ipex-gemms.patch"."""
    return name.split("-", 1)[0]


def parse(text: str) -> list[str]:
    """The tokens of a PATCHES= value."""
    return text.replace(",", " ").split()


def select(names: list[str], selection: list[str] | None, what: str) -> list[str]:
    """The names a selection picks, in series order (all without one)."""
    if not selection:
        return list(names)
    chosen = []
    for token in selection:
        found = [n for n in names if n == token or number(n) == token]
        if not found:
            raise Refusal(
                f"PATCHES: no patch {token!r} in {what}; it has " + ", ".join(names)
            )
        chosen += [n for n in found if n not in chosen]
    return [n for n in names if n in chosen]


def check_depends(depends: dict[str, list[str]], wanted: set[str]) -> None:
    """Refuse a set of patches that lacks a patch one of them needs."""
    for name in sorted(wanted):
        for dependency in depends.get(name, []):
            needed_number, _, why = dependency.partition(" ")
            if not any(number(n) == needed_number for n in wanted):
                needed = next(
                    (n for n in depends if number(n) == needed_number), needed_number
                )
                raise Refusal(
                    f"{name} needs {needed} {why}".rstrip()
                    + f"; add it (PATCHES='{needed_number} {number(name)}') or "
                    "apply it first; nothing changed"
                )
