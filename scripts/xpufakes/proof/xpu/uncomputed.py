"""What a stand-in raises where it computes nothing: an XPU-only module or
kernel the proof has no CPU reference for (made freely, never run here:
IPEX's attention module and its MoE module's int4 / mxfp4 experts,
vllm-xpu-kernels' functions the tree calls inside its own opaque ops, an
ESIMD op without a reference, a native function). A subclass of
NotImplementedError (so of RuntimeError), caught where those are. The
numbers (proof/model/numbers.py) say a run that reached one was not
computed here: the proof's limit, a failure, said so, never the tree's."""


class NoCPUReference(NotImplementedError):
    """A stand-in without a CPU reference was run."""


def found_in(error: BaseException | None) -> str:
    """The message of the NoCPUReference an error is, wraps (Dynamo's
    inner_exception), or was raised from or while handling; "" if none."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, NoCPUReference):
            return str(error)
        inner = getattr(error, "inner_exception", None)
        error = inner or error.__cause__ or error.__context__
    return ""
