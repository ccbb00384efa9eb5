"""FLYWHEEL_TRACE_STORE_ACK_WAIT_S on real servers: the trace store declares its three durable
consumers with it, so an event a dead trace store had taken and never acked is delivered again
after that wait (the kill drill's traffic stage sets it short), not the catalogue's 30 s, and
the restarted store stores it once."""

from __future__ import annotations

import secrets
import time
import uuid

import grpc
import pytest

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind
from flywheel.trace_store.app import DURABLES

from .helpers import eventually

pytestmark = pytest.mark.integration
ACK_WAIT_S = 2.0


def one_span_batch(task: str) -> SpanBatch:
    span = Span(
        trace_id=secrets.token_hex(16), span_id=secrets.token_hex(8), kind=SpanKind.SPAN_KIND_PROMPT, input=task
    )
    span.start_time.GetCurrentTime()
    span.end_time.GetCurrentTime()
    return SpanBatch(meta=EventMeta(event_id=uuid.uuid4().hex, source="test"), spans=[span])


async def test_an_unacked_event_comes_back_after_the_trace_stores_ack_wait(launch, nats_client, isolation):
    env = {"FLYWHEEL_TRACE_STORE_ACK_WAIT_S": f"{ACK_WAIT_S:g}"}
    store = launch("trace_store", env=env)
    js = nats_client.jetstream()
    catalogue = Catalogue(isolation["namespace"])
    for durable in DURABLES:
        spec = catalogue.consumer(durable)
        info = await js.consumer_info(spec.stream, durable)
        assert info.config.ack_wait == pytest.approx(ACK_WAIT_S), durable
    launch("evaluator")  # another service starts (declaring the topology): the value stays
    traces = catalogue.consumer("trace-store-traces")
    assert (await js.consumer_info(traces.stream, traces.durable)).config.ack_wait == pytest.approx(ACK_WAIT_S)

    store.kill()  # SIGKILL: what it held is never acked
    # Take the next span batch as the dead store would have, and never ack it.
    task = f"held by a dead store {uuid.uuid4().hex[:8]}"
    await js.publish(catalogue.traces("helper"), one_span_batch(task).SerializeToString())
    sub = await js.pull_subscribe_bind(traces.durable, traces.stream)
    try:
        (held,) = await sub.fetch(1, timeout=10)
    finally:
        await sub.unsubscribe()
    taken = time.monotonic()
    assert held.metadata.num_delivered == 1

    # The restarted store gets it once the ack wait has passed, not the catalogue's 30 s.
    restarted = launch("trace_store", env=env)
    async with grpc.aio.insecure_channel(restarted.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)

        async def found():
            return (await stub.QueryTraces(pb.QueryTracesRequest(text=task))).traces

        got = await eventually(found, lambda t: len(t) >= 1, timeout_s=60, interval_s=0.05)
    stored_after = time.monotonic() - taken
    assert [t.task for t in got] == [task]  # stored once
    assert ACK_WAIT_S * 0.9 <= stored_after < 30, f"stored {stored_after:.1f} s after it was taken"
