"""flywheel.core.bus.codec: protobuf by default, proto3 JSON by Content-Type, MalformedEvent otherwise."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1.events_pb2 import DecisionEvent, FeedbackEvent
from flywheel.core.bus.codec import CONTENT_TYPE, JSON, PROTOBUF, MalformedEvent, decode, encode

FULL_NAME = "flywheel.api.optimizer.v1.FeedbackEvent"


def _feedback() -> FeedbackEvent:
    return FeedbackEvent(
        meta=EventMeta(event_id="ev-1", source="sdk/test"),
        decision_id="d-42",
        reward=0.75,
        signals={"thumbs_up": 1.0, "latency": 0.2},
        endpoint="support-bot",
    )


def test_protobuf_round_trip():
    event = _feedback()
    payload, headers = encode(event)
    assert headers == {CONTENT_TYPE: PROTOBUF}
    assert isinstance(payload, bytes)
    decoded = decode(payload, headers, FeedbackEvent)
    assert decoded == event
    assert decoded.HasField("reward") and decoded.reward == 0.75


def test_protobuf_is_the_default_without_headers():
    payload, _ = encode(_feedback())
    assert decode(payload, None, FeedbackEvent) == _feedback()
    assert decode(payload, {}, FeedbackEvent) == _feedback()


def test_json_round_trip_through_encode():
    event = _feedback()
    payload, headers = encode(event, as_json=True)
    assert headers == {CONTENT_TYPE: JSON}
    assert decode(payload, headers, FeedbackEvent) == event


def test_hand_written_proto3_json_is_accepted():
    """What a product publishing with a plain NATS client would send."""
    payload = b'{"meta": {"eventId": "ev-9"}, "decisionId": "d-1", "signals": {"clicked": 1}}'
    decoded = decode(payload, {CONTENT_TYPE: "application/json"}, FeedbackEvent)
    assert decoded.meta.event_id == "ev-9"
    assert decoded.decision_id == "d-1"
    assert dict(decoded.signals) == {"clicked": 1.0}
    assert not decoded.HasField("reward")  # absent stays absent, it is not a zero reward


def test_json_content_type_with_parameters_and_case():
    payload = json_format.MessageToJson(_feedback()).encode()
    assert decode(payload, {CONTENT_TYPE: "Application/JSON; charset=utf-8"}, FeedbackEvent) == _feedback()


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"garbage bytes", b"\x08"])
def test_garbage_protobuf_is_malformed_and_names_the_type(payload):
    with pytest.raises(MalformedEvent, match=FULL_NAME.replace(".", r"\.")):
        decode(payload, {CONTENT_TYPE: PROTOBUF}, FeedbackEvent)


def test_the_reason_names_the_expected_type_not_another():
    with pytest.raises(MalformedEvent) as exc:
        decode(b"\xff\xff\xff", None, DecisionEvent)
    assert "flywheel.api.optimizer.v1.DecisionEvent" in str(exc.value)
    assert "FeedbackEvent" not in str(exc.value)


@pytest.mark.parametrize(
    "payload",
    [
        b"{",  # not JSON
        b"\xff\xfe",  # not UTF-8
        b'{"reward": "high"}',  # wrong type
        b'{"noSuchField": 1}',  # unknown field
        b"5",  # JSON, but not an object
        b"null",
    ],
)
def test_bad_json_is_malformed(payload):
    with pytest.raises(MalformedEvent) as exc:
        decode(payload, {CONTENT_TYPE: JSON}, FeedbackEvent)
    assert FULL_NAME in str(exc.value)
    assert "JSON" in str(exc.value)


def test_protobuf_bytes_sent_as_json_are_malformed():
    payload, _ = encode(_feedback())
    with pytest.raises(MalformedEvent):
        decode(payload, {CONTENT_TYPE: JSON}, FeedbackEvent)


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/x-msgpack"])
def test_unknown_content_type_is_malformed_and_named(content_type):
    payload, _ = encode(_feedback())
    with pytest.raises(MalformedEvent) as exc:
        decode(payload, {CONTENT_TYPE: content_type}, FeedbackEvent)
    message = str(exc.value)
    assert content_type in message
    # and it says what would have worked
    assert PROTOBUF in message and JSON in message


def test_content_type_header_name_is_case_insensitive():
    msg = FeedbackEvent(decision_id="d-1", reward=0.5)
    payload = json_format.MessageToJson(msg).encode()
    assert decode(payload, {"content-type": "application/json; charset=utf-8"}, FeedbackEvent) == msg
