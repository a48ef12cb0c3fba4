"""Paired significance of two configurations' scores on the same inputs.

- `mcnemar`: correct / incorrect scores (the Prompt Choreography paper's test):
  the exact two-sided binomial test on the discordant pairs (b: only A correct,
  c: only B correct), p = min(1, 2 * P[X <= min(b, c)]) with X ~ Bin(b + c, 1/2).
- `paired_bootstrap`: continuous scores: the mean difference B - A, a 95% interval
  from resampling the pairs, and a two-sided p-value (twice the share of
  resampled differences on the other side of zero, at most 1).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    test: str  # "mcnemar" or "bootstrap"
    a: float  # mean score of A (accuracy for bools)
    b: float
    p: float
    detail: dict

    @property
    def significant(self) -> bool:
        return self.p <= 0.05


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> Comparison:
    _check(a, b)
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    n, k = only_a + only_b, min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n if n else 1.0
    p = min(1.0, 2 * tail)
    return Comparison(
        "mcnemar", sum(a) / len(a), sum(b) / len(b), p, dict(only_a=only_a, only_b=only_b)
    )


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, samples: int = 10_000, seed: int = 0
) -> Comparison:
    _check(a, b)
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    rng, n = random.Random(seed), len(diffs)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(samples))
    mean = sum(diffs) / n
    below = sum(m <= 0 for m in means) / samples
    above = sum(m >= 0 for m in means) / samples
    p = min(1.0, 2 * min(below, above))
    low, high = means[int(0.025 * samples)], means[int(0.975 * samples) - 1]
    return Comparison(
        "bootstrap", sum(a) / n, sum(b) / n, p, dict(mean_diff=mean, low=low, high=high)
    )


def compare(a: Sequence[bool | float], b: Sequence[bool | float]) -> Comparison:
    """McNemar for bool scores, the paired bootstrap otherwise."""
    if all(isinstance(x, bool) for x in (*a, *b)):
        return mcnemar(a, b)  # type: ignore[arg-type]
    return paired_bootstrap([float(x) for x in a], [float(x) for x in b])


def _check(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b) or not a:
        raise ValueError(f"paired scores need the same inputs: got {len(a)} and {len(b)}")
