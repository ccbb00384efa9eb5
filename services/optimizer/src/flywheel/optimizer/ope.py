"""Off-policy evaluation: how would a candidate policy have done on the logged decisions?

Pure numpy/scipy. Each logged sample i carries the arm the logging policy chose
(``actions[i]``), the reward that followed (``rewards[i]``) and the probability the logging
policy gave that arm (``propensities[i]``). A candidate policy is given as ``target_probs``,
an ``(n, k)`` array whose row i is the candidate's distribution over the k arms for sample i
(rows may differ: a policy that depends on context, position or time).

Estimators (``V`` is the candidate's expected reward, ``w_i = target_probs[i, a_i] / p_i``):

- IPS:   ``mean(w_i r_i)``. Unbiased when every arm the candidate may choose had a positive
  logging probability.
- SNIPS: ``sum(w_i r_i) / sum(w_i)``. Slightly biased, usually much lower variance, and
  always inside the range of the observed rewards.
- DR:    ``mean(sum_a pi(a|i) q(i, a) + w_i (r_i - q(i, a_i)))`` with a reward model ``q``.
  Unbiased if either the propensities or the model are right; lower variance than IPS when
  the model is good.

Intervals. The default, ``method="normal"``, is the normal approximation around the mean of
the per-sample terms: ``value +/- z * sd(terms) / sqrt(n)`` with ``z = norm.ppf((1 + c) / 2)``;
SNIPS, a ratio of two means, gets its standard error by the delta method. It is the default
because it costs O(n), is deterministic (the same request gives the same answer), and the
estimators are means of i.i.d. terms, so the central limit theorem applies once the
effective sample size is not tiny. ``method="bootstrap"`` resamples the logged samples
``n_bootstrap`` times with a seeded generator and takes percentiles; it gives asymmetric
intervals for skewed terms (rare rewards, large weights) at ``n_bootstrap`` times the cost,
but it is no cure for a tiny effective sample size either. For DR the reward model is held
fixed across bootstrap replicates. Both intervals are unclipped: IPS and DR values may leave
the reward range.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy.stats import norm

Method = Literal["normal", "bootstrap"]

# Tolerances for "this row is a probability distribution" and "these two numbers are the
# same propensity".
_SUM_ATOL = 1e-6
_PROPENSITY_ATOL = 1e-6
# Bootstrap replicates are drawn in chunks of at most this many indices (memory bound).
_BOOTSTRAP_CHUNK = 2_000_000


@dataclass(frozen=True)
class Estimate:
    value: float
    ci_low: float
    ci_high: float
    estimator: str
    std_error: float = float("nan")
    confidence: float = 0.95
    method: str = "normal"


@dataclass(frozen=True)
class LoggedData:
    """Logged decisions joined with their rewards.

    actions: (n,) arm indices in [0, n_arms); rewards: (n,) finite floats; propensities: (n,)
    the logging policy's probability of the logged arm, in (0, 1]; logging_probabilities:
    optional (n, n_arms) full logging distributions, which must agree with ``propensities``
    and let the estimators check that the candidate stays where the logger explored.
    Arrays are validated and copied (as read-only float/int arrays) on construction.
    """

    actions: np.ndarray
    rewards: np.ndarray
    propensities: np.ndarray
    n_arms: int
    logging_probabilities: np.ndarray | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n_arms, bool) or not isinstance(self.n_arms, int | np.integer) or self.n_arms < 1:
            raise ValueError(f"n_arms must be a positive integer, got {self.n_arms!r}")
        actions = _as_1d("actions", self.actions)
        rewards = _as_1d("rewards", self.rewards).astype(float)
        propensities = _as_1d("propensities", self.propensities).astype(float)
        n = actions.shape[0]
        if n == 0:
            raise ValueError("logged data is empty: need at least one sample with a reward")
        if rewards.shape[0] != n or propensities.shape[0] != n:
            raise ValueError(
                f"actions, rewards and propensities must have the same length, got "
                f"{n}, {rewards.shape[0]} and {propensities.shape[0]}"
            )
        if actions.dtype.kind == "f":
            if not np.all(np.isfinite(actions)) or np.any(actions != np.round(actions)):
                raise ValueError("actions must be integer arm indices")
        elif actions.dtype.kind not in "iu":
            raise ValueError(f"actions must be integer arm indices, got dtype {actions.dtype}")
        actions = actions.astype(np.int64)
        bad = (actions < 0) | (actions >= self.n_arms)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(f"actions[{i}] = {actions[i]} is not an arm index in [0, {self.n_arms})")
        _check_finite("rewards", rewards)
        _check_propensities(propensities)
        logging = None
        if self.logging_probabilities is not None:
            logging = _check_distributions("logging_probabilities", self.logging_probabilities, n, self.n_arms)
            mismatch = np.abs(logging[np.arange(n), actions] - propensities) > _PROPENSITY_ATOL
            if np.any(mismatch):
                i = int(np.argmax(mismatch))
                raise ValueError(
                    f"logging_probabilities[{i}, {actions[i]}] = {logging[i, actions[i]]:.6g} does not match "
                    f"propensities[{i}] = {propensities[i]:.6g}"
                )
        for name, arr in (("actions", actions), ("rewards", rewards), ("propensities", propensities)):
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        if logging is not None:
            logging.flags.writeable = False
        object.__setattr__(self, "logging_probabilities", logging)
        object.__setattr__(self, "n_arms", int(self.n_arms))

    @property
    def n(self) -> int:
        return int(self.actions.shape[0])


# --- estimators ----------------------------------------------------------------------------


def importance_weights(data: LoggedData, target_probs: np.ndarray) -> np.ndarray:
    """``w_i = target_probs[i, a_i] / propensities[i]``, after validating ``target_probs``."""
    target = _check_target(data, target_probs)
    return target[np.arange(data.n), data.actions] / data.propensities


def ips(
    data: LoggedData,
    target_probs: np.ndarray,
    *,
    confidence: float = 0.95,
    method: Method = "normal",
    n_bootstrap: int = 2000,
    seed: int | np.random.Generator | None = 0,
) -> Estimate:
    """Inverse propensity scoring: the mean of ``w_i r_i``."""
    _check_interval_args(confidence, method, n_bootstrap)
    terms = importance_weights(data, target_probs) * data.rewards
    return _mean_estimate("ips", terms, confidence, method, n_bootstrap, seed)


def snips(
    data: LoggedData,
    target_probs: np.ndarray,
    *,
    confidence: float = 0.95,
    method: Method = "normal",
    n_bootstrap: int = 2000,
    seed: int | np.random.Generator | None = 0,
) -> Estimate:
    """Self-normalised IPS: ``sum(w_i r_i) / sum(w_i)``; normal interval by the delta method.

    The delta-method variance of a ratio of means ``mean(w r) / mean(w)`` is
    ``var(w_i (r_i - V)) / (n mean(w)^2)``.
    """
    _check_interval_args(confidence, method, n_bootstrap)
    w = importance_weights(data, target_probs)
    r = data.rewards
    total = w.sum()
    if total <= 0:
        raise ValueError(
            "SNIPS is undefined: the target policy gives probability 0 to every logged action "
            "(all importance weights are 0)"
        )
    value = float((w * r).sum() / total)
    if method == "bootstrap":
        low, high = _bootstrap_ratio(w * r, w, confidence, n_bootstrap, seed)
        return Estimate(value, low, high, "snips", _ratio_se(w, r, value), confidence, method)
    se = _ratio_se(w, r, value)
    half = _z(confidence) * se
    return Estimate(value, value - half, value + half, "snips", se, confidence, method)


def doubly_robust(
    data: LoggedData,
    target_probs: np.ndarray,
    reward_model: np.ndarray,
    *,
    confidence: float = 0.95,
    method: Method = "normal",
    n_bootstrap: int = 2000,
    seed: int | np.random.Generator | None = 0,
) -> Estimate:
    """Doubly robust: ``mean(sum_a pi(a|i) q(i, a) + w_i (r_i - q(i, a_i)))``.

    ``reward_model[i, a]`` is the model's predicted reward of arm a for sample i (for example
    :func:`per_arm_mean_model`). Intervals treat the model as fixed.
    """
    _check_interval_args(confidence, method, n_bootstrap)
    target = _check_target(data, target_probs)
    q = _as_float_array("reward_model", reward_model)
    if q.shape != (data.n, data.n_arms):
        raise ValueError(f"reward_model must have shape (n, n_arms) = {(data.n, data.n_arms)}, got {q.shape}")
    _check_finite("reward_model", q)
    idx = np.arange(data.n)
    w = target[idx, data.actions] / data.propensities
    terms = (target * q).sum(axis=1) + w * (data.rewards - q[idx, data.actions])
    return _mean_estimate("dr", terms, confidence, method, n_bootstrap, seed)


def on_policy_value(
    rewards: np.ndarray,
    *,
    confidence: float = 0.95,
    method: Method = "normal",
    n_bootstrap: int = 2000,
    seed: int | np.random.Generator | None = 0,
) -> Estimate:
    """The mean logged reward with its interval: the logging policy's own value."""
    _check_interval_args(confidence, method, n_bootstrap)
    r = _as_1d("rewards", rewards).astype(float)
    if r.shape[0] == 0:
        raise ValueError("rewards are empty: need at least one sample")
    _check_finite("rewards", r)
    return _mean_estimate("on_policy", r, confidence, method, n_bootstrap, seed)


