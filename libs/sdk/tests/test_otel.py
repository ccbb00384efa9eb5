"""OpenTelemetry GenAI spans map onto Flywheel's span model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from flywheel.api.traces.v1.spans_pb2 import SpanKind, SpanStatus
from flywheel.sdk.otel import span_from_otel, spans_from_otlp

TRACE = "5b8efff798038103d269b633813fc60c"


# What an OTel collector's file exporter writes for an agent run: agent, chat, tool, reward.
OTLP_EXPORT = Path(__file__).parent / "data" / "otlp_agent_run.json"


def test_an_otlp_export_maps_kinds_ids_models_tokens_and_status():
    root, chat, tool, judge = spans_from_otlp(OTLP_EXPORT.read_text())
    assert (root.trace_id, root.span_id, root.parent_span_id) == (TRACE, "eee19b7ec3c1b174", "")
    assert [s.kind for s in (root, chat, tool, judge)] == [
        SpanKind.SPAN_KIND_COORDINATION,
        SpanKind.SPAN_KIND_PROMPT,
        SpanKind.SPAN_KIND_TOOL,
        SpanKind.SPAN_KIND_REWARD,
    ]
    assert {s.agent for s in (root, chat, tool)} == {"support-bot"}
    assert (root.decision_id, root.user_id) == ("d-1", "u-9")
    assert (chat.model, chat.input_tokens, chat.output_tokens) == ("gpt-4o-mini", 120, 42)
    assert chat.input == '[{"role":"user","content":"refund?"}]' and chat.parent_span_id == root.span_id
    assert chat.end_time.ToNanoseconds() - chat.start_time.ToNanoseconds() == 900_000_000
    # Unmapped attributes are kept, not dropped; mapped ones are not repeated.
    assert dict(chat.attributes) == {"gen_ai.request.temperature": 0.2, "gen_ai.response.finish_reasons": ["stop"]}
    assert tool.status == SpanStatus.SPAN_STATUS_ERROR and tool.input == '{"order": 7}'
    assert chat.status == SpanStatus.SPAN_STATUS_OK
    assert (judge.reward, judge.reward_min, judge.reward_max) == (7.0, 0.0, 10.0)


def test_an_sdk_span_maps_with_integer_ids():
    parent = SimpleNamespace(span_id=0xEEE19B7EC3C1B174)
    span = SimpleNamespace(
        context=SimpleNamespace(trace_id=int(TRACE, 16), span_id=0xEEE19B7EC3C1B175),
        parent=parent,
        name="chat smollm2",
        start_time=1_700_000_000_000_000_000,
        end_time=1_700_000_000_500_000_000,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.usage.prompt_tokens": 9, "tags": ("a", "b")},
        status=SimpleNamespace(status_code=SimpleNamespace(value=2)),
        resource=SimpleNamespace(attributes={"service.name": "bot"}),
    )
    got = span_from_otel(span)
    assert (got.trace_id, got.span_id, got.parent_span_id) == (TRACE, "eee19b7ec3c1b175", "eee19b7ec3c1b174")
    assert (got.kind, got.agent, got.input_tokens, got.status) == (
        SpanKind.SPAN_KIND_PROMPT,
        "bot",
        9,
        SpanStatus.SPAN_STATUS_ERROR,
    )
    assert list(got.attributes["tags"]) == ["a", "b"]
