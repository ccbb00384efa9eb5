"""Checks for values that arrive from outside (gRPC requests, bus events), in one place.

Every check raises :class:`Invalid` (an ``InvalidArgument``, so gRPC answers
INVALID_ARGUMENT) whose message starts with the field's path, e.g.
``context.user.name: contains a NUL byte``; a bus handler turns the same error into a
dead letter with that reason. Checks happen before a value reaches SQL, JSON or the bus:

- strings: at most as long as their column (PostgreSQL ``varchar(n)`` counts characters),
  encodable as UTF-8 (protobuf's binary parser already refuses invalid UTF-8, but proto3
  JSON and Python callers can still hand over lone surrogates), and no NUL byte, which
  PostgreSQL's ``text`` cannot store;
- numbers: finite and in range;
- timestamps: inside the range every store here can hold (years 1 to 9999);
- enums: a value the schema knows;
- Struct / Value: bounded depth and serialized size, no NaN or infinity, no NUL in keys or
  strings.

The checks are cheap on the common case (a length and an ``in``); messages are built only
when a value is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.descriptor import EnumDescriptor
from google.protobuf.struct_pb2 import ListValue, Struct, Value
from google.protobuf.timestamp_pb2 import Timestamp

from flywheel.core.errors import InvalidArgument

# Timestamps every store here can hold: Python's datetime and PostgreSQL's timestamptz.
MIN_TIMESTAMP_S = -62135596800  # 0001-01-01T00:00:00Z
MAX_TIMESTAMP_S = 253402300799  # 9999-12-31T23:59:59Z
# Nesting of a Struct (a struct or list inside another counts one level).
MAX_STRUCT_DEPTH = 32
MAX_KEY_CHARS = 256

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Invalid(InvalidArgument):
    """A value refused at the door; ``field`` is the path of the value at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _join(path: str, key: str) -> str:
    # Keys that are not plain identifiers are quoted, so the path stays unambiguous.
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key[:40]!r}]"


def string_problem(value: str, *, max_len: int | None = None) -> str | None:
    """Why ``value`` cannot be stored as text (None when it can)."""
    if max_len is not None and len(value) > max_len:
        return f"is {len(value)} characters long, more than {max_len}"
    if "\x00" in value:
        return "contains a NUL byte"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid UTF-8 (it holds a lone surrogate)"
    return None


def check_string(value: str, field: str, *, max_len: int | None = None, required: bool = False, what: str = "") -> str:
    """Return ``value`` if it fits a text column of ``max_len`` characters; raise :class:`Invalid`."""
    if required and not value:
        raise Invalid(field, f"is empty{f'; give {what}' if what else ''}")
    problem = string_problem(value, max_len=max_len)
    if problem is not None:
        raise Invalid(field, problem)
    return value


def check_strings(values: Iterable[str], field: str, *, max_len: int | None = None) -> None:
    """Each of ``values`` (a repeated field or a map's keys) as :func:`check_string`."""
    for i, value in enumerate(values):
        problem = string_problem(value, max_len=max_len)
        if problem is not None:
            raise Invalid(f"{field}[{i}]", problem)


def check_number(
    value: float,
    field: str,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_exclusive: bool = False,
    max_abs: float | None = None,
) -> float:
    """Return ``value`` if it is finite and in range; raise :class:`Invalid`."""
    if not math.isfinite(value):
        raise Invalid(field, f"must be a finite number, got {value}")
    if min_value is not None and (value <= min_value if min_exclusive else value < min_value):
        raise Invalid(field, f"must be {'>' if min_exclusive else '>='} {min_value}, got {value}")
    if max_value is not None and value > max_value:
        raise Invalid(field, f"must be <= {max_value}, got {value}")
    if max_abs is not None and abs(value) > max_abs:
        raise Invalid(field, f"must be between -{max_abs:g} and {max_abs:g}, got {value}")
    return value


def check_numbers(values: Mapping[str, float], field: str, *, max_key_len: int = MAX_KEY_CHARS) -> None:
    """A ``map<string, double>``: keys as strings, values finite."""
    for key, value in values.items():
        problem = string_problem(key, max_len=max_key_len)
        if problem is not None:
            raise Invalid(field, f"key {key[:40]!r} {problem}")
        if not math.isfinite(value):
            raise Invalid(_join(field, key), f"must be a finite number, got {value}")


def check_timestamp(ts: Timestamp, field: str, *, required: bool = False) -> datetime | None:
    """The timestamp as an aware UTC datetime (None when unset and not required); raise
    :class:`Invalid` when it is outside years 1-9999 or its nanos are out of range."""
    if ts.seconds == 0 and ts.nanos == 0:
        if required:
            raise Invalid(field, "is missing")
        return None
    if not MIN_TIMESTAMP_S <= ts.seconds <= MAX_TIMESTAMP_S:
        raise Invalid(field, f"seconds {ts.seconds} are outside years 1-9999")
    if not 0 <= ts.nanos <= 999_999_999:
        raise Invalid(field, f"nanos {ts.nanos} must be in [0, 999999999]")
    return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def check_enum(value: int, enum: EnumDescriptor | Any, field: str, *, allow_unspecified: bool = True) -> int:
    """Return ``value`` if ``enum`` (a descriptor, or a generated enum wrapper) defines it."""
    descriptor: EnumDescriptor = getattr(enum, "DESCRIPTOR", enum)
    if value not in descriptor.values_by_number:
        names = [v.name for v in descriptor.values if v.number or allow_unspecified]
        raise Invalid(field, f"unknown value {value}; use one of {names}")
    if value == 0 and not allow_unspecified:
        raise Invalid(field, f"is unset; use one of {[v.name for v in descriptor.values if v.number]}")
    return value


