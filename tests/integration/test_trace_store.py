"""The trace store through real servers: span batches in over NATS and gRPC, traces back
as trees and filtered pages, bad batches dead-lettered, feedback joined, erasure."""

from __future__ import annotations

import asyncio
import gzip
import json
import secrets
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from minio import Minio

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta, PageRequest
from flywheel.api.optimizer.v1.events_pb2 import DecisionBatch, DecisionEvent, FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind
from flywheel.core.bus.connection import ensure_topology

from .helpers import eventually

pytestmark = pytest.mark.integration
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def make_span(trace_id: str, kind: int, *, parent: str = "", offset_s: float = 0.0, **fields) -> Span:
    span = Span(trace_id=trace_id, span_id=secrets.token_hex(8), parent_span_id=parent, kind=kind, **fields)
    span.start_time.FromDatetime(T0 + timedelta(seconds=offset_s))
    span.end_time.FromDatetime(T0 + timedelta(seconds=offset_s + 1))
    return span


def agent_trace(
    task: str, answer: str, reward: float, *, agent: str = "helper", user: str = "u-1", **root
) -> list[Span]:
    """A small agent run: prompt -> (tool, reasoning, content), and a reward on a 0..10 scale."""
    tid = secrets.token_hex(16)
    prompt = make_span(
        tid,
        SpanKind.SPAN_KIND_PROMPT,
        agent=agent,
        user_id=user,
        input=task,
        output=answer,
        model="smollm2",
        input_tokens=12,
        output_tokens=30,
        cost_usd=0.001,
        **root,
    )
    tool = make_span(
        tid,
        SpanKind.SPAN_KIND_TOOL,
        parent=prompt.span_id,
        offset_s=0.1,
        agent=agent,
        name="search",
        input='{"q": "x"}',
        output="result",
    )
    thought = make_span(
        tid, SpanKind.SPAN_KIND_REASONING, parent=prompt.span_id, offset_s=0.2, agent=agent, output="thinking"
    )
    content = make_span(
        tid, SpanKind.SPAN_KIND_CONTENT, parent=prompt.span_id, offset_s=0.3, agent=agent, output=answer
    )
    score = make_span(
        tid,
        SpanKind.SPAN_KIND_REWARD,
        parent=prompt.span_id,
        offset_s=0.4,
        agent=agent,
        name="judge",
        reward=reward * 10,
        reward_min=0,
        reward_max=10,
    )
    return [prompt, tool, thought, content, score]


def batch(spans: list[Span]) -> SpanBatch:
    return SpanBatch(meta=EventMeta(event_id=uuid.uuid4().hex, source="test"), spans=spans)


