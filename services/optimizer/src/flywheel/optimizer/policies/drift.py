"""Forgetting old evidence: exponential discounting by half-life, and sliding windows.

Discounting contract (what the service stores and how it reads it):

- Each arm's *evidence* is stored as a row of additive statistics together with
  ``as_of``, the time those values are valid at: Beta (alpha - 1, beta - 1), Gaussian
  (n, s, ss), linear (XtX, Xty). Priors are never stored in it and never discounted.
- To read the evidence at time ``now``, multiply every statistic of the row by
  ``decay_factor(now - as_of, half_life_s)``. All statistics of a row share one factor,
  so means and variances are unchanged and only the amount of evidence shrinks.
- To add a reward at ``now``: bring the row to ``now`` and add the increment, then set
  ``as_of = now``. In SQL, one statement: ``SET n = n * pow(0.5, (now - as_of) /
  half_life) + 1, ..., as_of = now`` (and ``now = greatest(now, as_of)`` so that a late
  writer never grows the evidence). It stays a single increment, so concurrent writers
  still never lose an update.
- With ``half_life_s <= 0`` the factor is 1 and this is the stationary posterior.

Sliding windows are the other option: the service adds rewards into time buckets and the
posterior uses the sum of the buckets in the window (`window_sum`).
"""

from __future__ import annotations

import numpy as np


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """0.5 ** (elapsed_s / half_life_s); 1.0 when half_life_s <= 0 or nothing elapsed."""
    if half_life_s <= 0 or elapsed_s <= 0:
        return 1.0
    return float(0.5 ** (elapsed_s / half_life_s))


def decay_factors(elapsed_s: np.ndarray, half_life_s: float) -> np.ndarray:
    """`decay_factor` for an array of elapsed times (negative elapsed counts as 0)."""
    elapsed = np.maximum(np.asarray(elapsed_s, dtype=float), 0.0)
    if half_life_s <= 0:
        return np.ones_like(elapsed)
    return np.power(0.5, elapsed / half_life_s)


def bring_to(values: np.ndarray, as_of: np.ndarray, now: float, half_life_s: float) -> np.ndarray:
    """Evidence rows valid at ``as_of`` (one time per row, leading axis) brought to ``now``."""
    factors = decay_factors(now - np.asarray(as_of, dtype=float), half_life_s)
    vals = np.asarray(values, dtype=float)
    return vals * factors.reshape(factors.shape + (1,) * (vals.ndim - factors.ndim))


def window_sum(bucket_start_s: np.ndarray, bucket_values: np.ndarray, now: float, window_s: float) -> np.ndarray:
    """Sum of the buckets that start within ``window_s`` before ``now`` (leading axis = bucket).

    A bucket counts whole or not at all, so the window is ``window_s`` rounded to the
    bucket width; buckets that start after ``now`` are ignored.
    """
    starts = np.asarray(bucket_start_s, dtype=float)
    values = np.asarray(bucket_values, dtype=float)
    keep = (starts > now - window_s) & (starts <= now)
    return values[keep].sum(axis=0)