# --- direct model, diagnostics, target policies --------------------------------------------


def per_arm_mean_model(data: LoggedData, prior_mean: float | None = None, prior_strength: float = 1.0) -> np.ndarray:
    """Per-arm mean rewards shrunk toward a prior, as an ``(n, n_arms)`` reward model.

    ``q[a] = (sum of rewards of arm a + prior_strength * prior_mean) / (n_a + prior_strength)``,
    the same for every sample. ``prior_mean`` defaults to the overall mean logged reward;
    ``prior_strength`` is a pseudo-count (0 gives the raw means, and the prior mean for arms
    never logged). Fitted in-sample, which is what the service does.
    """
    if prior_mean is None:
        prior_mean = float(data.rewards.mean())
    if not np.isfinite(prior_mean):
        raise ValueError(f"prior_mean must be finite, got {prior_mean!r}")
    if not np.isfinite(prior_strength) or prior_strength < 0:
        raise ValueError(f"prior_strength must be a finite number >= 0, got {prior_strength!r}")
    counts = np.bincount(data.actions, minlength=data.n_arms).astype(float)
    sums = np.bincount(data.actions, weights=data.rewards, minlength=data.n_arms)
    denom = counts + prior_strength
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(denom > 0, (sums + prior_strength * prior_mean) / denom, prior_mean)
    return np.tile(means, (data.n, 1))


