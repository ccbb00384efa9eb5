"""Hostile-input building blocks: raw gRPC calls, request mutators and the checks every
case shares (used by test_hostile_input.py).

A mutator takes a valid request and breaks exactly one field, so the error a case gets can
be blamed on that field. Invalid UTF-8 cannot be set through protobuf's Python API, so the
field is set to a marker and the marker's bytes are swapped in the serialized request for
bytes of the same length that are not UTF-8 (lengths in the wire format stay right).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

CALL_TIMEOUT_S = 20.0

# Undecodable requests: a length-delimited field that claims 255 bytes and has 7, and a tag
# with wire type 7 (which does not exist).
TRUNCATED = b"\x0a\xff\x01garbage"
BAD_WIRE_TYPE = b"\x0f\x00\x00"

# Set where invalid UTF-8 should go; swapped for the bytes below after serializing.
MARKER = "Zq7HOSTILEutf8Zq"
_NOT_UTF8 = b"\xff\xfe\xc3\x28\xc0\xaf\xed\xa0\x80" + b"x" * 7
assert len(MARKER.encode()) == len(_NOT_UTF8)

# What a caller must never see in an error message: internals it cannot act on.
LEAKS = ("Traceback", 'File "', "INSERT INTO", "SELECT ", "[SQL:", "Exception", "sqlalchemy", "asyncpg")

MB = 1024 * 1024
HUGE = "x" * (MB + 4096)

# Names an attacker tries where an identifier is expected.
HOSTILE_NAMES = {
    "path": "../../etc/passwd",
    "sql": "a'; DROP TABLE x;--",
    "dquote": 'a"b',
    "newline": "a\nb",
    "shell": "$(touch /tmp/pwned)",
    "rtl": "abc\u202etxt.exe",
}

YEAR_0 = -62135596800 - 366 * 86400  # a year before 0001-01-01
YEAR_10000 = 253402300800 + 86400  # a day into year 10000


def ts(seconds: int, nanos: int = 0) -> Timestamp:
    return Timestamp(seconds=seconds, nanos=nanos)


def struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def deep_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


HOSTILE_STRUCTS: dict[str, Callable[[], Struct]] = {
    "nan": lambda: struct({"x": float("nan")}),
    "inf": lambda: struct({"x": [1.0, float("inf")]}),
    "nul": lambda: struct({"x": "a\x00b"}),
    "nulkey": lambda: struct({"a\x00b": 1}),
    "deep200": lambda: struct(deep_dict(200)),
    "huge": lambda: struct({f"k{i:06d}": i for i in range(70_000)}),  # ~1.1 MB serialized
}

_STEP = re.compile(r"([A-Za-z_]\w*)(?:\[(\d+)\])?")


def _resolve(msg: Message, path: str) -> tuple[Message, str, int | None]:
    """The message holding the last step of ``path`` ("a.b[1].c"), that step's name and index."""
    steps = [_STEP.fullmatch(s) for s in path.split(".")]
    holder = msg
    for m in steps[:-1]:
        assert m, path
        value = getattr(holder, m.group(1))
        holder = value[int(m.group(2))] if m.group(2) is not None else value
    last = steps[-1]
    assert last, path
    return holder, last.group(1), int(last.group(2)) if last.group(2) is not None else None


def put(msg: Message, path: str, value: Any) -> Message:
    """Set the field at ``path`` to ``value`` (messages are copied in); returns ``msg``."""
    holder, name, index = _resolve(msg, path)
    if isinstance(value, Message):
        target = getattr(holder, name)
        (target[index] if index is not None else target).CopyFrom(value)
    elif index is not None:
        getattr(holder, name)[index] = value
    else:
        setattr(holder, name, value)
    return msg


def with_bad_utf8(msg: Message, path: str, *, in_struct: bool = False) -> bytes:
    """``msg`` serialized with the string at ``path`` (or a string value inside the Struct at
    ``path``) replaced by bytes that are not UTF-8."""
    put(msg, path, struct({"x": MARKER}) if in_struct else MARKER)
    return swap_marker(msg)


def swap_marker(msg: Message) -> bytes:
    """``msg`` serialized, with the one :data:`MARKER` string in it turned into invalid UTF-8."""
    raw = msg.SerializeToString()
    assert raw.count(MARKER.encode()) == 1
    return raw.replace(MARKER.encode(), _NOT_UTF8)


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str


async def call_raw(channel: grpc.aio.Channel, path: str, payload: bytes, shape: str = "unary") -> Outcome:
    """Send ``payload`` as the request bytes of method ``path`` (no client-side encoding)."""
    try:
        if shape == "unary":
            await channel.unary_unary(path)(payload, timeout=CALL_TIMEOUT_S)
        elif shape == "server_stream":
            stream = channel.unary_stream(path)(payload, timeout=CALL_TIMEOUT_S)
            async for _ in stream:  # the first message means the request was accepted
                break
            stream.cancel()
        elif shape == "bidi":
            stream = channel.stream_stream(path)(iter([payload]), timeout=CALL_TIMEOUT_S)
            async for _ in stream:
                pass
        else:
            raise ValueError(shape)
    except grpc.aio.AioRpcError as exc:
        return Outcome(exc.code(), exc.details() or "")
    return Outcome(grpc.StatusCode.OK, "")


def leaks(details: str) -> list[str]:
    """Internals found in an error message (empty when it is clean)."""
    return [word for word in LEAKS if word in details]