async def test_nats_and_grpc_ingest_then_get_and_query(launch, nats_client, isolation):
    store = launch("trace_store")
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    over_nats = [agent_trace(f"question {i} about tea", f"answer {i}", i / 10) for i in range(6)]
    for spans in over_nats:
        # Children before parents (as OTel exporters do), and the agent only in the subject.
        for s in spans:
            s.agent = ""
        msg = batch(list(reversed(spans)))
        await js.publish(
            catalogue.traces("helper"), msg.SerializeToString(), headers={"Nats-Msg-Id": msg.meta.event_id}
        )

    over_grpc = [
        agent_trace(f"grpc question {i}", f"grpc answer {i}", 0.5, agent="coder", user="u-2") for i in range(3)
    ]
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        requests = [pb.IngestRequest(batch=batch(spans)) for spans in over_grpc]
        requests.append(pb.IngestRequest(batch=batch(over_grpc[0])))  # a retried batch: stored once
        replies = [r async for r in stub.Ingest(iter(requests))]
        assert [(r.spans_stored, r.spans_duplicate) for r in replies] == [(5, 0), (5, 0), (5, 0), (0, 5)]

        async def helper_traces():
            return (await stub.QueryTraces(pb.QueryTracesRequest(agent="helper"))).traces

        found = await eventually(helper_traces, lambda t: len(t) == 6)
        assert all(t.span_count == 5 for t in found)
        by_task = {t.task: t for t in found}
        # The 0..10 reward is normalised by its scale.
        assert by_task["question 5 about tea"].reward == pytest.approx(0.5)

        # The tree comes back depth first, with the prompt at the root.
        first = over_nats[3]
        got = await stub.GetTrace(pb.GetTraceRequest(trace_id=first[0].trace_id))
        assert got.spans[0].kind == SpanKind.SPAN_KIND_PROMPT
        assert list(got.depths) == [0, 1, 1, 1, 1]
        assert {s.span_id for s in got.spans} == {s.span_id for s in first}
        assert got.spans[0].agent == "helper" and got.spans[0].input == "question 3 about tea"
        assert got.spans[0].input_tokens == 12 and got.spans[0].model == "smollm2"
        assert got.trace.reward == pytest.approx(0.3)

        # Filters: text, reward range, paging, agent.
        q = await stub.QueryTraces(pb.QueryTracesRequest(text="ABOUT TEA", min_reward=0.35, max_reward=0.75))
        assert sorted(t.task for t in q.traces) == [f"question {i} about tea" for i in (4, 5)]
        for wildcard in ("%", "_", "question_1"):  # matched literally, not as LIKE patterns
            assert len((await stub.QueryTraces(pb.QueryTracesRequest(text=wildcard))).traces) == 0
        pages, token = [], ""
        while True:
            page = await stub.QueryTraces(pb.QueryTracesRequest(page=PageRequest(page_size=4, page_token=token)))
            pages.append(len(page.traces))
            token = page.next_page_token
            if not token:
                break
        assert pages == [4, 4, 1]
        coder = await stub.QueryTraces(pb.QueryTracesRequest(agent="coder"))
        assert len(coder.traces) == 3 and all(t.span_count == 5 for t in coder.traces)

        # Bad requests say what to fix.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetTrace(pb.GetTraceRequest(trace_id="nope"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        bad = agent_trace("x", "y", 0.1)
        bad[1].kind = 42
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [r async for r in stub.Ingest(iter([pb.IngestRequest(batch=batch(bad))]))]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown span kind 42" in err.value.details()
        # Segments are gzip JSONL in S3, keyed by day and agent.
        keys = await asyncio.to_thread(list_segments, store.env, isolation["bucket_prefix"])
        assert any(k.startswith("segments/2025-03-01/helper/") for k in keys)
        # One object per stored gRPC batch: the retried batch's upload was deleted again.
        assert len([k for k in keys if k.startswith("segments/2025-03-01/coder/")]) == 3


def s3_client(env: dict[str, str]) -> Minio:
    return Minio(
        env["FLYWHEEL_S3_ENDPOINT"],
        access_key=env["FLYWHEEL_S3_ACCESS_KEY"],
        secret_key=env["FLYWHEEL_S3_SECRET_KEY"],
        secure=False,
        region=env.get("FLYWHEEL_S3_REGION", "us-east-1"),
    )


def list_segments(env: dict[str, str], prefix: str) -> list[str]:
    client = s3_client(env)
    return [o.object_name for o in client.list_objects(f"{prefix}-traces", prefix="segments/", recursive=True)]


def read_segment_lines(env: dict[str, str], prefix: str) -> list[str]:
    client = s3_client(env)
    lines = []
    for key in list_segments(env, prefix):
        resp = client.get_object(f"{prefix}-traces", key)
        lines += gzip.decompress(resp.read()).decode().split("\n")
        resp.close()
    return lines


async def dead_letters(js, catalogue: Catalogue, namespace: str, n: int) -> list[DeadLetter]:
    sub = await js.pull_subscribe(catalogue.dead_letter("trace-store-traces"), stream=f"{namespace.upper()}_DEADLETTER")
    letters: list[DeadLetter] = []
    while len(letters) < n:
        for msg in await sub.fetch(n - len(letters), timeout=20):
            letters.append(DeadLetter.FromString(msg.data))
            await msg.ack()
    return letters


async def test_text_search_is_served_by_the_trigram_index(launch, servers, isolation):
    """Migration 0003 adds a pg_trgm index on lower(task), and QueryTraces' filter can use it."""
    launch("trace_store")
    conn = await asyncpg.connect(servers.postgres.url, server_settings={"search_path": isolation["schema"]})
    try:
        index = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'ix_traces_task_trgm'",
            isolation["schema"],
        )
        assert index is not None and "gin_trgm_ops" in index
        async with conn.transaction():
            await conn.execute("SET LOCAL enable_seqscan = off")  # an empty table: make the planner show its options
            plan = await conn.fetch(
                "EXPLAIN SELECT trace_id FROM traces t WHERE lower(t.task) LIKE '%' || lower($1) || '%' ESCAPE '\\'",
                "about tea",
            )
        assert "ix_traces_task_trgm" in "\n".join(row[0] for row in plan)
    finally:
        await conn.close()


