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
