"""Validation at the door, and one bad row never poisons a batch (issue 13), through real
servers: a Select the decision log could not store is refused with INVALID_ARGUMENT naming the
field, and the decisions made around it are logged and take feedback; a fetched batch of
feedback events or span batches holding one bad event applies the good ones and dead-letters
only the bad one, with its reason."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import run_service_pb2 as run_pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as run_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind
from flywheel.core.bus.connection import ensure_topology

from .helpers import eventually, three_arm_endpoint

pytestmark = pytest.mark.integration


async def refused(call, request) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(request)
    return info.value


async def dead_letters(js, catalogue: Catalogue, durable: str, namespace: str, n: int) -> list[DeadLetter]:
    """Exactly ``n`` dead letters of ``durable`` (waits for them, then checks there is no more)."""
    sub = await js.pull_subscribe(catalogue.dead_letter(durable), stream=f"{namespace.upper()}_DEADLETTER")
    letters: list[DeadLetter] = []
    while len(letters) < n:
        for msg in await sub.fetch(n - len(letters), timeout=20):
            letters.append(DeadLetter.FromString(msg.data))
            await msg.ack()
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):
        await sub.fetch(1, timeout=1.0)
    return letters


async def recorded(traces: ts_grpc.TraceStoreServiceStub, decision_id: str) -> ts_pb.DecisionRecord | None:
    try:
        return (await traces.GetDecision(ts_pb.GetDecisionRequest(decision_id=decision_id))).decision
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return None


def select(user_id: str = "u-1", **context: object) -> sel_pb.SelectRequest:
    request = sel_pb.SelectRequest(endpoint="support-bot", user_id=user_id)
    if context:
        request.context.update(context)
    return request


async def test_a_select_the_log_could_not_store_is_refused_and_the_decisions_around_it_are_logged(launch):
    optimizer = launch("optimizer")
    trace_store = launch("trace_store")
    async with (
        grpc.aio.insecure_channel(optimizer.address) as channel,
        grpc.aio.insecure_channel(trace_store.address) as ts_channel,
    ):
        await admin_grpc.EndpointAdminServiceStub(channel).CreateEndpoint(three_arm_endpoint("support-bot"))
        stub = sel_grpc.SelectionServiceStub(channel)
        before = await stub.Select(select(note="before"))

        error = await refused(stub.Select, select(user_id="u" * 300))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("user_id: is 300 characters long, more than 256"), error.details()

        error = await refused(stub.Select, select(note="a\x00b"))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "context.note: contains a NUL byte"

        nested = select()
        nested.context.update({"user": {"tags": ["ok", float("nan")]}})
        error = await refused(stub.Select, nested)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "context.user.tags[1]: must be a finite number, got nan"

        big = select(blob="x" * 70_000)  # its decision event would crowd the bus's max payload
        error = await refused(stub.Select, big)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "context: is 700" in error.details()

        batch = sel_pb.SelectBatchRequest(
            requests=[select(), select(), sel_pb.SelectRequest(endpoint="support-bot", session_id="s\x00")]
        )
        error = await refused(stub.SelectBatch, batch)
        assert error.details() == "requests[2].session_id: contains a NUL byte"

        after = await stub.Select(select(note="after"))

        # Both decisions were logged (feedback applies to them) and published (the trace store has them).
        for decision in (before, after):
            update = await stub.Update(sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=1.0))
            assert update.applied and update.stats.arm_id == decision.arm_id
        traces = ts_grpc.TraceStoreServiceStub(ts_channel)
        for decision, note in ((before, "before"), (after, "after")):
            record = await eventually(lambda d=decision: recorded(traces, d.decision_id), lambda r: r is not None)
            assert record.context["note"] == note

        # The decision log is still healthy: a later burst is logged too.
        later = await stub.SelectBatch(sel_pb.SelectBatchRequest(requests=[select() for _ in range(20)]))
        await eventually(lambda: recorded(traces, later.decisions[-1].decision_id), lambda r: r is not None)

        # Undecodable bytes are INVALID_ARGUMENT, not INTERNAL.
        raw = channel.unary_unary(
            "/flywheel.api.optimizer.v1.SelectionService/Select",
            request_serializer=lambda b: b,
            response_deserializer=sel_pb.SelectResponse.FromString,
        )
        error = await refused(raw, b"\x0a\x05abc")  # a string field 5 bytes long with 3 bytes left
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "request body is not a valid flywheel.api.optimizer.v1.SelectRequest"


async def test_bad_endpoint_definitions_and_rewards_are_refused_naming_the_field(launch):
    optimizer = launch("optimizer")
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)

        def endpoint(**policy: object) -> admin_pb.CreateEndpointRequest:
            request = three_arm_endpoint("gauss")
            request.endpoint.policy.kind = ep_pb.POLICY_KIND_THOMPSON_GAUSSIAN
            for name, value in policy.items():
                if name == "min_pulls":
                    request.endpoint.policy.incumbent.min_pulls = value  # type: ignore[assignment]
                elif name == "max_interval_width":
                    request.endpoint.policy.incumbent.max_interval_width = value  # type: ignore[assignment]
                else:
                    setattr(request.endpoint.policy, name, value)
            return request

        for change, words in (
            ({"min_pulls": -5}, "incumbent_min_pulls must be >= 0"),
            ({"max_interval_width": -0.5}, "incumbent_max_interval_width must be a finite number > 0"),
            ({"kind": 7}, "endpoint.policy.kind: unknown value 7"),
            ({"allocation": 9}, "endpoint.policy.allocation: unknown value 9"),
        ):
            error = await refused(admin.CreateEndpoint, endpoint(**change))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert words in error.details(), error.details()
        bad_arm = three_arm_endpoint("arms")
        bad_arm.endpoint.arms[1].status = 12
        error = await refused(admin.CreateEndpoint, bad_arm)
        assert error.details().startswith("endpoint.arms[1].status: unknown value 12"), error.details()
        bad_params = three_arm_endpoint("params")
        bad_params.endpoint.arms[2].params.update({"prompt": "x\x00"})
        error = await refused(admin.CreateEndpoint, bad_params)
        assert error.details() == "endpoint.arms[2].params.prompt: contains a NUL byte"

        await admin.CreateEndpoint(endpoint())
        stub = sel_grpc.SelectionServiceStub(channel)
        decision = await stub.Select(sel_pb.SelectRequest(endpoint="gauss"))
        error = await refused(stub.Update, sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=1e300))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("reward: 1e+300")
        error = await refused(stub.Update, sel_pb.UpdateRequest(decision_id="d" * 65, reward=1.0))
        assert error.details() == "decision_id: is 65 characters long, more than 64"
        got = await stub.Update(sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=250.0))
        assert got.applied and 200 < got.stats.mean <= 250  # the posterior moved, and is a number

        runs = run_grpc.RunServiceStub(channel)
        start = run_pb.StartRunRequest()
        start.config.update({"name": "r", "search": {"population": float("nan")}})
        error = await refused(runs.StartRun, start)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "config.search.population: must be a finite number, got nan"
        error = await refused(runs.GetRun, run_pb.GetRunRequest(run_id="r\x00"))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details() == "run_id: contains a NUL byte"


async def test_a_feedback_batch_with_bad_events_applies_the_good_ones_and_dead_letters_only_the_bad(
    launch, nats_client, isolation
):
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    optimizer = launch("optimizer")
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("support-bot"))
        await admin.CreateEndpoint(three_arm_endpoint("other-bot"))
        stub = sel_grpc.SelectionServiceStub(channel)
        decisions = [await stub.Select(sel_pb.SelectRequest(endpoint="support-bot")) for _ in range(6)]
    optimizer.stop()  # flushes the log; the events below then reach the consumer in one fetch

    def event(i: int, **fields: object) -> FeedbackEvent:
        e = FeedbackEvent(
            meta=EventMeta(event_id=f"fb-{i}-{uuid.uuid4().hex[:8]}"),
            decision_id=decisions[i].decision_id,
            endpoint="support-bot",
            reward=1.0,
        )
        for name, value in fields.items():
            if name == "event_id":
                e.meta.event_id = value  # type: ignore[assignment]
            elif name == "seconds":
                e.meta.time.seconds = value  # type: ignore[assignment]
            else:
                setattr(e, name, value)
        return e

    bad = {
        "fb\x00nul": (event(1, event_id="fb\x00nul"), "meta.event_id: contains a NUL byte"),
        "long": (event(2, event_id="x" * 200), "meta.event_id: is 200 characters long, more than 128"),
        "time": (event(3, seconds=10**12), "meta.time: seconds 1000000000000 are outside years 1-9999"),
        "endpoint": (event(4, endpoint="other-bot"), "endpoint: the feedback names 'other-bot'"),
    }
    good = [event(0), event(5)]
    for e in [good[0], *(b for b, _ in bad.values()), good[1]]:
        await js.publish(catalogue.feedback("support-bot"), e.SerializeToString())

    optimizer = launch("optimizer")
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)

        async def pulls() -> int:
            got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))
            return sum(s.pulls for s in got.endpoint.stats)

        assert await eventually(pulls, lambda n: n == 2, timeout_s=15) == 2

    letters = await dead_letters(js, catalogue, "optimizer-feedback", isolation["namespace"], len(bad))
    by_id = {FeedbackEvent.FromString(letter.payload).meta.event_id: letter for letter in letters}
    for e, reason in bad.values():
        assert reason in by_id[e.meta.event_id].reason, by_id[e.meta.event_id].reason


def span(trace_id: str, **fields: object) -> Span:
    s = Span(trace_id=trace_id, span_id=secrets.token_hex(8), kind=SpanKind.SPAN_KIND_PROMPT, agent="helper")
    s.start_time.FromDatetime(datetime(2025, 3, 1, 12, tzinfo=UTC))
    s.end_time.FromDatetime(datetime(2025, 3, 1, 12, tzinfo=UTC) + timedelta(seconds=1))
    for name, value in fields.items():
        if name == "seconds":
            s.start_time.seconds = value  # type: ignore[assignment]
            s.end_time.seconds = value  # type: ignore[assignment]
        elif name == "attributes":
            s.attributes.update(value)  # type: ignore[arg-type]
        else:
            setattr(s, name, value)
    return s


async def test_a_fetch_of_span_batches_with_bad_ones_stores_the_good_and_dead_letters_only_the_bad(
    launch, nats_client, isolation
):
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    await ensure_topology(js, catalogue)
    good = [secrets.token_hex(16) for _ in range(3)]
    bad = {
        secrets.token_hex(16): ({"input": "task\x00"}, "input contains a NUL byte"),
        secrets.token_hex(16): ({"seconds": 10**12}, "start_time: (1000000000000 s, 0 ns) is outside years 1-9999"),
        secrets.token_hex(16): ({"user_id": "u" * 300}, "user_id is 300 characters long, more than 256"),
        secrets.token_hex(16): ({"attributes": {"score": float("inf")}}, "attributes.score: must be a finite number"),
    }
    order = [(good[0], {}), *((t, f) for t, (f, _) in bad.items()), (good[1], {}), (good[2], {})]
    for trace_id, fields in order:
        spans = [span(trace_id, **{"input": "task", **fields})]
        batch = SpanBatch(meta=EventMeta(event_id=f"batch-{trace_id}"), spans=spans)
        await js.publish(catalogue.traces("helper"), batch.SerializeToString())

    store = launch("trace_store")  # finds them all waiting: one fetch
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = ts_grpc.TraceStoreServiceStub(channel)

        async def stored() -> set[str]:
            got = await stub.QueryTraces(ts_pb.QueryTracesRequest(agent="helper"))
            return {t.trace_id for t in got.traces}

        assert await eventually(stored, lambda ids: ids >= set(good), timeout_s=15) == set(good)

        # The door of the gRPC side: the same problems, named, and nothing echoed from SQL.
        error = await refused(stub.GetDecision, ts_pb.GetDecisionRequest(decision_id="d\x00"))
        assert (
            error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details() == "decision_id: contains a NUL byte"
        )
        query = ts_pb.QueryTracesRequest(text="q\x00")
        error = await refused(stub.QueryTraces, query)
        assert error.details() == "text: contains a NUL byte"
        query = ts_pb.QueryTracesRequest()
        query.start_after.seconds = -(10**12)
        error = await refused(stub.QueryTraces, query)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("start_after:")

    letters = await dead_letters(js, catalogue, "trace-store-traces", isolation["namespace"], len(bad))
    by_trace = {SpanBatch.FromString(letter.payload).spans[0].trace_id: letter for letter in letters}
    for trace_id, (_, reason) in bad.items():
        assert reason in by_trace[trace_id].reason, by_trace[trace_id].reason
        assert "INSERT" not in by_trace[trace_id].reason


async def test_a_lookup_of_a_name_no_endpoint_can_have_is_refused_naming_the_field(launch):
    """GetEndpoint, AddArm, RetireArm and EstimatePolicyValue take only names CreateEndpoint
    could have accepted: "bad name;DROP TABLE endpoints" is INVALID_ARGUMENT naming the field
    (it was NOT_FOUND), while a well-formed name nobody created is still NOT_FOUND."""
    from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
    from flywheel.api.optimizer.v1 import off_policy_service_pb2_grpc as ope_grpc

    optimizer = launch("optimizer")
    hostile = "bad name;DROP TABLE endpoints"
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        ope = ope_grpc.OffPolicyServiceStub(channel)
        calls = [
            (admin.GetEndpoint, admin_pb.GetEndpointRequest(name=hostile), "name: "),
            (admin.AddArm, admin_pb.AddArmRequest(endpoint=hostile, arm=ep_pb.Arm(arm_id="x")), "endpoint: "),
            (admin.RetireArm, admin_pb.RetireArmRequest(endpoint="a.b", arm_id="x"), "endpoint: "),
            (ope.EstimatePolicyValue, ope_pb.EstimatePolicyValueRequest(endpoint="a*"), "endpoint: "),
        ]
        for call, request, field in calls:
            error = await refused(call, request)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, error.details())
            assert error.details().startswith(field), error.details()
            assert "[A-Za-z0-9_-]" in error.details()
        missing = await refused(admin.GetEndpoint, admin_pb.GetEndpointRequest(name="no-such-endpoint"))
        assert missing.code() == grpc.StatusCode.NOT_FOUND
