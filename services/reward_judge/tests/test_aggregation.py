"""Aggregation of signals of different scales."""

from __future__ import annotations

import math

import pytest

from flywheel.core.errors import InvalidArgument
from flywheel.reward_judge.aggregation import (
    Method,
    Signal,
    aggregate,
    cost_signal,
    latency_signal,
    pareto_ranks,
)


def test_signals_are_normalised_to_their_scale_before_combining():
    # MassGen would sum 3 + 0.5; here each counts by its weight on [0, 1].
    agg = aggregate([Signal("votes", 3, 0, 4), Signal("quality", 0.5)])
    assert agg.components == {"votes": 0.75, "quality": 0.5}
    assert agg.total == pytest.approx(0.625)


def test_missing_signal_is_left_out_not_zero():
    agg = aggregate([Signal("a", 0.8, weight=1), Signal("b", None, weight=3)])
    assert agg.total == pytest.approx(0.8) and "b" not in agg.components


def test_methods():
    s = [Signal("a", 0.25, weight=1), Signal("b", 1.0, weight=3)]
    assert aggregate(s, Method.WEIGHTED_MEAN).total == pytest.approx((0.25 + 3) / 4)
    assert aggregate(s, Method.WEIGHTED_SUM).total == pytest.approx(3.25)
    assert aggregate(s, Method.GEOMETRIC_MEAN).total == pytest.approx(math.exp(math.log(0.25) / 4))
    assert aggregate([Signal("a", 0.0), Signal("b", 1.0)], Method.GEOMETRIC_MEAN).total == 0.0


def test_values_outside_the_scale_are_clipped_and_lower_is_better_flips():
    assert aggregate([Signal("x", 7, 0, 5)]).total == 1.0
    assert latency_signal(300, target_ms=200, max_ms=1200).normalised() == pytest.approx(0.9)
    assert latency_signal(100, target_ms=200, max_ms=1200).normalised() == 1.0
    assert cost_signal(0.02, budget_usd=0.01).normalised() == 0.0


def test_nothing_present_is_zero_with_no_components():
    agg = aggregate([Signal("a", None)])
    assert agg.total == 0.0 and agg.components == {}


@pytest.mark.parametrize(
    ("signals", "words"),
    [
        ([Signal("a", 1, 1, 1)], "min < max"),
        ([Signal("a", 1, weight=-1)], "weight"),
        ([Signal("a", float("inf"))], "finite"),
        ([Signal("a", 1), Signal("a", 0)], "twice"),
        ([Signal("", 1)], "name"),
    ],
)
def test_bad_signals_are_refused(signals, words):
    with pytest.raises(InvalidArgument, match=words):
        aggregate(signals)


def test_pareto_ranks():
    points = [{"q": 0.9, "speed": 0.1}, {"q": 0.5, "speed": 0.5}, {"q": 0.4, "speed": 0.4}, {"q": 0.1, "speed": 0.9}]
    assert pareto_ranks(points) == [0, 0, 1, 0]
    assert pareto_ranks([{"q": 1.0}, {"q": 0.5}, {"q": 0.1}]) == [0, 1, 2]
