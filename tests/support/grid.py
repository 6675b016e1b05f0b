"""Run opcheck over the cases of the reference module and collect results."""

from unittest.mock import patch

import torch

from . import standins

TEST_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic")


def cases(full: bool = False) -> list:
    return standins.reference().opcheck_cases(full=full)


def _opcheck(case, device: str) -> None:
    """The fake checks; then the kernel checks the case can run
    (reference.SCHEMA_CHECK_SKIPPED says where not and why), test_schema with
    vLLM's fp8 allclose, test_autograd_registration with the float inputs
    requiring grad."""
    ref = standins.reference()
    torch.library.opcheck(case.op(), case.args(device), test_utils=TEST_UTILS)
    checks = case.kernel_checks()
    if "test_schema" in checks:
        with patch("torch.allclose", new=ref.fp8_allclose):
            torch.library.opcheck(
                case.op(), case.args(device), test_utils=("test_schema",)
            )
    if "test_autograd_registration" in checks:
        torch.library.opcheck(
            case.op(),
            ref.with_grad(case.args(device)),
            test_utils=("test_autograd_registration",),
        )


def run(chosen=None, device: str = "cpu") -> dict[str, str | None]:
    """case id -> None if opcheck passed, else the first line of its error.
    Cases of ops that do not exist are left out."""
    results: dict[str, str | None] = {}
    for case in chosen if chosen is not None else cases():
        if not case.available():
            continue
        try:
            _opcheck(case, device)
            results[case.id] = None
        except Exception as e:  # noqa: BLE001 - every failure is a result
            text = str(e).strip() or type(e).__name__
            results[case.id] = f"{type(e).__name__}: {text.splitlines()[0]}"
    return results


def failures(results: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in results.items() if v is not None}
