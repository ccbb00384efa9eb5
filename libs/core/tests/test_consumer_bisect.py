"""EventConsumer's safety net: when a batch handler raises for the whole batch because of one
event, the batch is bisected, the good events are acked and only the bad one is dead-lettered
with the database's reason (no SQL); a dependency outage is not bisected, every event is retried.
The real NATS path is covered by tests/integration/test_door_validation.py."""

from __future__ import annotations

from types import SimpleNamespace

import asyncpg

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.consumer import EventConsumer
from flywheel.core.bus.publisher import Publisher


class FakeMsg:
    def __init__(self, seq: int, event: FeedbackEvent) -> None:
        self.subject = "t.product.feedback.bot"
        self.headers: dict[str, str] = {}
        self.data = event.SerializeToString()
        self.metadata = SimpleNamespace(sequence=SimpleNamespace(stream=seq), num_delivered=1)
        self.settled: str | None = None

    async def ack(self) -> None:
        self.settled = "ack"

    async def nak(self, delay: float | None = None) -> None:
        self.settled = "nak"


class Letters(Publisher):
    def __init__(self) -> None:
        self.sent: list[DeadLetter] = []

    async def publish(self, subject, message, *, msg_id=None, as_json=False):  # type: ignore[override]
        self.sent.append(message)


def consumer(handler) -> tuple[EventConsumer, Letters]:
    c = EventConsumer(
        js=None,  # type: ignore[arg-type]
        catalogue=Catalogue("t"),
        spec=Catalogue("t").consumer("optimizer-feedback"),
        message_type=FeedbackEvent,
        batch_handler=handler,
    )
    letters = Letters()
    c._publisher = letters
    return c, letters


def messages(n: int, bad: int) -> list[FakeMsg]:
    return [
        FakeMsg(i, FeedbackEvent(meta=EventMeta(event_id="x\x00" if i == bad else f"e{i}"), decision_id="d"))
        for i in range(n)
    ]


async def test_one_bad_event_is_dead_lettered_alone_and_the_rest_applied():
    applied: list[str] = []
    calls = 0

    async def handler(items):
        nonlocal calls
        calls += 1
        if any("\x00" in e.meta.event_id for e, _ in items):  # as PostgreSQL refuses the whole statement
            raise asyncpg.exceptions.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00')
        applied.extend(e.meta.event_id for e, _ in items)
        return [None] * len(items)

    c, letters = consumer(handler)
    msgs = messages(64, bad=37)
    await c._process(msgs)  # type: ignore[arg-type]
    assert sorted(applied) == sorted(f"e{i}" for i in range(64) if i != 37)
    assert [m.settled for m in msgs] == ["ack"] * 64  # the bad one acked after its dead letter
    [letter] = letters.sent
    assert letter.stream_sequence == 37
    assert letter.reason == (
        'the event cannot be stored: CharacterNotInRepertoireError: invalid byte sequence for encoding "UTF8": 0x00'
    )
    assert calls < 20  # bisected, not one call per event


async def test_an_outage_is_not_bisected_and_every_event_is_retried():
    calls = 0

    async def handler(items):
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("PostgreSQL is down")

    c, letters = consumer(handler)
    msgs = messages(16, bad=-1)
    await c._process(msgs)  # type: ignore[arg-type]
    assert calls == 1 and not letters.sent
    assert [m.settled for m in msgs] == ["nak"] * 16
