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


def test_a_bounded_endpoint_clips_a_reward_outside_the_unit_interval_and_says_so():
    from types import SimpleNamespace

    from prometheus_client import REGISTRY
    from structlog.testing import capture_logs

    from flywheel.optimizer import service
    from flywheel.optimizer.service import FeedbackItem

    def clipped(side: str) -> float:
        return REGISTRY.get_sample_value("flywheel_optimizer_rewards_clipped_total", {"side": side}) or 0.0

    target = SimpleNamespace(decision=SimpleNamespace(endpoint="bot"), weights={}, bounded=True, kind="thompson_beta")
    above, below = clipped("above"), clipped("below")
    service._clip_warned_at[0] = float("-inf")
    with capture_logs() as logs:
        assert service._reward(FeedbackItem("e1", "d1", 5.0, {}), target) == 1.0  # stars sent as a reward
        assert service._reward(FeedbackItem("e2", "d1", 1e300, {}), target) == 1.0
        assert service._reward(FeedbackItem("e3", "d1", -0.5, {}), target) == 0.0
        assert service._reward(FeedbackItem("e4", "d1", 0.7, {}), target) == 0.7  # in range: nothing to say
    assert (clipped("above") - above, clipped("below") - below) == (2.0, 1.0)
    # One warning a minute names the endpoint and the value, not one per event.
    warnings = [e for e in logs if "clipped by a bounded endpoint" in e["event"]]
    assert len(warnings) == 1 and warnings[0]["endpoint"] == "bot" and warnings[0]["reward"] == 5.0
    # An unbounded endpoint refuses what it cannot hold instead.
    gaussian = SimpleNamespace(decision=target.decision, weights={}, bounded=False, kind="thompson_gaussian")
    refused = service._reward(FeedbackItem("e5", "d1", 1e300, {}), gaussian)
    assert isinstance(refused, service.InvalidArgument) and "outside" in str(refused)
