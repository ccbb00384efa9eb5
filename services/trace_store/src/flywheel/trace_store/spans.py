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
from datetime import UTC, datetime

from google.protobuf import json_format

from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind, SpanStatus
from flywheel.core.errors import InvalidArgument

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


def _ts(span: Span, field: str) -> datetime | None:
    ts = getattr(span, field)
    if not span.HasField(field) or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToDatetime(tzinfo=UTC)


def _check_span(span: Span, limits: Limits) -> None:
    where = f"span {span.span_id or '<no span_id>'} of trace {span.trace_id or '<no trace_id>'}"
    if not TRACE_ID.fullmatch(span.trace_id) or span.trace_id == "0" * 32:
        raise InvalidSpan(f"{where}: trace_id must be 32 lowercase hex chars (OpenTelemetry), not all zeros")
    if not SPAN_ID.fullmatch(span.span_id) or span.span_id == "0" * 16:
        raise InvalidSpan(f"{where}: span_id must be 16 lowercase hex chars (OpenTelemetry), not all zeros")
    if span.parent_span_id and not SPAN_ID.fullmatch(span.parent_span_id):
        raise InvalidSpan(f"{where}: parent_span_id must be empty or 16 lowercase hex chars")
    if span.parent_span_id == span.span_id:
        raise InvalidSpan(f"{where}: parent cycle (the span is its own parent)")
    if span.kind not in KIND_NAMES:
        raise InvalidSpan(f"{where}: unknown span kind {span.kind}; use one of {sorted(KINDS_BY_NAME)}")
    if span.status not in STATUS_NAMES:
        raise InvalidSpan(f"{where}: unknown status {span.status}")
    if not AGENT.fullmatch(span.agent):
        raise InvalidSpan(f"{where}: agent {span.agent!r} must be 1-64 chars of [A-Za-z0-9_-]")
    start, end = _ts(span, "start_time"), _ts(span, "end_time")
    if start is None:
        raise InvalidSpan(f"{where}: start_time is missing")
    if end is not None and end < start:
        raise InvalidSpan(f"{where}: end_time is before start_time")
    if span.input_tokens < 0 or span.output_tokens < 0:
        raise InvalidSpan(f"{where}: token counts must be >= 0")
    if not math.isfinite(span.cost_usd) or span.cost_usd < 0:
        raise InvalidSpan(f"{where}: cost_usd must be a finite number >= 0")
    for name in ("input", "output"):
        if len(getattr(span, name).encode()) > limits.max_text_bytes:
            raise InvalidSpan(f"{where}: {name} is larger than {limits.max_text_bytes} bytes")
    if span.HasField("attributes"):
        size = span.attributes.ByteSize()
        if size > limits.max_attributes_bytes:
            raise InvalidSpan(f"{where}: attributes are {size} bytes, more than {limits.max_attributes_bytes}")
    if span.kind == SpanKind.SPAN_KIND_REWARD:
        if not span.HasField("reward") or not math.isfinite(span.reward):
            raise InvalidSpan(f"{where}: a reward span needs a finite reward")
        lo, hi = reward_scale(span)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
            raise InvalidSpan(f"{where}: reward scale [{lo}, {hi}] is empty; set reward_min < reward_max")
        if not lo <= span.reward <= hi:
            raise InvalidSpan(f"{where}: reward {span.reward} is outside its scale [{lo}, {hi}]")


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


def check_links(spans: Iterable[Span], stored: Mapping[tuple[str, str], str]) -> None:
    """Refuse parent cycles among these spans and those already stored (``(trace, span) -> parent``)."""
    by_trace: dict[str, dict[str, str]] = {}
    for (trace_id, span_id), parent in stored.items():
        by_trace.setdefault(trace_id, {})[span_id] = parent
    for span in spans:
        by_trace.setdefault(span.trace_id, {}).setdefault(span.span_id, span.parent_span_id)
    for trace_id, links in by_trace.items():
        node = find_cycle(links)
        if node is not None:
            raise InvalidSpan(f"span {node} of trace {trace_id}: parent cycle through its parent links")


def to_record(span: Span) -> dict[str, object]:
    """The stored form of a span: one JSON object (a segment line). Written out by hand:
    json_format.MessageToDict costs several times more on the ingest hot path."""
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
        "start_time": span.start_time.ToJsonString(),
        "end_time": span.end_time.ToJsonString() if span.HasField("end_time") else None,
        "model": span.model,
        "input_tokens": span.input_tokens,
        "output_tokens": span.output_tokens,
        "cost_usd": span.cost_usd,
        "status": STATUS_NAMES[span.status],
        "input": span.input,
        "output": span.output,
    }
    if span.HasField("attributes"):
        record["attributes"] = json_format.MessageToDict(span.attributes)
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
