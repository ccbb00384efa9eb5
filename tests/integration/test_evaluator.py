"""The evaluator as real processes on real NATS: Python and LLM targets (the LLM being the
local model server), scores, traces, replicas sharing the work queue, a kill -9 mid-run
with every request answered exactly once, and malformed requests dead-lettered."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.evaluator.v1.events_pb2 import (
    EvaluationRequest,
    EvaluationResult,
    HttpTarget,
    LlmTarget,
    Metric,
    MetricType,
    Target,
)
from flywheel.api.evaluator.v1.events_pb2 import (
    TestCase as CaseMessage,
)
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1.spans_pb2 import SpanBatch, SpanKind

from .helpers import collect

pytestmark = pytest.mark.integration

ECHO = "flywheel.evaluator.examples:echo"


def struct(values: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(values)
    return s


def request(
    request_id: str,
    *,
    run_id: str = "run-1",
    target: Target | None = None,
    config: dict[str, Any] | None = None,
    question: str = "hello world",
    expected: dict[str, Any] | None = None,
    metrics: list[Metric] | None = None,
) -> EvaluationRequest:
    return EvaluationRequest(
        meta=EventMeta(event_id=f"req:{request_id}"),
        request_id=request_id,
        run_id=run_id,
        candidate_id="cand-1",
        config=struct(config or {}),
        test_case=CaseMessage(
            test_case_id=f"tc-{request_id}",
            input=struct({"question": question}),
            expected=struct(expected or {}),
        ),
        target=target or Target(python_callable=ECHO),
        metrics=metrics or [],
    )


async def publish(js, catalogue: Catalogue, requests: list[EvaluationRequest]) -> None:
    await asyncio.gather(*(js.publish(catalogue.evaluation_request(r.run_id), r.SerializeToString()) for r in requests))


def stream(catalogue: Catalogue, suffix: str) -> str:
    return f"{catalogue.namespace.upper()}_{suffix}"


async def test_python_callable_target_gives_scores_latency_cost_and_a_trace(launch, nats_client, isolation):
    launch("evaluator")
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    exact = Metric(name="exact", type=MetricType.METRIC_TYPE_EXACT_MATCH, weight=2)
    f1 = Metric(name="f1", type=MetricType.METRIC_TYPE_SIMILARITY, weight=1)
    custom = Metric(name="len", type=MetricType.METRIC_TYPE_CUSTOM, callable="flywheel.evaluator.examples:length_ratio")
    cost = Metric(name="cost", type=MetricType.METRIC_TYPE_COST, target=0.02)
    judge = Metric(name="quality", type=MetricType.METRIC_TYPE_LLM_JUDGE)
    priced = Target(python_callable="flywheel.evaluator.examples:priced_echo")
    await publish(
        js,
        catalogue,
        [
            request("right", question="Paris", expected={"answer": "paris."}, metrics=[exact, f1, custom]),
            request("half", question="Paris France", expected={"answer": "Paris"}, metrics=[exact, f1]),
            request("priced", target=priced, config={"price_usd": 0.005}, metrics=[cost, judge]),
            request("broken", target=Target(python_callable="flywheel.evaluator.examples:fail")),
        ],
    )
    results = await collect(
        js, catalogue.evaluation_result("run-1"), stream(catalogue, "EVALUATION_RESULTS"), EvaluationResult, 4
    )
    by_id = {r.request_id: r for r in results}
    assert sorted(by_id) == ["broken", "half", "priced", "right"]

    right = by_id["right"]
    assert right.output == "Paris" and not right.error
    assert dict(right.components) == {"exact": 1.0, "f1": 1.0, "len": pytest.approx(5 / 6)}
    assert right.score == pytest.approx((2 * 1 + 1 * 1 + 1 * 5 / 6) / 4)
    assert right.latency_ms > 0 and right.attempts == 1

    half = by_id["half"]  # "paris france" vs "paris": precision 1/2, recall 1 -> F1 2/3
    assert dict(half.components) == {"exact": 0.0, "f1": pytest.approx(2 / 3)}
    assert half.score == pytest.approx((2 / 3) / 3)

    priced_result = by_id["priced"]
    assert priced_result.cost_usd == pytest.approx(0.005)
    assert dict(priced_result.components) == {"cost": pytest.approx(0.75)}
    # No judge configured: llm_judge is left out of the score (not a zero) and says why.
    assert "FLYWHEEL_EVALUATOR_JUDGE_ADDRESS" in priced_result.metric_errors["quality"]
    assert priced_result.score == pytest.approx(0.75)

    broken = by_id["broken"]
    assert "ValueError: this target always fails" in broken.error and broken.score == 0.0

    traces = await collect(js, catalogue.traces("evaluator"), stream(catalogue, "TRACES"), SpanBatch, 4)
    spans = {b.spans[0].trace_id: b.spans for b in traces}
    trace = spans[right.trace_id]
    assert right.meta.trace_id == right.trace_id
    assert [s.name for s in trace][:2] == ["evaluation", "target.call"]
    rewards = {s.name: s.reward for s in trace if s.kind == SpanKind.SPAN_KIND_REWARD}
    assert rewards["score"] == pytest.approx(right.score) and rewards["metric.exact"] == 1.0
    assert all(s.parent_span_id == trace[0].span_id for s in trace[1:])


def served_model(model_server) -> str:
    """The base model's name, as /v1/models lists it first."""
    headers = {"Authorization": f"Bearer {model_server.api_key}"}
    return httpx.get(f"{model_server.url}/models", headers=headers, timeout=10).json()["data"][0]["id"]


