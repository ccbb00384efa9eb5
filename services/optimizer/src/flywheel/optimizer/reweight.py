"""Reweighting kept posterior draws instead of drawing again, when a fold changes a snapshot.

A fold moves a few arms' Beta posteriors by a little. Drawing 1,000 x k new Beta variates for
it costs ~0.5 ms on an idle core and several milliseconds under load: numpy releases the GIL
around every draw and every large array operation, and taking it back from Select's worker
threads is what such a rebuild mostly waits for. The draws a snapshot was computed from,
weighted by the ratio of the new posterior to the one they were drawn from, estimate the same
probabilities (self-normalized importance sampling). For Beta posteriors that ratio is exact
and cheap: ``p^(a1 - a0) * (1 - p)^(b1 - b0)`` per changed arm, so a rebuild becomes a weighted
count of the draws' winners, with no new draw and no thread.

The reweighting runs on the event loop in pieces of ``CHUNK`` draws: numpy releases the GIL
for an operation over more than 500 elements, and under load each release costs the loop up to
a switch interval (5 ms) before it runs again; over 500 or fewer it keeps the GIL throughout.
Some numpy calls let it go whatever their size (``np.zeros`` over 1 KiB, ``np.bincount``,
``np.unique``, ``np.searchsorted``), so the reweighting uses none of them: the weighted count
of winners is a product with their one-hot matrix, kept with the draws.

Reweighting is used while the weights' effective sample size stays above ``MIN_ESS_SHARE`` of
the draws; otherwise, and for selection rules that are not a weighted share of wins (Gaussian
and linear posteriors, IDS, more than one arm over its traffic cap), the caller draws again.
One arm over its cap (a canary, on trial or not) is reweighted too: its excess goes to the arm
that is best among the others in the same draws, which is each draw's winner or, where the
capped arm won, its runner-up (kept with the draws), as ``selection.thompson_probabilities``
hands it on; a canary on trial then gets its fixed share (``canary.trial_shares``).
Select is unaffected either way: it samples an arm from the probabilities it logs.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
from cachetools import LRUCache

from flywheel.optimizer.policies import canary, selection
from flywheel.optimizer.posterior import Stats, beta_params
from flywheel.optimizer.spec import BETA, IDS, PolicyConfig

# Below this effective sample size (as a share of the draws), draw again.
MIN_ESS_SHARE = 0.5
# Draws per piece: numpy keeps the GIL for element loops of at most 500 (NPY_BEGIN_THREADS_THRESHOLDED).
CHUNK = 500


@dataclass(frozen=True)
class DrawSet:
    """Joint draws of the live arms' Beta posteriors, kept for reweighting."""

    live: np.ndarray  # indices of the live arms, the draws' columns
    alpha: np.ndarray  # the Beta parameters they were drawn from, per live arm
    beta: np.ndarray
    # Per piece of at most CHUNK draws: log p and log(1 - p), shape (live arms, draws), in
    # float32 (half the memory; a weight needs no more), and which live arm each draw's
    # largest value belongs to, and its second largest (no ties; -1 with one live arm).
    log_p: tuple[np.ndarray, ...]
    log_q: tuple[np.ndarray, ...]
    winner: tuple[np.ndarray, ...]
    runner_up: tuple[np.ndarray, ...]
    # Per piece, the winners one-hot, shape (live arms, draws), float32: a weighted count of
    # wins is one matrix product, which keeps the GIL (np.bincount lets it go).
    wins_one_hot: tuple[np.ndarray, ...]

    @property
    def draws(self) -> int:
        return sum(len(w) for w in self.winner)

    @property
    def nbytes(self) -> int:
        parts = (self.log_p, self.log_q, self.winner, self.runner_up, self.wins_one_hot)
        return sum(a.nbytes for part in parts for a in part)


def keep(policy: PolicyConfig, live: np.ndarray, stats: Stats, draws: np.ndarray) -> DrawSet | None:
    """The draws behind a snapshot's probabilities, if later folds can reweight them: Beta
    posteriors, every draw inside (0, 1) (their logarithms are finite) and no tied winner
    nor runner-up (a weighted count of winners then equals the share of wins)."""
    if policy.kind != BETA or draws.ndim != 2 or draws.shape[1] == 0:
        return None
    if not np.all((draws > 0.0) & (draws < 1.0)):
        return None
    rows = np.arange(draws.shape[0])
    winner = draws.argmax(axis=1)
    rest = draws.copy()
    rest[rows, winner] = -np.inf
    runner_up = rest.argmax(axis=1) if draws.shape[1] > 1 else np.full(len(rows), -1)
    if np.any((draws == draws[rows, winner][:, None]).sum(axis=1) > 1):
        return None
    if draws.shape[1] > 1 and np.any((rest == rest[rows, runner_up][:, None]).sum(axis=1) > 1):
        return None
    idx = np.flatnonzero(live)
    alpha, beta = beta_params(Stats(stats.w[idx], stats.s[idx], stats.ss[idx]))
    pieces = range(0, draws.shape[0], CHUNK)
    log_p, log_q = np.log(draws).T.astype(np.float32), np.log1p(-draws).T.astype(np.float32)
    return DrawSet(
        idx,
        alpha,
        beta,
        tuple(np.ascontiguousarray(log_p[:, i : i + CHUNK]) for i in pieces),
        tuple(np.ascontiguousarray(log_q[:, i : i + CHUNK]) for i in pieces),
        tuple(winner[i : i + CHUNK].astype(np.int32) for i in pieces),
        tuple(runner_up[i : i + CHUNK].astype(np.int32) for i in pieces),
        tuple(_one_hot(winner[i : i + CHUNK], len(idx)) for i in pieces),
    )


