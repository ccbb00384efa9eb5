"""Advantages for RLP's rewards: the paper's group advantage, reward normalisation, and GAE
over a run's generations (The Convergence's ``gamma`` 0.99, ``gae_lambda`` 0.95)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """The paper's advantage for G thoughts of one context: A_i = G/(G-1)*(r_i - mean r).

    The G/(G-1) factor makes it the leave-one-out baseline r_i - mean_{j≠i} r_j. ValueError
    for fewer than 2 rewards or a non-finite one (the group is meaningless then)."""
    g = len(rewards)
    if g < 2:
        raise ValueError(f"rewards: a group needs at least 2 thoughts, got {g}")
    if not all(math.isfinite(r) for r in rewards):
        raise ValueError(f"rewards: every reward must be finite, got {list(rewards)}")
    mean = sum(rewards) / g
    return [g / (g - 1) * (r - mean) for r in rewards]


@dataclass
class RewardNormalizer:
    """Running mean and variance of rewards (Welford), so rewards of different contexts and
    runs share one scale. Its state is three numbers (``to_dict``/``from_dict``), kept with
    the experience buffer."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    eps: float = 1e-8

    def update(self, rewards: Sequence[float]) -> None:
        for r in rewards:
            if not math.isfinite(r):
                raise ValueError(f"rewards: every reward must be finite, got {r}")
            self.count += 1
            delta = r - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (r - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 1.0

    def normalize(self, reward: float) -> float:
        """(r - mean) / (std + eps) over the rewards seen so far (r itself when none were)."""
        if self.count == 0:
            return reward
        return (reward - self.mean) / (self.std + self.eps)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RewardNormalizer:
        return cls(count=int(data["count"]), mean=float(data["mean"]), m2=float(data["m2"]))


def gae(
    rewards: Sequence[float],
    values: Sequence[float],
    *,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    last_value: float = 0.0,
    done: bool = False,
) -> tuple[list[float], list[float]]:
    """Generalised advantage estimation over generations t = 0..T-1.

    delta_t = r_t + gamma*V_{t+1} - V_t (V_T = ``last_value``, 0 when the run is ``done``) and
    A_t = delta_t + gamma*lambda*A_{t+1}. Returns (advantages, returns = advantages + values)."""
    if len(rewards) != len(values):
        raise ValueError(f"values: need one value per reward ({len(rewards)}), got {len(values)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= gae_lambda <= 1.0):
        raise ValueError(f"gamma and gae_lambda must lie in [0, 1], got {gamma} and {gae_lambda}")
    advantages = [0.0] * len(rewards)
    following, running = (0.0 if done else last_value), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        delta = rewards[t] + gamma * following - values[t]
        running = delta + gamma * gae_lambda * running
        advantages[t] = running
        following = values[t]
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]
