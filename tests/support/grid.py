"""Run opcheck over the cases of the reference module and collect results."""

import torch

from . import standins

TEST_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic")


def cases(full: bool = False) -> list:
    return standins.reference().opcheck_cases(full=full)


def run(chosen=None, device: str = "cpu") -> dict[str, str | None]:
    """case id -> None if opcheck passed, else the first line of its error.
    Cases of ops that do not exist are left out."""
    results: dict[str, str | None] = {}
    for case in chosen if chosen is not None else cases():
        if not case.available():
            continue
        try:
            torch.library.opcheck(case.op(), case.args(device), test_utils=TEST_UTILS)
            results[case.id] = None
        except Exception as e:  # noqa: BLE001 - every failure is a result
            text = str(e).strip() or type(e).__name__
            results[case.id] = f"{type(e).__name__}: {text.splitlines()[0]}"
    return results


def failures(results: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in results.items() if v is not None}
