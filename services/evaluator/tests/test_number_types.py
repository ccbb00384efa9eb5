"""A candidate's integer params reach its target as integers: a protobuf Struct stores every
number as a double, and ``max_tokens: 256.0`` is refused by OpenAI and most typed APIs."""

from __future__ import annotations

import json

import httpx
from google.protobuf.struct_pb2 import Struct

from flywheel.api.evaluator.v1 import events_pb2 as ev
from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest, Metric, MetricType, Target
from flywheel.core.settings import NatsSettings
from flywheel.evaluator.service import Evaluator
from flywheel.evaluator.settings import EvaluatorSettings


def _struct(value: dict) -> Struct:
    out = Struct()
    out.update(value)
    return out


async def test_integer_params_and_inputs_reach_an_http_target_as_integers() -> None:
    bodies: list[bytes] = []

    def target(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return httpx.Response(200, json={"output": "ok"})

    settings = EvaluatorSettings(nats=NatsSettings(url="nats://127.0.0.1:4222"))
    async with httpx.AsyncClient(transport=httpx.MockTransport(target)) as http:
        evaluator = Evaluator(settings, judge=None, http=http)  # type: ignore[arg-type]  # no judge metric here
        req = EvaluationRequest(
            request_id="r1",
            run_id="run1",
            candidate_id="c1",
            config=_struct({"max_tokens": 256, "temperature": 0.5, "stop": {"n": 3}}),
            test_case=ev.TestCase(test_case_id="t1", input=_struct({"question": "q", "page": 2})),
            target=Target(http={"url": "http://127.0.0.1:9/answer"}),
            metrics=[Metric(name="latency", type=MetricType.METRIC_TYPE_LATENCY, weight=1.0)],
            timeout_s=5,
        )
        evaluation = await evaluator.evaluate(req)

    assert not evaluation.result.error, evaluation.result.error
    sent = json.loads(bodies[0])
    assert sent == {"question": "q", "page": 2, "max_tokens": 256, "temperature": 0.5, "stop": {"n": 3}}
    assert b'"max_tokens": 256,' in bodies[0] or b'"max_tokens":256' in bodies[0], bodies[0]
    assert isinstance(sent["max_tokens"], int) and isinstance(sent["page"], int)
