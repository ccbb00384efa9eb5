"""flywheel.optimizer.policy: Beta summaries, Thompson choices with honest propensities, reward combination."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flywheel.optimizer.policy import choose, combine_reward, summarize

# --- summarize -----------------------------------------------------------------------------


@pytest.mark.parametrize(("alpha", "beta"), [(2.0, 3.0), (10.0, 10.0), (30.5, 7.25), (5.0, 95.0), (400.0, 600.0)])
def test_summary_matches_the_beta_formulas(alpha, beta):
    s = summarize(alpha, beta)
    total = alpha + beta
    mean = alpha / total
    half = 1.96 * math.sqrt(alpha * beta / (total**2 * (total + 1)))
    assert s.mean == pytest.approx(mean)
    assert s.ci_low == pytest.approx(max(0.0, mean - half))
    assert s.ci_high == pytest.approx(min(1.0, mean + half))
    assert s.ci_low <= s.mean <= s.ci_high


def test_summary_known_values():
    s = summarize(3.0, 1.0)  # mean 0.75, var 3/(16*5) = 0.0375
    assert s.mean == pytest.approx(0.75)
    assert s.ci_low == pytest.approx(0.75 - 1.96 * math.sqrt(0.0375))
    assert s.ci_high == pytest.approx(min(1.0, 0.75 + 1.96 * math.sqrt(0.0375)))


def test_summary_interval_is_clipped_to_unit_range():
    prior = summarize(1.0, 1.0)  # half-width 0.566 around 0.5
    assert (prior.ci_low, prior.mean, prior.ci_high) == (0.0, 0.5, 1.0)
    high = summarize(1000.0, 1.0)
    assert high.ci_high == 1.0 and high.ci_low < high.mean < 1.0
    low = summarize(1.0, 1000.0)
    assert low.ci_low == 0.0 and 0.0 < low.mean < low.ci_high


def test_summary_interval_narrows_with_evidence():
    few, many = summarize(6.0, 4.0), summarize(600.0, 400.0)
    assert few.mean == pytest.approx(many.mean)
    assert many.ci_high - many.ci_low < (few.ci_high - few.ci_low) / 5


# --- choose --------------------------------------------------------------------------------


def _run(alphas, betas, *, calls: int, floor: float = 0.0, seed: int = 7):
    rng = np.random.default_rng(seed)
    a, b = np.asarray(alphas, dtype=float), np.asarray(betas, dtype=float)
    chosen, probs = zip(*(choose(a, b, rng, floor) for _ in range(calls)), strict=True)
    return np.array(chosen), np.array(probs)


def test_a_clearly_best_arm_is_chosen_most_of_the_time():
    chosen, probs = _run([90, 10, 10], [10, 90, 90], calls=300)
    assert (chosen == 0).mean() > 0.95
    assert probs[chosen == 0].min() > 0.95


def test_best_arm_position_does_not_matter():
    chosen, _ = _run([10, 10, 90], [90, 90, 10], calls=300)
    assert (chosen == 2).mean() > 0.95


def test_reported_probability_matches_empirical_selection_frequency():
    """Off-policy evaluation weighs each logged decision by 1/probability: the probability must
    be the real chance the policy had of choosing that arm."""
    chosen, probs = _run([12, 10, 8], [8, 10, 12], calls=1500)
    for arm in range(3):
        picked = chosen == arm
        assert picked.sum() > 50, "every arm should be chosen sometimes in this setup"
        assert probs[picked].mean() == pytest.approx(picked.mean(), abs=0.035), f"arm {arm}"
    # Inverse propensity weights of the chosen arms average to the number of arms.
    assert (1 / probs).mean() == pytest.approx(3.0, rel=0.1)


def test_reported_probability_with_exploration_floor_matches_frequency():
    chosen, probs = _run([12, 10, 8], [8, 10, 12], calls=1500, floor=0.1, seed=11)
    for arm in range(3):
        picked = chosen == arm
        assert probs[picked].mean() == pytest.approx(picked.mean(), abs=0.035), f"arm {arm}"
    assert (1 / probs).mean() == pytest.approx(3.0, rel=0.1)


def test_exploration_floor_is_a_lower_bound_on_every_arm():
    floor = 0.05
    chosen, probs = _run([200, 1, 1, 1], [1, 200, 200, 200], calls=1500, floor=floor, seed=3)
    assert probs.min() >= floor
    for arm in (1, 2, 3):  # hopeless arms are still explored at about the floor rate
        assert (chosen == arm).mean() == pytest.approx(floor, abs=0.02)
        assert probs[chosen == arm].mean() == pytest.approx(floor, abs=0.01)


def test_floor_times_arms_of_one_is_uniform():
    chosen, probs = _run([200, 1], [1, 200], calls=1000, floor=0.5)
    assert probs == pytest.approx(np.full(1000, 0.5))
    assert (chosen == 1).mean() == pytest.approx(0.5, abs=0.06)


def test_no_logged_probability_is_zero_or_above_one():
    _, probs = _run([500, 1], [1, 500], calls=200)
    assert (probs > 0).all() and (probs <= 1).all()


def test_single_arm_has_probability_close_to_one():
    chosen, probs = _run([3], [5], calls=20)
    assert (chosen == 0).all()
    assert probs == pytest.approx(np.ones(20), abs=1e-3)


def test_no_arms_raises():
    with pytest.raises(ValueError, match="no arms"):
        choose(np.array([]), np.array([]), np.random.default_rng(0))


def test_same_seed_same_choices():
    a, _ = _run([5, 5, 5], [5, 5, 5], calls=50, seed=42)
    b, _ = _run([5, 5, 5], [5, 5, 5], calls=50, seed=42)
    assert (a == b).all()


# --- combine_reward ------------------------------------------------------------------------


def test_weighted_mean_of_present_signals():
    weights = {"thumbs_up": 1.0, "resolved": 3.0}
    assert combine_reward(None, {"thumbs_up": 1.0, "resolved": 0.0}, weights) == pytest.approx(0.25)
    assert combine_reward(None, {"thumbs_up": 0.0, "resolved": 1.0}, weights) == pytest.approx(0.75)


def test_a_missing_signal_is_not_a_zero():
    weights = {"thumbs_up": 1.0, "resolved": 3.0}
    assert combine_reward(None, {"thumbs_up": 1.0}, weights) == pytest.approx(1.0)
    assert combine_reward(None, {"resolved": 0.6}, weights) == pytest.approx(0.6)


def test_signals_without_a_weight_are_ignored_when_weights_are_set():
    assert combine_reward(None, {"resolved": 0.5, "noise": 0.0}, {"resolved": 2.0}) == pytest.approx(0.5)


def test_without_weights_every_signal_counts_equally():
    assert combine_reward(None, {"a": 1.0, "b": 0.0, "c": 0.5}, {}) == pytest.approx(0.5)


@pytest.mark.parametrize("reward", [0.2, 0.0, 1.0])
def test_scalar_reward_wins_over_signals(reward):
    assert combine_reward(reward, {"resolved": 0.9}, {"resolved": 1.0}) == reward


def test_no_matching_signal_raises():
    with pytest.raises(ValueError, match="none of the endpoint's signals"):
        combine_reward(None, {"other": 1.0}, {"resolved": 1.0})
    with pytest.raises(ValueError, match="no reward"):
        combine_reward(None, {}, {})


def test_only_zero_weight_signals_present_raises():
    with pytest.raises(ValueError, match="sum to zero"):
        combine_reward(None, {"ignored": 1.0}, {"ignored": 0.0, "resolved": 1.0})
