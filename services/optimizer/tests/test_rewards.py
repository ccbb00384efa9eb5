"""Feedback to one reward: scalar first, else the weighted mean of the present signals."""

from __future__ import annotations

import pytest

from flywheel.optimizer.rewards import combine_reward


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


def test_measurements_are_not_rewards_unless_weighted():
    assert combine_reward(None, {"latency_ms": 850.0, "thumbs_up": 1.0}, {}) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no reward"):
        combine_reward(None, {"latency_ms": 850.0, "cost_usd": 0.01}, {})
    assert combine_reward(None, {"latency_ms": 0.2}, {"latency_ms": 1.0}) == pytest.approx(0.2)
