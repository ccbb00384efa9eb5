"""Posteriors of one endpoint's arms from their additive statistics, for each policy kind.

Statistics per arm: effective count ``w``, reward sum ``s`` and sum of squares ``ss``
(and ``xtx``/``xty`` for linear TS). A Beta posterior is Beta(1 + s, 1 + w - s); a
Gaussian one is Normal-Inverse-Gamma over (w, s, ss). A segment borrows the endpoint's
statistics scaled down to at most ``strength`` pulls, which is the same as a prior with
the endpoint's mean and that many pseudo-pulls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flywheel.optimizer.policies import beta, gaussian, linear
from flywheel.optimizer.spec import BETA, GAUSSIAN, LINEAR, PolicyConfig

GAUSSIAN_PRIOR = gaussian.NigPrior()


@dataclass(frozen=True)
class Stats:
    """Additive sufficient statistics of k arms."""

    w: np.ndarray
    s: np.ndarray
    ss: np.ndarray
    xtx: np.ndarray | None = None  # (k, d, d)
    xty: np.ndarray | None = None  # (k, d)

    @classmethod
    def zeros(cls, k: int, d: int = 0) -> Stats:
        return cls(
            np.zeros(k), np.zeros(k), np.zeros(k), np.zeros((k, d, d)) if d else None, np.zeros((k, d)) if d else None
        )

    def with_borrowed(self, endpoint: Stats, strength: float) -> Stats:
        """This segment's evidence plus the endpoint's, scaled to at most ``strength`` pulls."""
        scale = np.minimum(1.0, strength / np.maximum(endpoint.w, 1e-12))
        return Stats(self.w + scale * endpoint.w, self.s + scale * endpoint.s, self.ss + scale * endpoint.ss)


def beta_params(stats: Stats) -> tuple[np.ndarray, np.ndarray]:
    return 1.0 + stats.s, 1.0 + np.maximum(stats.w - stats.s, 0.0)


def draws(
    policy: PolicyConfig, stats: Stats, rng: np.random.Generator, m: int, x: np.ndarray | None = None
) -> np.ndarray:
    """``m`` joint posterior draws of every arm's expected reward, shape (m, k)."""
    if policy.kind == BETA:
        a, b = beta_params(stats)
        return beta.draws(a, b, rng, m)
    if policy.kind == GAUSSIAN:
        return gaussian.draws(stats.w, stats.s, stats.ss, GAUSSIAN_PRIOR, rng, m)
    if policy.kind == LINEAR:
        assert stats.xtx is not None and stats.xty is not None and x is not None
        return linear.draws(stats.xtx, stats.xty, x, policy.ridge_lambda, rng, m)
    raise ValueError(f"unknown policy kind {policy.kind!r}")


def summaries(policy: PolicyConfig, stats: Stats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Posterior mean of each arm's reward and its 95% interval (context-free)."""
    if policy.kind == BETA:
        items = [beta.summarize(a, b) for a, b in zip(*beta_params(stats), strict=True)]
    else:
        # Linear endpoints report the context-free mean reward of each arm.
        items = [
            gaussian.summarize(n, s, ss, GAUSSIAN_PRIOR) for n, s, ss in zip(stats.w, stats.s, stats.ss, strict=True)
        ]
    return (
        np.array([i.mean for i in items]),
        np.array([i.ci_low for i in items]),
        np.array([i.ci_high for i in items]),
    )
