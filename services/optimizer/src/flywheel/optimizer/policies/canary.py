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
    promote_probability, "retire" when it is <= retire_probability, else "continue".

    Both verdicts need ``min_pulls``: a canary retired after three unlucky pulls is a wrong
    rollback as often as not. `trial_shares` makes sure a canary reaches ``min_pulls``."""
    if not 0 <= retire_probability < promote_probability <= 1:
        raise ValueError("need 0 <= retire_probability < promote_probability <= 1")
    if canary_pulls < min_pulls:
        return "continue"
    if p_better >= promote_probability:
        return "promote"
    if p_better <= retire_probability:
        return "retire"
    return "continue"


def trial_shares(p: np.ndarray, on_trial: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Selection probabilities with every canary on trial given exactly its trial share.

    A canary is on trial until it has ``min_pulls`` pulls. Thompson sampling alone starves a
    canary that looks worse after a few unlucky pulls, so its verdict would rest on a handful
    of pulls or never come; a fixed trial share (the classic canary rollout) gets it to
    ``min_pulls`` at a known rate, after which the posterior decides. The other arms keep
    their relative probabilities and share what is left.
    """
    p = np.asarray(p, dtype=float)
    trial = np.asarray(on_trial, dtype=bool)
    if not trial.any():
        return p
    given = np.where(trial, np.asarray(shares, dtype=float), 0.0)
    total_given = float(given.sum())
    if total_given >= 1.0:
        given = given / total_given
        total_given = 1.0
    rest = np.where(trial, 0.0, p)
    rest_sum = float(rest.sum())
    if rest_sum > 0:
        return rest * (1.0 - total_given) / rest_sum + given
    return given / total_given
