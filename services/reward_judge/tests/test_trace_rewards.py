"""Rewards from spans: declared scales, normalised before aggregation."""

from __future__ import annotations

import pytest

from flywheel.reward_judge.trace_rewards import (
    SpanView,
    answer_depth,
    answer_structure,
    tool_outcome,
    trace_reward,
    trace_signals,
)

STRUCTURED = """# Fixing the build

The build fails because the cache is stale, for example after a branch switch.

1. Run `make clean`.
2. Run `make` again; it takes about 3 minutes.

```bash
make clean && make
```
"""


def test_tool_outcomes_follow_massgen():
    assert tool_outcome(SpanView("tool", attributes={"result": {"hits": 3}})) == 1.0
    assert tool_outcome(SpanView("tool", attributes={"result": []})) == -0.5
    assert tool_outcome(SpanView("tool", attributes={"result_empty": True})) == -0.5
    assert tool_outcome(SpanView("tool", ok=False)) == -1.0
    assert tool_outcome(SpanView("tool", attributes={"error": "boom"})) == -1.0


def test_answer_structure_and_depth_order_answers_sensibly():
    assert answer_structure("") == 0.0 and answer_depth("") == 0.0
    assert answer_structure(STRUCTURED) == 1.0
    assert answer_depth(STRUCTURED) > answer_depth("Run make clean.") > 0


def test_every_signal_declares_its_scale_and_is_normalised():
    spans = [
        SpanView("tool", attributes={"result": "ok"}),
        SpanView("tool", ok=False),
        SpanView("coordination", attributes={"event": "round", "round": 3}, tokens=20_000),
        SpanView("coordination", attributes={"event": "vote", "consensus": True}, tokens=30_000),
        SpanView("reward", name="judge", reward=8.0, reward_min=0.0, reward_max=10.0),
        SpanView("reward", name="judge", reward=-1.0, reward_min=-1.0, reward_max=1.0),
    ]
    agg, signals = trace_reward(spans, answer=STRUCTURED)
    by_name = {s.name: s for s in signals}
    assert (by_name["tool_success"].value, by_name["tool_success"].min, by_name["tool_success"].max) == (0.0, -1, 1)
    assert agg.components["tool_success"] == 0.5
    assert by_name["coordination_rounds"].value == 3 and agg.components["coordination_rounds"] == pytest.approx(7 / 9)
    assert by_name["consensus"].value == 1.0 and agg.components["consensus"] == 1.0
    assert agg.components["coordination_tokens"] == pytest.approx(0.5)
    assert agg.components["reward:judge"] == pytest.approx(0.8)
    assert agg.components["reward:judge#5"] == 0.0  # same name, still its own signal
    assert all(0.0 <= x <= 1.0 for x in agg.components.values())
    assert 0.0 <= agg.total <= 1.0


def test_no_consensus_is_the_bottom_of_its_scale():
    agg, _ = trace_reward([SpanView("coordination", attributes={"event": "vote"})])
    assert agg.components["consensus"] == 0.0


def test_a_wide_scale_does_not_dominate():
    # Raw, a coordination reward of +2.5 would swamp a tool failure at -1 (MassGen's sum).
    spans = [SpanView("tool", ok=False), SpanView("reward", name="coord", reward=2.5, reward_min=-1.5, reward_max=3.0)]
    agg, _ = trace_reward(spans)
    assert agg.components["tool_success"] == 0.0
    assert agg.components["reward:coord"] == pytest.approx(4 / 4.5)


def test_answer_from_the_last_content_span():
    signals = trace_signals([SpanView("content", attributes={"text": STRUCTURED})])
    assert {s.name for s in signals} == {"answer_structure", "answer_depth"}
