"""Canary decisions: does the new arm beat the incumbent, by posterior probability."""

from __future__ import annotations

from typing import Literal

import numpy as np

Verdict = Literal["promote", "retire", "continue"]


def probability_better(draws_canary: np.ndarray, draws_incumbent: np.ndarray) -> float:
    """P(canary > incumbent) from paired posterior draws of shape (m,); a tie counts one half."""
    c = np.asarray(draws_canary, dtype=float)
    i = np.asarray(draws_incumbent, dtype=float)
    if c.shape != i.shape or c.ndim != 1 or c.shape[0] == 0:
        raise ValueError("need two non-empty draw vectors of the same length")
    return float(np.mean(c > i) + 0.5 * np.mean(c == i))


def canary_verdict(
    p_better: float,
    canary_pulls: float,
    *,
    min_pulls: float = 30,
    promote_probability: float = 0.95,
    retire_probability: float = 0.05,
) -> Verdict:
    """ "continue" until the canary has min_pulls; then "promote" when P(better) >=
    promote_probability, "retire" when it is <= retire_probability, else "continue"."""
    if not 0 <= retire_probability < promote_probability <= 1:
        raise ValueError("need 0 <= retire_probability < promote_probability <= 1")
    if canary_pulls < min_pulls:
        return "continue"
    if p_better >= promote_probability:
        return "promote"
    if p_better <= retire_probability:
        return "retire"
    return "continue"
