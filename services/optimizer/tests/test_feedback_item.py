"""handlers.feedback_item: the fast path for the common event gives exactly what the full
checks give, and every other event still takes the checks and is refused naming its field."""

from __future__ import annotations

import math

import pytest

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.errors import InvalidArgument
from flywheel.core.validation import check_numbers, check_string, check_timestamp
from flywheel.optimizer.handlers import feedback_item
from flywheel.optimizer.service import DECISION_ID_CHARS, ENDPOINT_CHARS, EVENT_ID_CHARS, FeedbackItem


def _event(
    event_id: str = "ev-1",
    decision_id: str = "dec-1",
    *,
    reward: float | None = 0.75,
    signals: dict[str, float] | None = None,
    endpoint: str = "",
    seconds: int = 1_700_000_000,
    nanos: int = 5,
) -> FeedbackEvent:
    e = FeedbackEvent(decision_id=decision_id, endpoint=endpoint, signals=signals or {})
    if reward is not None:
        e.reward = reward
    e.meta.event_id = event_id
    e.meta.time.seconds = seconds
    e.meta.time.nanos = nanos
    return e


def _reference(e: FeedbackEvent) -> FeedbackItem:
    """Every check, one after another (what feedback_item did before its fast path)."""
    check_string(e.meta.event_id, "meta.event_id", max_len=EVENT_ID_CHARS)
    check_string(e.decision_id, "decision_id", max_len=DECISION_ID_CHARS)
    check_string(e.endpoint, "endpoint", max_len=ENDPOINT_CHARS)
    check_timestamp(e.meta.time, "meta.time")
    check_numbers(e.signals, "signals")
    return FeedbackItem(
        e.meta.event_id, e.decision_id, e.reward if e.HasField("reward") else None, dict(e.signals), e.endpoint
    )


GOOD = [
    _event(),
    _event(reward=None),
    _event(reward=0.0),
    _event(reward=-3.5, endpoint="support-bot"),
    _event(reward=math.inf),  # not feedback_item's to refuse: service._check says "finite"
    _event(signals={"thumbs_up": 1.0, "resolved": 0.0}, reward=None),
    _event("é" * EVENT_ID_CHARS, "ü" * DECISION_ID_CHARS, endpoint="ß" * ENDPOINT_CHARS),  # non-ASCII, full width
    _event("", ""),  # empty ids: refused later by service._check, with the SDK's message
    _event(seconds=0, nanos=0),  # unset time
    _event(seconds=-62135596800, nanos=0),
    _event(seconds=253402300799, nanos=999_999_999),
]

BAD = [
    (_event("e" * (EVENT_ID_CHARS + 1)), "meta.event_id: is 129 characters long"),
    (_event(decision_id="d" * (DECISION_ID_CHARS + 1)), "decision_id: is 65 characters long"),
    (_event(endpoint="p" * (ENDPOINT_CHARS + 1)), "endpoint: is 65 characters long"),
    (_event("ev\x00"), "meta.event_id: contains a NUL byte"),
    (_event(decision_id="d\x00"), "decision_id: contains a NUL byte"),
    (_event(endpoint="\x00"), "endpoint: contains a NUL byte"),
    (_event(seconds=253402300800), "meta.time: seconds 253402300800 are outside years 1-9999"),
    (_event(seconds=-62135596801), "meta.time: seconds -62135596801 are outside years 1-9999"),
    (_event(nanos=-1), "meta.time: nanos -1 must be in [0, 999999999]"),
    (_event(signals={"ok": math.nan}), "signals.ok: must be a finite number"),
    (_event(signals={"a\x00": 1.0}), "signals: key 'a\\x00' contains a NUL byte"),
]


@pytest.mark.parametrize("event", GOOD, ids=range(len(GOOD)))
def test_a_good_event_gives_what_the_full_checks_give(event):
    item = feedback_item(event)
    assert item == _reference(event)
    assert type(item.signals) is dict  # a copy, not the message's map
    assert (item.reward is None) == (not event.HasField("reward"))


@pytest.mark.parametrize(("event", "message"), BAD, ids=range(len(BAD)))
def test_a_bad_event_is_refused_naming_its_field(event, message):
    with pytest.raises(InvalidArgument) as exc:
        feedback_item(event)
    assert str(exc.value).startswith(message)
    with pytest.raises(InvalidArgument) as ref:
        _reference(event)
    assert str(exc.value) == str(ref.value)


def test_the_signals_are_copied_so_the_message_can_be_reused():
    event = _event(signals={"a": 1.0}, reward=None)
    item = feedback_item(event)
    event.signals["a"] = 5.0
    assert item.signals == {"a": 1.0}
