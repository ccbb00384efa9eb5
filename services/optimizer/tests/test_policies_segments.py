"""policies.segments: priors borrowed from the endpoint keep its mean and cap its weight."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.policies import gaussian, segments
from flywheel.optimizer.policies.gaussian import NigPrior


def test_beta_prior_keeps_the_endpoint_mean_with_at_most_strength_pulls():
    a0, b0 = segments.beta_prior_from_endpoint(np.array([801.0, 21.0]), np.array([201.0, 81.0]), strength=10.0)
    np.testing.assert_allclose(a0 + b0, [10.0, 10.0])  # the endpoint's 1000 and 100 pulls count as 10
    np.testing.assert_allclose(a0 / (a0 + b0), [801 / 1002, 21 / 102])


def test_beta_prior_is_weaker_when_the_endpoint_knows_little():
    a0, b0 = segments.beta_prior_from_endpoint(3.0, 2.0, strength=50.0)
    assert float(a0 + b0) == pytest.approx(5.0)  # the endpoint's own 3 pulls + its Beta(1, 1)
    a0, b0 = segments.beta_prior_from_endpoint(1.0, 1.0, strength=50.0)
    assert (float(a0), float(b0)) == (1.0, 1.0)  # nothing known: Beta(1, 1)


def test_segment_posterior_adds_the_segments_own_evidence():
    alpha, b = segments.beta_segment_posterior(901.0, 101.0, seg_alpha=1.0 + 2.0, seg_beta=1.0 + 8.0, strength=20.0)
    assert float(alpha) == pytest.approx(20 * 901 / 1002 + 2.0)
    assert float(b) == pytest.approx(20 * 101 / 1002 + 8.0)


def test_a_segment_with_plenty_of_data_follows_its_own_data():
    alpha, b = segments.beta_segment_posterior(9001.0, 1001.0, 1.0 + 200.0, 1.0 + 800.0, strength=10.0)
    assert float(alpha / (alpha + b)) == pytest.approx(0.2, abs=0.01)  # endpoint says 0.9


def test_strength_must_be_positive():
    with pytest.raises(ValueError, match="strength"):
        segments.beta_prior_from_endpoint(2.0, 2.0, strength=0.0)
    with pytest.raises(ValueError, match="strength"):
        segments.gaussian_prior_from_endpoint(1.0, 1.0, 1.0, strength=-1.0)


def test_gaussian_prior_caps_borrowed_observations_and_keeps_mean_and_spread():
    rng = np.random.default_rng(0)
    x = rng.normal(2.0, 0.5, size=5000)
    base = NigPrior()
    prior = segments.gaussian_prior_from_endpoint(5000.0, x.sum(), (x**2).sum(), strength=20.0, base=base)
    assert float(prior.kappa) == pytest.approx(base.kappa + 20.0)
    assert float(prior.a) == pytest.approx(base.a + 10.0)
    assert float(prior.mean) == pytest.approx(x.mean(), abs=0.02)
    # E[sigma^2] = b / (a - 1): the base guess (b0 = 1) plus 20 observations of variance ~0.25
    assert float(prior.b / (prior.a - 1)) == pytest.approx((base.b + 20 * x.var() / 2) / (base.a + 10 - 1), rel=0.01)
    small = segments.gaussian_prior_from_endpoint(4.0, 8.0, 17.0, strength=20.0, base=base)
    assert float(small.kappa) == pytest.approx(base.kappa + 4.0)  # fewer when the endpoint has fewer


def test_gaussian_segment_posterior_moves_from_the_endpoint_to_its_own_mean():
    prior = segments.gaussian_prior_from_endpoint(np.array([1000.0]), np.array([1000.0]), np.array([1250.0]), 10.0)
    young = gaussian.posterior(np.array([2.0]), np.array([0.0]), np.array([0.0]), prior)
    old = gaussian.posterior(np.array([500.0]), np.array([0.0]), np.array([125.0]), prior)
    assert float(young.mean[0]) > 0.7  # mostly the endpoint's 1.0
    assert float(old.mean[0]) < 0.05  # its own 0.0
