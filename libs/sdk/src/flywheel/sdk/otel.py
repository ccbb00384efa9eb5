"""OpenTelemetry GenAI spans into Flywheel spans.

A product already instrumented with OpenTelemetry (the GenAI semantic conventions,
``gen_ai.*`` attributes) does not need a second instrumentation: its spans map in.

- :func:`spans_from_otlp` takes an OTLP/JSON export (``{"resourceSpans": [...]}``, what the
  collector's file exporter and OTLP/HTTP JSON carry; ids are hex there).
- :func:`span_from_otel` takes one span of the OpenTelemetry Python SDK (a ``ReadableSpan``,
  duck-typed, so this module needs no OpenTelemetry dependency); use it from a
  ``SpanExporter.export`` to send spans on as they end: ``tracer.emit(span_from_otel(s))``.

Mapping (gen_ai semantic conventions 1.3x, older names accepted):

=====================================  ==========================================
``gen_ai.operation.name``              kind
=====================================  ==========================================
chat, text_completion, generate_content  prompt
execute_tool                           tool
invoke_agent, create_agent             coordination
anything else, or absent               content
=====================================  ==========================================

A span whose attributes say ``flywheel.kind`` (prompt, tool, reward, coordination, content,
reasoning) keeps that kind. Model: ``gen_ai.response.model`` else ``gen_ai.request.model``.
Tokens: ``gen_ai.usage.input_tokens``/``output_tokens`` (or ``prompt_tokens``/
``completion_tokens``). Input/output: ``gen_ai.input.messages``/``gen_ai.output.messages``
(or ``gen_ai.prompt``/``gen_ai.completion``, or the tool call's arguments/result). Agent:
``gen_ai.agent.name``, else the resource's ``service.name``. ``flywheel.decision_id``,
``flywheel.endpoint``, ``flywheel.cost_usd``, ``flywheel.reward`` (with ``flywheel.reward_min``/
``_max``) and ``user.id``/``enduser.id`` fill Flywheel's own fields. Every other attribute
is kept in ``attributes``. An OTel status of ERROR becomes ``SPAN_STATUS_ERROR``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from flywheel.api.traces.v1.spans_pb2 import Span, SpanKind, SpanStatus

_OPERATION_KINDS = {
    "chat": SpanKind.SPAN_KIND_PROMPT,
    "text_completion": SpanKind.SPAN_KIND_PROMPT,
    "generate_content": SpanKind.SPAN_KIND_PROMPT,
    "execute_tool": SpanKind.SPAN_KIND_TOOL,
    "invoke_agent": SpanKind.SPAN_KIND_COORDINATION,
    "create_agent": SpanKind.SPAN_KIND_COORDINATION,
}
_FLYWHEEL_KINDS = {
    name.removeprefix("SPAN_KIND_").lower(): value
    for name, value in SpanKind.items()
    if value != SpanKind.SPAN_KIND_UNSPECIFIED
}
# Attributes that become fields of the span, so they are not repeated in ``attributes``.
_CONSUMED = {
    "gen_ai.operation.name",
    "gen_ai.response.model",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "gen_ai.agent.name",
    "flywheel.kind",
    "flywheel.decision_id",
    "flywheel.endpoint",
    "flywheel.cost_usd",
    "flywheel.reward",
    "flywheel.reward_min",
    "flywheel.reward_max",
    "user.id",
    "enduser.id",
}
_OTEL_STATUS_ERROR = 2  # StatusCode.ERROR in both OTLP and the Python SDK


def spans_from_otlp(payload: Mapping[str, Any] | str) -> list[Span]:
    """Every span of an OTLP/JSON traces export, as Flywheel spans."""
    data = json.loads(payload) if isinstance(payload, str) else payload
    out: list[Span] = []
    for resource_spans in data.get("resourceSpans", []):
        resource = _otlp_attributes(resource_spans.get("resource", {}).get("attributes", []))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for raw in scope_spans.get("spans", []):
                status = raw.get("status", {}).get("code", 0)
                out.append(
                    _build(
                        trace_id=str(raw.get("traceId", "")).lower(),
                        span_id=str(raw.get("spanId", "")).lower(),
                        parent_span_id=str(raw.get("parentSpanId", "") or "").lower(),
                        name=str(raw.get("name", "")),
                        start_ns=int(raw.get("startTimeUnixNano", 0) or 0),
                        end_ns=int(raw.get("endTimeUnixNano", 0) or 0),
                        attributes=_otlp_attributes(raw.get("attributes", [])),
                        resource=resource,
                        error=status in (_OTEL_STATUS_ERROR, "STATUS_CODE_ERROR"),
                    )
                )
    return out


def span_from_otel(otel_span: Any) -> Span:
    """One OpenTelemetry SDK span (``ReadableSpan``) as a Flywheel span."""
    context = otel_span.context
    parent = getattr(otel_span, "parent", None)
    status = getattr(getattr(otel_span, "status", None), "status_code", None)
    resource = getattr(getattr(otel_span, "resource", None), "attributes", None) or {}
    return _build(
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else "",
        name=str(otel_span.name),
        start_ns=int(otel_span.start_time or 0),
        end_ns=int(otel_span.end_time or 0),
        attributes=dict(otel_span.attributes or {}),
        resource=dict(resource),
        error=getattr(status, "value", status) == _OTEL_STATUS_ERROR,
    )


def _build(
    *,
    trace_id: str,
    span_id: str,
    parent_span_id: str,
    name: str,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any],
    resource: Mapping[str, Any],
    error: bool,
) -> Span:
    a = attributes
    kind = _FLYWHEEL_KINDS.get(str(a.get("flywheel.kind", "")).lower()) or _OPERATION_KINDS.get(
        str(a.get("gen_ai.operation.name", "")), SpanKind.SPAN_KIND_CONTENT
    )
    span = Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_span_id,
        kind=kind,
        name=name,
        agent=str(a.get("gen_ai.agent.name") or resource.get("service.name") or ""),
        decision_id=str(a.get("flywheel.decision_id", "")),
        endpoint=str(a.get("flywheel.endpoint", "")),
        user_id=str(a.get("user.id") or a.get("enduser.id") or ""),
        model=str(a.get("gen_ai.response.model") or a.get("gen_ai.request.model") or ""),
        input_tokens=int(a.get("gen_ai.usage.input_tokens", a.get("gen_ai.usage.prompt_tokens", 0)) or 0),
        output_tokens=int(a.get("gen_ai.usage.output_tokens", a.get("gen_ai.usage.completion_tokens", 0)) or 0),
        cost_usd=float(a.get("flywheel.cost_usd", 0.0) or 0.0),
        status=SpanStatus.SPAN_STATUS_ERROR if error else SpanStatus.SPAN_STATUS_OK,
        input=_text(a.get("gen_ai.input.messages", a.get("gen_ai.prompt", a.get("gen_ai.tool.call.arguments")))),
        output=_text(a.get("gen_ai.output.messages", a.get("gen_ai.completion", a.get("gen_ai.tool.call.result")))),
    )
    if start_ns:
        span.start_time.CopyFrom(_timestamp(start_ns))
    if end_ns:
        span.end_time.CopyFrom(_timestamp(end_ns))
    if "flywheel.reward" in a:
        span.reward = float(a["flywheel.reward"])
        span.reward_min = float(a.get("flywheel.reward_min", 0.0))
        span.reward_max = float(a.get("flywheel.reward_max", 1.0))
    rest = {k: _plain(v) for k, v in a.items() if k not in _CONSUMED}
    if rest:
        span.attributes.CopyFrom(_struct(rest))
    return span


def _otlp_attributes(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _otlp_value(item.get("value", {})) for item in items if "key" in item}


def _otlp_value(value: Mapping[str, Any]) -> Any:
    """An OTLP AnyValue as a Python value (intValue arrives as a string in OTLP/JSON)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_otlp_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return _otlp_attributes(value["kvlistValue"].get("values", []))
    return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(_plain(value))


def _plain(value: Any) -> Any:
    """Attribute values as JSON-able values (OTel SDK sequences arrive as tuples)."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _struct(values: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(values)
    return out


def _timestamp(ns: int) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(ns)
    return ts
