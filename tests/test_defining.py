"""proof/xpu/defining.py, which the stand-ins define their ops with
(loading_ops.py, esimd.py, xpu_moe.py; ipex.py and xpu_kernels.py ask it
what is defined already): an op defined in its namespace's FRAGMENT
library runs its CPU kernel; one torch refuses raises, or is said in the
caller's list. Each namespace here is this test's own, so that nothing
else defines it. Under a second."""

import pytest
import torch

from xpufakes.proof.xpu import defining


def test_an_op_is_defined_once_with_its_cpu_kernel():
    libraries: dict = {}
    op = "xpufakes_test_defining::twice"
    assert not defining.defined(op)  # the control: nothing yet
    assert defining.define(libraries, op, "twice(Tensor x) -> Tensor", lambda x: 2 * x)
    assert defining.defined(op)
    assert not defining.defined(f"{op}.other")  # a named overload is not
    assert list(libraries) == ["xpufakes_test_defining"]
    got = torch.ops.xpufakes_test_defining.twice(torch.tensor([1.0, 3.0]))
    assert got.tolist() == [2.0, 6.0]


def test_a_named_overload_is_its_own():
    libraries: dict = {}
    op = "xpufakes_test_defining_overload::half.xpu"
    assert not defining.defined(op)
    assert defining.define(
        libraries, op, "half.xpu(Tensor x) -> Tensor", lambda x: x / 2, "CONSERVATIVE"
    )
    assert defining.defined(op)
    assert not defining.defined("xpufakes_test_defining_overload::half")


def test_a_refused_schema_raises_or_is_said():
    libraries: dict = {}
    op = "xpufakes_test_defining_refused::once"
    assert defining.define(libraries, op, "once(Tensor x) -> Tensor", lambda x: x)
    with pytest.raises(RuntimeError):  # defined already
        defining.define(libraries, op, "once(Tensor x) -> Tensor", lambda x: x)
    refused: list[str] = []
    assert not defining.define(
        libraries, op, "once(Tensor x) -> Tensor", lambda x: x, refused=refused
    )
    bad = "xpufakes_test_defining_refused::bad"
    assert not defining.define(
        libraries, bad, "bad(Nonsense x) -> ()", print, "", refused
    )
    assert [r.partition(": ")[0] for r in refused] == [op, bad]
    # torch's first line that says something: why (a schema torch cannot
    # parse gets a message that starts with a newline)
    assert refused[0].startswith(f"{op}: Tried to register an operator"), refused
    assert refused[1].split(": ", 1)[1].strip(), refused
    assert "\n" not in "".join(refused)
    assert not defining.defined(bad)
