"""EventConsumer exports its lag: each event's age when taken (from JetStream's stored
timestamp) and the messages still waiting after the last fetch, labelled by consumer."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

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


async def test_event_age_and_pending_are_exported_per_consumer():
    async def handler(items):
        return [None] * len(items)

    catalogue = Catalogue("lag")
    c = EventConsumer(
        js=None,  # type: ignore[arg-type]
        catalogue=catalogue,
        spec=catalogue.consumer("optimizer-feedback"),
        message_type=FeedbackEvent,
        batch_handler=handler,
    )
    count0 = _sample("flywheel_event_age_seconds_count", c.name)
    sum0 = _sample("flywheel_event_age_seconds_sum", c.name)
    await c._process([FakeMsg(1, age_s=30.0, pending=9), FakeMsg(2, age_s=20.0, pending=8)])  # type: ignore[list-item]
    assert _sample("flywheel_event_age_seconds_count", c.name) - count0 == 2
    assert 49.0 < _sample("flywheel_event_age_seconds_sum", c.name) - sum0 < 60.0
    assert _sample("flywheel_consumer_pending", c.name) == 8  # as of the last message fetched
