"""The first loop, end to end through the real servers: create an endpoint, Select over
gRPC, publish feedback on NATS (twice), see the posterior move once, and find the
decision and its feedback in the trace store."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.sdk import FlywheelClient

from .helpers import eventually, three_arm_endpoint

pytestmark = pytest.mark.integration


async def test_select_feedback_twice_updates_once_and_trace_store_records_both(
    launch, stack_env, nats_client, isolation
):
    optimizer = launch("optimizer")
    trace_store = launch("trace_store")
    ns = isolation["namespace"]

    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        created = await admin.CreateEndpoint(three_arm_endpoint("support-bot"))
        assert [a.arm_id for a in created.endpoint.arms] == ["small", "large", "creative"]

        async with FlywheelClient(
            target=optimizer.address,
            nats_url=stack_env["FLYWHEEL_NATS_URL"],
            nats_user=stack_env["FLYWHEEL_NATS_USER"],
            nats_password=stack_env["FLYWHEEL_NATS_PASSWORD"],
            namespace=ns,
        ) as fw:
            decision = await fw.select("support-bot", user_id="u-1", context={"lang": "en"})
            assert decision.arm_id in {"small", "large", "creative"}
            assert decision.params["model"].startswith("gpt-4o")
            assert 0 < decision.probability <= 1

            # The same event, delivered twice (a producer retry with a new NATS message id,
            # so JetStream's own dedup does not hide it): the posterior moves once.
            event = FeedbackEvent(
                meta=EventMeta(event_id="fb-1", source="test"),
                decision_id=decision.decision_id,
                endpoint="support-bot",
                reward=1.0,
            )
            js = nats_client.jetstream()
            subject = Catalogue(ns).feedback("support-bot")
            for attempt in range(2):
                await js.publish(subject, event.SerializeToString(), headers={"Nats-Msg-Id": f"retry-{attempt}"})

            async def arm_stats():
                got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))
                return {s.arm_id: s for s in got.endpoint.stats}

            stats = await eventually(arm_stats, lambda s: s[decision.arm_id].pulls >= 1)
            await asyncio.sleep(1.0)  # room for a wrongly applied second copy to land
            stats = await arm_stats()
            chosen = stats[decision.arm_id]
            assert (chosen.pulls, chosen.alpha, chosen.beta) == (1, 2.0, 1.0)
            assert all(s.pulls == 0 for a, s in stats.items() if a != decision.arm_id)

    async with grpc.aio.insecure_channel(trace_store.address) as channel:
        traces = ts_grpc.TraceStoreServiceStub(channel)

        async def recorded():
            try:
                return (await traces.GetDecision(ts_pb.GetDecisionRequest(decision_id=decision.decision_id))).decision
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:  # not recorded yet is the only acceptable error
                    raise
                return None

        record = await eventually(recorded, lambda r: r is not None and len(r.feedback) >= 1)
        assert record.arm_id == decision.arm_id
        assert record.user_id == "u-1"
        assert record.probability == pytest.approx(decision.probability)
        assert [(f.event_id, f.reward) for f in record.feedback] == [("fb-1", 1.0)]

    # Prometheus metrics tell the same story: two deliveries acked, one Select served.
    metrics = await asyncio.to_thread(scrape, optimizer.metrics_port)
    assert 'flywheel_events_total{consumer="optimizer-feedback",outcome="ack"} 2.0' in metrics
    assert (
        'flywheel_grpc_requests_total{code="OK",method="/flywheel.api.optimizer.v1.SelectionService/Select"} 1.0'
        in metrics
    )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()
