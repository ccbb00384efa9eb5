"""Malformed or impossible feedback goes to the dead-letter subject with the reason, once,
and the consumer keeps applying the good events behind it."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import json_format

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue

from .helpers import eventually, three_arm_endpoint

pytestmark = pytest.mark.integration


async def test_bad_feedback_is_dead_lettered_with_reason_and_good_feedback_still_applies(
    launch, nats_client, isolation
):
    optimizer = launch("optimizer")
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    subject = catalogue.feedback("support-bot")

    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("support-bot"))
        decision = await sel_grpc.SelectionServiceStub(channel).Select(sel_pb.SelectRequest(endpoint="support-bot"))

        def feedback(event_id: str, decision_id: str, reward: float) -> FeedbackEvent:
            return FeedbackEvent(meta=EventMeta(event_id=event_id), decision_id=decision_id, reward=reward)

        bad = [
            # (payload, headers, expected words in the reason)
            (b"\x0a\xff\x01garbage", {}, "invalid protobuf"),
            (b'{"decisionId": 42, "nope": true}', {"Content-Type": "application/json"}, "invalid proto3 JSON"),
            (b"<xml/>", {"Content-Type": "text/xml"}, "unsupported Content-Type"),
            (feedback("fb-unknown", "no-such-decision", 1.0).SerializeToString(), {}, "unknown"),
            (feedback("", decision.decision_id, 1.0).SerializeToString(), {}, "no event id"),
        ]
        for payload, headers, _ in bad:
            await js.publish(subject, payload, headers=headers)
        # A good event behind the bad ones, as proto3 JSON (any NATS client can send it).
        good = json_format.MessageToJson(feedback("fb-good", decision.decision_id, 1.0)).encode()
        await js.publish(subject, good, headers={"Content-Type": "application/json"})

        async def pulls():
            got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))
            return {s.arm_id: s.pulls for s in got.endpoint.stats}[decision.arm_id]

        assert await eventually(pulls, lambda n: n == 1) == 1

    dead_stream = f"{isolation['namespace'].upper()}_DEADLETTER"
    dead = await js.pull_subscribe(catalogue.dead_letter("optimizer-feedback"), stream=dead_stream)
    letters: list[DeadLetter] = []
    while len(letters) < len(bad):
        for msg in await dead.fetch(len(bad), timeout=10):
            letter = DeadLetter()
            letter.ParseFromString(msg.data)
            letters.append(letter)
            await msg.ack()
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):
        await dead.fetch(1, timeout=1.0)  # exactly one letter per bad message

    by_payload = {letter.payload: letter for letter in letters}
    for payload, headers, words in bad:
        letter = by_payload[payload]
        assert words in letter.reason, letter.reason
        assert letter.subject == subject
        assert letter.consumer == "optimizer-feedback"
        assert dict(letter.headers).items() >= headers.items()