async def test_llm_target_against_the_local_model_server(launch, nats_client, isolation, model_server):
    evaluator = launch("evaluator", env={"FLYWHEEL_TARGET_EVAL_MODEL_KEY": model_server.api_key})
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    target = Target(
        llm=LlmTarget(
            model=f"openai/{served_model(model_server)}",
            api_base=model_server.url,
            api_key_env="FLYWHEEL_TARGET_EVAL_MODEL_KEY",
        )
    )
    http = Target(
        http=HttpTarget(
            url=f"{model_server.url}/chat/completions",
            body_template=json.dumps(
                {
                    "model": served_model(model_server),
                    "max_tokens": "{{max_tokens}}",
                    "messages": [{"role": "user", "content": "{{input.question}}"}],
                }
            ),
            response_path="choices.0.message.content",
            header_envs={"Authorization": "Bearer ${FLYWHEEL_TARGET_EVAL_MODEL_KEY}"},
        )
    )
    no_key = Target(
        llm=LlmTarget(model=target.llm.model, api_base=model_server.url, api_key_env="FLYWHEEL_TARGET_EVAL_UNSET_KEY")
    )
    config = {"temperature": 0, "max_tokens": 6, "system_prompt": "Answer in one word."}
    f1 = Metric(name="f1", type=MetricType.METRIC_TYPE_SIMILARITY)
    latency = Metric(name="latency", type=MetricType.METRIC_TYPE_LATENCY, target=600_000)
    await publish(
        js,
        catalogue,
        [
            request(
                "llm",
                target=target,
                config=config,
                question="What is the capital of France?",
                expected={"answer": "Paris"},
                metrics=[f1, latency],
            ),
            request("no-key", target=no_key, config=config),
            request("http", target=http, config=config, question="Say hello."),
        ],
    )
    results = await collect(
        js, catalogue.evaluation_result("run-1"), stream(catalogue, "EVALUATION_RESULTS"), EvaluationResult, 3
    )
    by_id = {r.request_id: r for r in results}
    llm = by_id["llm"]
    assert not llm.error, llm.error
    assert llm.output.strip() and 0 < llm.output_tokens <= 6 and llm.input_tokens > 5
    assert llm.latency_ms > 0 and llm.cost_usd == 0.0  # a local model has no price
    assert set(llm.components) == {"f1", "latency"} and 0.0 < llm.components["latency"] < 1.0
    assert "FLYWHEEL_TARGET_EVAL_UNSET_KEY" in by_id["no-key"].error and "not set" in by_id["no-key"].error
    # The HTTP target: templated body, auth header from the environment, output at response_path.
    assert not by_id["http"].error, by_id["http"].error
    assert by_id["http"].output.strip() and by_id["http"].latency_ms > 0
    assert model_server.api_key not in evaluator.log_file.read_text()


async def test_two_replicas_share_the_queue(launch, nats_client, isolation):
    env = {"FLYWHEEL_EVALUATOR_CONCURRENCY": "2"}
    launch("evaluator", env={**env, "FLYWHEEL_EVALUATOR_REPLICA_ID": "a"})
    launch("evaluator", env={**env, "FLYWHEEL_EVALUATOR_REPLICA_ID": "b"})
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    await publish(js, catalogue, [request(f"r{i}", config={"delay_s": 0.1}) for i in range(30)])
    results = await collect(
        js, catalogue.evaluation_result("run-1"), stream(catalogue, "EVALUATION_RESULTS"), EvaluationResult, 30
    )
    assert Counter(r.request_id for r in results) == Counter(f"r{i}" for i in range(30))
    # 30 x 0.1 s of work, two slots each: one replica alone would hold the queue for 1.5 s.
    assert {r.meta.source for r in results} == {"evaluator/a", "evaluator/b"}


