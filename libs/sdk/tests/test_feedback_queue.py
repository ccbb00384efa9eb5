"""The SDK's background feedback publisher: bounded, concurrent, retried with the same event id,
flushed on demand and on close (unit tests with a publish function standing in for JetStream;
tests/integration/test_sdk_feedback_nowait.py runs it against a real NATS and optimizer)."""

from __future__ import annotations

import asyncio

import pytest

from flywheel.sdk.feedback_queue import FeedbackQueue, FeedbackQueueFull


class Recorder:
    def __init__(self, *, fail_first: int = 0, delay_s: float = 0.0, always_fail: bool = False) -> None:
        self.calls: list[str] = []
        self.in_flight = self.peak = 0
        self.fail_first, self.delay_s, self.always_fail = fail_first, delay_s, always_fail

    async def __call__(self, endpoint, decision_id, reward, signals, event_id) -> None:
        self.calls.append(event_id)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if self.always_fail or self.calls.count(event_id) <= self.fail_first:
                raise ConnectionError("no JetStream ack")
        finally:
            self.in_flight -= 1


def put(queue: FeedbackQueue, i: int) -> None:
    queue.put_nowait(endpoint="e", decision_id=f"d{i}", reward=1.0, signals=None, event_id=f"ev{i}")


async def test_events_are_published_concurrently_and_flush_waits_for_every_ack() -> None:
    publish = Recorder(delay_s=0.02)
    queue = FeedbackQueue(publish, max_in_flight=8)
    for i in range(40):
        put(queue, i)
    await queue.flush()
    assert sorted(publish.calls) == sorted(f"ev{i}" for i in range(40))
    assert 1 < publish.peak <= 8  # acknowledgements awaited side by side, never more than the cap
    assert (queue.stats.acked, queue.stats.failed, queue.stats.pending) == (40, 0, 0)
    await queue.close()


async def test_a_failed_publish_is_retried_with_the_same_event_id() -> None:
    publish = Recorder(fail_first=2)
    queue = FeedbackQueue(publish, max_in_flight=2)
    put(queue, 1)
    await queue.flush()
    assert publish.calls == ["ev1", "ev1", "ev1"] and queue.stats.retried == 2 and queue.stats.acked == 1
    await queue.close()


async def test_a_publish_failing_past_its_deadline_is_counted_not_raised() -> None:
    queue = FeedbackQueue(Recorder(always_fail=True), retry_deadline_s=0.2)
    put(queue, 1)
    await queue.flush()
    assert queue.stats.failed == 1 and queue.stats.acked == 0
    assert "ev1: ConnectionError: no JetStream ack" in queue.stats.last_errors[0]
    await queue.close()


async def test_memory_is_bounded_the_caller_gets_queue_full() -> None:
    queue = FeedbackQueue(Recorder(delay_s=0.5), max_pending=3, max_in_flight=1)
    put(queue, 0)
    await asyncio.sleep(0.05)  # the one publisher holds ev0
    for i in range(1, 4):
        put(queue, i)
    with pytest.raises(FeedbackQueueFull, match="3 feedback events are waiting"):
        put(queue, 4)
    assert queue.stats.queued == 4
    await queue.close()  # close flushes what was queued
    assert queue.stats.acked == 4


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_pending and max_in_flight must be >= 1"):
        FeedbackQueue(Recorder(), max_pending=0)


async def test_each_ack_keeps_its_latency_from_queued_to_acknowledged() -> None:
    publish = Recorder(delay_s=0.03, fail_first=1)  # every event: one failure, then acked
    queue = FeedbackQueue(publish, max_in_flight=4)
    assert queue.stats.ack_quantile(0.5) is None  # nothing acked yet
    for i in range(6):
        put(queue, i)
    await queue.flush()
    await queue.close()
    assert len(queue.stats.ack_seconds) == 6
    # Two publishes of 30 ms each and a retry pause of at least 25 ms: the latency spans them all.
    assert min(queue.stats.ack_seconds) >= 0.08
    assert queue.stats.ack_quantile(0.0) == min(queue.stats.ack_seconds)
    assert queue.stats.ack_quantile(1.0) == max(queue.stats.ack_seconds)
    with pytest.raises(ValueError, match="q must be within"):
        queue.stats.ack_quantile(1.5)
