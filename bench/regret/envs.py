"""Simulated bandit environments, generated up front so every policy sees the same streams.

For one (arms k, seed) pair we draw, once: a uniform matrix U and a standard normal matrix
Z, both (T, k); the best arm's position; the arm that becomes best after the drift; and a
delay per step. Every reward type, gap and scenario is built from these, and every policy
is fed the same rewards: if two policies pull arm a at step t they get the same reward.

Means: the best arm has 0.5 + gap, every other arm 0.5.
- Bernoulli: reward = 1 if U[t, a] < mean else 0.
- Gaussian: reward = mean + Z[t, a] (noise sigma = 1, so a gap of 0.1 is a tenth of the noise).
Scenarios:
- stationary: means fixed; feedback reaches the policy at the end of its batch.
- delayed: as stationary, plus a delay uniform on {0, ..., D} steps per decision.
- drift: at T/2 the best arm's mean is swapped with another arm's, so the best arm
  becomes (one of) the worst and a random other arm becomes the best.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REWARDS = ("bernoulli", "gaussian")
SCENARIOS = ("stationary", "delayed", "drift")
BASE_MEAN = 0.5


@dataclass(frozen=True)
class Base:
    """The randomness shared by every environment of one (k, seed)."""

    uniform: np.ndarray  # (T, k)
    normal: np.ndarray  # (T, k)
    best: int
    new_best: int
    delays: np.ndarray  # (T,) ints in [0, D]


@dataclass(frozen=True)
class Environment:
    """What a run needs: the reward of every arm at every step, the means, the delays."""

    rewards: np.ndarray  # (T, k)
    means_before: np.ndarray  # (k,)
    means_after: np.ndarray  # (k,)
    switch_at: int  # first step with means_after (T when nothing drifts)
    delays: np.ndarray  # (T,)

    def regret(self, arms: np.ndarray) -> np.ndarray:
        """Per-step pseudo-regret: best mean minus the chosen arm's mean, shape (T,)."""
        t = np.arange(arms.shape[0])
        before = t < self.switch_at
        chosen = np.where(before, self.means_before[arms], self.means_after[arms])
        best = np.where(before, self.means_before.max(), self.means_after.max())
        return best - chosen


def make_base(k: int, seed: int, horizon: int, max_delay: int) -> Base:
    """Draw the shared randomness for (k, seed)."""
    rng = np.random.default_rng(np.random.SeedSequence([20240611, k, seed]))
    best = int(rng.integers(k))
    others = [a for a in range(k) if a != best]
    new_best = int(rng.choice(others))
    return Base(
        uniform=rng.random((horizon, k)),
        normal=rng.standard_normal((horizon, k)),
        best=best,
        new_best=new_best,
        delays=rng.integers(0, max_delay + 1, size=horizon),
    )


def _rewards(base: Base, reward: str, means: np.ndarray, rows: slice) -> np.ndarray:
    if reward == "bernoulli":
        return (base.uniform[rows] < means).astype(float)
    return means + base.normal[rows]


def environment(base: Base, reward: str, gap: float, scenario: str) -> Environment:
    """Build one environment from the shared randomness."""
    horizon, k = base.uniform.shape
    before = np.full(k, BASE_MEAN)
    before[base.best] += gap
    after = before.copy()
    switch = horizon
    if scenario == "drift":
        after[[base.best, base.new_best]] = after[[base.new_best, base.best]]
        switch = horizon // 2
    rewards = np.empty((horizon, k))
    rewards[:switch] = _rewards(base, reward, before, slice(0, switch))
    rewards[switch:] = _rewards(base, reward, after, slice(switch, horizon))
    delays = base.delays if scenario == "delayed" else np.zeros(horizon, dtype=base.delays.dtype)
    return Environment(rewards, before, after, switch, delays)
