"""What the per-test-case scores say about each candidate: case-adjusted means, posteriors and
the racing test.

Every candidate is scored on a prefix of one shared random order of the test cases, so two
candidates are compared on the same cases (paired), and a case's difficulty cancels out. The
"true score" of a config is its mean over all N test cases; a candidate scored on n of them
has a posterior whose variance carries the finite-population correction (N - n) / (N - 1):
a candidate scored on every case is known exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

# How the racing test treats its repeated looks at one candidate (SearchSettings.racing_sequential)
SEQUENTIAL = ("none", "bonferroni", "spending", "mixture")


@dataclass(frozen=True)
class Posterior:
    mean: np.ndarray  # shrunk, case-adjusted mean score per candidate
    var: np.ndarray  # posterior variance of the true score
    raw_mean: np.ndarray  # plain mean of the scores seen
    noise_var: float  # pooled per-case residual variance


def case_effects(matrix: np.ndarray, mask: np.ndarray, iters: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Additive two-way fit score[c, j] ~ a[c] + d[j] on the observed cells (d centred)."""
    a = np.where(mask.any(1), (matrix * mask).sum(1) / np.maximum(mask.sum(1), 1), 0.0)
    d = np.zeros(matrix.shape[1])
    for _ in range(iters):
        resid_j = (matrix - a[:, None]) * mask
        d = np.where(mask.any(0), resid_j.sum(0) / np.maximum(mask.sum(0), 1), 0.0)
        seen = mask.any(0)
        if seen.any():
            d[seen] -= d[seen].mean()
        resid_c = (matrix - d[None, :]) * mask
        a = np.where(mask.any(1), resid_c.sum(1) / np.maximum(mask.sum(1), 1), 0.0)
    return a, d


def posterior(matrix: np.ndarray, mask: np.ndarray, n_cases: int, prior_var: float | None = None) -> Posterior:
    """Posterior of each candidate's true score (rows with no score get the population prior)."""
    n = mask.sum(1)
    a, d = case_effects(matrix, mask)
    raw = np.where(n > 0, (matrix * mask).sum(1) / np.maximum(n, 1), np.nan)
    resid = (matrix - a[:, None] - d[None, :]) * mask
    dof = int(mask.sum()) - int((n > 0).sum()) - max(0, int(mask.any(0).sum()) - 1)
    noise_var = float((resid**2).sum() / dof) if dof > 0 else 0.0
    seen = n > 0
    mu0 = float(a[seen].mean()) if seen.any() else 0.0
    tau2 = float(a[seen].var()) if seen.sum() > 1 else 0.0
    if prior_var is not None:
        tau2 = max(tau2, prior_var)
    tau2 = max(tau2, noise_var, 1e-12)
    fpc = np.where(n_cases > 1, (n_cases - n) / max(n_cases - 1, 1), 0.0)
    like_var = np.where(n > 0, noise_var / np.maximum(n, 1) * fpc, np.inf)
    # normal-normal shrinkage toward the population: exact where every case was scored
    with np.errstate(divide="ignore"):
        like_prec = np.where(n > 0, 1.0 / np.maximum(like_var, 1e-300), 0.0)
    exact = (n > 0) & (like_var <= 1e-15)
    prec = 1.0 / tau2 + np.where(exact, 0.0, like_prec)
    mean = np.where(exact, a, (mu0 / tau2 + np.where(exact, 0.0, like_prec) * a) / prec)
    var = np.where(exact, 0.0, 1.0 / prec)
    return Posterior(mean=mean, var=var, raw_mean=raw, noise_var=noise_var)


def confidently_worse(diffs: np.ndarray, *, confidence: float, pooled_var: float, n_cases: int) -> bool:
    """Racing's drop rule: the paired differences (candidate - leader) on their common cases put
    the candidate below the leader with one-sided ``confidence``. A pooled variance enters as
    two pseudo-observations, so a few identical differences do not look certain."""
    n = len(diffs)
    if n >= n_cases:  # both scored on every case: the true scores are known
        return bool(diffs.mean() < 0)
    if n < 2:
        return False
    var = (float(diffs.var(ddof=1)) * (n - 1) + 2.0 * pooled_var) / (n + 1)
    fpc = (n_cases - n) / (n_cases - 1) if n_cases > 1 else 1.0
    se = math.sqrt(max(var, 1e-12) / n * fpc)
    t = float(special.stdtrit(n - 1, confidence))
    return bool(diffs.mean() + t * se < 0)


