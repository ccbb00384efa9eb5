"""Feedback is never lost and never counted twice: across a kill -9 of the optimizer,
across two replicas updating at once, and at the edges (late or unknown decisions)."""

from __future__ import annotations

import asyncio
import random
import time

import grpc
import pytest

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue

from .helpers import eventually, three_arm_endpoint

pytestmark = pytest.mark.integration


async def totals(admin) -> tuple[int, float]:
    got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))
    return sum(s.pulls for s in got.endpoint.stats), round(sum(s.reward_sum for s in got.endpoint.stats), 6)


async def test_kill_9_mid_stream_loses_nothing_and_counts_nothing_twice(launch, nats_client, isolation):
    first = launch("optimizer")
    js = nats_client.jetstream()
    subject = Catalogue(isolation["namespace"]).feedback("support-bot")
    rng = random.Random(11)
    async with grpc.aio.insecure_channel(first.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        sel = sel_grpc.SelectionServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("support-bot"))
        decisions = []
        for _ in range(3):
            batch = await sel.SelectBatch(
                sel_pb.SelectBatchRequest(requests=[sel_pb.SelectRequest(endpoint="support-bot")] * 1000)
            )
            decisions += list(batch.decisions)
        rewards = {d.decision_id: rng.choice([0.0, 0.25, 1.0]) for d in decisions}
        acks = []
        for i, d in enumerate(decisions):
            event = FeedbackEvent(
                meta=EventMeta(event_id=f"fb-{i}"), decision_id=d.decision_id, reward=rewards[d.decision_id]
            )
            acks.append(js.publish(subject, event.SerializeToString(), headers={"Nats-Msg-Id": f"m-{i}"}))
            if i % 10 == 0:  # every tenth event is re-sent by a "retrying producer"
                acks.append(js.publish(subject, event.SerializeToString(), headers={"Nats-Msg-Id": f"r-{i}"}))
        await asyncio.gather(*acks)  # every event is acknowledged by JetStream now
        await eventually(lambda: totals(admin), lambda t: t[0] >= 300, timeout_s=30, interval_s=0.02)
    first.kill()

    second = launch("optimizer")
    async with grpc.aio.insecure_channel(second.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        expected = (len(decisions), round(sum(rewards.values()), 6))
        assert await eventually(lambda: totals(admin), lambda t: t == expected, timeout_s=60) == expected


async def test_two_replicas_update_concurrently_and_agree(launch):
    env = {"FLYWHEEL_OPTIMIZER_REFRESH_INTERVAL_S": "0.3"}
    a, b = launch("optimizer", env=env), launch("optimizer", env=env)
    async with grpc.aio.insecure_channel(a.address) as ca, grpc.aio.insecure_channel(b.address) as cb:
        admin_a, admin_b = admin_grpc.EndpointAdminServiceStub(ca), admin_grpc.EndpointAdminServiceStub(cb)
        sel_a, sel_b = sel_grpc.SelectionServiceStub(ca), sel_grpc.SelectionServiceStub(cb)
        await admin_a.CreateEndpoint(three_arm_endpoint("support-bot"))
        # B has never seen the endpoint: its first Select loads it.
        ds = [
            await (sel_a if i % 2 else sel_b).Select(sel_pb.SelectRequest(endpoint="support-bot")) for i in range(200)
        ]

        async def update(i: int, d) -> None:
            stub = sel_b if i % 2 else sel_a  # feedback lands on the other replica
            await stub.Update(sel_pb.UpdateRequest(decision_id=d.decision_id, reward=1.0, feedback_id=f"f{i}"))

        await asyncio.gather(*(update(i, d) for i, d in enumerate(ds)))
        started = time.monotonic()
        seen_a = await eventually(lambda: totals(admin_a), lambda t: t == (200, 200.0), timeout_s=5)
        seen_b = await eventually(lambda: totals(admin_b), lambda t: t == (200, 200.0), timeout_s=5)
        assert seen_a == seen_b == (200, 200.0)
        assert time.monotonic() - started < 2.0  # agreement within the refresh lag

        # Hot-path snapshots converge too: both replicas report the same posterior.
        async def alphas(admin):
            got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))
            return sorted((s.arm_id, s.alpha, s.beta) for s in got.endpoint.stats)

        assert await alphas(admin_a) == await alphas(admin_b)


async def dead_letters(js, catalogue: Catalogue, stream: str, n: int) -> list[DeadLetter]:
    sub = await js.pull_subscribe(catalogue.dead_letter("optimizer-feedback"), stream=stream)
    letters: list[DeadLetter] = []
    while len(letters) < n:
        for msg in await sub.fetch(n - len(letters), timeout=20):
            letter = DeadLetter()
            letter.ParseFromString(msg.data)
            letters.append(letter)
            await msg.ack()
    return letters


async def test_late_and_never_logged_feedback_is_dead_lettered(launch, nats_client, isolation):
    optimizer = launch("optimizer", env={"FLYWHEEL_OPTIMIZER_FEEDBACK_WINDOW_S": "1"})
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        await admin_grpc.EndpointAdminServiceStub(channel).CreateEndpoint(three_arm_endpoint("support-bot"))
        decision = await sel_grpc.SelectionServiceStub(channel).Select(sel_pb.SelectRequest(endpoint="support-bot"))
    await asyncio.sleep(1.5)
    late = FeedbackEvent(meta=EventMeta(event_id="late"), decision_id=decision.decision_id, reward=1.0)
    # An id shaped like a fresh decision that no replica ever logged: retried, then dead-lettered.
    ghost_id = f"{int(time.time() * 1000):012x}{'0' * 20}"
    ghost = FeedbackEvent(meta=EventMeta(event_id="ghost"), decision_id=ghost_id, reward=1.0)
    subject = catalogue.feedback("support-bot")
    for event in (late, ghost):
        await js.publish(subject, event.SerializeToString())
    letters = await dead_letters(js, catalogue, f"{isolation['namespace'].upper()}_DEADLETTER", 2)
    reasons = {FeedbackEvent.FromString(letter.payload).meta.event_id: letter.reason for letter in letters}
    assert "older than the feedback window" in reasons["late"]
    assert "not logged yet" in reasons["ghost"]
    assert "failed 5 times" in reasons["ghost"]


async def test_a_burst_of_4000_decisions_is_logged_in_full(launch):
    optimizer = launch("optimizer")
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        await admin_grpc.EndpointAdminServiceStub(channel).CreateEndpoint(three_arm_endpoint("support-bot"))
        sel = sel_grpc.SelectionServiceStub(channel)
        request = sel_pb.SelectBatchRequest(requests=[sel_pb.SelectRequest(endpoint="support-bot")] * 1000)
        batches = await asyncio.gather(*(sel.SelectBatch(request) for _ in range(4)))
        # More rows than one INSERT may bind: every decision must still be logged.
        for batch in batches:
            for d in (batch.decisions[0], batch.decisions[-1]):
                reply = await sel.Update(sel_pb.UpdateRequest(decision_id=d.decision_id, reward=1.0))
                assert reply.applied
