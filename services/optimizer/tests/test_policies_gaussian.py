"""policies.gaussian: the NIG posterior with no data, tiny and fractional n; coverage; TS with unknown variances."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.policies import gaussian
from flywheel.optimizer.policies.gaussian import NigPrior
from flywheel.optimizer.policies.selection import action_probabilities


def test_no_data_gives_back_the_prior():
    prior = NigPrior(mean=0.2, kappa=0.5, a=2.0, b=3.0)
    post = gaussian.posterior(np.zeros(2), np.zeros(2), np.zeros(2), prior)
    np.testing.assert_allclose(post.mean, 0.2)
    np.testing.assert_allclose(post.kappa, 0.5)
    np.testing.assert_allclose(post.a, 2.0)
    np.testing.assert_allclose(post.b, 3.0)


def test_posterior_matches_the_textbook_update():
    x = np.array([1.0, 2.0, 4.0])
    prior = NigPrior(mean=0.5, kappa=2.0, a=1.5, b=0.7)
    post = gaussian.posterior(3.0, x.sum(), (x**2).sum(), prior)
    n, xbar = 3, x.mean()
    assert float(post.kappa) == pytest.approx(5.0)
    assert float(post.mean) == pytest.approx((2.0 * 0.5 + x.sum()) / 5.0)
    assert float(post.a) == pytest.approx(1.5 + n / 2)
    expected_b = 0.7 + 0.5 * ((x - xbar) ** 2).sum() + 2.0 * n * (xbar - 0.5) ** 2 / (2 * 5.0)
    assert float(post.b) == pytest.approx(expected_b)


def test_prior_only_and_tiny_n_draws_are_finite_and_wide():
    rng = np.random.default_rng(0)
    n = np.array([0.0, 0.3, 1.0, 2.0])
    s = np.array([0.0, 0.3, 1.0, 2.0])  # all rewards equal to 1: zero sample variance
    ss = s.copy()
    d = gaussian.draws(n, s, ss, NigPrior(), rng, 4000)
    assert d.shape == (4000, 4)
    assert np.all(np.isfinite(d))
    spread = np.percentile(d, 90, axis=0) - np.percentile(d, 10, axis=0)
    assert spread[0] > 10  # an untried arm could be anything
    assert np.all(spread[2:] > 0.5)  # two equal rewards are not certainty


def test_summary_with_no_data_is_finite():
    s = gaussian.summarize(0.0, 0.0, 0.0)
    assert s.mean == 0.0 and np.isfinite(s.ci_low) and s.ci_low < 0 < s.ci_high


def test_discounted_statistics_keep_the_mean_and_widen_the_interval():
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, size=400)
    full = gaussian.summarize(400.0, x.sum(), (x**2).sum())
    f = 0.1  # the same decay factor on all three statistics
    decayed = gaussian.summarize(400.0 * f, x.sum() * f, (x**2).sum() * f)
    assert decayed.mean == pytest.approx(full.mean, abs=0.01)
    assert decayed.width > 2.5 * full.width


def test_posterior_mean_converges_and_the_interval_covers():
    rng = np.random.default_rng(2)
    mu, sigma, n, trials = 1.5, 3.0, 30, 600
    covered = 0
    for _ in range(trials):
        x = rng.normal(mu, sigma, size=n)
        s = gaussian.summarize(float(n), x.sum(), (x**2).sum())
        covered += s.ci_low <= mu <= s.ci_high
    assert 0.92 <= covered / trials <= 0.98
    x = rng.normal(mu, sigma, size=20000)
    assert gaussian.summarize(20000.0, x.sum(), (x**2).sum()).mean == pytest.approx(mu, abs=0.06)


def test_thompson_picks_the_better_arm_whatever_the_variances():
    """Arm 0: mean 1.0 but noisy (sigma 3); arm 1: mean 0.6, nearly deterministic (sigma 0.05)."""
    rng = np.random.default_rng(3)
    means, sigmas = np.array([1.0, 0.6]), np.array([3.0, 0.05])
    n, s, ss = np.zeros(2), np.zeros(2), np.zeros(2)
    pulls = np.zeros(2)
    for _ in range(3000):
        arm = int(np.argmax(gaussian.draws(n, s, ss, NigPrior(), rng, 1)[0]))
        r = rng.normal(means[arm], sigmas[arm])
        n[arm] += 1
        s[arm] += r
        ss[arm] += r * r
        pulls[arm] += 1
    p = action_probabilities(gaussian.draws(n, s, ss, NigPrior(), rng, 4000))
    assert p[0] > 0.9
    assert pulls[0] > pulls[1]


def test_for_scale_sets_the_variance_guess():
    assert NigPrior.for_scale(0.5).b == pytest.approx(0.25)
    with pytest.raises(ValueError, match="positive"):
        NigPrior.for_scale(0.0)
