"""The standard wrong fakes of any op of the registry (data/fakes.toml),
derived from the op's real fake and its schema (data/op_schemas.toml), so
that no op needs a wrong fake written by hand. They are the mistakes of the
fakes the series replaces (the kernels patch's header lists them):

* flattened: the output's leading dimensions flattened into one (2-D,
  contiguous), as vLLM's fakes did;
* contiguous-strides: the right shape and dtype, contiguous strides, a new
  tensor;
* fp32-default: float32 where the op's output dtype argument (`ScalarType?`)
  is None, torch's default dtype where the kernels return float16 (only for
  an op whose schema has that argument).

Each also says which cases of the op's opcheck grid it must fail, from the
case's arguments and from what the stand-in kernel (the reference) returns
for them -- never from the fake under test: a flattened output differs from
a kernel's output of 3 or more dimensions, a contiguous one from a strided
output, and both from an output that is one of the arguments (an op that
writes into its `out`); a float32 one from a kernel's output of another
dtype when the dtype argument is None."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

Fake = Callable[..., torch.Tensor]


def _dtype_argument(schema: str) -> int | None:
    """The position of the schema's optional output dtype, else None."""
    arguments = torch._C.parse_schema(schema).arguments
    for position, argument in enumerate(arguments):
        if str(argument.real_type) == "Optional[ScalarType]":
            return position
    return None


def _is_an_argument(out: torch.Tensor, args: tuple) -> bool:
    storage = out.untyped_storage().data_ptr()
    return any(
        isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == storage
        for a in args
    )


@dataclass(frozen=True)
class WrongFake:
    name: str
    # (the real fake, the schema) -> the wrong fake
    wrap: Callable[[Fake, str], Fake]
    # (the schema, a case's arguments, the kernel's output) -> whether the
    # wrong fake must fail that case
    must_fail: Callable[[str, tuple, torch.Tensor], bool]
    # whether it applies to an op of that schema
    applies: Callable[[str], bool] = lambda schema: True


def _flattened(fake: Fake, schema: str) -> Fake:
    def wrong(*args):
        out = fake(*args)
        return out.new_empty((out.numel() // out.size(-1), out.size(-1)))

    return wrong


def _contiguous(fake: Fake, schema: str) -> Fake:
    def wrong(*args):
        out = fake(*args)
        return out.new_empty(out.shape)

    return wrong


def _fp32_default(fake: Fake, schema: str) -> Fake:
    position = _dtype_argument(schema)

    def wrong(*args):
        out = fake(*args)
        if args[position] is not None:
            return out
        return out.new_empty_strided(out.shape, out.stride(), dtype=torch.float32)

    return wrong


WRONG_FAKES = (
    WrongFake(
        "flattened",
        _flattened,
        lambda schema, args, out: out.dim() >= 3 or _is_an_argument(out, args),
    ),
    WrongFake(
        "contiguous-strides",
        _contiguous,
        lambda schema, args, out: not out.is_contiguous() or _is_an_argument(out, args),
    ),
    WrongFake(
        "fp32-default",
        _fp32_default,
        lambda schema, args, out: (
            args[_dtype_argument(schema)] is None and out.dtype != torch.float32
        ),
        applies=lambda schema: _dtype_argument(schema) is not None,
    ),
)


def for_schema(schema: str) -> list[WrongFake]:
    """The standard wrong fakes that apply to an op of this schema."""
    return [wrong for wrong in WRONG_FAKES if wrong.applies(schema)]


def by_name(name: str) -> WrongFake:
    return next(wrong for wrong in WRONG_FAKES if wrong.name == name)
