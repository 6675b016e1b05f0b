"""How the e2e tests compare two runs of the same model (plain Python).

Teacher-forced: the log-probability each run gives every token of fixed
sequences (``prompt_logprobs``), position by position; the runs agree when
the mean and the largest absolute difference are within the tolerance of the
case's family (``TOLERANCE``) and every value is finite.

Greedy: the continuations must be the same token for token until the first
position where the reference's best two tokens are within ``near_tie`` nats
of each other; from there on the runs may legitimately part (a prefix that
differs changes everything after it).

The tolerances come from measurement (docs/proof.md, *What `make e2e`
proves*): eager against compiled on the same model differs only by rounding,
because Inductor fuses the code around the GEMMs and keeps fp32 where eager
rounds to bf16 between ops; where the activations are quantized too (fp8
W8A8, MXFP4 W4A4), an activation that lands on the neighbouring fp8 / fp4
value moves the result much more than a bf16 rounding does.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    mean: float  # nats, mean |delta| over all positions
    max: float  # nats, largest |delta|
    near_tie: float  # nats between the reference's best two tokens


TOLERANCE = {
    # weight-only quantization: activations stay bf16
    "weight-only": Tolerance(mean=0.2, max=1.5, near_tie=1.0),
    # activations quantized per token (fp8 e4m3) or per 32 values (e2m1)
    "activation-quantized": Tolerance(mean=1.0, max=5.0, near_tie=2.5),
}


@dataclass(frozen=True)
class Agreement:
    mean_abs: float
    max_abs: float
    positions: int
    finite: bool

    def within(self, tolerance: Tolerance) -> bool:
        return (
            self.finite
            and self.mean_abs <= tolerance.mean
            and self.max_abs <= tolerance.max
        )

    def __str__(self) -> str:
        return (
            f"mean |d| {self.mean_abs:.3f}, max |d| {self.max_abs:.3f} nats over "
            f"{self.positions} positions{'' if self.finite else ', NOT FINITE'}"
        )


def teacher_forced(reference: dict, candidate: dict) -> Agreement:
    deltas, finite = [], True
    for ref_seq, cand_seq in zip(
        reference["prompt_logprobs"], candidate["prompt_logprobs"], strict=True
    ):
        for a, b in zip(ref_seq, cand_seq, strict=True):
            if b is None or not math.isfinite(b):
                finite = False
                continue
            deltas.append(abs(a - b))
    if not deltas:
        return Agreement(math.inf, math.inf, 0, False)
    return Agreement(sum(deltas) / len(deltas), max(deltas), len(deltas), finite)


def greedy_disagreements(
    reference: dict, candidate: dict, tolerance: Tolerance
) -> list[str]:
    """Positions where the continuations part although the reference's top
    two are not nearly tied (empty: they agree as far as they must)."""
    problems = []
    for i, (ref, cand) in enumerate(
        zip(reference["greedy"], candidate["greedy"], strict=True)
    ):
        for pos, (a, b) in enumerate(zip(ref["tokens"], cand["tokens"], strict=True)):
            if a == b:
                continue
            top = ref["top2"][pos]
            margin = top[0] - top[1] if len(top) > 1 else math.inf
            if margin >= tolerance.near_tie:
                problems.append(
                    f"prompt {i}, token {pos}: {a} vs {b}, reference margin "
                    f"{margin:.3f} nats (not a near-tie)"
                )
            break
    return problems


def first_divergences(reference: dict, candidate: dict) -> list[int | None]:
    out = []
    for ref, cand in zip(reference["greedy"], candidate["greedy"], strict=True):
        pos = next(
            (
                p
                for p, (a, b) in enumerate(
                    zip(ref["tokens"], cand["tokens"], strict=False)
                )
                if a != b
            ),
            None,
        )
        out.append(pos)
    return out
