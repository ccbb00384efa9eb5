"""policies.canary: probability that the canary is better, and its verdict."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.policies import beta
from flywheel.optimizer.policies.canary import canary_verdict, probability_better


def test_probability_better_counts_paired_draws_and_halves_ties():
    assert probability_better(np.array([0.5, 0.7, 0.2, 0.4]), np.array([0.4, 0.6, 0.3, 0.4])) == pytest.approx(0.625)
    with pytest.raises(ValueError, match="same length"):
        probability_better(np.zeros(3), np.zeros(4))


def test_clearly_better_canary_is_promoted_and_clearly_worse_retired():
    rng = np.random.default_rng(0)
    draws = beta.draws(np.array([1 + 70.0, 1 + 50.0, 1 + 30.0]), np.array([1 + 30.0, 1 + 50.0, 1 + 70.0]), rng, 4000)
    incumbent = draws[:, 1]
    better, worse = probability_better(draws[:, 0], incumbent), probability_better(draws[:, 2], incumbent)
    assert better > 0.99 and worse < 0.01
    assert canary_verdict(better, 100) == "promote"
    assert canary_verdict(worse, 100) == "retire"


def test_undecided_or_young_canaries_continue():
    assert canary_verdict(0.999, 29) == "continue"
    assert canary_verdict(0.0, 10) == "continue"
    assert canary_verdict(0.6, 1000) == "continue"
    assert canary_verdict(0.95, 30) == "promote"
    assert canary_verdict(0.05, 30) == "retire"


def test_thresholds_are_configurable_and_checked():
    assert canary_verdict(0.9, 50, promote_probability=0.85) == "promote"
    assert canary_verdict(0.9, 50, min_pulls=100) == "continue"
    with pytest.raises(ValueError, match="retire_probability"):
        canary_verdict(0.5, 50, promote_probability=0.1, retire_probability=0.2)
