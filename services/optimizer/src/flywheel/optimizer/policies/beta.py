"""Beta-Bernoulli posteriors with fractional rewards.

Prior Beta(1, 1). A reward r in [0, 1] adds r to alpha and 1 - r to beta, which is the
exact conjugate update for r in {0, 1} and the standard "fractional" update otherwise
(the posterior mean tracks the running mean of r). The service applies the same update
as a SQL increment, so concurrent writers never lose an update.
"""

from __future__ import annotations

import math

import numpy as np

from flywheel.optimizer.policies.summary import Summary

PRIOR_ALPHA = 1.0
PRIOR_BETA = 1.0
Z95 = 1.96


def clip_reward(reward: float) -> float:
    """Clamp a reward to [0, 1]; NaN is rejected (the service dead-letters it)."""
    if math.isnan(reward):
        raise ValueError("reward is NaN")
    return min(1.0, max(0.0, reward))


def increments(reward: float) -> tuple[float, float]:
    """(delta_alpha, delta_beta) for one reward: (r, 1 - r) after clamping."""
    r = clip_reward(reward)
    return r, 1.0 - r


def summarize(alpha: float, beta: float) -> Summary:
    """Posterior mean alpha/(alpha+beta) and the normal-approximation 95% interval

    mean +- 1.96 * sqrt(alpha*beta / ((alpha+beta)^2 (alpha+beta+1))), clipped to [0, 1].
    """
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"Beta parameters must be positive, got ({alpha}, {beta})")
    total = alpha + beta
    mean = alpha / total
    half = Z95 * math.sqrt(alpha * beta / (total * total * (total + 1.0)))
    return Summary(mean, max(0.0, mean - half), min(1.0, mean + half))


def draws(alpha: np.ndarray, beta: np.ndarray, rng: np.random.Generator, m: int) -> np.ndarray:
    """m joint posterior draws of every arm's success rate, shape (m, k)."""
    a = np.asarray(alpha, dtype=float)
    b = np.asarray(beta, dtype=float)
    return rng.beta(a, b, size=(m, a.shape[0]))
