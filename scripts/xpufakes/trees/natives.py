"""The native modules a vLLM build adds (its compiled extensions), by name,
and which names below them a tree uses as modules: data and source text
only, no torch.

A build's extension is a C module. pybind11 modules (a downstream's
`vllm._C`, with `m.def_submodule("ops")`) hold submodules and builtin
functions; the stand-ins (proof/xpu/extensions.py) answer each name below a
native module as what the tree uses it as: a module where it imports it as
one or takes an attribute of it (`import vllm._C.ops`, `from vllm._C import
ops` then `ops.rms_norm`), a builtin function everywhere else (what Dynamo
cannot trace).
"""

import ast
import re

from xpufakes.trees import names

# What a vLLM build adds to the tree and a source tree (or the proof's copy
# of a tree) does not have: its compiled extensions -- every
# `CMakeExtension(name=...)` of the pinned sdists' setup.py and every
# `define_extension_target` of their CMake files (tests/test_native_standins.py
# checks this list against them). A downstream build's own extension named in
# vLLM's style (`vllm._xpu_C`, `vllm.<package>._<name>_C`) is one too
# (NATIVE_STYLE). Not the pure-Python packages a build copies into
# vllm/third_party/ (triton_kernels, deep_gemm, ...): vLLM treats them as
# optional and probes for them (`find_spec`, then reads `__file__`), so a
# stand-in would tell it they are there; a tree without them is a build
# without them.
NATIVE_MODULES = frozenset(
    {
        "vllm._C",
        "vllm._C_AVX2",
        "vllm._C_AVX512",
        "vllm._C_stable_libtorch",
        "vllm._moe_C",
        "vllm._moe_C_stable_libtorch",
        "vllm._rocm_C",
        "vllm._flashmla_C",
        "vllm._flashmla_extension_C",
        "vllm._deep_gemm_C",
        "vllm._deepselect_C",
        "vllm._flashkda_C",
        "vllm._qutlass_C",
        "vllm.cumem_allocator",
        "vllm.fs_io_C",
        "vllm.spinloop",
        "vllm.vllm_flash_attn._vllm_fa2_C",
        "vllm.vllm_flash_attn._vllm_fa3_C",
        "vllm.vllm_flash_attn._vllm_fa4_cutedsl_C",
        "vllm.triton_kernels",
        "vllm.fmha_sm100",
        "vllm.tml_fa4",
    }
)
NATIVE_STYLE = re.compile(r"vllm(\.\w+)*\._(\w+_)?C(_\w+)?")


def is_native(name: str) -> bool:
    """Whether a module name is one of a vLLM build's (NATIVE_MODULES)."""
    return name in NATIVE_MODULES or NATIVE_STYLE.fullmatch(name) is not None


def native_root(dotted: str) -> str | None:
    """The native module a dotted name is or lies below, else None."""
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if is_native(prefix):
            return prefix
    return None


# A module's text may name a native module only if it holds one of these.
_MENTION = re.compile(r"\b_\w*C\b|_C_|cumem_allocator|fs_io_C|spinloop|triton_kernels")


def imports_of(module: str, tree: ast.AST, is_package: bool = False) -> dict[str, str]:
    """local name -> dotted target, for every import anywhere in a module
    (function-level ones too; the first binding of a name wins)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name, target in names.bindings(node, module, is_package):
                found.setdefault(name, target)
    return found


def used_as_modules(texts: dict[str, str]) -> set[str]:
    """The names at or below a native module that a tree uses as modules:
    the ones it imports (`import vllm._C.ops`, the `vllm._C` of `from
    vllm._C import ops`) and every one it takes an attribute of (`ops` in
    `ops.rms_norm(...)` after `from vllm._C import ops`; `vllm._C.ops` in
    `vllm._C.ops.rms_norm(...)`). `texts`: path -> source of vllm/'s files."""
    found: set[str] = set()
    for path, text in texts.items():
        if not _MENTION.search(text):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        module = names.module_name(path)
        is_package = path.endswith("__init__.py")
        imports = imports_of(module, tree, is_package)
        for node in ast.walk(tree):
            named = []
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module
                if node.level:
                    base = f"{names.package_of(module, node.level, is_package)}.{base}"
                named = [base]
            elif isinstance(node, ast.Attribute):
                name = names.dotted(node.value)
                if name:
                    named = [names.qualify(name, imports)]
            for name in named:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if native_root(prefix):
                        found.add(prefix)
    return found
