"""Decisions travel as DecisionBatch messages (one per endpoint and flush), and the trace
store records every decision of them once, context included; a batch with a broken
decision keeps the good ones and is dead-lettered with the reason."""

from __future__ import annotations

import grpc
import pytest

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.api.optimizer.v1.events_pb2 import DecisionBatch, DecisionEvent
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc

from .helpers import eventually, three_arm_endpoint

pytestmark = pytest.mark.integration


def request(endpoint: str, i: int) -> sel_pb.SelectRequest:
    r = sel_pb.SelectRequest(endpoint=endpoint, user_id=f"u-{i}")
    r.context.update({"i": i})
    return r


async def decision_or_none(traces: ts_grpc.TraceStoreServiceStub, decision_id: str):
    try:
        return (await traces.GetDecision(ts_pb.GetDecisionRequest(decision_id=decision_id))).decision
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return None


async def test_decisions_are_published_in_batches_and_each_is_recorded_once(launch, nats_client, isolation):
    optimizer = launch("optimizer")
    trace_store = launch("trace_store")
    made: list[tuple[str, sel_pb.SelectResponse, int]] = []
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        for name in ("bot-a", "bot-b"):
            await admin.CreateEndpoint(three_arm_endpoint(name))
        stub = sel_grpc.SelectionServiceStub(channel)
        for round_ in range(3):  # 1,500 decisions per endpoint: more than one message's 1,000
            for name in ("bot-a", "bot-b"):
                reqs = [request(name, round_ * 500 + i) for i in range(500)]
                got = await stub.SelectBatch(sel_pb.SelectBatchRequest(requests=reqs))
                made += [(name, d, round_ * 500 + i) for i, d in enumerate(got.decisions)]

    js = nats_client.jetstream()
    stream = f"{isolation['namespace'].upper()}_DECISIONS"

    async def stored_messages() -> int:
        return (await js.stream_info(stream)).state.messages

    messages = await eventually(stored_messages, lambda n: n >= 4)
    assert messages <= 60  # batches: 3,000 decisions in a handful of messages, not 3,000
    # Every decision of every message, once, in the order made per endpoint.
    sub = await js.pull_subscribe(f"{isolation['namespace']}.optimizer.decision.>", stream=stream)
    seen: dict[str, list[str]] = {"bot-a": [], "bot-b": []}
    while sum(len(v) for v in seen.values()) < len(made):
        for msg in await sub.fetch(100, timeout=5):
            batch = DecisionBatch.FromString(msg.data)
            assert batch.meta.event_id and batch.meta.source == "optimizer"
            assert msg.headers["Nats-Msg-Id"] == batch.meta.event_id
            endpoint = msg.subject.rsplit(".", 1)[1]
            assert {d.endpoint for d in batch.decisions} == {endpoint}
            seen[endpoint] += [d.decision_id for d in batch.decisions]
            await msg.ack()
    for name in seen:
        assert seen[name] == [d.decision_id for n, d, _ in made if n == name]

    async with grpc.aio.insecure_channel(trace_store.address) as channel:
        traces = ts_grpc.TraceStoreServiceStub(channel)
        last = made[-1][1]
        await eventually(lambda: decision_or_none(traces, last.decision_id), lambda r: r is not None)
        for name, d, i in made[::97]:
            record = await decision_or_none(traces, d.decision_id)
            assert record is not None, f"decision {i} of {name} not recorded"
            assert (record.arm_id, record.user_id) == (d.arm_id, f"u-{i}")
            assert record.probability == pytest.approx(d.probability)


async def test_a_batch_with_a_broken_decision_keeps_the_rest_and_is_dead_lettered(launch, nats_client, isolation):
    trace_store = launch("trace_store")
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    good = DecisionEvent(
        meta=EventMeta(event_id="ok-1"), decision_id="ok-1", endpoint="bot", arm_id="a", probability=0.5
    )
    broken = DecisionEvent(meta=EventMeta(event_id="bad"), decision_id="bad", endpoint="bot")  # no arm
    batch = DecisionBatch(meta=EventMeta(event_id="b-1"), decisions=[good, broken])
    await js.publish(catalogue.decision("bot"), batch.SerializeToString())

    async with grpc.aio.insecure_channel(trace_store.address) as channel:
        traces = ts_grpc.TraceStoreServiceStub(channel)
        record = await eventually(lambda: decision_or_none(traces, "ok-1"), lambda r: r is not None)
        assert record.arm_id == "a"
        assert await decision_or_none(traces, "bad") is None

    dead = await js.pull_subscribe(
        catalogue.dead_letter("trace-store-decisions"), stream=f"{isolation['namespace'].upper()}_DEADLETTER"
    )
    [msg] = await dead.fetch(1, timeout=20)
    letter = DeadLetter.FromString(msg.data)
    assert "decisions [1] of the batch are invalid" in letter.reason
    assert "decisions[1] 'bad': lacks decision_id, endpoint or arm_id" in letter.reason
    assert DecisionBatch.FromString(letter.payload) == batch  # the whole message, to replay once fixed
