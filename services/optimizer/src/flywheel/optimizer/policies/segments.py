"""Per-segment posteriors that borrow a capped amount of strength from the endpoint.

A segment (say, ``lang=de``) sees a slice of an endpoint's traffic. Its posterior is a
prior built from the endpoint's posterior, worth at most ``strength`` pseudo-observations
(fewer when the endpoint itself has less evidence), plus the segment's own evidence. A
young segment starts from what the endpoint knows; an old one is ruled by its own data.
"""

from __future__ import annotations

import numpy as np

from flywheel.optimizer.policies.beta import PRIOR_ALPHA, PRIOR_BETA
from flywheel.optimizer.policies.gaussian import NigPrior, posterior


def beta_prior_from_endpoint(
    ep_alpha: np.ndarray | float, ep_beta: np.ndarray | float, strength: float
) -> tuple[np.ndarray, np.ndarray]:
    """(alpha0, beta0) with the endpoint posterior's mean and w = min(strength, ep_alpha + ep_beta)
    pseudo-pulls, per arm.

    With no endpoint evidence (Beta(1, 1)) and strength >= 2 this is Beta(1, 1) again.
    """
    if strength <= 0:
        raise ValueError("strength must be positive")
    a = np.asarray(ep_alpha, dtype=float)
    b = np.asarray(ep_beta, dtype=float)
    total = a + b
    weight = np.minimum(strength, total)
    return weight * a / total, weight * b / total


def beta_segment_posterior(
    ep_alpha: np.ndarray | float,
    ep_beta: np.ndarray | float,
    seg_alpha: np.ndarray | float,
    seg_beta: np.ndarray | float,
    strength: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The segment posterior: the borrowed prior plus the segment's own evidence (alpha - 1, beta - 1).

    ``seg_alpha``/``seg_beta`` are the segment's stored parameters (prior Beta(1, 1) included,
    as the service stores them).
    """
    alpha0, beta0 = beta_prior_from_endpoint(ep_alpha, ep_beta, strength)
    seg_a = np.asarray(seg_alpha, dtype=float) - PRIOR_ALPHA
    seg_b = np.asarray(seg_beta, dtype=float) - PRIOR_BETA
    return alpha0 + seg_a, beta0 + seg_b


def gaussian_prior_from_endpoint(
    ep_n: np.ndarray | float,
    ep_s: np.ndarray | float,
    ep_ss: np.ndarray | float,
    strength: float,
    base: NigPrior | None = None,
) -> NigPrior:
    """A NIG prior per arm: ``base`` updated with the endpoint's statistics scaled down to at most
    ``strength`` observations.

    Scaling n, s and ss by one factor f = min(1, strength / n) keeps the endpoint's mean
    and variance estimates and caps how much they count (the same trick as discounting).
    The segment posterior is then ``gaussian.posterior(seg_n, seg_s, seg_ss, prior)``.
    """
    if strength <= 0:
        raise ValueError("strength must be positive")
    base = base or NigPrior()
    n = np.asarray(ep_n, dtype=float)
    s = np.asarray(ep_s, dtype=float)
    ss = np.asarray(ep_ss, dtype=float)
    f = np.where(n > strength, strength / np.where(n > 0, n, 1.0), 1.0)
    post = posterior(f * n, f * s, f * ss, base)
    return NigPrior(mean=post.mean, kappa=post.kappa, a=post.a, b=post.b)
