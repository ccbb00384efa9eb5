"""The SDK's background feedback on real servers: a product queues feedback without waiting
(``feedback_nowait``), flushes, and every event is applied exactly once by the optimizer, no
matter that the publishes overlapped; an event queued twice under one id still counts once."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.sdk import FlywheelClient

from .helpers import eventually, sdk_nats, three_arm_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_queued_feedback_is_applied_once_each_after_flush(launch, stack_env, isolation):
    optimizer = launch("optimizer")
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("nowait"))
        async with FlywheelClient(
            target=optimizer.address,
            **sdk_nats(stack_env, isolation["namespace"]),
            feedback_max_in_flight=16,
        ) as fw:
            decisions = [await fw.select("nowait", user_id=f"u{i}") for i in range(120)]
            started = time.perf_counter()
            ids = [fw.feedback_nowait(d, reward=1.0) for d in decisions]
            queued_s = time.perf_counter() - started
            fw.feedback_nowait(decisions[0], reward=1.0, event_id=ids[0])  # a retry under the same id
            stats = await fw.flush_feedback()
        assert queued_s < 0.5  # queuing does not wait for JetStream
        assert (stats.queued, stats.acked, stats.failed) == (121, 121, 0)

        async def pulls() -> int:
            got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="nowait"))
            return sum(s.pulls for s in got.endpoint.stats)

        await eventually(pulls, lambda n: n >= 120, timeout_s=30)
        await asyncio.sleep(1.0)  # room for a wrongly applied duplicate to land
        assert await pulls() == 120
