"""The SDK tracer in a product's process stays bounded when NATS is away: its queue never
holds more than ``max_queued_batches`` batches (the oldest goes first), every lost span is
counted, the warning is rate-limited, and a batch is given up after ``give_up_after_s``."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import nats
import pytest

from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch
from flywheel.sdk.tracing import Tracer


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def span(i: int) -> Span:
    return Span(trace_id=f"{i:032x}", span_id=f"{i:016x}", name=f"s{i}", agent="bot")


def test_queue_stays_bounded_and_counts_drops_when_nats_is_down(caplog):
    caplog.set_level(logging.WARNING, logger="flywheel.sdk.tracing")
    tracer = Tracer(
        nats_url=f"nats://127.0.0.1:{closed_port()}",
        agent="bot",
        max_batch=10,
        max_queued_batches=3,
        give_up_after_s=1.0,
        publish_timeout_s=0.5,
        flush_interval_s=0.01,
    )
    bound = (3 + 1) * 10  # queued batches plus the one being filled
    most = 0
    for i in range(2000):
        tracer.emit(span(i))
        most = max(most, tracer.stats().queued_spans)
    assert most <= bound
    stats = tracer.stats()
    assert stats.published_spans == 0
    assert stats.dropped_batches >= (2000 - bound - 10) // 10  # at most one batch is in flight
    assert stats.dropped_spans == 10 * stats.dropped_batches
    # The oldest went first: what is still queued is the newest.
    queued = [s.name for b in tracer._batches for s in b]
    assert queued and queued[-1] == "s1999" and "s0" not in queued
    # Everything left is given up within about give_up_after_s per batch, never retried forever.
    started = time.monotonic()
    lost = tracer.flush(timeout_s=30)
    assert time.monotonic() - started < 15
    final = tracer.stats()
    assert final.queued_spans == 0 and final.published_spans == 0
    assert final.expired_batches >= 1
    assert final.dropped_spans + final.expired_spans == 2000 == tracer.dropped_spans
    assert lost == 2000 - stats.dropped_spans
    assert "cannot connect to NATS" in final.last_error and "refused" in final.last_error.lower()
    # Thousands of drops, one warning: the log line is rate-limited (60 s by default).
    warnings = [r for r in caplog.records if r.name == "flywheel.sdk.tracing"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "dropped" in warnings[0].getMessage()
    tracer.close(timeout_s=5)
    assert not tracer._thread.is_alive()


def test_a_batch_is_given_up_after_its_time():
    tracer = Tracer(nats_url=f"nats://127.0.0.1:{closed_port()}", agent="bot", give_up_after_s=0.5)
    tracer.emit(span(1))
    started = time.monotonic()
    assert tracer.flush(timeout_s=10) == 1
    assert time.monotonic() - started < 5
    assert tracer.stats().expired_batches == 1
    tracer.close(timeout_s=5)


@pytest.mark.parametrize("name", ["max_batch", "max_queued_batches", "give_up_after_s", "publish_timeout_s"])
def test_bounds_must_be_positive(name):
    with pytest.raises(ValueError, match=name):
        Tracer(nats_url="nats://127.0.0.1:1", agent="bot", **{name: 0})


async def _add_stream(server, namespace: str) -> None:
    nc = await nats.connect(server.url, user=server.user, password=server.password)
    try:
        await nc.jetstream().add_stream(name=f"{namespace}_TRACES", subjects=[f"{namespace}.product.traces.>"])
    finally:
        await nc.close()


async def _stored(server, namespace: str) -> int:
    nc = await nats.connect(server.url, user=server.user, password=server.password)
    try:
        info = await nc.jetstream().stream_info(f"{namespace}_TRACES")
        spans = 0
        sub = await nc.jetstream().pull_subscribe(f"{namespace}.product.traces.>", durable="check")
        for msg in await sub.fetch(info.state.messages, timeout=5):
            spans += len(SpanBatch.FromString(msg.data).spans)
        return spans
    finally:
        await nc.close()


def test_against_a_real_nats_that_goes_away(private_nats):
    asyncio.run(_add_stream(private_nats, "tb"))
    tracer = Tracer(
        nats_url=private_nats.url,
        nats_user=private_nats.user,
        nats_password=private_nats.password,
        namespace="tb",
        agent="bot",
        max_batch=5,
        max_queued_batches=4,
        give_up_after_s=1.0,
        publish_timeout_s=0.5,
    )
    for i in range(12):  # fits the queue while the first connection is made
        tracer.emit(span(i))
    assert tracer.flush(timeout_s=20) == 0
    assert tracer.stats().published_spans == 12
    nc_check = asyncio.run(_stored(private_nats, "tb"))
    assert nc_check == 12
    private_nats.stop()
    for i in range(12, 200):
        tracer.emit(span(i))
        assert tracer.stats().queued_spans <= (4 + 1) * 5
    assert tracer.flush(timeout_s=30) >= 5  # what was still queued is given up, not retried forever
    final = tracer.stats()
    assert final.published_spans == 12 and final.dropped_spans + final.expired_spans == 188
    tracer.close(timeout_s=5)
