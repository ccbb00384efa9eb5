"""A Gaussian-process surrogate (ARD Matern 5/2, numpy/scipy only) that screens offspring.

The evolution breeds many more children than it evaluates; the surrogate scores them with
Thompson draws from its posterior and the search keeps the children with the highest draws.

- Kernel: Matern 5/2 with one lengthscale per encoded column (ARD) on the unit cube, times a
  signal variance. Its hyperparameters (lengthscales, signal and noise variance) maximise the
  log marginal likelihood plus weak log-normal priors (L-BFGS-B with analytic gradients, from
  a few fixed starting points, so a fit is deterministic and uses no random numbers).
- Noise: each observation carries its own known variance (a candidate raced on few test
  cases is uncertain) on top of the fitted homoscedastic noise, so partly raced candidates
  inform the model without dominating it.
- ``thompson`` draws one independent sample per row; ``batch_thompson`` draws joint samples
  over a candidate pool and takes each draw's argmax (batch Thompson sampling: the picks
  spread out where the model is unsure, and concentrate where it is sure).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
from scipy import linalg, optimize
from scipy.spatial import distance
from threadpoolctl import threadpool_limits

SQRT5 = math.sqrt(5.0)
LOG_ELL_BOUNDS = (math.log(0.01), math.log(20.0))
LOG_SIGNAL_BOUNDS = (math.log(0.05), math.log(20.0))
LOG_NOISE_BOUNDS = (math.log(1e-6), math.log(0.5))
# weak priors (log-normal) keep a fit on few points from running to the bounds
ELL_PRIOR = (math.log(0.5), 1.5)
NOISE_PRIOR = (math.log(1e-3), 3.0)
STARTS = ((0.5, 1.0, 1e-3), (0.15, 1.0, 1e-2), (2.0, 1.0, 1e-4))


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """BLAS on one thread: the matrices here are small (hundreds of rows), and on a busy machine
    a multi-threaded BLAS spends far more time waiting for cores than computing."""
    with threadpool_limits(1, user_api="blas"):
        yield


def _sqdist_per_dim(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(d, len(a), len(b)) squared differences per column."""
    return (a.T[:, :, None] - b.T[:, None, :]) ** 2


def matern52(a: np.ndarray, b: np.ndarray, ell: np.ndarray, signal: float) -> np.ndarray:
    r = SQRT5 * distance.cdist(a / ell, b / ell)
    return signal * (1.0 + r + r * r / 3.0) * np.exp(-r)


