"""Per-segment posteriors that borrow strength from the other segments, only as much as the
data show the segments agree (empirical Bayes with a confidence bound).

A segment (say, ``lang=de``) sees a slice of an endpoint's traffic. Its posterior is a prior
learnt from the *other* segments plus the segment's own evidence. `segment_priors` sets the
prior per arm from a table of every group's own statistics (the cached segments, and the
endpoint's remainder as one more group):

1. **How much the segments differ.** For one arm, group j has ``n_j`` (effective) pulls and
   mean ``y_j``; ``v_j = sigma2 / n_j`` is the noise of that mean (``sigma2``: the Bernoulli
   variance mu (1 - mu) of the pooled mean for Beta endpoints, the pooled within-group variance
   for Gaussian ones). The arm's true mean varies between segments with variance ``tau2``.
   Cochran's statistic

       Q(tau2) = sum_j (y_j - ybar(tau2))^2 / (v_j + tau2),  ybar: the same weights' mean

   follows a chi-square law with J - 1 degrees of freedom at the true tau2 (Q-profile method).
   The rule uses the **upper** confidence bound ``tau2_hi``: the tau2 where Q equals the
   ``alpha`` quantile of chi2(J - 1) (``alpha = 0.05``: a 95% bound), 0 when even Q(0) is
   below it. With few segments or little data the bound is wide, so a segment borrows little
   until the data show the segments agree; with many alike segments it shrinks to about 0.
2. **Prior weight** in pseudo-observations: the number of observations whose noise equals that
   spread, ``m = sigma2 / tau2_hi`` (for Beta, the Beta law of means with variance tau2_hi:
   ``m = mu (1 - mu) / tau2_hi - 1``), then

       strength = min(cap, m, the other groups' pulls)

   with ``cap`` the endpoint's ``segment_prior_strength``. Alike segments borrow the full cap;
   segments that really differ borrow a fraction of a pseudo-observation or none. One group
   alone (nothing to compare with) borrows nothing.
3. **Prior mean**: the other groups' means weighted by 1 / (v_j + tau2_hi), leaving the
   segment's own data out. When segments differ every segment counts about the same, so an
   arm pulled a lot only where it is good does not look good everywhere (the pooled endpoint
   mean would make it look so).

The prior is returned as pseudo-statistics (w, s, ss) = (strength, strength * mu,
strength * (mu^2 + sigma2)) that add to the segment's own statistics, so a segment's posterior
is the usual `beta`/`gaussian` posterior of the sum. Why a bound and not the point estimate:
on a bandit's data, borrowing even a few pseudo-observations from segments with other best
arms costs regret early (their arm looks good here until this segment's data say otherwise),
while alike segments lose little by waiting for the evidence (tests/test_policies_segment_borrowing.py
measures both against one Thompson sampler per segment).

The older fixed rule (the endpoint's posterior capped at ``strength`` pseudo-observations,
whatever the segments look like) stays below as `beta_prior_from_endpoint` and
`gaussian_prior_from_endpoint`; it loses to independent per-segment samplers when segments
have different best arms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.stats import chi2

from flywheel.optimizer.policies.beta import PRIOR_ALPHA, PRIOR_BETA
from flywheel.optimizer.policies.gaussian import NigPrior, posterior

# The confidence bound on the between-segment variance: tau2_hi is its 1 - ALPHA upper bound.
ALPHA = 0.05
_TINY = 1e-12
_BISECT_STEPS = 30


@dataclass(frozen=True)
class SegmentPriors:
    """Borrowed pseudo-statistics per group and arm (shape (..., J, k)); per arm (..., k) the
    upper bound ``tau2_hi`` on the between-segment variance (inf: fewer than two groups), the
    reward noise ``sigma2`` and the weight ``m`` before the cap."""

    w: np.ndarray
    s: np.ndarray
    ss: np.ndarray
    tau2_hi: np.ndarray
    sigma2: np.ndarray
    m: np.ndarray


def segment_priors(
    w: np.ndarray,
    s: np.ndarray,
    ss: np.ndarray,
    cap: float,
    kind: Literal["beta", "gaussian"] = "beta",
    *,
    alpha: float = ALPHA,
) -> SegmentPriors:
    """Each group's prior, borrowed from the other groups as much as they provably agree
    (the rule is in the module docstring).

    Args:
        w, s, ss: every group's own statistics (effective count, reward sum, sum of squares),
            shape (..., J, k): J groups, k arms; leading axes are independent tables.
        cap: the most pseudo-observations a prior may count (``segment_prior_strength``), > 0.
        kind: "beta" (rewards in [0, 1]) or "gaussian".
        alpha: tau2_hi is the (1 - alpha) upper confidence bound, 0 < alpha < 1.
    """
    if cap <= 0:
        raise ValueError("cap must be positive")
    if kind not in ("beta", "gaussian"):
        raise ValueError(f"unknown kind {kind!r}")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    w = np.maximum(np.asarray(w, dtype=float), 0.0)
    s = np.asarray(s, dtype=float)
    ss = np.asarray(ss, dtype=float)
    has = w > 1e-9
    safe_w = np.where(has, w, 1.0)
    mean_j = np.where(has, s / safe_w, 0.0)
    big_n = w.sum(axis=-2)
    groups = has.sum(axis=-2)
    if kind == "beta":
        mu = (s.sum(axis=-2) + PRIOR_ALPHA) / (big_n + PRIOR_ALPHA + PRIOR_BETA)
        sigma2 = mu * (1.0 - mu)
    else:
        within = np.maximum(np.where(has, ss - s * s / safe_w, 0.0), 0.0).sum(axis=-2)
        sigma2 = np.maximum(within / np.maximum(big_n - groups, 1.0), _TINY)
    noise = np.where(has, sigma2[..., None, :] / safe_w, 0.0)  # variance of each group's mean

    def cochran_q(tau2: np.ndarray) -> np.ndarray:
        weight = np.where(has, 1.0 / (noise + tau2[..., None, :] + _TINY), 0.0)
        centre = (weight * mean_j).sum(axis=-2) / np.maximum(weight.sum(axis=-2), _TINY)
        return (weight * (mean_j - centre[..., None, :]) ** 2).sum(axis=-2)

    target = chi2.ppf(alpha, np.maximum(groups - 1, 1))
    # Q falls as tau2 grows: bisect (on a log scale) for Q(tau2) = target.
    spread = np.where(has, mean_j, 0.0)
    top = np.maximum((spread.max(axis=-2) - np.where(has, mean_j, np.inf).min(axis=-2)) ** 2, _TINY)
    hi = np.where(groups >= 2, 4.0 * top + sigma2, 1.0)
    lo = np.full_like(hi, 1e-10)
    for _ in range(_BISECT_STEPS):
        mid = np.sqrt(lo * hi)
        above = cochran_q(mid) > target
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    tau2_hi = np.where(cochran_q(np.zeros_like(hi)) <= target, 0.0, hi)
    tau2_hi = np.where(groups >= 2, tau2_hi, np.inf)
    finite = np.isfinite(tau2_hi)
    t2 = np.where(finite, tau2_hi, 0.0)
    with np.errstate(divide="ignore"):
        m = sigma2 / np.where(t2 > _TINY, t2, 0.0) - (1.0 if kind == "beta" else 0.0)
    m = np.where(finite, np.where(t2 > _TINY, np.maximum(m, 0.0), np.inf), 0.0)
    # Leave-one-out mean of the other groups, each weighted by 1 / (its noise + tau2_hi).
    precision = np.where(has, 1.0 / (noise + t2[..., None, :] + _TINY), 0.0)
    total_p = precision.sum(axis=-2, keepdims=True) - precision
    total_pm = (precision * mean_j).sum(axis=-2, keepdims=True) - precision * mean_j
    others = big_n[..., None, :] - w
    borrow = (total_p > _TINY) & (others > 1e-9)
    mu_j = np.where(borrow, total_pm / np.where(borrow, total_p, 1.0), 0.0)
    strength = np.where(borrow, np.minimum(np.minimum(cap, m[..., None, :]), others), 0.0)
    return SegmentPriors(
        w=strength,
        s=strength * mu_j,
        ss=strength * (mu_j * mu_j + sigma2[..., None, :]),
        tau2_hi=tau2_hi,
        sigma2=sigma2,
        m=m,
    )


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
