"""The worlds of bench/regret, with one more (segmented), as per-step means and rewards.

Everything random is drawn once per (world, k, seed) by `bench/regret/envs.make_base` (the
uniform matrix U, the best arm, the arm that becomes best after the drift, the delays), so a
decision at step t for arm a earns the same reward in the service run and in process:
Bernoulli reward = 1 if U[t, a] < mean[t, a] else 0, Gaussian = mean[t, a] + Z[t, a].

- stationary: the best arm has 0.5 + gap, the others 0.5.
- delayed: as stationary; the reward of decision t is published after ``delay[t]`` more
  decisions (uniform on {0, ..., max_delay}).
- drift: at T/2 the best arm's mean is swapped with another arm's (bench/regret's drift).
- segmented: min(4, k) segments, each with its own best arm (distinct arms), a segment drawn
  uniformly per step; the endpoint segments on a context key.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REGRET_DIR = Path(__file__).resolve().parents[1] / "regret"
sys.path.insert(0, str(REGRET_DIR))
from envs import BASE_MEAN, environment, make_base  # noqa: E402  (bench/regret/envs.py)

WORLDS = ("stationary", "delayed", "drift", "segmented")
MAX_SEGMENTS = 4


@dataclass(frozen=True)
class World:
    """One world: per-step means and realized rewards of every arm, delays and segments."""

    name: str
    reward: str  # "bernoulli" or "gaussian"
    k: int
    seed: int
    means: np.ndarray  # (T, k): the mean of every arm at every step
    rewards: np.ndarray  # (T, k): the reward arm a would earn at step t
    delays: np.ndarray  # (T,) decisions between a decision and the publication of its reward
    segments: np.ndarray  # (T,) segment index of every step (all 0 when unsegmented)
    n_segments: int  # 1 when unsegmented

    @property
    def horizon(self) -> int:
        return int(self.means.shape[0])

    @property
    def segmented(self) -> bool:
        return self.n_segments > 1

    def regret(self, arms: np.ndarray) -> np.ndarray:
        """Per-step pseudo-regret: the best mean at that step minus the chosen arm's mean."""
        t = np.arange(self.horizon)
        return self.means.max(axis=1) - self.means[t, arms]


def make_world(name: str, reward: str, k: int, seed: int, horizon: int, gap: float, max_delay: int) -> World:
    """Build one world from bench/regret's shared randomness for (k, seed)."""
    if name not in WORLDS:
        raise ValueError(f"world must be one of {WORLDS}, got {name!r}")
    base = make_base(k, seed, horizon, max_delay)
    if name == "segmented":
        return _segmented(base, reward, k, seed, horizon, gap)
    scenario = "drift" if name == "drift" else ("delayed" if name == "delayed" else "stationary")
    env = environment(base, reward, gap, scenario)
    means = np.empty((horizon, k))
    means[: env.switch_at] = env.means_before
    means[env.switch_at :] = env.means_after
    return World(name, reward, k, seed, means, env.rewards, env.delays.astype(np.int64), np.zeros(horizon, int), 1)


def _segmented(base, reward: str, k: int, seed: int, horizon: int, gap: float) -> World:
    n = min(MAX_SEGMENTS, k)
    rng = np.random.default_rng(np.random.SeedSequence([20261124, k, seed]))
    best = rng.permutation(k)[:n]  # a distinct best arm per segment
    segments = rng.integers(n, size=horizon)
    table = np.full((n, k), BASE_MEAN)
    table[np.arange(n), best] += gap
    means = table[segments]
    rewards = (base.uniform < means).astype(float) if reward == "bernoulli" else means + base.normal
    return World("segmented", reward, k, seed, means, rewards, np.zeros(horizon, np.int64), segments, n)
