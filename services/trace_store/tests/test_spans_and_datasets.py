"""Unit tests: span validation and stored form, tree order, dataset rows and the split."""

from __future__ import annotations

import pytest

from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind
from flywheel.trace_store.datasets import Example, build_rows, split_by_prompt
from flywheel.trace_store.queries import tree_order
from flywheel.trace_store.spans import InvalidSpan, Limits, find_cycle, from_record, to_record, validate_batch


def span(span_id: str, parent: str = "", kind: int = SpanKind.SPAN_KIND_PROMPT, start: int = 1, **kw) -> Span:
    s = Span(trace_id="a" * 32, span_id=span_id, parent_span_id=parent, kind=kind, agent="bot", **kw)
    s.start_time.seconds = start
    return s


def test_a_valid_batch_round_trips_through_its_stored_form():
    s = span("1" * 16, model="m", input="q", output="a", input_tokens=3, cost_usd=0.5)
    s.attributes.update({"gen_ai.system": "openai", "n": 2})
    r = span("2" * 16, "1" * 16, SpanKind.SPAN_KIND_REWARD, reward=7, reward_min=0, reward_max=10)
    spans = validate_batch(SpanBatch(spans=[s, r]))
    assert [from_record(to_record(x)) for x in spans] == spans


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: setattr(s, "span_id", ""), "span_id must be 16 lowercase hex"),
        (lambda s: setattr(s, "trace_id", "A" * 32), "trace_id must be 32 lowercase hex"),
        (lambda s: setattr(s, "kind", 7), "unknown span kind 7"),
        (lambda s: setattr(s, "parent_span_id", s.span_id), "own parent"),
        (lambda s: s.attributes.update({"x": "y" * 200}), "attributes are"),
        (lambda s: s.ClearField("start_time"), "start_time is missing"),
        (lambda s: setattr(s, "agent", "a b"), "agent"),
        (lambda s: setattr(s, "cost_usd", float("nan")), "cost_usd"),
    ],
)
def test_invalid_spans_are_refused_with_the_reason(change, reason):
    s = span("1" * 16)
    change(s)
    with pytest.raises(InvalidSpan, match=reason):
        validate_batch(SpanBatch(spans=[s]), limits=Limits(max_attributes_bytes=100))


def test_reward_spans_need_a_value_inside_a_nonempty_scale():
    for fields, reason in (({}, "finite reward"), ({"reward": 2}, "outside its scale"),
                           ({"reward": 1, "reward_min": 3, "reward_max": 3}, "scale")):  # fmt: skip
        with pytest.raises(InvalidSpan, match=reason):
            validate_batch(SpanBatch(spans=[span("1" * 16, kind=SpanKind.SPAN_KIND_REWARD, **fields)]))


def test_cycles_are_found_and_the_agent_defaults_to_the_subject():
    assert find_cycle({"a": "b", "b": "c", "c": "a"}) in {"a", "b", "c"}
    assert find_cycle({"a": "b", "b": "", "c": "b"}) is None
    with pytest.raises(InvalidSpan, match="parent cycle"):
        validate_batch(SpanBatch(spans=[span("1" * 16, "2" * 16), span("2" * 16, "1" * 16)]))
    s = span("1" * 16)
    s.agent = ""
    assert validate_batch(SpanBatch(spans=[s]), default_agent="from-subject")[0].agent == "from-subject"


def test_tree_order_is_depth_first_with_orphans_as_roots():
    root, a, b, aa = (
        span("1" * 16, start=1),
        span("2" * 16, "1" * 16, start=3),
        span("3" * 16, "1" * 16, start=2),
        span("4" * 16, "2" * 16, start=4),
    )
    orphan = span("5" * 16, "9" * 16, start=0)
    order = [(s.span_id[0], d) for s, d in tree_order([aa, a, orphan, b, root])]
    assert order == [("5", 0), ("1", 0), ("3", 1), ("2", 1), ("4", 2)]


def examples() -> list[Example]:
    out = []
    for p in range(10):
        for r, (answer, reward) in enumerate((("good", 0.9), ("ok", 0.6), ("bad", 0.1))):
            out.append(Example(f"t{p}-{r}", f"prompt {p}", f"{answer} {p}", reward))
    out.append(Example("dup", "  PROMPT 0 ", "good 0", 0.7))  # same prompt and answer: merged
    return out


def test_preference_pairs_best_against_worst_with_provenance():
    rows = build_rows("preference", examples(), min_margin=0.2)
    assert len(rows) == 10 and all(len(v) == 1 for v in rows.values())
    first = rows["prompt 0"][0]
    assert (first["chosen"], first["rejected"], first["chosen_score"]) == ("good 0", "bad 0", pytest.approx(0.8))
    assert first["trace_ids"] == ["dup", "t0-0", "t0-2"]
    assert build_rows("preference", examples(), min_margin=0.9) == {}


def test_sft_and_reward_rows_and_a_split_without_leakage():
    assert sum(len(v) for v in build_rows("sft", examples(), min_reward=0.75).values()) == 10
    reward_rows = build_rows("reward", examples())
    assert sum(len(v) for v in reward_rows.values()) == 30
    train, validation = split_by_prompt(reward_rows, 0.2)
    assert (len(train), len(validation)) == (24, 6)
    assert not {r["prompt"].lower().strip() for r in train} & {r["prompt"].lower().strip() for r in validation}
    assert split_by_prompt(reward_rows, 0.2) == (train, validation)  # deterministic