def _one_hot(winner: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros((k, len(winner)), dtype=np.float32)
    out[winner, np.arange(len(winner))] = 1.0
    return out


def _zeros(n: int) -> np.ndarray:
    """np.zeros(n) that keeps the GIL: np.zeros lets it go while it allocates over 1 KiB."""
    out = np.empty(n)
    out.fill(0.0)
    return out


def probabilities(
    draw_set: DrawSet,
    policy: PolicyConfig,
    stats: Stats,
    live: np.ndarray,
    caps: np.ndarray,
    trial: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(selection probabilities, probability each arm is best, the weights' effective sample
    size as a share of the draws) over all arms for ``stats``, from ``draw_set`` reweighted;
    the same rule as ``selection.thompson_probabilities`` with the floor and caps, then the
    trial shares of canaries on trial (``trial``), as ``snapshot._drawn_probabilities``. None
    when the draws cannot serve: draw again."""
    if policy.kind != BETA or policy.allocation == IDS:
        return None
    idx = np.flatnonzero(live)
    if not np.array_equal(idx, draw_set.live):
        return None
    alpha, beta = beta_params(Stats(stats.w[idx], stats.s[idx], stats.ss[idx]))
    d_alpha, d_beta = alpha - draw_set.alpha, beta - draw_set.beta
    k = len(idx)
    terms = [(d_alpha[j], d_beta[j], j) for j in np.flatnonzero((d_alpha != 0.0) | (d_beta != 0.0))]
    # log weight of each draw: sum over changed arms of d_alpha log p + d_beta log(1 - p)
    log_w = []
    for log_p, log_q in zip(draw_set.log_p, draw_set.log_q, strict=True):
        lw = _zeros(log_p.shape[1])
        for da, db, j in terms:
            lw += da * log_p[j]
            lw += db * log_q[j]
        log_w.append(lw)
    top = max(float(lw.max()) for lw in log_w)
    weights = [np.exp(lw - top) for lw in log_w]
    wins, total, squares = _zeros(k), 0.0, 0.0
    for w, one_hot in zip(weights, draw_set.wins_one_hot, strict=True):
        total += float(w.sum())
        squares += float(w @ w)
        wins += one_hot @ w.astype(np.float32)
    # Effective sample size (sum w)^2 / sum w^2, as a share of the draws.
    ess_share = total * total / (draw_set.draws * squares)
    if ess_share < MIN_ESS_SHARE:
        return None
    wins /= total
    cap = caps[idx]
    shares = wins
    over = np.flatnonzero(wins > cap + 1e-12)
    if len(over) > 1:
        return None  # the excess of one capped arm would go to the next: draw again
    if len(over) == 1:
        # thompson_probabilities: the capped arm at its cap, the rest shared as each arm is
        # best among the others: the winner of a draw, or its runner-up where the capped arm won.
        c = int(over[0])
        among = np.zeros(k)
        for w, winner, runner_up in zip(weights, draw_set.winner, draw_set.runner_up, strict=True):
            among += np.bincount(np.where(winner == c, runner_up, winner), weights=w, minlength=k)
        shares = among / total * (1.0 - float(cap[c]))
        shares[c] = cap[c]
        if np.any(np.delete(shares > cap + 1e-12, c)):
            return None  # a second arm over its cap: draw again
    out, best = _zeros(len(live)), _zeros(len(live))
    best[idx] = wins
    out[idx] = selection.constrain(shares, floor=policy.exploration_floor, caps=cap)
    if trial is not None and np.any(trial > 0):
        out = canary.trial_shares(out, trial > 0, trial)
    return out, best, ess_share


class DrawSetStore:
    """Draw sets by key, each with what it was drawn under (``basis``), at most ``max_bytes`` of
    them: the least recently used is dropped first (its next rebuild draws again)."""

    def __init__(self, max_bytes: int) -> None:
        self._sets: LRUCache[Hashable, tuple[Hashable, DrawSet]] = LRUCache(
            maxsize=max_bytes, getsizeof=lambda kept: kept[1].nbytes
        )

    def get(self, key: Hashable, basis: Hashable) -> DrawSet | None:
        """The draw set kept for ``key`` if it was drawn under the same ``basis``."""
        kept = self._sets.get(key)  # a hit makes it the most recently used
        return None if kept is None or kept[0] != basis else kept[1]

    def put(self, key: Hashable, basis: Hashable, draw_set: DrawSet | None) -> None:
        self.pop(key)
        if draw_set is not None and draw_set.nbytes <= self._sets.maxsize:
            self._sets[key] = (basis, draw_set)

    def pop(self, key: Hashable) -> None:
        self._sets.pop(key, None)

    @property
    def nbytes(self) -> int:
        return int(self._sets.currsize)

    def __len__(self) -> int:
        return len(self._sets)
