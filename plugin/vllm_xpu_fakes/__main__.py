# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plugin's self-check, in the environment vLLM runs in (docs/plugin.md).

``python -m vllm_xpu_fakes``: what register() does here; exit status 0 if
the fix is in effect, else 1. ``python -m vllm_xpu_fakes --verify``: that,
and on an XPU the opcheck grid of the fakes against the real kernels, and
schema truth on the image's own ops (schemacheck.py: does each kernel write
or return what ``make audit`` says its schema hides?); 77 where there is no
XPU.
"""

import argparse
import sys

NOT_HERE = 77  # cannot run on this machine (no Intel GPU): not a failure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_xpu_fakes",
        description="What the vllm-xpu-fakes plugin does in this environment.",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="on an XPU, also run the opcheck grid of the fakes against the "
        "real kernels (a report to paste into an issue)",
    )
    args = parser.parse_args(argv)
    if args.verify:
        import torch

        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            print(
                "vllm-xpu-fakes --verify: cannot run here: no Intel GPU "
                "(torch.xpu.is_available() is False); the grid runs the real "
                "kernels, on the XPU host"
            )
            return NOT_HERE
    from vllm_xpu_fakes import selfcheck

    report = selfcheck.check()
    if not args.verify:
        print(report.text(), flush=True)
        return 0 if report.ok else 1
    from vllm_xpu_fakes import opcheck

    # the kernels' ops and the fakes in effect, as a vLLM process has them
    # once it runs a model: vLLM's registering module imported
    try:
        selfcheck.registering_modules()
    except Exception as e:  # noqa: BLE001 - said; the grid runs what exists
        print(f"vLLM's registering module cannot be imported: {type(e).__name__}: {e}")
    results = opcheck.run("xpu")
    passed = bool(results) and all(r.ok for r in results)
    print(report.text())
    print()
    # the image's own ops whose schemas hide a write or an alias (make
    # audit's schema truth): does this XPU's kernel do what was found?
    from vllm_xpu_fakes import schemacases, schemacheck

    said = schemacheck.load_image_packages()
    truth = schemacheck.run(
        schemacases.FINDINGS,
        schemacases.CASES,
        schemacases.NO_CASE,
        "xpu",
        schemacheck.loaded,
        cited=schemacases.CITED,
    )
    print(schemacheck.report(truth, said))
    print()
    print("opcheck grid of the fakes in effect, on the XPU's kernels:")
    print(opcheck.table(results), flush=True)
    bad = sum(not r.ok for r in results)
    print(
        "vllm-xpu-fakes --verify: "
        + (
            "PASS: every fake in effect conforms to this XPU's kernels"
            if passed
            else f"FAIL: {bad} of {len(results)} ops' fakes do not conform to "
            "this XPU's kernels (above)"
        )
        + "; "
        + ("the fix is in effect" if report.ok else "the fix is NOT in effect (above)"),
        flush=True,
    )
    return 0 if passed and report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
