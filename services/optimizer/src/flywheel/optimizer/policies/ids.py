"""Information-directed sampling (IDS) from joint posterior draws.

Russo and Van Roy, "Learning to Optimize via Information-Directed Sampling" (Operations
Research, 2018), variance-based IDS with sample estimates. From m joint draws of the arms'
means:

- p*(a): the share of draws in which arm a is best (the Thompson probabilities);
- Delta_a = E[max_b theta_b] - E[theta_a]: the expected regret of pulling a;
- v_a = sum_a* p*(a*) (E[theta_a | a* best] - E[theta_a])^2: how much pulling a tells about
  which arm is best (the variance of its conditional mean);

then it plays the distribution pi minimising the information ratio (pi.Delta)^2 / (pi.v),
which is always supported on at most two arms. Unlike Thompson sampling it spends no pulls
on arms that are unlikely to be best *and* would teach little, which is where Thompson
sampling over-explores when there are several similar arms.

Two things differ from the paper, both measured on the regret bench's tuning seeds:

- v is debiased: each conditional mean is estimated from the n_a* draws where a* won, so
  the plain estimate carries var(theta_a | a*) / n_a* of sampling noise per term, which
  inflates the information of wide posteriors; that noise is subtracted.
- The distribution played is (1 - thompson_share) IDS + thompson_share Thompson sampling.
  Pure IDS allots an arm that had an unlucky start about a fifth of what Thompson sampling
  would, and on 1 seed in 20 it then stayed on the worse of two arms for the whole run; a
  10% share of Thompson sampling keeps that arm's recovery going.

The service computes p once per posterior snapshot from the same draws Thompson sampling
would use, so the logged propensity is still exactly the probability the arm was drawn with.
"""

from __future__ import annotations

import numpy as np

from flywheel.optimizer.policies.selection import action_probabilities, constrain

_TINY = 1e-300
DEFAULT_THOMPSON_SHARE = 0.1
# IDS looks at most at this many arms, those that win the most draws: the cost is
# O(m c + c^2) for c candidates instead of O(m k^2), and an arm that (almost) never wins a
# draw is neither low-regret nor informative. The others keep their Thompson share.
MAX_CANDIDATES = 128


def regret_and_information(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Delta, v) per arm, each shape (k,), estimated from m joint draws of shape (m, k)."""
    d = np.asarray(draws, dtype=float)
    if d.ndim != 2 or d.shape[0] == 0 or d.shape[1] == 0:
        raise ValueError(f"draws must have shape (m, k) with m, k >= 1, got {d.shape}")
    m, k = d.shape
    best = np.argmax(d, axis=1)
    won_by = np.zeros((m, k))
    won_by[np.arange(m), best] = 1.0
    n = won_by.sum(axis=0)
    mean = d.mean(axis=0)
    delta = np.maximum(d[np.arange(m), best].mean() - mean, 0.0)
    won = n > 0
    n = n[won, None]
    conditional = (won_by.T @ d)[won] / n  # [a*, a]: mean of theta_a over the draws a* won
    info = ((n / m) * (conditional - mean) ** 2).sum(axis=0)
    # Sampling noise of each conditional mean: the within-group variance over n_a* draws.
    within = np.maximum((won_by.T @ (d * d))[won] / n - conditional**2, 0.0) * n / np.maximum(n - 1, 1)
    noise = (within * (n > 1)).sum(axis=0) / m
    return delta, np.maximum(info - noise, 0.0)


def information_directed(draws: np.ndarray, max_candidates: int | None = MAX_CANDIDATES) -> np.ndarray:
    """Pure IDS: the distribution over the k arms (at most two > 0) minimising the information ratio.

    For every pair (i, j) the best mix q i + (1 - q) j minimises (q Di + (1-q) Dj)^2 /
    (q vi + (1-q) vj); its stationary point is q = Dj / (Di - Dj) - 2 vj / (vi - vj), so the
    minimum is at that point clipped to [0, 1] or at an end. When no arm carries information
    any more (the draws agree on the best arm) the arm of least expected regret is played.
    With more than ``max_candidates`` arms only the ones that win the most draws are
    considered (None: all).
    """
    d = np.asarray(draws, dtype=float)
    if max_candidates is not None and d.ndim == 2 and d.shape[1] > max_candidates:
        wins = np.bincount(np.argmax(d, axis=1), minlength=d.shape[1])
        keep = np.sort(np.argsort(-wins, kind="stable")[:max_candidates])
        out = np.zeros(d.shape[1])
        out[keep] = information_directed(d[:, keep], None)
        return out
    delta, info = regret_and_information(d)
    k = delta.shape[0]
    p = np.zeros(k)
    if k == 1 or info.max() <= _TINY:
        p[int(np.argmin(delta))] = 1.0
        return p
    dj, vj = delta[None, :], info[None, :]
    a, b = delta[:, None] - dj, info[:, None] - vj
    with np.errstate(divide="ignore", invalid="ignore"):
        stationary = dj / a - 2 * vj / b
    stationary = np.clip(np.nan_to_num(stationary, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
    q = np.stack([np.zeros_like(a), np.ones_like(a), stationary])  # candidates, shape (3, k, k)
    regret = dj + q * a
    ratio = np.where(regret <= 0, 0.0, regret**2 / np.maximum(vj + q * b, _TINY))
    c, i, j = np.unravel_index(int(np.argmin(ratio)), ratio.shape)
    p[i] += q[c, i, j]
    p[j] += 1.0 - q[c, i, j]
    return p


def ids_probabilities(
    draws: np.ndarray,
    *,
    floor: float = 0.0,
    caps: np.ndarray | None = None,
    thompson_share: float = DEFAULT_THOMPSON_SHARE,
) -> np.ndarray:
    """What the ``ids`` allocation plays: (1 - share) IDS + share Thompson sampling, shape (k,).

    The counterpart of `selection.thompson_probabilities`, with the same ``floor`` and
    ``caps`` (applied by `selection.constrain` when one binds).
    """
    if not 0.0 <= thompson_share <= 1.0:
        raise ValueError(f"thompson_share must be in [0, 1], got {thompson_share}")
    p = (1.0 - thompson_share) * information_directed(draws) + thompson_share * action_probabilities(draws)
    p = p / p.sum()
    if floor > 0 or (caps is not None and np.any(np.asarray(caps) < 1)):
        p = constrain(p, floor=floor, caps=caps)
    return p
