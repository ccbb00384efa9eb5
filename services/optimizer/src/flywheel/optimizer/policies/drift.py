"""Forgetting old evidence: exponential discounting by half-life, and sliding windows, measured
in seconds or in the endpoint's own decisions.

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

Forgetting by decisions (``half_life_decisions``, ``window_decisions``): the same contract
on another clock. A half-life in seconds forgets after a number of requests that depends on
the traffic rate; a half-life in decisions forgets after the same number of decisions at any
rate. The clock is per endpoint: ``endpoints.decisions_total``, the decisions the
DecisionLog has written for it, advanced by the statement that inserts them (so a decision
row and its tick commit together, and a retried batch ticks once). Each stats row keeps
``as_of_decisions`` beside ``as_of``:

- add: ``x = x * 0.5 ** ((clock - as_of_decisions) / half_life_decisions) + increment``,
  ``as_of_decisions = greatest(as_of_decisions, clock)``, with ``clock`` read from the endpoint
  row inside the same statement;
- read: every statistic times ``0.5 ** ((clock - as_of_decisions) / half_life_decisions)``,
  ``clock`` read with the rows (`stats.load_rows`, `stats.aggregate`);
- window: rows go into buckets of ``bucket_decisions`` (a twentieth of the window, at least 1)
  numbered by their first decision, ``clock // bucket_decisions * bucket_decisions``; a bucket
  counts while ``bucket + bucket_decisions > clock - window_decisions``.

This is exactly `simulate.ThompsonAgent` with ``half_life_s = half_life_decisions`` and its
``now`` the number of decisions made so far, which is how `bench/regret` runs it (one decision
per simulated second). The decisions still in a replica's buffer (at most one flush interval,
20 ms) are not yet on the clock; feedback applied meanwhile counts from the clock before them.

In memory (a replica folding feedback into its snapshot between reloads), the one function to
decay by is `stats.evidence_factor(policy, elapsed_s=, elapsed_decisions=)`: seconds and
decisions since the snapshot was read; the factor of several steps multiplies to the factor
of their sum. A replica counts the decisions it logs itself; other replicas' decisions reach
its clock only with the next reload, so with several replicas the in-memory decision clock
runs behind by theirs until then (at most one refresh interval of their traffic).

At most one of ``half_life_s``, ``window_s``, ``half_life_decisions`` and ``window_decisions``
is set (`spec.check_policy`).
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
