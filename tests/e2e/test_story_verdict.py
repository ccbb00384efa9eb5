"""The traffic stage's verdict: which arm the bandit favours, how sure it is, and whether that
is the hidden best, said plainly in the report and the demo's summary."""

from __future__ import annotations

import pytest

from flywheel.stack.story.record import StoryRecord
from flywheel.stack.story.report import summary
from flywheel.stack.story.verdict import TOLD_APART, verdict, verdict_text


def arms(*rates: float) -> list[dict]:
    return [{"arm_id": f"config-{i}", "true_rate": r} for i, r in enumerate(rates, start=1)]


def post(*ab: tuple[float, float]) -> dict[str, dict[str, float]]:
    return {f"config-{i}": {"alpha": a, "beta": b, "mean": a / (a + b)} for i, (a, b) in enumerate(ab, start=1)}


def test_a_clear_winner_is_told_apart_and_named_the_hidden_best() -> None:
    v = verdict(arms(0.2, 0.6, 0.3), post((20, 80), (120, 80), (30, 70)))
    assert v["favourite"] == v["hidden_best"] == "config-2"
    assert v["told_apart"] and v["p_best"]["config-2"] > 0.99
    assert sum(v["p_best"].values()) == pytest.approx(1.0, abs=0.01)
    p = v["p_best"]["config-2"]
    assert verdict_text(v, 300) == f"the bandit favours config-2, the hidden best (P(best) {p:.2f}, told apart)"


def test_close_arms_favouring_the_wrong_one_are_said_not_told_apart() -> None:
    # The demo's case: 300 decisions, hidden rates 0.28 / 0.31 / 0.35, most traffic on the worst.
    v = verdict(arms(0.31, 0.28, 0.35), post((15, 35), (60, 140), (12, 30)))
    assert v["favourite"] != v["hidden_best"] == "config-3"
    assert not v["told_apart"] and v["p_best"][v["favourite"]] < TOLD_APART
    said = verdict_text(v, 300)
    assert "not the hidden best config-3" in said and "300 decisions have not told these arms apart yet" in said


def test_a_confident_wrong_favourite_is_called_a_miss() -> None:
    v = verdict(arms(0.5, 0.6), post((400, 100), (10, 90)))
    assert v["favourite"] == "config-1" and v["told_apart"] and v["hidden_best"] == "config-2"
    assert verdict_text(v, 600).endswith("(hidden rates 0.50 vs 0.60): a miss")


def test_no_posterior_no_verdict_and_unmeasured_rates_say_so() -> None:
    assert verdict(arms(0.3), {}) == {} and verdict_text({}, 0) == "no arm had a posterior"
    v = verdict([{"arm_id": "config-1"}, {"arm_id": "config-2"}], post((50, 50), (5, 95)))
    assert v["hidden_best"] is None and "no hidden rate was measured" in verdict_text(v, 100)


def test_the_reports_summary_carries_the_verdict() -> None:
    a = arms(0.31, 0.28, 0.35)
    v = verdict(a, post((15, 35), (60, 140), (12, 30)))
    said = summary(StoryRecord(traffic={"decisions": 300, "feedback_applied": 300, "arms": a, "verdict": v}))
    assert f"At the end, the bandit favours {v['favourite']} (P(best)" in said and "not told these arms apart" in said
    # A record from before the verdict existed still summarises.
    assert "At the end" not in summary(StoryRecord(traffic={"decisions": 300, "arms": a}))
