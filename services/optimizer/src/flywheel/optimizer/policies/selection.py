"""From posterior draws to the distribution an arm is sampled from.

The service computes p once per posterior snapshot (m of about 1000-4000 joint draws)
with `thompson_probabilities` (Thompson probabilities, traffic caps, exploration floor)
and samples every Select from that p with `sample`. The propensity it logs is therefore exactly the
probability the arm was sampled with, which is what off-policy evaluation needs.
"""

from __future__ import annotations

import bisect

import numpy as np

_EPS = 1e-12


def action_probabilities(draws: np.ndarray) -> np.ndarray:
    """Share of the m joint draws (rows) in which each of the k arms is largest, shape (k,).

    A tie between arms splits that draw evenly among them, which is the expected result of
    breaking ties at random (without needing a generator).
    """
    d = np.asarray(draws, dtype=float)
    if d.ndim != 2 or d.shape[0] == 0 or d.shape[1] == 0:
        raise ValueError(f"draws must have shape (m, k) with m, k >= 1, got {d.shape}")
    is_max = d == d.max(axis=1, keepdims=True)
    shares = is_max / is_max.sum(axis=1, keepdims=True)
    return shares.mean(axis=0)


probability_best = action_probabilities
"""Posterior probability that each arm is the best: the unconstrained Thompson distribution."""


def _fill(base: np.ndarray, lo: np.ndarray, hi: np.ndarray, total: float) -> np.ndarray | None:
    """clip(lam * base, lo, hi) with lam chosen so that it sums to ``total``; None if no lam can.

    g(lam) = sum(clip(lam * base, lo, hi)) is piecewise linear and non-decreasing, with
    breakpoints at lo/base and hi/base; the exact lam is found by interpolation.
    """
    pos = base > 0
    # In Python, not np.unique / np.searchsorted: those let the GIL go, and this runs on the
    # optimizer's event loop in every rebuild (reweight.py).
    points = np.array(sorted({0.0, *(lo[pos] / base[pos]).tolist(), *(hi[pos] / base[pos]).tolist()}))
    sums = np.clip(points[:, None] * base[None, :], lo, hi).sum(axis=1)
    j = bisect.bisect_left(sums.tolist(), total - _EPS)
    if j >= points.shape[0]:
        return None
    if j == 0:
        lam = 0.0
    else:
        lo_pt, hi_pt = points[j - 1], points[j]
        rise = sums[j] - sums[j - 1]
        lam = hi_pt if rise <= 0 else lo_pt + (total - sums[j - 1]) * (hi_pt - lo_pt) / rise
    return np.clip(lam * base, lo, hi)


def constrain(p: np.ndarray, *, floor: float = 0.0, caps: np.ndarray | None = None) -> np.ndarray:
    """Apply per-arm caps (max share, e.g. a canary at 0.1) and an exploration floor to p.

    The result is the fixed point of "cap the arms over their cap, raise the arms under the
    floor, hand the difference to the other arms in proportion to p, repeat": each arm gets
    clip(lam * p_i, floor, cap_i) with one lam for all arms, so it sums to 1 and the order of
    the unconstrained arms is kept. Arms with p_i = 0 sit at the floor unless the caps leave
    mass that only they can take, which they then share evenly.

    When p comes from posterior draws, `thompson_probabilities` is the better tool for caps:
    it hands a capped arm's excess to the arms that would win without it, which p cannot
    tell when they all have p = 0.

    Raises ValueError when floor * k > 1, a cap is below the floor, or the caps sum below 1.
    """
    probs = np.asarray(p, dtype=float)
    k = probs.shape[0]
    if k == 0 or np.any(probs < 0) or probs.sum() <= 0:
        raise ValueError("p must be a non-empty, non-negative vector with positive sum")
    probs = probs / probs.sum()
    if floor < 0 or floor * k > 1 + 1e-9:
        raise ValueError(f"exploration floor {floor} is impossible for {k} arms (need 0 <= floor*k <= 1)")
    hi = np.ones(k) if caps is None else np.asarray(caps, dtype=float)
    if hi.shape != (k,) or np.any(hi <= 0) or np.any(hi > 1 + 1e-12):
        raise ValueError("caps must be one share in (0, 1] per arm")
    lo = np.full(k, float(floor))
    if np.any(hi < lo - 1e-12):
        raise ValueError("a cap is below the exploration floor")
    if hi.sum() < 1 - 1e-9:
        raise ValueError(f"caps sum to {hi.sum():.3f} < 1: they cannot make a distribution")
    out = _fill(probs, lo, hi, 1.0)
    if out is None:  # mass left after every arm with p > 0 hit its cap: the p = 0 arms share it
        out = np.where(probs > 0, hi, lo)
        zero = probs == 0
        rest = _fill(np.ones(int(zero.sum())), lo[zero], hi[zero], 1.0 - float(hi[probs > 0].sum()))
        if rest is None:  # unreachable after the checks above, kept for safety
            raise ValueError("caps cannot make a distribution")
        out[zero] = rest
    return out / out.sum()


def thompson_probabilities(draws: np.ndarray, *, floor: float = 0.0, caps: np.ndarray | None = None) -> np.ndarray:
    """The service's p: Thompson probabilities from joint draws, with caps and the floor applied.

    An arm over its cap is fixed at the cap, and the mass left is shared by the other arms
    in proportion to how often each is best *among them* in the same draws (what Thompson
    sampling would do if the capped arm were not there); repeat until no arm is over its
    cap, then apply the floor with `constrain`. This differs from `constrain` on
    `action_probabilities` when a capped arm wins nearly every draw: p alone then says
    nothing about which of the others is next best, the draws do.
    """
    d = np.asarray(draws, dtype=float)
    k = d.shape[1] if d.ndim == 2 else 0
    if caps is None:
        q = action_probabilities(d)
    else:
        hi = np.asarray(caps, dtype=float)
        if hi.shape != (k,) or np.any(hi <= 0) or hi.sum() < 1 - 1e-9:
            raise ValueError("caps must be one share in (0, 1] per arm, summing to at least 1")
        capped = np.zeros(k, dtype=bool)
        q = np.zeros(k)
        while True:
            free = ~capped
            share = action_probabilities(d[:, free]) * (1.0 - float(hi[capped].sum()))
            over = share > hi[free] + 1e-12
            if not over.any():
                q[free] = share
                q[capped] = hi[capped]
                break
            capped[np.flatnonzero(free)[over]] = True
    if floor > 0 or caps is not None:
        q = constrain(q, floor=floor, caps=caps)
    return q


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Index drawn from the distribution p (one uniform draw, inverse CDF)."""
    cdf = np.cumsum(p)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(idx, len(cdf) - 1)


def sample_many(p: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """n independent indices drawn from the distribution p, shape (n,): `sample` n times at once."""
    cdf = np.cumsum(p)
    return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), len(cdf) - 1)
