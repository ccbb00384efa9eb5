"""Events travel as binary protobuf; proto3 JSON is accepted when the Content-Type
header says so, so a product can publish with any NATS client."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from flywheel.core.validation import undecodable_reason

CONTENT_TYPE = "Content-Type"
PROTOBUF = "application/protobuf"
JSON = "application/json"

M = TypeVar("M", bound=Message)


class MalformedEvent(Exception):
    """The payload is not a valid instance of the expected message; goes to dead-letter."""


def encode(message: Message, *, as_json: bool = False) -> tuple[bytes, dict[str, str]]:
    """Serialise a message and the Content-Type header that says how."""
    if as_json:
        return json_format.MessageToJson(message).encode(), {CONTENT_TYPE: JSON}
    return message.SerializeToString(), {CONTENT_TYPE: PROTOBUF}


def decode(payload: bytes, headers: dict[str, str] | None, message_type: type[M]) -> M:
    """Parse a payload by its Content-Type (protobuf when absent)."""
    # Header names are case-insensitive in practice: clients send content-type too.
    found = {k.lower(): v for k, v in (headers or {}).items()}.get(CONTENT_TYPE.lower(), PROTOBUF)
    content_type = found.split(";")[0].strip().lower()
    message = message_type()
    if content_type == JSON:
        try:
            json_format.Parse(payload.decode("utf-8"), message)
        except (json_format.ParseError, UnicodeDecodeError) as exc:
            raise MalformedEvent(f"invalid proto3 JSON for {message.DESCRIPTOR.full_name}: {exc}") from exc
        return message
    if content_type != PROTOBUF:
        raise MalformedEvent(f"unsupported Content-Type {content_type!r}; use {PROTOBUF} or {JSON}")
    try:
        message.ParseFromString(payload)
    except DecodeError as exc:
        # Name the field when the walk finds it (bad UTF-8, nesting too deep).
        reason = undecodable_reason(message.DESCRIPTOR, payload)
        detail = f"{reason}" if reason else str(exc)
        raise MalformedEvent(f"invalid protobuf for {message.DESCRIPTOR.full_name}: {detail}") from exc
    return message
