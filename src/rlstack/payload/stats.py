"""Statistics for accuracy and paired comparisons, exact and dependency-free (no scipy in the images).

- Wilson score interval for one accuracy.
- Exact McNemar test: on the same questions only the discordant pairs (b: base right/tuned wrong, c: the reverse)
  carry information; under H0 each is a fair coin, so p = P(Binomial(b+c, 1/2) as extreme as observed), two-sided.
- Paired bootstrap CI of the accuracy delta (resampling questions, seeded).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n."""
    if n <= 0:
        raise ValueError("n must be positive")
    if not 0 <= k <= n:
        raise ValueError("k must be within 0..n")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At k = 0 or k = n a bound is exactly 0 or 1; float rounding would otherwise leave 0.9999999999999999.
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: 2 * P(X <= min(b, c)), X ~ Binomial(b + c, 1/2), capped at 1."""
    if b < 0 or c < 0:
        raise ValueError("counts must be non-negative")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    # Exact integer arithmetic until the final division, so large n does not lose the tail to rounding.
    return min(1.0, 2 * tail / 2**n)


def bootstrap_delta_ci(base: Sequence[bool], tuned: Sequence[bool], *, iters: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of mean(tuned) - mean(base), resampling question indices with replacement."""
    n = len(base)
    if n == 0 or n != len(tuned):
        raise ValueError("need two equally long, non-empty outcome lists")
    diffs = [int(t) - int(b) for b, t in zip(base, tuned, strict=True)]
    rng = random.Random(seed)
    stats = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(iters))
    lo_i = math.floor((1 - level) / 2 * iters)
    hi_i = min(iters - 1, math.ceil((1 + level) / 2 * iters) - 1)
    return stats[lo_i], stats[hi_i]


@dataclass(frozen=True)
class Paired:
    n: int
    base_correct: int
    tuned_correct: int
    base_only: int  # b: base right, tuned wrong
    tuned_only: int  # c: tuned right, base wrong
    delta: float  # accuracy points as a fraction (0.0766 = +7.66 pts)
    p_value: float
    ci: tuple[float, float]


def paired(base: Sequence[bool], tuned: Sequence[bool], *, iters: int = 10_000, seed: int = 0) -> Paired:
    b = sum(1 for x, y in zip(base, tuned, strict=True) if x and not y)
    c = sum(1 for x, y in zip(base, tuned, strict=True) if y and not x)
    n = len(base)
    return Paired(
        n=n,
        base_correct=sum(map(bool, base)),
        tuned_correct=sum(map(bool, tuned)),
        base_only=b,
        tuned_only=c,
        delta=(c - b) / n,
        p_value=mcnemar_exact(b, c),
        ci=bootstrap_delta_ci(base, tuned, iters=iters, seed=seed),
    )