async def test_bad_batches_are_dead_lettered_and_the_consumer_keeps_going(launch, nats_client, isolation):
    store = launch("trace_store", env={"FLYWHEEL_TRACE_STORE_MAX_ATTRIBUTES_BYTES": "1000"})
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    subject = catalogue.traces("helper")

    no_ids = agent_trace("a", "b", 0.5)
    no_ids[2].span_id = ""
    bad_trace_id = agent_trace("a", "b", 0.5)
    bad_trace_id[0].trace_id = "XYZ"
    cycle = agent_trace("a", "b", 0.5)
    cycle[0].parent_span_id = cycle[1].span_id  # prompt -> tool -> prompt
    huge = agent_trace("a", "b", 0.5)
    huge[1].attributes.update({"blob": "x" * 5000})
    unknown = agent_trace("a", "b", 0.5)
    unknown[3].kind = 9
    off_scale = agent_trace("a", "b", 0.5)
    off_scale[4].reward = 11
    good = agent_trace("fine question", "fine answer", 0.9)
    cases = {
        "no-ids": no_ids,
        "bad-trace-id": bad_trace_id,
        "cycle": cycle,
        "huge": huge,
        "unknown": unknown,
        "off-scale": off_scale,
        "good": good,
    }
    for name, spans in cases.items():
        await js.publish(subject, batch(spans).SerializeToString(), headers={"Nats-Msg-Id": name})
    await js.publish(subject, b"\x00not protobuf", headers={"Nats-Msg-Id": "garbage"})
    # A cycle across batches: A (parent B) is stored first; B arrives later claiming A as parent.
    tid, a_id, b_id = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(8)
    span_a = make_span(tid, SpanKind.SPAN_KIND_CONTENT, agent="helper", output="a")
    span_a.span_id, span_a.parent_span_id = a_id, b_id
    span_b = make_span(tid, SpanKind.SPAN_KIND_PROMPT, agent="helper", input="cyclic task")
    span_b.span_id, span_b.parent_span_id = b_id, a_id
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        await js.publish(subject, batch([span_a]).SerializeToString(), headers={"Nats-Msg-Id": "a"})
        await eventually(lambda: stub.QueryTraces(pb.QueryTracesRequest()), lambda r: len(r.traces) == 2)
        await js.publish(subject, batch([span_b]).SerializeToString(), headers={"Nats-Msg-Id": "late-cycle"})

        letters = await dead_letters(js, catalogue, isolation["namespace"], 8)
        reasons = {letter.headers.get("Nats-Msg-Id"): letter.reason for letter in letters}
        assert "span_id must be 16 lowercase hex" in reasons["no-ids"]
        assert "trace_id must be 32 lowercase hex" in reasons["bad-trace-id"]
        assert "parent cycle" in reasons["cycle"]
        assert "attributes are" in reasons["huge"] and "more than 1000" in reasons["huge"]
        assert "unknown span kind 9" in reasons["unknown"]
        assert "outside its scale" in reasons["off-scale"]
        assert "invalid protobuf" in reasons["garbage"]
        assert "good" not in reasons
        assert "parent cycle" in reasons["late-cycle"]
        traces = (await stub.QueryTraces(pb.QueryTracesRequest())).traces
        assert sorted(t.task for t in traces) == ["", "fine question"]
        assert sum(t.span_count for t in traces) == 6