def racing_looks(min_cases: int, growth: float, n_cases: int) -> list[int]:
    """The case counts at which the rung-end race tests a candidate, before it has every case:
    ``min_cases``, then each rung ``max(n + 1, ceil(n * growth))`` while below ``n_cases``."""
    looks, n = [], min(min_cases, n_cases)
    while n < n_cases:
        looks.append(n)
        n = min(n_cases, max(n + 1, math.ceil(n * growth)))
    return looks


def _obf_spent(fraction: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending: the error spent by information ``fraction``."""
    if fraction <= 0:
        return 0.0
    return float(2.0 * (1.0 - special.ndtr(special.ndtri(1.0 - alpha / 2.0) / math.sqrt(min(fraction, 1.0)))))


def look_confidence(n: int, looks: list[int], confidence: float, method: str) -> float:
    """The one-sided confidence one look at ``n`` cases needs so that the chance of ever dropping
    a candidate that is not worse, over all of ``looks``, stays within ``1 - confidence``.

    ``none``: ``confidence`` at every look (the error grows with the looks). ``bonferroni``: the
    error split evenly over the looks. ``spending``: each look gets the increment of an O'Brien-
    Fleming-type spending function of ``n / looks[-1]``, strict early and loose late (its sum over
    the looks is ``1 - confidence``; a union bound, so conservative). A look between the scheduled
    ones (a revisited or injected candidate) counts as the scheduled look just below it."""
    alpha = 1.0 - confidence
    if method == "none" or not looks:
        return confidence
    if method == "bonferroni":
        return 1.0 - alpha / len(looks)
    if method != "spending":
        raise ValueError(f"no per-look confidence for {method!r}")
    at = max((m for m in looks if m <= n), default=looks[0])
    before = max((m for m in looks if m < at), default=0)
    spent = _obf_spent(at / looks[-1], alpha) - _obf_spent(before / looks[-1], alpha)
    return 1.0 - max(spent, 1e-12)


def mixture_margin(n: int, var: float, alpha: float, tight_at: int) -> float:
    """Half-width of the normal-mixture (Robbins) confidence sequence for a mean after ``n``
    observations of variance ``var``: with probability ``1 - alpha`` the running mean stays within
    it of the true mean at every ``n`` at once (anytime-valid: any number of looks). ``tight_at``
    is the ``n`` where it is narrowest for its level (Howard et al. 2021; Waudby-Smith's
    ``best_rho2_approx``). Two-sided, so conservative as a one-sided bound."""
    log_a = -math.log(alpha)
    r = (2.0 * log_a + math.log(2.0 * log_a + 1.0)) / max(tight_at, 1)
    return math.sqrt(var * 2.0 * (n * r + 1.0) * math.log(math.sqrt(n * r + 1.0) / alpha) / (n * n * r))


def confidently_worse_sequential(
    diffs: np.ndarray,
    *,
    confidence: float,
    pooled_var: float,
    n_cases: int,
    looks: list[int],
    method: str,
    margin: float = 0.0,
) -> bool:
    """The racing drop rule with its repeated looks accounted for (``method`` in ``SEQUENTIAL``):
    ``1 - confidence`` bounds the chance that a candidate not worse than the leader by more than
    ``margin`` is ever dropped over the looks. ``none``, ``bonferroni`` and ``spending`` run
    ``confidently_worse`` at ``look_confidence``; ``mixture`` drops when the paired mean plus the
    normal-mixture confidence sequence's margin is below ``-margin``. ``margin`` (score units) is
    the indifference zone: a candidate is dropped only when confidently behind by more than it."""
    n = len(diffs)
    if n >= n_cases:  # both scored on every case: the true scores are known
        return bool(diffs.mean() < 0)
    if n < 2:
        return False
    shifted = diffs + margin
    if method != "mixture":
        level = look_confidence(n, looks, confidence, method)
        return confidently_worse(shifted, confidence=level, pooled_var=pooled_var, n_cases=n_cases)
    var = (float(diffs.var(ddof=1)) * (n - 1) + 2.0 * pooled_var) / (n + 1)
    tight_at = looks[-1] if looks else n_cases
    return bool(shifted.mean() + mixture_margin(n, max(var, 1e-12), 1.0 - confidence, tight_at) < 0)