def struct_to_dict(
    value: Struct, field: str, *, max_bytes: int | None = None, max_depth: int = MAX_STRUCT_DEPTH
) -> dict[str, Any]:
    """The Struct as plain Python values (what ``json_format.MessageToDict`` gives: numbers are
    floats), refusing what cannot be stored or sent: more than ``max_bytes`` serialized, nesting
    deeper than ``max_depth``, NaN or infinity, NUL bytes or bad UTF-8 in keys or strings.
    Validating and converting in one walk keeps the hot path (Select's context) to one pass."""
    if max_bytes is not None:
        size = value.ByteSize()
        if size > max_bytes:
            raise Invalid(field, f"is {size} bytes serialized, more than {max_bytes}")
    return _struct(value, field, max_depth)


def check_struct(value: Struct, field: str, *, max_bytes: int | None = None, max_depth: int = MAX_STRUCT_DEPTH) -> None:
    """:func:`struct_to_dict` for its checks only."""
    struct_to_dict(value, field, max_bytes=max_bytes, max_depth=max_depth)


def _struct(value: Struct, path: str, depth: int) -> dict[str, Any]:
    if depth <= 0:
        raise Invalid(path, f"is nested more than {MAX_STRUCT_DEPTH} levels deep")
    out = {}
    for key, item in value.fields.items():
        if len(key) > MAX_KEY_CHARS or "\x00" in key or not key.isascii():
            problem = string_problem(key, max_len=MAX_KEY_CHARS)
            if problem is not None:
                raise Invalid(path or "<root>", f"key {key[:40]!r} {problem}")
        out[key] = _value(item, _join(path, key), depth)
    return out


def _list(value: ListValue, path: str, depth: int) -> list[Any]:
    if depth <= 0:
        raise Invalid(path, f"is nested more than {MAX_STRUCT_DEPTH} levels deep")
    return [_value(item, f"{path}[{i}]", depth) for i, item in enumerate(value.values)]


def _value(value: Value, path: str, depth: int) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        text = value.string_value
        if "\x00" in text or not text.isascii():
            problem = string_problem(text)
            if problem is not None:
                raise Invalid(path, problem)
        return text
    if kind == "number_value":
        number = value.number_value
        if math.isinf(number) or math.isnan(number):
            raise Invalid(path, f"must be a finite number, got {number}")
        return number
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return _struct(value.struct_value, path, depth - 1)
    if kind == "list_value":
        return _list(value.list_value, path, depth - 1)
    return None


def check_plain(value: Any, field: str, *, max_depth: int = MAX_STRUCT_DEPTH) -> None:
    """The same rules for plain JSON-like Python data (a dict read from YAML or a config)."""
    if max_depth < 0:
        raise Invalid(field, f"is nested more than {MAX_STRUCT_DEPTH} levels deep")
    if isinstance(value, str):
        problem = string_problem(value)
        if problem is not None:
            raise Invalid(field, problem)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise Invalid(field, f"must be a finite number, got {value}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            key = str(key)
            problem = string_problem(key, max_len=MAX_KEY_CHARS)
            if problem is not None:
                raise Invalid(field or "<root>", f"key {key[:40]!r} {problem}")
            check_plain(item, _join(field, key), max_depth=max_depth - 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{field}[{i}]", max_depth=max_depth - 1)


def undecodable_reason(descriptor: Any, data: bytes, path: str = "", depth: int = 0) -> str | None:
    """Why protobuf refused ``data`` (a serialized ``descriptor`` message), naming the field:
    ``user_id: is not valid UTF-8`` or ``context...: is nested more than 90 messages deep``;
    None when the walk finds neither (then the bytes are simply not that message). protobuf
    refuses such a message whole without naming the field; this walks the wire format."""
    if depth > 90:  # protobuf's own recursion limit is 100
        return f"{path[:60] + '...' if len(path) > 60 else path or '<root>'}: is nested more than 90 messages deep"
    counts: dict[int, int] = {}
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag, pos = _varint(data, pos)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                size, pos = _varint(data, pos)
                chunk, pos = data[pos : pos + size], pos + size
                field = descriptor.fields_by_number.get(number)
                if field is None:
                    continue
                index = counts[number] = counts.get(number, -1) + 1
                name = f"{path}.{field.name}" if path else field.name
                if field.is_repeated:
                    name = f"{name}[{index}]"
                if field.type == field.TYPE_STRING:
                    try:
                        chunk.decode("utf-8")
                    except UnicodeDecodeError:
                        return f"{name}: is not valid UTF-8"
                elif field.type == field.TYPE_MESSAGE:
                    found = undecodable_reason(field.message_type, chunk, name, depth + 1)
                    if found is not None:
                        return found
            else:
                return None  # groups: not used by these APIs
    except IndexError:
        return None
    return None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")
