"""The trace every evaluation leaves: a root span, the target call, one reward span per
metric and the total. Ids derive from the request id (or the request's own trace id),
so a redelivered request produces the very same trace, which the bus then deduplicates."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime

from google.protobuf.struct_pb2 import Struct

from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest, EvaluationResult
from flywheel.api.traces.v1.spans_pb2 import Span, SpanKind, SpanStatus

AGENT = "evaluator"
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def trace_id_for(req: EvaluationRequest) -> str:
    """The request's trace id when it carries a valid one, else one derived from request_id."""
    given = req.meta.trace_id.lower()
    if _TRACE_ID.fullmatch(given) and given != "0" * 32:
        return given
    return hashlib.sha256(f"evaluation:{req.request_id}".encode()).hexdigest()[:32]


def _span_id(trace_id: str, name: str) -> str:
    return hashlib.sha256(f"{trace_id}:{name}".encode()).hexdigest()[:16]


def _span(trace_id: str, name: str, kind: int, started: datetime, ended: datetime, parent: str = "") -> Span:
    span = Span(
        trace_id=trace_id,
        span_id=_span_id(trace_id, name),
        parent_span_id=parent,
        kind=kind,  # type: ignore[arg-type]
        name=name,
        agent=AGENT,
        status=SpanStatus.SPAN_STATUS_OK,
    )
    span.start_time.FromDatetime(started)
    span.end_time.FromDatetime(ended)
    return span


def build_spans(
    req: EvaluationRequest,
    result: EvaluationResult,
    *,
    started: datetime,
    call_started: datetime,
    call_ended: datetime,
    prompt: str,
    model: str,
    judged: dict[str, str],
) -> list[Span]:
    """Spans of one evaluation (times are UTC)."""
    tid = result.trace_id
    ended = datetime.now(UTC)
    root = _span(tid, "evaluation", SpanKind.SPAN_KIND_COORDINATION, started, ended)
    attrs = Struct()
    attrs.update(
        {
            "request_id": req.request_id,
            "run_id": req.run_id,
            "candidate_id": req.candidate_id,
            "test_case_id": req.test_case.test_case_id,
            "target": req.target.WhichOneof("kind") or "",
        }
    )
    attrs.fields["config"].struct_value.CopyFrom(req.config)
    root.attributes.CopyFrom(attrs)
    root.input = prompt
    root.output = result.output
    kind = SpanKind.SPAN_KIND_PROMPT if req.target.WhichOneof("kind") == "llm" else SpanKind.SPAN_KIND_TOOL
    call = _span(tid, "target.call", kind, call_started, call_ended, root.span_id)
    call.model = model
    call.input_tokens = result.input_tokens
    call.output_tokens = result.output_tokens
    call.cost_usd = result.cost_usd
    call.input = prompt
    call.output = result.output
    if result.error:
        for span in (root, call):
            span.status = SpanStatus.SPAN_STATUS_ERROR
        call.attributes.update({"error": result.error, "attempts": result.attempts})
        return [root, call]
    spans = [root, call]
    for name, value in sorted(result.components.items()):
        reward = _span(tid, f"metric.{name}", SpanKind.SPAN_KIND_REWARD, call_ended, ended, root.span_id)
        reward.reward, reward.reward_min, reward.reward_max = value, 0.0, 1.0
        if name in judged:
            reward.attributes.update({"judge": judged[name]})
        spans.append(reward)
    total = _span(tid, "score", SpanKind.SPAN_KIND_REWARD, call_ended, ended, root.span_id)
    total.reward, total.reward_min, total.reward_max = result.score, 0.0, 1.0
    if result.metric_errors:
        total.attributes.update({"metric_errors": dict(result.metric_errors)})
    spans.append(total)
    return spans
