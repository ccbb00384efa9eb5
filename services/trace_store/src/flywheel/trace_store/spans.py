"""The span model: validation of incoming spans and their stored (JSON line) form.

Ids follow OpenTelemetry: a trace id is 16 bytes and a span id 8 bytes, both lowercase
hex and not all zeros, so OTel spans map in unchanged (see :mod:`flywheel.trace_store.otel`).
A batch is accepted or refused as a whole; the reason names the span at fault.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from google.protobuf.struct_pb2 import Value
from google.protobuf.timestamp_pb2 import Timestamp

from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind, SpanStatus
from flywheel.core.errors import InvalidArgument
from flywheel.core.validation import MAX_TIMESTAMP_S, MIN_TIMESTAMP_S, Invalid, check_struct, string_problem

TRACE_ID = re.compile(r"[0-9a-f]{32}")
SPAN_ID = re.compile(r"[0-9a-f]{16}")
AGENT = re.compile(r"[A-Za-z0-9_-]{1,64}")
KIND_NAMES = {v: SpanKind.Name(v).removeprefix("SPAN_KIND_").lower() for v in SpanKind.values() if v}
KINDS_BY_NAME = {name: value for value, name in KIND_NAMES.items()}
STATUS_NAMES = {v: SpanStatus.Name(v).removeprefix("SPAN_STATUS_").lower() for v in SpanStatus.values()}
# Rank of a span's output as "the trace's response": final content beats a raw prompt output.
RESPONSE_RANK = {SpanKind.SPAN_KIND_CONTENT: 2, SpanKind.SPAN_KIND_PROMPT: 1}


class InvalidSpan(InvalidArgument):
    """A span (or batch) that can never be stored; the message says which and why."""


@dataclass(frozen=True)
class Limits:
    """Size limits per span: attributes as JSON, and input/output text."""

    max_attributes_bytes: int = 64 * 1024
    max_text_bytes: int = 1024 * 1024
    max_spans_per_batch: int = 10_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
# Short text fields and their widths: the first three are columns of ``traces``
# (migrations/versions/0002_spans.py); name and model only go to segments, bounded all the same.
_TEXT_FIELDS = (("user_id", 256), ("endpoint", 64), ("decision_id", 64), ("name", 1024), ("model", 256))


def to_datetime(ts: Timestamp) -> datetime:
    """A protobuf Timestamp as an aware UTC datetime (microseconds). Timestamp.ToDatetime
    with a tzinfo costs several times more, and the ingest path calls this twice per span."""
    return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def span_times(span: Span) -> tuple[datetime, datetime]:
    """Start and end of a validated span; a span without an end ends when it starts."""
    start, end = span.start_time, span.end_time
    return to_datetime(start), to_datetime(end if end.seconds or end.nanos else start)


def _rfc3339(ts: Timestamp, as_datetime: datetime) -> str:
    # isoformat is fast but stops at microseconds; OpenTelemetry times carry nanoseconds.
    return as_datetime.isoformat() if ts.nanos % 1000 == 0 else ts.ToJsonString()


def _check_span(span: Span, limits: Limits) -> None:
    # The common case (a good span) builds no strings: the reason is written on failure only.
    def refuse(reason: str) -> InvalidSpan:
        where = f"span {span.span_id or '<no span_id>'} of trace {span.trace_id or '<no trace_id>'}"
        return InvalidSpan(f"{where}: {reason}")

    if not TRACE_ID.fullmatch(span.trace_id) or span.trace_id == _ZERO_TRACE:
        raise refuse("trace_id must be 32 lowercase hex chars (OpenTelemetry), not all zeros")
    if not SPAN_ID.fullmatch(span.span_id) or span.span_id == _ZERO_SPAN:
        raise refuse("span_id must be 16 lowercase hex chars (OpenTelemetry), not all zeros")
    parent = span.parent_span_id
    if parent and not SPAN_ID.fullmatch(parent):
        raise refuse("parent_span_id must be empty or 16 lowercase hex chars")
    if parent == span.span_id:
        raise refuse("parent cycle (the span is its own parent)")
    if span.kind not in KIND_NAMES:
        raise refuse(f"unknown span kind {span.kind}; use one of {sorted(KINDS_BY_NAME)}")
    if span.status not in STATUS_NAMES:
        raise refuse(f"unknown status {span.status}")
    if not AGENT.fullmatch(span.agent):
        raise refuse(f"agent {span.agent!r} must be 1-64 chars of [A-Za-z0-9_-]")
    start = (span.start_time.seconds, span.start_time.nanos)
    if start == (0, 0):
        raise refuse("start_time is missing")
    end = (span.end_time.seconds, span.end_time.nanos)  # (0, 0) when absent
    for name, (seconds, nanos) in (("start_time", start), ("end_time", end)):
        if not (MIN_TIMESTAMP_S <= seconds <= MAX_TIMESTAMP_S and 0 <= nanos <= 999_999_999):
            raise refuse(f"{name}: ({seconds} s, {nanos} ns) is outside years 1-9999")
    if end != (0, 0) and end < start:
        raise refuse("end_time is before start_time")
    for name, width in _TEXT_FIELDS:
        problem = string_problem(getattr(span, name), max_len=width)
        if problem is not None:
            raise refuse(f"{name} {problem}")
    for name in ("input_tokens", "output_tokens"):
        if getattr(span, name) < 0:
            raise refuse(f"{name} must be >= 0, got {getattr(span, name)}")
    if span.HasField("reward") and not (
        math.isfinite(span.reward) and math.isfinite(span.reward_min) and math.isfinite(span.reward_max)
    ):
        raise refuse("reward, reward_min and reward_max must be finite numbers")
    if not math.isfinite(span.cost_usd) or span.cost_usd < 0:
        raise refuse("cost_usd must be a finite number >= 0")
    for name in ("input", "output"):
        text = getattr(span, name)
        # UTF-8 takes at most 4 bytes a character: only long texts need encoding to be measured.
        if len(text) * 4 > limits.max_text_bytes and len(text.encode()) > limits.max_text_bytes:
            raise refuse(f"{name} is larger than {limits.max_text_bytes} bytes")
        if "\x00" in text:  # PostgreSQL text (a trace's task and response) cannot hold NUL
            raise refuse(f"{name} contains a NUL byte")
    if span.HasField("attributes"):
        size = span.attributes.ByteSize()
        if size > limits.max_attributes_bytes:
            raise refuse(f"attributes are {size} bytes, more than {limits.max_attributes_bytes}")
        try:
            check_struct(span.attributes, "attributes")  # NaN, infinity, NUL, depth
        except Invalid as exc:
            raise refuse(str(exc)) from None
    if span.kind == SpanKind.SPAN_KIND_REWARD:
        if not span.HasField("reward") or not math.isfinite(span.reward):
            raise refuse("a reward span needs a finite reward")
        lo, hi = reward_scale(span)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
            raise refuse(f"reward scale [{lo}, {hi}] is empty; set reward_min < reward_max")
        if not lo <= span.reward <= hi:
            raise refuse(f"reward {span.reward} is outside its scale [{lo}, {hi}]")


def reward_scale(span: Span) -> tuple[float, float]:
    """The declared scale of a reward span; [0, 1] when none is given."""
    if span.reward_min == 0 and span.reward_max == 0:
        return 0.0, 1.0
    return span.reward_min, span.reward_max


def normalised_reward(span: Span) -> float:
    """The reward mapped to [0, 1] by its own scale, so rewards of different scales can be summed."""
    lo, hi = reward_scale(span)
    return (span.reward - lo) / (hi - lo)


def find_cycle(links: Mapping[str, str]) -> str | None:
    """A span id on a parent cycle in ``span_id -> parent_span_id`` links, or None."""
    done: set[str] = set()
    for start in links:
        path: set[str] = set()
        node = start
        while node and node not in done:
            if node in path:
                return node
            path.add(node)
            node = links.get(node, "")
        done |= path
    return None


def validate_batch(batch: SpanBatch, *, default_agent: str = "", limits: Limits = Limits()) -> list[Span]:
    """Check every span of a batch (filling ``agent`` from the subject when empty) and the
    parent links inside it; raise :class:`InvalidSpan` for the first problem found."""
    problem = string_problem(batch.meta.event_id, max_len=128)
    if problem is not None:
        raise InvalidSpan(f"meta.event_id {problem}")
    if not batch.spans:
        raise InvalidSpan("the batch has no spans")
    if len(batch.spans) > limits.max_spans_per_batch:
        raise InvalidSpan(f"the batch has {len(batch.spans)} spans; split it (at most {limits.max_spans_per_batch})")
    spans = list(batch.spans)
    for span in spans:
        if not span.agent and default_agent:
            span.agent = default_agent
        _check_span(span, limits)
    check_links(spans, {})
    return spans


def check_links(spans: Iterable[Span], stored: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """Refuse parent cycles among these spans and those already stored (``trace_id ->
    {span_id: parent}``). Only the traces these spans touch are walked; their merged links
    are returned so a caller can check the next batch against them."""
    merged: dict[str, dict[str, str]] = {}
    for span in spans:
        links = merged.get(span.trace_id)
        if links is None:
            links = merged[span.trace_id] = dict(stored.get(span.trace_id, {}))
        links.setdefault(span.span_id, span.parent_span_id)
    for trace_id, links in merged.items():
        node = find_cycle(links)
        if node is not None:
            raise InvalidSpan(f"span {node} of trace {trace_id}: parent cycle through its parent links")
    return merged


def _plain(value: Value) -> object:
    """A Struct value as plain JSON data (what json_format.MessageToDict gives, at a
    fraction of its cost)."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {k: _plain(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind == "null_value" or kind is None:
        return None
    return getattr(value, kind)


