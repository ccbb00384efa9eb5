"""policies.linear: Cholesky-based posterior, exact score moments, and LinTS learning a context-dependent arm."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.policies import linear
from flywheel.optimizer.policies.simulate import ThompsonAgent


def _random_stats(rng: np.random.Generator, k: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(k, 20, d))
    y = rng.normal(size=(k, 20))
    return np.einsum("kni,knj->kij", x, x), np.einsum("kni,kn->ki", x, y)


def test_posterior_means_match_a_direct_solve():
    rng = np.random.default_rng(0)
    xtx, xty = _random_stats(rng, 4, 3)
    expected = np.stack([np.linalg.solve(xtx[i] + 0.5 * np.eye(3), xty[i]) for i in range(4)])
    np.testing.assert_allclose(linear.posterior_means(xtx, xty, 0.5), expected, rtol=1e-10)


def test_score_moments_are_exact():
    rng = np.random.default_rng(1)
    xtx, xty = _random_stats(rng, 3, 4)
    x = rng.normal(size=4)
    mean, var = linear.score_moments(xtx, xty, x, 2.0)
    for i in range(3):
        a = xtx[i] + 2.0 * np.eye(4)
        assert mean[i] == pytest.approx(np.linalg.solve(a, xty[i]) @ x)
        assert var[i] == pytest.approx(x @ np.linalg.solve(a, x))


def test_draws_follow_the_score_distribution():
    rng = np.random.default_rng(2)
    xtx, xty = _random_stats(rng, 2, 3)
    x = np.array([1.0, -0.5, 0.25])
    d = linear.draws(xtx, xty, x, 1.0, rng, 40000, noise_scale=0.7)
    mean, var = linear.score_moments(xtx, xty, x, 1.0)
    assert d.shape == (40000, 2)
    np.testing.assert_allclose(d.mean(axis=0), mean, atol=0.01)
    np.testing.assert_allclose(d.var(axis=0), 0.49 * var, rtol=0.05)


def test_no_data_draws_come_from_the_ridge_prior():
    rng = np.random.default_rng(3)
    d = linear.draws(np.zeros((2, 2, 2)), np.zeros((2, 2)), np.array([3.0, 4.0]), 4.0, rng, 20000)
    np.testing.assert_allclose(d.std(axis=0), 5.0 / 2.0, rtol=0.05)  # |x| / sqrt(ridge)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="ridge"):
        linear.posterior_means(np.zeros((1, 2, 2)), np.zeros((1, 2)), 0.0)
    with pytest.raises(ValueError, match="shape"):
        linear.score_moments(np.zeros((1, 2, 2)), np.zeros((1, 2)), np.zeros(3), 1.0)


def test_lints_learns_which_arm_is_best_in_which_context():
    """Two user kinds: arm 0 is better for kind A, arm 1 for kind B (features: bias, is_b)."""
    rng = np.random.default_rng(4)
    theta = np.array([[0.7, -0.4], [0.4, 0.3]])  # arm 0: 0.7 for A, 0.3 for B; arm 1: 0.4 for A, 0.7 for B
    agent = ThompsonAgent(2, "linear", dim=2, ridge=1.0, noise_scale=0.3)
    contexts = [np.array([1.0, 0.0]), np.array([1.0, 1.0])]
    late_correct = []
    for t in range(1500):
        kind = int(rng.integers(2))
        x = contexts[kind]
        arm = agent.select(rng, x)
        agent.update(arm, float(theta[arm] @ x + rng.normal(0, 0.3)), now=float(t), context=x)
        if t >= 1000:
            late_correct.append(arm == kind)
    assert np.mean(late_correct) > 0.9
    for kind, x in enumerate(contexts):
        assert agent.probabilities(rng, x)[kind] > 0.9