def _neg_log_posterior(theta: np.ndarray, d2: np.ndarray, z: np.ndarray, known: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log marginal likelihood (+ priors) of theta = (log ell_1..d, log signal, log noise)
    and its gradient."""
    dims = d2.shape[0]
    ell2 = np.exp(2.0 * theta[:dims])
    signal, noise = math.exp(theta[dims]), math.exp(theta[dims + 1])
    scaled = d2 / ell2[:, None, None]
    s = SQRT5 * np.sqrt(np.maximum(scaled.sum(0), 0.0))
    e = np.exp(-s)
    k = signal * (1.0 + s + s * s / 3.0) * e
    n = len(z)
    try:
        chol = linalg.cholesky(k + np.diag(noise + known + 1e-8), lower=True)
    except linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = linalg.cho_solve((chol, True), z)
    nll = 0.5 * float(z @ alpha) + float(np.log(np.diag(chol)).sum()) + 0.5 * n * math.log(2 * math.pi)
    w = np.outer(alpha, alpha) - linalg.cho_solve((chol, True), np.eye(n))
    # dk/dlog(ell_j) = signal * 5/3 * (1 + s) * exp(-s) * (x_j - x'_j)^2 / ell_j^2
    common = signal * (5.0 / 3.0) * (1.0 + s) * e
    grad = np.empty_like(theta)
    grad[:dims] = -0.5 * np.einsum("ij,dij->d", w * common, scaled)
    grad[dims] = -0.5 * float((w * k).sum())
    grad[dims + 1] = -0.5 * float(np.trace(w)) * noise
    mu, sd = ELL_PRIOR
    nll += float(((theta[:dims] - mu) ** 2).sum()) / (2 * sd * sd)
    grad[:dims] += (theta[:dims] - mu) / (sd * sd)
    mu, sd = NOISE_PRIOR
    nll += (theta[dims + 1] - mu) ** 2 / (2 * sd * sd)
    grad[dims + 1] += (theta[dims + 1] - mu) / (sd * sd)
    return nll, grad


class Surrogate:
    """Fit on encoded configs ``x`` (rows in [0, 1]), scores ``y`` and per-row noise variances
    (in the units of ``y``)."""

    def __init__(
        self, x: np.ndarray, y: np.ndarray, noise: np.ndarray, *, max_iter: int = 50, fit_points: int = 80
    ) -> None:
        self.x = x
        self.mu = float(y.mean())
        self.sd = float(y.std()) or 1.0
        z = (y - self.mu) / self.sd
        known = np.maximum(noise, 0.0) / self.sd**2
        dims = x.shape[1]
        # hyperparameters from at most fit_points rows (the fit is cubic in them, and runs ~100
        # times): the best half and the most recent; the posterior then uses every row
        rows = np.arange(len(z))
        if len(z) > fit_points:
            best = np.argsort(-z, kind="stable")[: fit_points // 2]
            recent = [i for i in rows[::-1] if i not in set(best)][: fit_points - len(best)]
            rows = np.sort(np.concatenate([best, recent]))
        d2 = _sqdist_per_dim(x[rows], x[rows])
        bounds = [LOG_ELL_BOUNDS] * dims + [LOG_SIGNAL_BOUNDS, LOG_NOISE_BOUNDS]
        found: tuple[float, np.ndarray] | None = None
        for ell, signal, nz in STARTS:
            theta0 = np.array([math.log(ell)] * dims + [math.log(signal), math.log(nz)])
            res = optimize.minimize(
                _neg_log_posterior,
                theta0,
                args=(d2, z[rows], known[rows]),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": max_iter},
            )
            value = float(res.fun) if np.isfinite(res.fun) else 1e10
            if found is None or value < found[0]:
                found = (value, np.asarray(res.x))
        assert found is not None
        theta = found[1]
        self.lengthscales = np.exp(theta[:dims])
        self.signal = math.exp(theta[dims])
        self.noise = math.exp(theta[dims + 1])
        k = matern52(x, x, self.lengthscales, self.signal) + np.diag(self.noise + known + 1e-8)
        self.chol = linalg.cholesky(k, lower=True)
        self.alpha = linalg.cho_solve((self.chol, True), z)

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the (noise-free) score at ``xs``."""
        ks = matern52(xs, self.x, self.lengthscales, self.signal)
        mean = ks @ self.alpha
        v = linalg.solve_triangular(self.chol, ks.T, lower=True)
        var = np.maximum(self.signal - (v * v).sum(0), 1e-12)
        return self.mu + self.sd * mean, self.sd * np.sqrt(var)

    def thompson(self, xs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One independent posterior draw per row."""
        mean, sd = self.predict(xs)
        return mean + sd * rng.standard_normal(len(xs))

    def batch_thompson(self, xs: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
        """``k`` distinct row indices of ``xs``: each the argmax of one joint posterior draw over
        all rows (a draw whose argmax was already taken gives its best row not yet taken)."""
        k = min(k, len(xs))
        if k <= 0:
            return []
        ks = matern52(xs, self.x, self.lengthscales, self.signal)
        mean = ks @ self.alpha
        v = linalg.solve_triangular(self.chol, ks.T, lower=True)
        cov = matern52(xs, xs, self.lengthscales, self.signal) - v.T @ v
        normals = rng.standard_normal((len(xs), k))
        factor = None
        for jitter in (1e-8, 1e-6, 1e-4, 1e-2):
            try:
                factor = linalg.cholesky(cov + np.eye(len(xs)) * jitter * self.signal, lower=True)
                break
            except linalg.LinAlgError:
                continue
        if factor is None:  # numerically hopeless: independent draws
            draws = mean[:, None] + np.sqrt(np.maximum(np.diag(cov), 1e-12))[:, None] * normals
        else:
            draws = mean[:, None] + factor @ normals
        picked: list[int] = []
        taken = np.zeros(len(xs), dtype=bool)
        for j in range(k):
            order = np.argsort(-draws[:, j], kind="stable")
            i = int(next(i for i in order if not taken[i]))
            taken[i] = True
            picked.append(i)
        return picked

    def relevance(self) -> np.ndarray:
        """Per-column lengthscales scaled to geometric mean 1 (the trust region's aspect ratio)."""
        w = self.lengthscales / math.exp(float(np.log(self.lengthscales).mean()))
        return w


def fit_surrogate(x: np.ndarray, y: np.ndarray, noise: np.ndarray) -> Surrogate | None:
    """A surrogate once there are a few distinct observations, else None."""
    if len(y) < 4 or not math.isfinite(float(y.std())) or float(y.std()) == 0.0:
        return None
    try:
        return Surrogate(x, y, noise)
    except linalg.LinAlgError:
        return None