def to_record(span: Span, times: tuple[datetime, datetime] | None = None) -> dict[str, object]:
    """The stored form of a span: one JSON object (a segment line). Written out by hand:
    json_format.MessageToDict costs several times more on the ingest hot path. ``times``
    are the span's (start, end) when the caller has them already."""
    start, end = times or span_times(span)
    record: dict[str, object] = {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "kind": KIND_NAMES[span.kind],
        "name": span.name,
        "agent": span.agent,
        "decision_id": span.decision_id,
        "user_id": span.user_id,
        "endpoint": span.endpoint,
        "start_time": _rfc3339(span.start_time, start),
        "end_time": _rfc3339(span.end_time, end) if span.end_time.seconds or span.end_time.nanos else None,
        "model": span.model,
        "input_tokens": span.input_tokens,
        "output_tokens": span.output_tokens,
        "cost_usd": span.cost_usd,
        "status": STATUS_NAMES[span.status],
        "input": span.input,
        "output": span.output,
    }
    if span.HasField("attributes"):
        record["attributes"] = {k: _plain(v) for k, v in span.attributes.fields.items()}
    if span.HasField("reward"):
        record["reward"] = span.reward
        record["reward_min"], record["reward_max"] = reward_scale(span)
    return record


def from_record(record: Mapping[str, object]) -> Span:
    """A stored span back as the wire message."""
    span = Span(
        trace_id=str(record["trace_id"]),
        span_id=str(record["span_id"]),
        parent_span_id=str(record["parent_span_id"]),
        kind=KINDS_BY_NAME[str(record["kind"])],  # type: ignore[arg-type]
        name=str(record["name"]),
        agent=str(record["agent"]),
        decision_id=str(record["decision_id"]),
        user_id=str(record.get("user_id", "")),
        endpoint=str(record.get("endpoint", "")),
        model=str(record["model"]),
        input_tokens=int(record["input_tokens"]),  # type: ignore[call-overload]
        output_tokens=int(record["output_tokens"]),  # type: ignore[call-overload]
        cost_usd=float(record["cost_usd"]),  # type: ignore[arg-type]
        status=SpanStatus.Value("SPAN_STATUS_" + str(record["status"]).upper()),
        input=str(record.get("input", "")),
        output=str(record.get("output", "")),
    )
    span.start_time.FromJsonString(str(record["start_time"]))
    if record.get("end_time"):
        span.end_time.FromJsonString(str(record["end_time"]))
    if "attributes" in record:
        span.attributes.update(record["attributes"])  # type: ignore[arg-type]
    if "reward" in record:
        span.reward = float(record["reward"])  # type: ignore[arg-type]
        span.reward_min = float(record["reward_min"])  # type: ignore[arg-type]
        span.reward_max = float(record["reward_max"])  # type: ignore[arg-type]
    return span
