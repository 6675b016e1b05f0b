"""The cases of the in-place cut's in-tree test, run on this CPU against the
stand-in kernels, with a tree's own fakes (stage's validation).

That test (vllm_overlay/in-place/tests/kernels/quantization/
test_xpu_gemm_fakes.py) runs on an Intel GPU only. Here it is loaded as a
module, its DEVICE set to "cpu", and its test function called with each of
its CASES once the stand-ins carry the kernels' schemas and the tree's
vllm/_xpu_ops.py registered its fakes: the staged tree must pass every case,
the unpatched tree (the same test) fails where its fakes are wrong.

    python -m xpufakes.proof.testcases TREE TEST --standins KERNELS --json-out FILE

Needs torch; run in a process of its own (registrations are global).
"""

import argparse
import json
import sys
from pathlib import Path

from xpufakes.common import bypath

TEST_FUNCTION = "test_fake_matches_kernel"


def run(tree: Path, test: Path, standins: str) -> dict[str, str | None]:
    """case id -> None if it passed, else why it failed (verify.reason)."""
    from xpufakes.proof import verify
    from xpufakes.proof.xpu import extensions, reference, registering, xpu_kernels

    libraries = reference.define_standins(standins)  # noqa: F841 - keep them
    xpu_kernels.stub_xpu_kernel_package()
    extensions.stub_vllm_extensions(tree)
    registering.import_registering_module(tree)  # the tree first on sys.path
    module = bypath.load("staged_xpu_gemm_test", test)
    module.DEVICE = "cpu"
    results: dict[str, str | None] = {}
    for case in module.CASES:
        try:
            getattr(module, TEST_FUNCTION)(*case.values)
            results[case.id] = None
        except Exception as e:  # noqa: BLE001 - every failure is a result
            results[case.id] = verify.reason(e)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufakes.proof.testcases")
    parser.add_argument("tree", type=Path)
    parser.add_argument("test", type=Path)
    parser.add_argument("--standins", required=True)
    parser.add_argument("--json-out", type=Path, required=True)
    args = parser.parse_args(argv)
    results = run(args.tree.absolute(), args.test.absolute(), args.standins)
    args.json_out.write_text(json.dumps(results, indent=1))
    return 0 if results and all(v is None for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
