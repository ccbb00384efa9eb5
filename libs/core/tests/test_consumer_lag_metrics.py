"""EventConsumer exports its lag: each event's age when taken (from JetStream's stored
timestamp) and the messages still waiting after the last fetch, labelled by consumer; and the
same lag cut into stages (busy, fetch, queue, handle, ack, total)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.consumer import EventConsumer


class FakeMsg:
    def __init__(self, seq: int, age_s: float, pending: int) -> None:
        self.subject = "lag.product.feedback.bot"
        self.headers: dict[str, str] = {}
        self.data = FeedbackEvent(meta=EventMeta(event_id=f"e{seq}"), decision_id="d").SerializeToString()
        stored = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=age_s)
        self.metadata = SimpleNamespace(
            sequence=SimpleNamespace(stream=seq), num_delivered=1, num_pending=pending, timestamp=stored
        )

    async def ack(self) -> None:
        pass


def _sample(name: str, consumer: str) -> float:
    return REGISTRY.get_sample_value(name, {"consumer": consumer}) or 0.0


STAGES = ("busy", "fetch", "queue", "handle", "ack", "total")


def feedback_consumer(prefix: str, handler, **options) -> EventConsumer:
    """An optimizer-feedback consumer of a catalogue named ``prefix`` (no NATS: ``_process`` only)."""
    catalogue = Catalogue(prefix)
    return EventConsumer(
        js=None,  # type: ignore[arg-type]
        catalogue=catalogue,
        spec=catalogue.consumer("optimizer-feedback"),
        message_type=FeedbackEvent,
        batch_handler=handler,
        **options,
    )


async def test_event_age_and_pending_are_exported_per_consumer():
    async def handler(items):
        return [None] * len(items)

    c = feedback_consumer("lag", handler)
    count0 = _sample("flywheel_event_age_seconds_count", c.name)
    sum0 = _sample("flywheel_event_age_seconds_sum", c.name)
    await c._process([FakeMsg(1, age_s=30.0, pending=9), FakeMsg(2, age_s=20.0, pending=8)])  # type: ignore[list-item]
    assert _sample("flywheel_event_age_seconds_count", c.name) - count0 == 2
    assert 49.0 < _sample("flywheel_event_age_seconds_sum", c.name) - sum0 < 60.0
    assert _sample("flywheel_consumer_pending", c.name) == 8  # as of the last message fetched


def _stage(consumer: str, stage: str, what: str = "sum") -> float:
    return (
        REGISTRY.get_sample_value(f"flywheel_event_lag_seconds_{what}", {"consumer": consumer, "stage": stage}) or 0.0
    )


async def test_each_event_s_lag_is_cut_into_stages():
    async def handler(items):
        await asyncio.sleep(0.05)
        return [None] * len(items)

    c = feedback_consumer("stages", handler, lag_sample_every=1)
    stages = STAGES
    count0 = {s: _stage(c.name, s, "count") for s in stages}
    sum0 = {s: _stage(c.name, s) for s in stages}
    # Stored 30 s and 5 s ago; the fetch that took them was sent 10 s ago.
    requested = time.time() - 10.0
    await c._process([FakeMsg(1, age_s=30.0, pending=1), FakeMsg(2, age_s=5.0, pending=0)], requested)  # type: ignore[list-item]
    got = {s: _stage(c.name, s) - sum0[s] for s in stages}
    assert all(_stage(c.name, s, "count") - count0[s] == 2 for s in stages)
    assert 19.9 < got["busy"] < 20.5  # 30 - 10 for the first, 0 for the one stored after the request
    assert 14.9 < got["fetch"] < 15.5  # 10 for the first (request -> fetched), 5 for the second
    assert got["queue"] < 0.05  # handled at once
    assert 0.1 <= got["handle"] < 0.5  # 50 ms each
    assert got["ack"] < 0.05
    assert 35.1 < got["total"] < 36.0  # 30.05 + 5.05


async def test_the_stages_are_observed_for_a_sample_of_events_by_sequence():
    async def handler(items):
        return [None] * len(items)

    c = feedback_consumer("sampled", handler, lag_sample_every=4)
    stages = STAGES
    count0 = {s: _stage(c.name, s, "count") for s in stages}
    age0 = _sample("flywheel_event_age_seconds_count", c.name)
    await c._process([FakeMsg(seq, age_s=1.0, pending=0) for seq in range(1, 10)], time.time())  # type: ignore[list-item]
    # Sequences 4 and 8 are in the sample; every event's age is still observed.
    assert all(_stage(c.name, s, "count") - count0[s] == 2 for s in stages)
    assert _sample("flywheel_event_age_seconds_count", c.name) - age0 == 9
    with pytest.raises(ValueError, match="lag_sample_every"):
        feedback_consumer("sampled", handler, lag_sample_every=0)
