"""The negative control of the output comparison: a deliberately wrong
stand-in, i.e. a kernel that does not return what its fake says.

``XPUFAKES_E2E_WRONG_STANDIN=<op>@<N>`` (e.g. ``_xpu_C::fp8_gemm_w8a16@1024``)
defines that op, before the other stand-ins, as the reference kernel which,
while ``XPUFAKES_E2E_WRONG_NOW=1`` is in the environment of the process at
the time of the call (the driver sets it around one run, so that the right
and the wrong runs share an engine process), hands a result with N columns
back column-major (the same values,
the last two dimensions transposed in memory), where the real kernel -- and
so the fake, ours or vLLM's -- says row-major. With N the width of the
gate_up projection, compiled code passes that output straight to Inductor's
own fused SiLU-and-mul, which indexes it with the fake's strides (vLLM turns
Inductor's size and stride asserts off on the CPU platform): it computes
with transposed numbers, and the engine starts. The e2e test asserts that
the comparison with eager (the right stand-in) catches it. This is the bug
class of a wrong fake, seen from the kernel's side.

Measured, what does not get that far: a wrong fake itself (strides or
dtype), or a wrong layout for the q/k/v projection (vLLM's own ops that take
it check their input: the warm-up stops), or for o_proj / down_proj (the
model's hidden states come out non-contiguous and vLLM's lm_head GEMM
refuses them at the first request). Unset (always, outside that test), this
defines nothing.
"""

import os

VARIABLE = "XPUFAKES_E2E_WRONG_STANDIN"
NOW = "XPUFAKES_E2E_WRONG_NOW"
_LIBRARIES: list = []


def _column_major(kernel, n: int):
    def wrong(*args):
        out = kernel(*args)
        if out.shape[-1] != n or os.environ.get(NOW) != "1":
            return out
        return out.transpose(-1, -2).contiguous().transpose(-1, -2)

    wrong.__name__ = f"column_major_{getattr(kernel, '__name__', 'kernel')}"
    return wrong


def define(ref, kernels_release: str | None) -> str | None:
    """Define the wrong stand-in (call before the other stand-ins: they skip
    an op that exists)."""
    value = os.environ.get(VARIABLE)
    if not value:
        return None
    qualname, _, columns = value.partition("@")
    import torch

    namespace, _, name = qualname.partition("::")
    if namespace == "_xpu_C":
        release = ref._Release(ref.parse_version(kernels_release))
        kernel = ref.make_xpu_c_kernels(release)[name]
        schema, alias = ref.XPU_C_SCHEMAS[name], None
    elif namespace == "torch_ipex" and name in ref.TORCH_IPEX_KERNELS:
        kernel = ref.TORCH_IPEX_KERNELS[name]
        schema, alias = ref.TORCH_IPEX_SCHEMAS[name], "CONSERVATIVE"
    else:
        raise RuntimeError(f"{VARIABLE}={qualname}: not a GEMM of the stand-ins")
    library = torch.library.Library(namespace, "FRAGMENT")
    if alias:
        library.define(schema, alias_analysis=alias)
    else:
        library.define(schema)
    library.impl(
        name, ref.as_backend_kernel(_column_major(kernel, int(columns))), "CPU"
    )
    _LIBRARIES.append(library)
    return value
