"""Paired comparison of two models on the same prompts: accuracy difference with a
bootstrap interval, and McNemar's exact test on the discordant prompts."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Paired:
    n: int
    base_accuracy: float
    adapter_accuracy: float
    delta: float  # adapter - base
    ci_low: float
    ci_high: float
    only_adapter: int  # prompts the adapter gets right and the base wrong
    only_base: int
    p_value: float  # McNemar exact, two-sided


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: under H0 the b + c discordant prompts split
    Binomial(b + c, 1/2); p = 2 P(X <= min(b, c)), capped at 1."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(base: list[bool], adapter: list[bool], *, resamples: int = 10_000, seed: int = 0) -> Paired:
    """Compare per-prompt correctness of ``base`` and ``adapter`` (same prompts, same order).
    The 95% interval of the accuracy difference is the percentile bootstrap over prompts."""
    if len(base) != len(adapter) or not base:
        raise ValueError("base and adapter: the same non-zero number of prompts")
    n = len(base)
    diffs = [int(a) - int(b) for a, b in zip(adapter, base, strict=True)]
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo, hi = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    only_adapter = sum(d == 1 for d in diffs)
    only_base = sum(d == -1 for d in diffs)
    return Paired(
        n=n,
        base_accuracy=sum(base) / n,
        adapter_accuracy=sum(adapter) / n,
        delta=sum(diffs) / n,
        ci_low=lo,
        ci_high=hi,
        only_adapter=only_adapter,
        only_base=only_base,
        p_value=mcnemar_exact(only_adapter, only_base),
    )
