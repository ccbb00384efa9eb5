"""Feedback for a decision still in ANOTHER replica's decision buffer is applied without a
bounce (issue 19). Two optimizer replicas share the feedback consumer's durable, so about half
of the feedback lands on the replica that did not make the decision; that replica cannot flush
the other's 20 ms buffer, so it defers the events (the message stays unsettled) and applies
them again 1.5 flush intervals later, instead of sending them back for a JetStream redelivery
(49-73 bounces per bench run before). Real processes, NATS and PostgreSQL.

The flush interval is 0.5 s here (20 ms by default), on both replicas. The feedback consumer's
pull of 1000 lingers up to 0.5 s, so the replicas take events in windows, and events are
~40-500 ms old when applied; the decision's replica also flushes its whole buffer whenever its
own window holds an early event. At 20 ms or 0.2 s the decision was nearly always written by
the time the other replica read its feedback (0 to 12 deferrals in 200, five runs), and the test
would not show the path it is about. At 0.5 s, with the decisions spread over ~4 s, 31 to 46 of
B's 78-98 events were deferred (three runs); B applies them again after 0.75 s and would bounce
them after three intervals (1.5 s). Before the fix the same test counted 17 redeliveries."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.sdk import FlywheelClient

from .helpers import eventually, sdk_nats, three_arm_endpoint
from .test_feedback_no_bounce import counter
from .test_first_loop import scrape

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DECISIONS = 200
# Between one decision's feedback and the next Select: 200 decisions then span ~4 s, several of
# the consumers' 0.5 s pull windows, so which replica flushes when cannot line up for the run.
PACE_S = 0.01
CONSUMER = "optimizer-feedback"
SLOW_FLUSH = {"FLYWHEEL_OPTIMIZER_DECISION_FLUSH_INTERVAL_S": "0.5"}


async def test_feedback_one_ms_after_a_select_on_the_other_replica_is_applied_once_without_a_bounce(
    launch, stack_env, isolation
):
    a = launch("optimizer", env=SLOW_FLUSH)
    b = launch("optimizer", env=SLOW_FLUSH)
    async with (
        grpc.aio.insecure_channel(a.address) as channel,
        FlywheelClient(
            target=a.address,  # every decision is made, and buffered, by A
            **sdk_nats(stack_env, isolation["namespace"]),
        ) as fw,
    ):
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("prompt"))
        started = time.monotonic()

        for i in range(DECISIONS):
            decision = await fw.select("prompt", user_id=f"u{i}")
            await asyncio.sleep(0.001)
            await fw.feedback(decision, reward=1.0)
            await asyncio.sleep(PACE_S)

        async def pulls() -> int:
            got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="prompt"))
            return sum(s.pulls for s in got.endpoint.stats)

        sent = time.monotonic()
        await eventually(pulls, lambda n: n >= DECISIONS, timeout_s=20)
        print(f"sent in {sent - started:.1f} s, applied {time.monotonic() - sent:.1f} s later")
        await asyncio.sleep(0.5)  # a duplicate apply would show up by now
        assert await pulls() == DECISIONS  # every event applied, none twice

    metrics = [await asyncio.to_thread(scrape, r.metrics_port) for r in (a, b)]

    def total(name: str, **labels: str) -> list[float]:
        return [counter(m, name, **labels) for m in metrics]

    acks = total("flywheel_events_total", consumer=CONSUMER, outcome="ack")
    deferred = total("flywheel_optimizer_feedback_deferred_total")
    print(f"acks A/B {acks}, deferred A/B {deferred}")
    assert min(acks) > 0, f"both replicas should consume feedback: acks {acks}"
    assert sum(acks) == DECISIONS
    assert total("flywheel_events_total", consumer=CONSUMER, outcome="retry") == [0, 0]
    assert total("flywheel_events_total", consumer=CONSUMER, outcome="deadletter") == [0, 0]
    assert total("flywheel_optimizer_feedback_bounces_total") == [0, 0]
    # B held events for A's buffer (A none: it flushes its own): the path under test ran.
    assert deferred[0] == 0 and deferred[1] > 0
