"""Defining a stand-in's ops in torch: each op "ns::name" (or
"ns::name.overload") in a FRAGMENT library of its namespace, with a kernel
for one dispatch key (the CPU, where a stand-in computes), beside the
libraries that defined the namespace's other ops."""

from collections.abc import Callable

import torch


def defined(op: str) -> bool:
    """Whether torch has the op "ns::name" (its default overload) or
    "ns::name.overload" defined already."""
    namespace, _, name = op.partition("::")
    op_name, _, overload = name.partition(".")
    packet = getattr(getattr(torch.ops, namespace), op_name, None)
    return packet is not None and (overload or "default") in packet.overloads()


def define(
    libraries: dict[str, torch.library.Library],
    op: str,
    schema: str,
    kernel: Callable,
    alias_analysis: str = "",
    refused: list[str] | None = None,
) -> bool:
    """Define `op` ("ns::name[.overload]") with `schema` in the FRAGMENT
    library of its namespace in `libraries` (made there if it has none yet:
    keep them referenced), `kernel` its CPU kernel. A schema torch refuses
    (one defined already, or one it cannot parse) raises, or with `refused`
    is added to it ("ns::name: <torch's first line that says something>") and nothing is
    defined. Returns whether the op was defined."""
    namespace, _, name = op.partition("::")
    if namespace not in libraries:
        libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
    try:
        libraries[namespace].define(schema, alias_analysis=alias_analysis)
    except RuntimeError as e:
        if refused is None:
            raise
        why = next((line for line in str(e).splitlines() if line.strip()), "")
        refused.append(f"{op}: {why.strip()}")
        return False
    libraries[namespace].impl(name, kernel, "CPU")
    return True