async def test_decisions_and_feedback_join_and_erasure_removes_segments_and_index(launch, nats_client, isolation):
    store = launch("trace_store")
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    decision = DecisionEvent(
        meta=EventMeta(event_id="dec-1"),
        decision_id="dec-1",
        endpoint="support-bot",
        arm_id="small",
        probability=0.5,
        user_id="u-9",
    )
    decisions = DecisionBatch(meta=EventMeta(event_id="batch-1"), decisions=[decision])
    await js.publish(catalogue.decision("support-bot"), decisions.SerializeToString())
    fb = FeedbackEvent(meta=EventMeta(event_id="f-1"), decision_id="dec-1", endpoint="support-bot", reward=0.25)
    await js.publish(catalogue.feedback("support-bot"), fb.SerializeToString())

    served = agent_trace("joined task", "joined answer", 0.5, user="u-9", decision_id="dec-1")[:4]  # no reward span
    other = agent_trace("keep me", "kept", 0.5, user="u-10")
    also_u9 = agent_trace("second of u-9", "gone", 0.5, user="u-9")
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        _ = [r async for r in stub.Ingest(iter([pb.IngestRequest(batch=batch(served + other + also_u9))]))]

        async def joined():
            return await stub.GetTrace(pb.GetTraceRequest(trace_id=served[0].trace_id))

        got = await eventually(joined, lambda g: g.trace.HasField("reward") and len(g.decision.feedback) == 1)
        assert got.trace.reward == pytest.approx(0.25)  # no reward span: the decision's feedback
        assert got.trace.endpoint == "support-bot"  # from the decision
        assert got.decision.arm_id == "small"
        by_endpoint = await stub.QueryTraces(pb.QueryTracesRequest(endpoint="support-bot"))
        assert [t.trace_id for t in by_endpoint.traces] == [served[0].trace_id]
        by_decision = await stub.QueryTraces(pb.QueryTracesRequest(decision_id="dec-1"))
        assert [t.trace_id for t in by_decision.traces] == [served[0].trace_id]

        deleted = await stub.DeleteTraces(pb.DeleteTracesRequest(user_id="u-9"))
        assert (deleted.traces_deleted, deleted.spans_deleted) == (2, 9)
        left = await stub.QueryTraces(pb.QueryTracesRequest())
        assert [t.task for t in left.traces] == ["keep me"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetTrace(pb.GetTraceRequest(trace_id=served[0].trace_id))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # The erased spans are gone from the segment objects too; the kept trace still reads.
        lines = await asyncio.to_thread(read_segment_lines, store.env, isolation["bucket_prefix"])
        stored = [json.loads(x) for x in lines if x != "null"]
        assert {s["trace_id"] for s in stored} == {other[0].trace_id}
        kept = await stub.GetTrace(pb.GetTraceRequest(trace_id=other[0].trace_id))
        assert len(kept.spans) == 5

        deleted = await stub.DeleteTraces(pb.DeleteTracesRequest(trace_id=other[0].trace_id))
        assert (deleted.traces_deleted, deleted.spans_deleted) == (1, 5)
        assert await asyncio.to_thread(list_segments, store.env, isolation["bucket_prefix"]) == []


async def test_raw_batches_wait_for_the_store_and_leave_the_bus_once_stored(launch, nats_client, isolation):
    """TRACES keeps a batch only until the trace store has stored it: published before the
    store ever ran, it waits; once stored (and after an erasure) no raw copy stays on the bus."""
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    stream = catalogue.consumer("trace-store-traces").stream
    await ensure_topology(js, catalogue)  # what any Flywheel service does on start
    runs = [agent_trace(f"early question {i}", f"early answer {i}", 0.5, user="u-early") for i in range(3)]
    for spans in runs:
        msg = batch(spans)
        await js.publish(
            catalogue.traces("helper"), msg.SerializeToString(), headers={"Nats-Msg-Id": msg.meta.event_id}
        )
    assert (await js.stream_info(stream)).state.messages == 3  # no store yet: kept, not dropped

    store = launch("trace_store")
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)

        async def early_traces():
            return (await stub.QueryTraces(pb.QueryTracesRequest(agent="helper"))).traces

        assert len(await eventually(early_traces, lambda t: len(t) == 3)) == 3

        async def left_on_bus():
            return (await js.stream_info(stream)).state.messages

        assert await eventually(left_on_bus, lambda n: n == 0) == 0
        deleted = await stub.DeleteTraces(pb.DeleteTracesRequest(user_id="u-early"))
        assert deleted.traces_deleted == 3
        assert len(await early_traces()) == 0
        assert await left_on_bus() == 0


async def test_retention_sweep_expires_an_agents_old_traces_and_keeps_the_rest(launch, isolation):
    """A 1-day TTL for agent "short": its traces (which ended in 2025) go from index and segments
    at the next sweep; agent "keep" has no TTL and the default keeps forever."""
    store = launch(
        "trace_store",
        env={
            "FLYWHEEL_TRACE_STORE_RETENTION_DAYS": '{"short": 1}',
            "FLYWHEEL_TRACE_STORE_RETENTION_INTERVAL_S": "0.5",
        },
    )
    old = agent_trace("old and short-lived", "gone", 0.5, agent="short")
    kept = agent_trace("old but kept", "still here", 0.5, agent="keep")
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        replies = [r async for r in stub.Ingest(iter([pb.IngestRequest(batch=batch(old + kept))]))]
        assert sum(r.spans_stored for r in replies) == 10

        async def agents():
            return sorted(t.agent for t in (await stub.QueryTraces(pb.QueryTracesRequest())).traces)

        assert await eventually(agents, lambda a: a == ["keep"], timeout_s=15)
    lines = await asyncio.to_thread(read_segment_lines, store.env, isolation["bucket_prefix"])
    assert {json.loads(x)["trace_id"] for x in lines if x and x != "null"} == {kept[0].trace_id}
