"""policies.simulate: the agent keeps the service's statistics and learns with them."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.policies.drift import decay_factor
from flywheel.optimizer.policies.simulate import ThompsonAgent


def test_beta_updates_mirror_the_sql_increments():
    agent = ThompsonAgent(3, "beta")
    agent.update(0, 1.0, now=1.0)
    agent.update(0, 0.25, now=2.0)
    agent.update(2, 7.0, now=3.0)  # clamped to 1
    np.testing.assert_allclose(agent.stats[0], [1.25, 0.0, 1.0])
    np.testing.assert_allclose(agent.stats[1], [0.75, 0.0, 0.0])
    np.testing.assert_allclose(agent.pulls(), [2.0, 0.0, 1.0])


def test_gaussian_updates_mirror_the_sql_increments():
    agent = ThompsonAgent(2, "gaussian")
    for r in (1.5, -0.5, 2.0):
        agent.update(1, r, now=0.0)
    np.testing.assert_allclose(agent.stats[0], [0.0, 3.0])
    np.testing.assert_allclose(agent.stats[1], [0.0, 3.0])
    np.testing.assert_allclose(agent.stats[2], [0.0, 2.25 + 0.25 + 4.0])


def test_discounting_scales_the_evidence_not_the_prior():
    agent = ThompsonAgent(2, "beta", half_life_s=10.0)
    agent.update(0, 1.0, now=0.0)
    agent.update(0, 1.0, now=10.0)  # the first reward now counts one half
    assert agent.stats[0][0] == pytest.approx(1.5)
    assert agent.as_of[0] == 10.0
    ev = agent.evidence(now=30.0)
    assert ev[0][0] == pytest.approx(1.5 * decay_factor(20.0, 10.0))
    draws = agent.draws(np.random.default_rng(0), 20000, now=1e6)  # all evidence forgotten: Beta(1, 1)
    assert draws[:, 0].mean() == pytest.approx(0.5, abs=0.01)


def test_update_many_equals_updates_in_turn():
    rng = np.random.default_rng(1)
    arms, rewards = rng.integers(0, 4, size=50), rng.normal(size=50)
    one, many = ThompsonAgent(4, "gaussian", half_life_s=5.0), ThompsonAgent(4, "gaussian", half_life_s=5.0)
    one.update(2, 1.0, now=0.0)
    many.update(2, 1.0, now=0.0)
    for a, r in zip(arms, rewards, strict=True):
        one.update(int(a), float(r), now=7.0)
    many.update_many(arms, rewards, now=7.0)
    for s1, s2 in zip(one.stats, many.stats, strict=True):
        np.testing.assert_allclose(s1, s2)


def test_the_agent_finds_the_best_bernoulli_arm():
    rng = np.random.default_rng(2)
    means = np.array([0.3, 0.5, 0.45, 0.2])
    agent = ThompsonAgent(4, "beta")
    for t in range(0, 3000, 10):
        arms = agent.select_many(rng, 10, now=float(t))
        agent.update_many(arms, (rng.random(10) < means[arms]).astype(float), now=float(t + 10))
    alpha, b = 1 + agent.stats[0], 1 + agent.stats[1]
    assert abs(alpha[1] / (alpha[1] + b[1]) - 0.5) < 0.03
    assert agent.probabilities(rng)[1] > 0.8
    assert agent.pulls()[1] > 0.6 * 3000


def test_exploration_floor_and_caps_shape_the_sampling_distribution():
    rng = np.random.default_rng(3)
    agent = ThompsonAgent(3, "beta", exploration_floor=0.05, caps=np.array([1.0, 1.0, 0.1]))
    agent.stats[0][:] = [900.0, 100.0, 950.0]  # arm 2 (a canary) looks best
    agent.stats[1][:] = [100.0, 900.0, 50.0]
    p = agent.probabilities(rng)
    # arm 2 is held at its cap, its excess goes to arm 0 (best without it), then the floor for arm 1
    np.testing.assert_allclose(p, [0.855, 0.05, 0.095], atol=1e-9)
    picks = np.bincount(agent.select_many(rng, 20000), minlength=3) / 20000
    np.testing.assert_allclose(picks, p, atol=0.015)
    assert agent.select(rng) in (0, 1, 2)


def test_impossible_settings_fail_at_construction():
    with pytest.raises(ValueError, match="impossible"):
        ThompsonAgent(4, "beta", exploration_floor=0.3)
    with pytest.raises(ValueError, match="dim"):
        ThompsonAgent(2, "linear")
    with pytest.raises(ValueError, match="kind"):
        ThompsonAgent(2, "poisson")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-contextual"):
        ThompsonAgent(2, "linear", dim=2).update_many(np.array([0]), np.array([1.0]))
