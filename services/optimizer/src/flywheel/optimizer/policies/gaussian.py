"""Gaussian rewards with unknown mean and variance: the Normal-Inverse-Gamma posterior.

Model per arm: reward ~ N(mu, sigma^2), with the conjugate prior

    sigma^2 ~ InvGamma(a0, b0),   mu | sigma^2 ~ N(m0, sigma^2 / kappa0).

Sufficient statistics per arm are additive, so the service keeps them as SQL increments:
n (count), s (sum of rewards) and ss (sum of squared rewards). With discounting (see
`drift`) all three are multiplied by the same factor, so they stay consistent and may be
fractional; every formula here accepts fractional n, including n = 0 (prior only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import stdtrit

from flywheel.optimizer.policies.summary import Summary


@dataclass(frozen=True)
class NigPrior:
    """Normal-Inverse-Gamma prior; the defaults are weak and assume rewards of unit scale.

    - ``mean = 0.0``, ``kappa = 0.01``: the prior mean counts as 1/100 of an observation,
      so one real reward outweighs it a hundredfold; an arm with no data draws means
      spread over tens of reward units, so untried arms get tried first.
    - ``a = 1.0``, ``b = 1.0``: one pseudo-observation's worth of belief that the reward
      variance is about 1 (E[1/sigma^2] = a/b = 1). Overestimating the variance early
      only costs exploration; underestimating it (vague a, b -> 0) lets two equal
      rewards look certain and lock an arm in. For rewards in [0, 1] (variance <= 0.25)
      these defaults are conservative; for another scale use `NigPrior.for_scale`.

    Fields may also be arrays (one prior per arm), as `segments` produces.
    """

    mean: float | np.ndarray = 0.0
    kappa: float | np.ndarray = 0.01
    a: float | np.ndarray = 1.0
    b: float | np.ndarray = 1.0

    @classmethod
    def for_scale(cls, sigma: float, *, mean: float = 0.0) -> NigPrior:
        """The default prior for rewards whose noise is about ``sigma``."""
        if sigma <= 0:
            raise ValueError("sigma must be positive")
        return cls(mean=mean, kappa=0.01, a=1.0, b=float(sigma) ** 2)


@dataclass(frozen=True)
class NigPosterior:
    """Posterior parameters (arrays with one entry per arm, or floats)."""

    mean: np.ndarray
    kappa: np.ndarray
    a: np.ndarray
    b: np.ndarray


def posterior(n: np.ndarray | float, s: np.ndarray | float, ss: np.ndarray | float, prior: NigPrior) -> NigPosterior:
    """Conjugate update of ``prior`` with (possibly fractional) statistics n, s, ss.

    kappa_n = kappa0 + n, mean_n = (kappa0 m0 + s) / kappa_n, a_n = a0 + n/2,
    b_n = b0 + (ss - s^2/n)/2 + kappa0 n (s/n - m0)^2 / (2 kappa_n).
    """
    n_ = np.asarray(n, dtype=float)
    s_ = np.asarray(s, dtype=float)
    ss_ = np.asarray(ss, dtype=float)
    if np.any(n_ < 0):
        raise ValueError("n must be >= 0")
    kappa_n = prior.kappa + n_
    mean_n = (prior.kappa * prior.mean + s_) / kappa_n
    a_n = prior.a + 0.5 * n_
    has = n_ > 0
    safe_n = np.where(has, n_, 1.0)
    centered = np.where(has, np.maximum(ss_ - s_ * s_ / safe_n, 0.0), 0.0)
    shift = np.where(has, prior.kappa * (s_ - n_ * prior.mean) ** 2 / (safe_n * kappa_n), 0.0)
    b_n = prior.b + 0.5 * centered + 0.5 * shift
    return NigPosterior(mean_n, kappa_n, a_n, b_n)


def summarize(n: float, s: float, ss: float, prior: NigPrior | None = None) -> Summary:
    """Posterior mean of mu and its 95% interval from the Student-t marginal

    mu ~ t_{2 a_n}(mean_n, b_n / (a_n kappa_n)). Not clipped: Gaussian rewards are unbounded.
    """
    post = posterior(n, s, ss, prior or NigPrior())
    mean = float(post.mean)
    scale = float(np.sqrt(post.b / (post.a * post.kappa)))
    half = float(stdtrit(2.0 * float(post.a), 0.975)) * scale  # Student-t quantile
    return Summary(mean, mean - half, mean + half)


def draws(
    n: np.ndarray,
    s: np.ndarray,
    ss: np.ndarray,
    prior: NigPrior,
    rng: np.random.Generator,
    m: int,
) -> np.ndarray:
    """m joint draws of every arm's mean reward mu, shape (m, k).

    sigma^2 ~ InvGamma(a_n, b_n) (as b_n / Gamma(a_n, 1)), then mu ~ N(mean_n, sigma^2 / kappa_n).
    """
    post = posterior(n, s, ss, prior)
    k = np.shape(post.mean)[0]
    sigma2 = post.b / rng.gamma(post.a, 1.0, size=(m, k))
    return post.mean + np.sqrt(sigma2 / post.kappa) * rng.standard_normal((m, k))