async def test_kill_9_mid_run_every_request_gets_exactly_one_result(launch, nats_client, isolation):
    env = {"FLYWHEEL_EVALUATOR_CONCURRENCY": "4", "FLYWHEEL_EVALUATOR_ACK_WAIT_S": "2"}
    victim = launch("evaluator", env={**env, "FLYWHEEL_EVALUATOR_REPLICA_ID": "victim"})
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    n = 60
    await publish(js, catalogue, [request(f"k{i}", config={"delay_s": 0.15}) for i in range(n)])
    subject, results_stream = catalogue.evaluation_result("run-1"), stream(catalogue, "EVALUATION_RESULTS")
    deadline = time.monotonic() + 30
    while (await js.stream_info(results_stream)).state.messages < 8:
        assert time.monotonic() < deadline, "the evaluator produced no results"
        await asyncio.sleep(0.05)
    victim.kill()  # four requests in hand, unacked: they come back after the 2 s ack wait
    launch("evaluator", env={**env, "FLYWHEEL_EVALUATOR_REPLICA_ID": "survivor"})
    results = await collect(js, subject, results_stream, EvaluationResult, n, timeout_s=90)
    counts = Counter(r.request_id for r in results)
    assert counts == Counter(f"k{i}" for i in range(n)), "a request got no result or more than one"
    assert {r.meta.source for r in results} == {"evaluator/victim", "evaluator/survivor"}
    assert all(not r.error and r.output == "hello world" for r in results)
    # The work queue is empty: every request was acked once answered.
    assert (await js.stream_info(stream(catalogue, "EVALUATIONS"))).state.messages == 0


async def test_malformed_requests_are_dead_lettered_with_the_reason(launch, nats_client, isolation):
    launch("evaluator")
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    subject = catalogue.evaluation_request("run-1")
    bad_custom = Metric(name="mine", type=MetricType.METRIC_TYPE_CUSTOM)
    cases = {
        "no-target": request("no-target", target=Target()),
        "bad-callable": request("bad-callable", target=Target(python_callable="no_colon_here")),
        "no-model": request("no-model", target=Target(llm=LlmTarget(api_base="http://127.0.0.1:1/v1"))),
        "bad-metric": request("bad-metric", metrics=[bad_custom]),
        "": request(""),
    }
    for req in cases.values():
        await js.publish(subject, req.SerializeToString())
    await js.publish(subject, b"\xff\xfenot protobuf")
    await js.publish(subject, b"{not json", headers={"Content-Type": "application/json"})
    good = request("good", question="fine")
    await js.publish(
        subject,
        json.dumps(
            {
                "requestId": "good",
                "runId": "run-1",
                "testCase": {"testCaseId": "tc-good", "input": {"question": "fine"}},
                "target": {"pythonCallable": ECHO},
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )

    letters = await collect(
        js, catalogue.dead_letter("evaluator-requests"), stream(catalogue, "DEADLETTER"), DeadLetter, 7
    )
    assert len(letters) == 7
    reasons = {}
    for letter in letters:
        try:
            reasons[EvaluationRequest.FromString(letter.payload).request_id] = letter.reason
        except Exception:
            reasons.setdefault("undecodable", []).append(letter.reason)  # type: ignore[union-attr]
    assert "target is empty" in reasons["no-target"]
    assert "'package.module:function'" in reasons["bad-callable"]
    assert "target.llm.model is empty" in reasons["no-model"]
    assert "needs callable" in reasons["bad-metric"]
    assert "request_id is empty" in reasons[""]
    assert len(reasons["undecodable"]) == 2
    assert any("invalid protobuf" in r for r in reasons["undecodable"])
    assert any("invalid proto3 JSON" in r for r in reasons["undecodable"])

    # The good one behind them is answered; the rejected ones with ids get an error result too.
    results = await collect(
        js, catalogue.evaluation_result("run-1"), stream(catalogue, "EVALUATION_RESULTS"), EvaluationResult, 5
    )
    by_id = {r.request_id: r for r in results}
    assert by_id["good"].output == good.test_case.input["question"] and not by_id["good"].error
    assert set(by_id) == {"good", "no-target", "bad-callable", "no-model", "bad-metric"}
    assert by_id["no-target"].error.startswith("malformed evaluation request: target is empty")
