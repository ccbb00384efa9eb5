"""Beta-Bernoulli Thompson sampling, pure functions over posterior parameters.

Prior Beta(1, 1); a fractional reward r in [0, 1] adds r to alpha and 1 - r to beta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Draws used to estimate the probability the policy had of choosing each arm.
PROPENSITY_DRAWS = 2000


@dataclass(frozen=True)
class BetaSummary:
    mean: float
    ci_low: float
    ci_high: float


def summarize(alpha: float, beta: float) -> BetaSummary:
    """Posterior mean and normal-approximation 95% interval, clipped to [0, 1]."""
    total = alpha + beta
    mean = alpha / total
    half = 1.96 * math.sqrt(alpha * beta / (total * total * (total + 1)))
    return BetaSummary(mean, max(0.0, mean - half), min(1.0, mean + half))


def choose(
    alphas: np.ndarray, betas: np.ndarray, rng: np.random.Generator, exploration_floor: float = 0.0
) -> tuple[int, float]:
    """Pick an arm by Thompson sampling; return (index, probability of that choice).

    The probability is estimated from the same posterior by Monte Carlo and mixed with
    the exploration floor exactly as the choice is, so logged propensities are honest
    inputs for off-policy evaluation.
    """
    n = len(alphas)
    if n == 0:
        raise ValueError("no arms to choose from")
    if exploration_floor > 0 and rng.random() < exploration_floor * n:
        chosen = int(rng.integers(n))
    else:
        chosen = int(np.argmax(rng.beta(alphas, betas)))
    wins = np.bincount(np.argmax(rng.beta(alphas, betas, size=(PROPENSITY_DRAWS, n)), axis=1), minlength=n)
    p_ts = (wins[chosen] + 1) / (PROPENSITY_DRAWS + n)  # add-one so no logged propensity is 0
    mix = min(1.0, exploration_floor * n)
    return chosen, float(mix / n + (1 - mix) * p_ts)


def combine_reward(reward: float | None, signals: dict[str, float], weights: dict[str, float]) -> float:
    """The scalar reward, or the weighted mean of the signals present (a missing signal is
    not a zero). Signals without a weight count with weight 1 when no weights are set."""
    if reward is not None:
        return reward
    present = {k: v for k, v in signals.items() if not weights or k in weights}
    if not present:
        raise ValueError("feedback has no reward and none of the endpoint's signals")
    total_weight = sum(weights.get(k, 1.0) for k in present)
    if total_weight <= 0:
        raise ValueError("signal weights of the present signals sum to zero")
    return sum(v * weights.get(k, 1.0) for k, v in present.items()) / total_weight
