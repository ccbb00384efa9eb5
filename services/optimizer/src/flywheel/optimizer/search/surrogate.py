"""A small Gaussian-process surrogate (Matern 5/2, numpy only) that screens offspring.

The evolution breeds many more children than it evaluates; the surrogate draws one Thompson
sample per child from its posterior and the search keeps the children with the highest
draws. Each observation carries its own noise variance (a candidate seen on few test cases
is uncertain), so partly raced candidates inform the model without dominating it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import linalg

LENGTHSCALES = (0.08, 0.15, 0.3, 0.6, 1.2, 2.4)


def _matern52(a: np.ndarray, b: np.ndarray, ell: float) -> np.ndarray:
    d2 = np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1), 0.0)
    r = np.sqrt(5.0 * d2) / ell
    return (1.0 + r + r * r / 3.0) * np.exp(-r)


class Surrogate:
    """Fit on encoded configs ``x`` (rows in [0, 1]), scores ``y`` and per-row noise variances."""

    def __init__(self, x: np.ndarray, y: np.ndarray, noise: np.ndarray) -> None:
        self.x = x
        self.mu = float(y.mean())
        self.sd = float(y.std()) or 1.0
        z = (y - self.mu) / self.sd
        nz = noise / self.sd**2 + 1e-6
        best = None
        # the lengthscale with the highest marginal likelihood (a grid: cheap and never diverges)
        for ell in LENGTHSCALES:
            k = _matern52(x, x, ell) + np.diag(nz)
            try:
                chol = linalg.cholesky(k, lower=True)
            except linalg.LinAlgError:
                continue
            alpha = linalg.cho_solve((chol, True), z)
            ll = -0.5 * float(z @ alpha) - float(np.log(np.diag(chol)).sum())
            if best is None or ll > best[0]:
                best = (ll, ell, chol, alpha)
        if best is None:
            raise linalg.LinAlgError("no lengthscale gave a positive-definite kernel")
        _, self.ell, self.chol, self.alpha = best

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the score at ``xs``."""
        ks = _matern52(xs, self.x, self.ell)
        mean = ks @ self.alpha
        v = linalg.solve_triangular(self.chol, ks.T, lower=True)
        var = np.maximum(1.0 - (v * v).sum(0), 1e-12)
        return self.mu + self.sd * mean, self.sd * np.sqrt(var)

    def thompson(self, xs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One independent posterior draw per row."""
        mean, sd = self.predict(xs)
        return mean + sd * rng.standard_normal(len(xs))


def fit_surrogate(x: np.ndarray, y: np.ndarray, noise: np.ndarray) -> Surrogate | None:
    """A surrogate once there are a few distinct observations, else None."""
    if len(y) < 4 or not math.isfinite(float(y.std())) or float(y.std()) == 0.0:
        return None
    try:
        return Surrogate(x, y, noise)
    except linalg.LinAlgError:
        return None
