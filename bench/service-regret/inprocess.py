"""The reference: the same policy in process, updated after every decision.

`flywheel.optimizer.policies.simulate.ThompsonAgent` (the service's statistics and functions,
as bench/regret uses it) played by bench/regret's `loop.play` with batches of one: decision t
is taken from a posterior that holds every reward that has arrived before it, the reward of
decision t arriving after ``delay[t]`` more decisions. Time is counted in decisions, so a
drift half-life is in decisions too. Segmented worlds get one independent agent per segment.
"""

from __future__ import annotations

import numpy as np
from loop import play  # bench/regret/loop.py (on sys.path through worlds)
from worlds import World

from flywheel.optimizer.policies.simulate import ThompsonAgent


class SegmentedThompson:
    """One ThompsonAgent per segment, behind `loop.play`'s policy interface (batches of one)."""

    def __init__(self, world: World, kind: str, rng: np.random.Generator, half_life: float) -> None:
        self.segments = world.segments
        self.agents = [
            ThompsonAgent(world.k, kind, half_life_s=half_life)  # type: ignore[arg-type]
            for _ in range(world.n_segments)
        ]
        self.rng = rng

    def select(self, n: int, now: float) -> np.ndarray:
        start = int(now)  # loop.play's clock is the index of the batch's first step
        return np.array(
            [self.agents[self.segments[t]].select(self.rng, now=now) for t in range(start, start + n)], dtype=np.intp
        )

    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None:
        seg = self.segments[steps]
        for s in np.unique(seg):
            mask = seg == s
            self.agents[s].update_many(arms[mask], rewards[mask], now=now)


def run_in_process(world: World, half_life: float, seed: int, batch: int = 1) -> np.ndarray:
    """The arms the in-process policy picks at every step, shape (T,)."""
    kind = "beta" if world.reward == "bernoulli" else "gaussian"
    rng = np.random.default_rng(seed)
    policy = SegmentedThompson(world, kind, rng, half_life)
    return play(policy, world, batch)  # type: ignore[arg-type]  (World has rewards and delays)


def run_replicas(world: World, half_life: float, seed: int, extra: np.ndarray) -> np.ndarray:
    """The arms R replicas of the in-process policy pick, shape (T,): decision t by replica
    t % R, the reward of decision t reaching replica r after ``delay[t] + extra[r, t]`` more
    decisions (``extra`` has shape (R, T)). Every replica draws from the same generator, so with
    the same delays for all R this is ``run_in_process`` draw for draw (and with R = 1, always)."""
    kind = "beta" if world.reward == "bernoulli" else "gaussian"
    rng = np.random.default_rng(seed)
    replicas, horizon = extra.shape
    policies = [SegmentedThompson(world, kind, rng, half_life) for _ in range(replicas)]
    arms = np.zeros(horizon, dtype=np.intp)
    orders, arrivals = [], []
    for r in range(replicas):
        arrival = np.arange(horizon) + 1 + world.delays + extra[r]
        order = np.argsort(arrival, kind="stable")
        orders.append(order)
        arrivals.append(arrival[order])
    delivered = [0] * replicas
    for t in range(horizon):
        # As loop.play: the rewards that arrived by t reach every replica before decision t.
        for r in range(replicas):
            upto = int(np.searchsorted(arrivals[r], t, side="right"))
            if upto > delivered[r]:
                steps = orders[r][delivered[r] : upto]
                policies[r].update(steps, arms[steps], world.rewards[steps, arms[steps]], float(t))
                delivered[r] = upto
        arms[t] = policies[t % replicas].select(1, float(t))[0]
    return arms
