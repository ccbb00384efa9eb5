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


def test_a_canary_on_trial_gets_exactly_its_share_and_the_others_keep_their_ratio():
    from flywheel.optimizer.policies.canary import trial_shares

    p = np.array([0.6, 0.3, 0.1])  # Thompson would nearly starve the canary (last)
    out = trial_shares(p, np.array([False, False, True]), np.array([0.0, 0.0, 0.25]))
    assert out.sum() == pytest.approx(1.0)
    assert out[2] == pytest.approx(0.25)
    assert out[0] / out[1] == pytest.approx(2.0)
    # Nothing on trial: unchanged.
    assert np.array_equal(trial_shares(p, np.zeros(3, bool), np.zeros(3)), p)
    # Only canaries live: they split everything.
    assert trial_shares(np.array([0.0, 1.0]), np.array([True, True]), np.array([0.5, 0.5])).tolist() == [0.5, 0.5]


def test_snapshot_gives_a_young_canary_its_trial_share_until_min_pulls():
    from flywheel.optimizer.posterior import Stats
    from flywheel.optimizer.snapshot import selection_probabilities, trial_share_vector
    from flywheel.optimizer.spec import ACTIVE, CANARY, PolicyConfig

    policy = PolicyConfig(canary_min_pulls=20)
    statuses = [ACTIVE, CANARY]
    caps = np.array([1.0, 0.3])
    # The canary lost its first 3 pulls; the incumbent won 40 of 50.
    stats = Stats(w=np.array([50.0, 3.0]), s=np.array([40.0, 0.0]), ss=np.array([40.0, 0.0]))
    rng = np.random.default_rng(0)
    young = trial_share_vector(policy, statuses, caps, np.array([50.0, 3.0]))
    p = selection_probabilities(policy, stats, np.array([True, True]), caps, rng, trial=young)
    assert p[1] == pytest.approx(0.3)
    # With min_pulls reached, the posterior decides again: the canary gets almost nothing.
    grown = trial_share_vector(policy, statuses, caps, np.array([50.0, 20.0]))
    stats20 = Stats(w=np.array([50.0, 20.0]), s=np.array([40.0, 2.0]), ss=np.array([40.0, 2.0]))
    assert selection_probabilities(policy, stats20, np.array([True, True]), caps, rng, trial=grown)[1] < 0.01
