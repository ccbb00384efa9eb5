"""The one loop that feeds every policy: batched decisions, feedback when it arrives."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from envs import Environment


class Policy(Protocol):
    def select(self, n: int, now: float) -> np.ndarray: ...
    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None: ...


def play(policy: Policy, env: Environment, batch: int) -> np.ndarray:
    """Run ``policy`` for T steps; return the arm chosen at each step, shape (T,).

    Steps are decisions, one per second of simulated time. Decisions are taken in batches
    of ``batch`` from one snapshot of the policy. The reward of step t reaches the policy
    at time t + 1 + delay[t], delivered at the first batch boundary at or after it (in the
    order it arrived), so with no delay a batch's feedback arrives before the next batch.
    """
    horizon = env.rewards.shape[0]
    arms = np.zeros(horizon, dtype=np.intp)
    arrival = np.arange(horizon) + 1 + env.delays
    order = np.argsort(arrival, kind="stable")
    sorted_arrival = arrival[order]
    delivered = 0
    for start in range(0, horizon, batch):
        n = min(batch, horizon - start)
        arms[start : start + n] = policy.select(n, float(start))
        end = start + n
        upto = int(np.searchsorted(sorted_arrival, end, side="right"))
        if upto > delivered:
            steps = order[delivered:upto]
            policy.update(steps, arms[steps], env.rewards[steps, arms[steps]], float(end))
            delivered = upto
    return arms
