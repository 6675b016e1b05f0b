"""The device: an Intel Arc B-series GPU (BMG, Xe2: the bug report's), as
vLLM asks about it while it makes a model, and the XPU device named while a
model is made, taken as the CPU (where the proof's tensors are)."""

import torch

# vllm-xpu-kernels' device queries (`_xpu_C::is_xe2_arch`, ...), answered
# for an Arc B-series GPU (BMG, Xe2: the bug report's): vLLM's XPU MoE
# experts ask them while the model is made (0.33.0's xpu_moe.py;
# xpu_kernels.define_xpu_device_queries)
XPU_DEVICE: dict[str, bool] = {
    "is_xe2_arch": True,
    "is_xe3_arch": False,
    "is_bmg": True,
    "is_pvc": False,
}
# torch.xpu.get_device_properties().max_compute_units of an Arc B580
# (20 Xe2 cores x 8 vector engines)
XPU_COMPUTE_UNITS = 160
# torch.xpu.current_device() of a host with one XPU: its index
XPU_DEVICE_INDEX = 0


def current_device() -> int:
    """torch.xpu.current_device(), as on a host with one XPU."""
    return XPU_DEVICE_INDEX


class XPUOnCPU(torch.overrides.TorchFunctionMode):
    """The XPU device, where a tree names it while it makes the model or
    processes its weights (`.to("xpu")`, `device=current_platform.device_type`):
    the CPU, where the tensors of the proof are; a torch without XPU cannot
    make a tensor there."""

    @staticmethod
    def _cpu(value):
        if isinstance(value, str) and (value == "xpu" or value.startswith("xpu:")):
            return "cpu"
        if isinstance(value, torch.device) and value.type == "xpu":
            return torch.device("cpu")
        if isinstance(value, (list, tuple)):
            return type(value)(XPUOnCPU._cpu(v) for v in value)
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.xpu:
            return args[0]
        args = tuple(self._cpu(a) for a in args)
        kwargs = {k: self._cpu(v) for k, v in kwargs.items()}
        if isinstance(kwargs.get("device"), int) and not isinstance(
            kwargs["device"], bool
        ):
            # a device index names the accelerator (the XPU: what
            # current_device() answers, above)
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


_XPU_ALSO_CPU: list = []


def xpu_kernels_run_on_cpu() -> None:
    """A Python kernel registered for the XPU dispatch key (vLLM registers
    its own ops for current_platform.dispatch_key: "XPU" on the XPU
    platform) is registered for the CPU key too, where none is: the
    proof's tensors are on the CPU, and an eager run of the model calls
    those ops with them. Nothing else changes: a trace uses the ops' fakes."""
    if _XPU_ALSO_CPU:
        return
    original = torch.library.Library.impl

    def impl(self, op_name, fn, dispatch_key="", *args, **kwargs):
        done = original(self, op_name, fn, dispatch_key, *args, **kwargs)
        if dispatch_key == "XPU" and callable(fn):
            name = op_name if "::" in op_name else f"{self.ns}::{op_name}"
            if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
                original(self, op_name, _or_instead(name, fn), "CPU", *args, **kwargs)
        return done

    torch.library.Library.impl = impl
    _XPU_ALSO_CPU.append(original)


# "ns::op" -> a function called instead of the op's XPU kernel where it
# runs on the CPU (INSTEAD_ON_CPU[op](kernel, *args, **kwargs)): the model
# proof's stand-in of a kernel vLLM runs inside its own op (numbers.py:
# the GDN core the profile run's forward leaves unwritten)
INSTEAD_ON_CPU: dict = {}


def _or_instead(name: str, fn):
    def kernel(*args, **kwargs):
        instead = INSTEAD_ON_CPU.get(name)
        if instead is None:
            return fn(*args, **kwargs)
        return instead(fn, *args, **kwargs)

    kernel.__name__ = getattr(fn, "__name__", name)
    return kernel
