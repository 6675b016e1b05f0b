"""The negative control of the output comparison: a deliberately wrong fake.

``XPUFAKES_E2E_WRONG_FAKE=<op>`` (e.g. ``_xpu_C::fp8_gemm_w8a16``) replaces,
after vLLM registered it, the fake of that op by one that is right in shape
and dtype and wrong in strides: the last two dimensions column-major where
the kernel returns them row-major, the kind of mistake the kernels-era fakes
make (strides ignored). vLLM turns Inductor's size and stride asserts off on
the CPU platform, so compiled code built on it reads the kernel's output
through the wrong strides and the engine starts; the e2e test asserts that
the comparison with eager catches it. (A wrong dtype does not get that far:
the next kernel's dtype check stops the warm-up.) Unset (always, outside
that test), this changes nothing.
"""

import os

VARIABLE = "XPUFAKES_E2E_WRONG_FAKE"
_LIBRARIES: list = []


def apply() -> str | None:
    qualname = os.environ.get(VARIABLE)
    if not qualname:
        return None
    import torch
    from torch._library.simple_registry import singleton

    right = singleton.find(qualname).fake_impl.kernel
    if right is None:
        raise RuntimeError(f"{VARIABLE}={qualname}: the op has no fake to make wrong")

    def wrong_strides_fake(*args, **kwargs):
        out = right(*args, **kwargs)
        return out.transpose(-1, -2).contiguous().transpose(-1, -2)

    namespace = qualname.partition("::")[0]
    library = torch.library.Library(namespace, "FRAGMENT")
    _LIBRARIES.append(library)
    torch.library.register_fake(
        qualname, wrong_strides_fake, lib=library, allow_override=True
    )
    return qualname