def effective_sample_size(weights: np.ndarray) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2``; 0 when every weight is 0."""
    w = _as_1d("weights", weights).astype(float)
    if w.shape[0] == 0:
        raise ValueError("weights are empty")
    _check_finite("weights", w)
    if np.any(w < 0):
        raise ValueError("weights must be >= 0")
    sq = float((w * w).sum())
    return 0.0 if sq == 0 else float(w.sum() ** 2 / sq)


def deterministic(arm_index: int | np.ndarray, n: int, k: int) -> np.ndarray:
    """Target probabilities of a policy that always picks ``arm_index`` (or, given an (n,)
    array, arm ``arm_index[i]`` for sample i)."""
    _check_size("n", n)
    _check_size("k", k)
    arms = np.broadcast_to(np.asarray(arm_index), (n,)) if np.ndim(arm_index) == 0 else np.asarray(arm_index)
    if arms.shape != (n,):
        raise ValueError(f"arm_index must be an int or an array of shape (n,) = ({n},), got shape {arms.shape}")
    if arms.dtype.kind not in "iu":
        raise ValueError(f"arm_index must be integer, got dtype {arms.dtype}")
    if np.any((arms < 0) | (arms >= k)):
        raise ValueError(f"arm_index must lie in [0, {k}), got {arms[(arms < 0) | (arms >= k)][0]}")
    out = np.zeros((n, k))
    out[np.arange(n), arms] = 1.0
    return out


def fixed_distribution(p: np.ndarray, n: int) -> np.ndarray:
    """Target probabilities of a policy that draws from the same distribution ``p`` (k,) for
    every sample."""
    _check_size("n", n)
    dist = _as_1d("p", p).astype(float)
    if dist.shape[0] == 0:
        raise ValueError("p is empty")
    _check_finite("p", dist)
    if np.any(dist < 0):
        raise ValueError("p must be >= 0")
    if abs(dist.sum() - 1.0) > _SUM_ATOL:
        raise ValueError(f"p must sum to 1, sums to {dist.sum():.9g}")
    return np.tile(dist, (n, 1))


# --- internals -----------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _z(confidence: float) -> float:
    return float(norm.ppf(0.5 + confidence / 2))


def _mean_estimate(name: str, terms: np.ndarray, confidence: float, method: Method, n_bootstrap: int, seed) -> Estimate:
    n = terms.shape[0]
    value = float(terms.mean())
    se = float(terms.std(ddof=1) / np.sqrt(n)) if n > 1 else float("inf")
    if method == "bootstrap":
        low, high = _bootstrap_ratio(terms, None, confidence, n_bootstrap, seed)
        return Estimate(value, low, high, name, se, confidence, method)
    if not np.isfinite(se):
        return Estimate(value, -np.inf, np.inf, name, se, confidence, method)
    half = _z(confidence) * se
    return Estimate(value, value - half, value + half, name, se, confidence, method)


def _ratio_se(w: np.ndarray, r: np.ndarray, value: float) -> float:
    n = w.shape[0]
    if n < 2:
        return float("inf")
    return float((w * (r - value)).std(ddof=1) / np.sqrt(n) / w.mean())


def _bootstrap_ratio(
    num: np.ndarray, den: np.ndarray | None, confidence: float, n_bootstrap: int, seed
) -> tuple[float, float]:
    """Percentile interval of mean(num) (or sum(num)/sum(den)) over bootstrap resamples."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    n = num.shape[0]
    stats = np.empty(n_bootstrap)
    chunk = max(1, _BOOTSTRAP_CHUNK // n)
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        idx = rng.integers(0, n, size=(b, n))
        top = num[idx].sum(axis=1)
        if den is None:
            stats[start : start + b] = top / n
        else:
            bottom = den[idx].sum(axis=1)
            # A resample with no positive weight has no SNIPS value; count it as 0 reward.
            with np.errstate(invalid="ignore", divide="ignore"):
                stats[start : start + b] = np.where(bottom > 0, top / bottom, 0.0)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return float(low), float(high)


def _check_interval_args(confidence: float, method: str, n_bootstrap: int) -> None:
    if not (isinstance(confidence, float | int) and 0 < confidence < 1):
        raise ValueError(f"confidence must be a number strictly between 0 and 1, got {confidence!r}")
    if method not in ("normal", "bootstrap"):
        raise ValueError(f"method must be 'normal' or 'bootstrap', got {method!r}")
    if method == "bootstrap" and (
        isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int | np.integer) or n_bootstrap < 1
    ):
        raise ValueError(f"n_bootstrap must be a positive integer, got {n_bootstrap!r}")


