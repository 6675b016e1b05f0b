"""Dotted names in a tree's Python, read as text: a file's module name,
what an import statement binds, a Name/Attribute chain as a dotted name,
and a dotted expression qualified through the imports. The one place these
rules are written: the scan, the search for untraceable calls
(pysource.py) and the native modules' stand-ins (natives.py) all read
names this way."""

import ast


def module_name(path: str) -> str:
    """ "vllm.a.b" for "vllm/a/b.py" or "vllm/a/b/__init__.py"."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str, level: int, is_package: bool = False) -> str:
    """The package a relative import of `level` dots starts from, in a module
    (`is_package`: the module is a package's __init__.py, whose name is the
    package's own)."""
    parts = module.split(".")
    up = level - 1 if is_package else level
    return ".".join(parts[: len(parts) - up]) if up else module


def bindings(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool = False
) -> list[tuple[str, str]]:
    """(local name, dotted target) of each name an import statement binds in
    `module`: `import a.b` binds a (to a), `import a.b as c` c (to a.b),
    `from .x import y as z` z (to <package>.x.y)."""
    if isinstance(node, ast.Import):
        return [
            (alias.asname, alias.name)
            if alias.asname
            else (alias.name.split(".")[0], alias.name.split(".")[0])
            for alias in node.names
        ]
    base = node.module or ""
    if node.level:
        package = package_of(module, node.level, is_package)
        base = f"{package}.{base}" if base else package
    return [
        (alias.asname or alias.name, f"{base}.{alias.name}") for alias in node.names
    ]


def dotted(node: ast.expr) -> str:
    """'a.b.c' for a Name/Attribute chain, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


def qualify(name: str, imports: dict[str, str]) -> str:
    """A dotted expression with its first part replaced by what it imports
    ("" if the first part is not an imported name)."""
    head, _, rest = name.partition(".")
    target = imports.get(head)
    if target is None:
        return ""
    return f"{target}.{rest}" if rest else target
