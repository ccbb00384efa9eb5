"""The SDK's tracing against a real trace store: ``trace`` and span helpers, and an agent
whose streaming chat method is instrumented without changing its code (prompt, content,
reasoning and tool spans, tool results included)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

import flywheel.sdk
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1.spans_pb2 import SpanKind, SpanStatus
from flywheel.sdk.otel import spans_from_otlp
from flywheel.sdk.tracing import Tracer, instrument, prompt, reward, tool

from .helpers import eventually

pytestmark = pytest.mark.integration
K = SpanKind


class StreamingAgent:
    """A MassGen-style agent: ``async for chunk in agent.chat(messages)``."""

    model = "smollm2"

    async def chat(self, messages):
        if messages[-1]["role"] == "tool":
            yield {"type": "content", "content": "It is 21 degrees in Paris."}
            yield {"type": "done", "usage": {"prompt_tokens": 30, "completion_tokens": 8}}
            return
        yield {"type": "reasoning", "reasoning_delta": "I need the weather. "}
        yield {
            "type": "tool_calls",
            "tool_calls": [{"id": "call-1", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}],
        }


class PlainAgent:
    def chat(self, messages):
        raise ValueError("model refused")


async def test_trace_helpers_and_an_instrumented_streaming_agent(launch, stack_env, isolation):
    store = launch("trace_store")
    tracer = Tracer(
        nats_url=stack_env["FLYWHEEL_NATS_URL"],
        nats_user=stack_env["FLYWHEEL_NATS_USER"],
        nats_password=stack_env["FLYWHEEL_NATS_PASSWORD"],
        namespace=isolation["namespace"],
        agent="weather-bot",
    )
    agent = instrument(StreamingAgent(), tracer=tracer)  # the agent's code is untouched
    with flywheel.sdk.trace(
        "weather question", input="What is the weather in Paris?", user_id="u-7", tracer=tracer
    ) as run:
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        chunks = [c async for c in agent.chat(messages)]
        assert len(chunks) == 2  # the wrapper passes every chunk through
        messages += [
            {"role": "assistant", "tool_calls": chunks[1]["tool_calls"]},
            {"role": "tool", "tool_call_id": "call-1", "content": '{"celsius": 21}'},
        ]
        _ = [c async for c in agent.chat(messages)]
        reward(8, min=0, max=10, name="judge", tracer=tracer)
    with (
        flywheel.sdk.trace("manual", input="sum 2 and 3", tracer=tracer) as manual,
        prompt("plan", input="sum 2 and 3", model="m", tracer=tracer) as p,
    ):
        with tool("add", input="[2, 3]", tracer=tracer) as t:
            t.output = "5"
        p.output = "5"
    failing = instrument(PlainAgent(), tracer=tracer)
    with pytest.raises(ValueError, match="model refused"):
        failing.chat([{"role": "user", "content": "hi"}])
    tracer.flush()

    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)

        async def get(trace_id):
            try:
                return await stub.GetTrace(pb.GetTraceRequest(trace_id=trace_id))
            except grpc.aio.AioRpcError:
                return None

        got = await eventually(lambda: get(run.trace_id), lambda g: g is not None and len(g.spans) == 7)
        kinds = [(s.kind, s.name, d) for s, d in zip(got.spans, got.depths, strict=True)]
        assert kinds[0] == (K.SPAN_KIND_COORDINATION, "weather question", 0)
        by_kind = {}
        for s in got.spans:
            by_kind.setdefault(s.kind, []).append(s)
        assert len(by_kind[K.SPAN_KIND_PROMPT]) == 2
        assert all(
            p.input == "What is the weather in Paris?" and p.model == "smollm2" for p in by_kind[K.SPAN_KIND_PROMPT]
        )
        (weather,) = by_kind[K.SPAN_KIND_TOOL]
        assert (weather.name, weather.input, weather.output) == ("weather", '{"city": "Paris"}', '{"celsius": 21}')
        assert by_kind[K.SPAN_KIND_REASONING][0].output == "I need the weather. "
        assert by_kind[K.SPAN_KIND_CONTENT][0].output == "It is 21 degrees in Paris."
        assert any(p.output_tokens == 8 for p in by_kind[K.SPAN_KIND_PROMPT])
        assert got.trace.reward == pytest.approx(0.8) and got.trace.user_id == "u-7"
        assert got.trace.task == "What is the weather in Paris?"

        manual_got = await eventually(lambda: get(manual.trace_id), lambda g: g is not None)
        assert [(s.name, d) for s, d in zip(manual_got.spans, manual_got.depths, strict=True)] == [
            ("manual", 0),
            ("plan", 1),
            ("add", 2),
        ]
        errors = await stub.QueryTraces(pb.QueryTracesRequest(agent="weather-bot", status=SpanStatus.SPAN_STATUS_ERROR))
        assert [t.task for t in errors.traces] == ["hi"]
    tracer.close()


async def test_opentelemetry_genai_spans_map_in(launch, stack_env, isolation):
    """An OTLP/JSON export of an OTel-instrumented agent, sent on by the SDK, reads back as a
    Flywheel trace: the tree, the kinds, the model and the tokens."""
    export = Path(__file__).parents[2] / "libs" / "sdk" / "tests" / "data" / "otlp_agent_run.json"
    spans = spans_from_otlp(export.read_text())

    store = launch("trace_store")
    tracer = Tracer(
        nats_url=stack_env["FLYWHEEL_NATS_URL"],
        nats_user=stack_env["FLYWHEEL_NATS_USER"],
        nats_password=stack_env["FLYWHEEL_NATS_PASSWORD"],
        namespace=isolation["namespace"],
        agent="support-bot",
    )
    for span in spans:
        tracer.emit(span)
    tracer.flush()
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)

        async def get():
            try:
                return await stub.GetTrace(pb.GetTraceRequest(trace_id=spans[0].trace_id))
            except grpc.aio.AioRpcError:
                return None

        got = await eventually(get, lambda g: g is not None and len(g.spans) == 4)
    assert (got.spans[0].kind, got.depths[0]) == (K.SPAN_KIND_COORDINATION, 0)
    assert sorted(s.kind for s in got.spans[1:]) == [K.SPAN_KIND_PROMPT, K.SPAN_KIND_TOOL, K.SPAN_KIND_REWARD]
    (chat,) = [s for s in got.spans if s.kind == K.SPAN_KIND_PROMPT]
    assert (chat.model, chat.input_tokens, chat.output_tokens) == ("gpt-4o-mini", 120, 42)
    assert got.trace.reward == pytest.approx(0.7) and got.trace.user_id == "u-9"
    tracer.close()