def _check_target(data: LoggedData, target_probs: np.ndarray) -> np.ndarray:
    target = _check_distributions("target_probs", target_probs, data.n, data.n_arms)
    if data.logging_probabilities is not None:
        unsupported = (target * (data.logging_probabilities <= 0)).sum(axis=1)
        if np.any(unsupported > _SUM_ATOL):
            i = int(np.argmax(unsupported))
            raise ValueError(
                f"target policy puts probability {unsupported[i]:.6g} on arms the logging policy could not "
                f"choose (sample {i}); importance-weighted estimates would be biased"
            )
    return target


def _check_distributions(name: str, probs: np.ndarray, n: int, k: int) -> np.ndarray:
    arr = _as_float_array(name, probs)
    if arr.shape != (n, k):
        raise ValueError(f"{name} must have shape (n, n_arms) = {(n, k)}, got {arr.shape}")
    _check_finite(name, arr)
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0")
    sums = arr.sum(axis=1)
    off = np.abs(sums - 1.0) > _SUM_ATOL
    if np.any(off):
        i = int(np.argmax(off))
        raise ValueError(f"each row of {name} must sum to 1; row {i} sums to {sums[i]:.9g}")
    return arr


def _check_propensities(p: np.ndarray) -> None:
    nan = np.isnan(p)
    if np.any(nan):
        raise ValueError(f"propensities must be numbers in (0, 1]; propensities[{int(np.argmax(nan))}] is NaN")
    bad = ~((p > 0) & (p <= 1 + _PROPENSITY_ATOL))
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"propensities must be in (0, 1] (the logging policy's probability of the logged arm); "
            f"propensities[{i}] = {float(p[i])!r}"
        )


def _check_finite(name: str, arr: np.ndarray) -> None:
    bad = ~np.isfinite(arr)
    if np.any(bad):
        where = np.unravel_index(int(np.argmax(bad)), arr.shape)
        pos = where[0] if len(where) == 1 else where
        raise ValueError(f"{name} must be finite; {name}[{pos}] = {float(arr[where])!r}")


def _check_size(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _as_float_array(name: str, values) -> np.ndarray:
    try:
        return np.array(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric: {exc}") from exc


def _as_1d(name: str, values) -> np.ndarray:
    arr = np.array(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    return arr
