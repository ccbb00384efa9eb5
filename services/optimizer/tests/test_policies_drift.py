"""policies.drift: the decay factor, the (value, as_of) contract, window sums, and recovery after a change."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.policies import drift
from flywheel.optimizer.policies.simulate import ThompsonAgent


def test_decay_factor_halves_every_half_life():
    assert drift.decay_factor(0.0, 60.0) == 1.0
    assert drift.decay_factor(60.0, 60.0) == pytest.approx(0.5)
    assert drift.decay_factor(180.0, 60.0) == pytest.approx(0.125)
    assert drift.decay_factor(1e6, 0.0) == 1.0  # no half-life: stationary
    assert drift.decay_factor(1e6, -5.0) == 1.0
    assert drift.decay_factor(-10.0, 60.0) == 1.0  # a late writer never grows evidence


def test_bring_to_scales_each_row_by_its_own_age():
    values = np.array([[4.0, 8.0], [2.0, 2.0]])
    out = drift.bring_to(values, np.array([0.0, 10.0]), now=20.0, half_life_s=10.0)
    np.testing.assert_allclose(out, [[1.0, 2.0], [1.0, 1.0]])
    np.testing.assert_allclose(drift.decay_factors(np.array([0.0, 10.0, -1.0]), 10.0), [1.0, 0.5, 1.0])


def test_incremental_updates_equal_discounting_each_reward_by_its_age():
    """Bringing the row to now and adding, reward after reward, is the exponentially weighted sum."""
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0, 1000, size=50))
    rewards = rng.random(50)
    half_life = 120.0
    value, as_of = 0.0, 0.0
    for t, r in zip(times, rewards, strict=True):
        value = value * drift.decay_factor(t - as_of, half_life) + r
        as_of = t
    now = 1100.0
    read = value * drift.decay_factor(now - as_of, half_life)
    assert read == pytest.approx(np.sum(rewards * 0.5 ** ((now - times) / half_life)))


def test_window_sum_keeps_the_buckets_inside_the_window():
    starts = np.array([0.0, 60.0, 120.0, 180.0])
    values = np.array([[1.0, 1.0], [2.0, 0.0], [3.0, 1.0], [4.0, 4.0]])
    np.testing.assert_allclose(drift.window_sum(starts, values, now=150.0, window_s=100.0), [5.0, 1.0])


def test_discounting_recovers_after_the_best_arm_changes():
    """At t = 2000 the best arm becomes the worst; with a half-life the agent follows, without it, it lags."""
    rng = np.random.default_rng(1)
    env_rng = np.random.default_rng(2)
    agents = {"stationary": ThompsonAgent(2, "beta"), "discounted": ThompsonAgent(2, "beta", half_life_s=150.0)}
    after_change = {name: 0 for name in agents}
    uniform = env_rng.random((3000, 2))
    for t in range(3000):
        means = (0.7, 0.3) if t < 2000 else (0.3, 0.7)
        for name, agent in agents.items():
            arm = agent.select(rng, now=float(t))
            agent.update(arm, float(uniform[t, arm] < means[arm]), now=float(t))
            if t >= 2300:
                after_change[name] += arm == 1
    assert after_change["discounted"] / 700 > 0.85
    assert after_change["stationary"] / 700 < 0.5
