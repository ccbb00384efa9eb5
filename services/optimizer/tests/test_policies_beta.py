"""policies.beta: the Beta summary formulas, fractional updates, draws that converge and cover."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flywheel.optimizer.policies import beta


def test_summary_matches_the_seed_formula():
    s = beta.summarize(30.5, 7.25)
    total = 37.75
    half = 1.96 * math.sqrt(30.5 * 7.25 / (total**2 * (total + 1)))
    assert s.mean == pytest.approx(30.5 / total)
    assert (s.ci_low, s.ci_high) == pytest.approx((s.mean - half, s.mean + half))
    assert s.width == pytest.approx(2 * half)


def test_summary_is_clipped_to_the_unit_interval():
    prior = beta.summarize(1.0, 1.0)
    assert (prior.ci_low, prior.mean, prior.ci_high) == (0.0, 0.5, 1.0)
    assert beta.summarize(1000.0, 1.0).ci_high == 1.0
    assert beta.summarize(1.0, 1000.0).ci_low == 0.0


def test_summary_rejects_non_positive_parameters():
    with pytest.raises(ValueError, match="positive"):
        beta.summarize(0.0, 1.0)


def test_increments_clamp_rewards_and_reject_nan():
    assert beta.increments(0.25) == (0.25, 0.75)
    assert beta.increments(1.7) == (1.0, 0.0)
    assert beta.increments(-3.0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        beta.increments(float("nan"))


def test_draws_have_shape_m_by_k_and_the_posterior_means():
    rng = np.random.default_rng(0)
    d = beta.draws(np.array([2.0, 30.0, 5.0]), np.array([8.0, 10.0, 5.0]), rng, 20000)
    assert d.shape == (20000, 3)
    assert np.all((d >= 0) & (d <= 1))
    np.testing.assert_allclose(d.mean(axis=0), [0.2, 0.75, 0.5], atol=0.01)


def test_fractional_rewards_converge_to_the_true_mean():
    rng = np.random.default_rng(1)
    rewards = np.clip(rng.normal(0.3, 0.15, size=5000), 0, 1)  # judge-like scores in [0, 1]
    alpha = beta.PRIOR_ALPHA + rewards.sum()
    b = beta.PRIOR_BETA + (1 - rewards).sum()
    s = beta.summarize(alpha, b)
    assert s.mean == pytest.approx(rewards.mean(), abs=0.002)
    assert s.ci_low < rewards.mean() < s.ci_high
    assert s.width < 0.03


def test_interval_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    p, n, trials = 0.3, 200, 1000
    successes = rng.binomial(n, p, size=trials)
    covered = 0
    for k in successes:
        s = beta.summarize(1.0 + k, 1.0 + n - k)
        covered += s.ci_low <= p <= s.ci_high
    assert 0.92 <= covered / trials <= 0.98
