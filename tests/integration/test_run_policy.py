"""The run-config trust boundary, against the real optimizer and evaluator on real NATS: a
run may not name the services' secrets, arbitrary code or (with an allow-list) arbitrary
hosts, whether it comes through StartRun or straight on the bus; run sizes are capped; and a
request that cannot be evaluated is answered with an error result, never left unanswered.

Each hostile request is aimed at a local HTTP listener started by the test: it must receive
nothing but the one allowed request sent as a control."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
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
from flywheel.api.evaluator.v1.events_pb2 import TestCase as CaseMessage
from flywheel.api.optimizer.v1 import run_service_pb2 as pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as pb_grpc
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.subjects import Catalogue
from flywheel.stack.services import health_status

from .helpers import collect

pytestmark = pytest.mark.integration

ECHO = "flywheel.evaluator.examples:echo"
FAILING_METRIC = "flywheel.evaluator.examples:fail"  # fail(input, config) called with 3 arguments raises
DANGEROUS = ("builtins:exec", "os:system", "subprocess:run")
INVALID = grpc.StatusCode.INVALID_ARGUMENT


class Listener:
    """A tiny HTTP server on loopback that records every request it gets."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.command, self.path, dict(self.headers), body))
                data = json.dumps({"output": "pong"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


def struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def run_config(api: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "api": {"name": "policy", **api},
        "search_space": {"parameters": {"prefix": {"choices": ["", "A: "]}}},
        "evaluation": {
            "test_cases": {"inline": [{"id": "q1", "input": "hello", "expected": "hello"}]},
            "metrics": {"correct": {"type": "exact_match", "weight": 1.0}},
        },
        "optimization": {"evolution": {"population": 2, "generations": 1, "elite": 0}},
    }
    for path, value in overrides.items():
        *parents, leaf = path.split("__")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


async def refused(stub: pb_grpc.RunServiceStub, config: dict[str, Any]) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartRun(pb.StartRunRequest(config=struct(config)), timeout=10)
    assert err.value.code() == INVALID, err.value.details()
    return err.value.details()


async def test_start_run_refuses_secrets_code_hosts_and_oversized_runs(launch, listener):
    # The host allow-list holds the listener's host: the secrets are refused for what they are.
    optimizer = launch("optimizer", env={"FLYWHEEL_RUN_POLICY_ALLOWED_HOSTS": f"127.0.0.1:{listener.port}"})
    endpoint = f"{listener.url}/score"
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        stub = pb_grpc.RunServiceStub(channel)
        for secret in ("FLYWHEEL_DB_URL", "FLYWHEEL_NATS_PASSWORD", "FLYWHEEL_S3_SECRET_KEY"):
            http = {"kind": "http", "endpoint": endpoint, "auth": {"type": "bearer", "token_env": secret}}
            details = await refused(stub, run_config(http))
            assert f"api.auth.token_env: {secret} is one of the services' own settings" in details
            # An LLM target's key (the evaluator's api_key_env) comes from the same field.
            llm = {"kind": "llm", "model": "openai/x", "api_base": f"{listener.url}/v1", "auth": {"token_env": secret}}
            assert f"api.auth.token_env: {secret}" in await refused(stub, run_config(llm))
        assert "api.auth.token_env: OPENAI_API_KEY is not a credential variable" in await refused(
            stub,
            run_config(
                {"kind": "http", "endpoint": endpoint, "auth": {"type": "bearer", "token_env": "OPENAI_API_KEY"}}
            ),
        )
        for path in DANGEROUS:
            details = await refused(stub, run_config({"kind": "python", "callable": path}))
            assert f"api.callable: {path!r}: module {path.split(':')[0]} may never be named by a run" in details
            metric = {"type": "custom", "callable": path, "weight": 0.5}
            details = await refused(
                stub, run_config({"kind": "python", "callable": ECHO}, evaluation__metrics__mine=metric)
            )
            assert f"evaluation.metrics.mine.callable: {path!r}" in details
        assert "api.callable: 'json:loads': module json is not one runs may call" in await refused(
            stub, run_config({"kind": "python", "callable": "json:loads"})
        )
        # Hosts: off the list, and the userinfo trick that names an allowed host before the real one.
        for url in ("http://evil.test/score", f"http://127.0.0.1:{listener.port}@evil.test/", "http://127.0.0.1:1/"):
            assert "api.endpoint:" in await refused(stub, run_config({"kind": "http", "endpoint": url}))
        assert "api.api_base: is empty, and with a host allow-list" in await refused(
            stub, run_config({"kind": "llm", "model": "openai/gpt-4o-mini"})
        )

        # Run sizes: refused at once with the field and the cap, and the optimizer keeps answering.
        started = time.monotonic()
        details = await refused(
            stub, run_config({"kind": "python", "callable": ECHO}, optimization__evolution__population=1_000_000)
        )
        assert (
            "optimization.evolution.population_size: 1000000 is above this optimizer's cap of 1000"
            " (FLYWHEEL_OPTIMIZER_RUN_MAX_POPULATION)" in details
        )
        details = await refused(
            stub,
            run_config(
                {"kind": "python", "callable": ECHO},
                optimization__evolution__population=500,
                optimization__evolution__generations=500,
            ),
        )
        assert "the run may take 250000 evaluations" in details and "FLYWHEEL_OPTIMIZER_RUN_MAX_EVALUATIONS" in details
        assert time.monotonic() - started < 5
        assert (await stub.ListRuns(pb.ListRunsRequest(limit=10), timeout=5)).runs == []  # nothing was created
        assert health_status(optimizer.address) == "SERVING"

        # What the policy allows still starts: the stack's example module, a FLYWHEEL_TARGET_
        # credential to an allowed host (spelled in capitals).
        for api in (
            {"kind": "python", "callable": ECHO},
            {
                "kind": "http",
                "endpoint": f"HTTP://127.0.0.1:{listener.port}/score",
                "auth": {"type": "bearer", "token_env": "FLYWHEEL_TARGET_SCORER_KEY"},
            },
        ):
            run = (await stub.StartRun(pb.StartRunRequest(config=struct(run_config(api))), timeout=10)).run
            assert run.state == runs_pb2.RUN_STATE_RUNNING
            await stub.CancelRun(pb.CancelRunRequest(run_id=run.run_id))


# -- the same requests published straight on the bus -------------------------------------------
def request(
    request_id: str,
    target: Target,
    *,
    metrics: list[Metric] | None = None,
    expected: dict[str, Any] | None = None,
    **inputs: Any,
) -> EvaluationRequest:
    return EvaluationRequest(
        meta=EventMeta(event_id=f"req:{request_id}"),
        request_id=request_id,
        run_id="run-1",
        candidate_id="cand-1",
        test_case=CaseMessage(
            test_case_id=f"tc-{request_id}",
            input=struct(inputs or {"question": "hello"}),
            expected=struct(expected or {}),
        ),
        target=target,
        metrics=metrics or [],
    )


async def publish_and_collect(nats_client, namespace: str, requests: list[EvaluationRequest], letters: int):
    catalogue = Catalogue(namespace)
    js = nats_client.jetstream()
    for req in requests:
        await js.publish(catalogue.evaluation_request(req.run_id), req.SerializeToString())
    ns = namespace.upper()
    dead = await collect(js, catalogue.dead_letter("evaluator-requests"), f"{ns}_DEADLETTER", DeadLetter, letters)
    results = await collect(
        js, catalogue.evaluation_result("run-1"), f"{ns}_EVALUATION_RESULTS", EvaluationResult, len(requests)
    )
    reasons = {EvaluationRequest.FromString(d.payload).request_id: d.reason for d in dead}
    return reasons, {r.request_id: r for r in results}


async def test_requests_on_the_bus_naming_secrets_or_code_are_dead_lettered_and_send_nothing(
    launch, nats_client, isolation, listener
):
    evaluator = launch("evaluator", env={"FLYWHEEL_TARGET_PROBE_KEY": "probe-value"})
    secrets = {
        k: v
        for k, v in evaluator.env.items()
        if k.startswith(("FLYWHEEL_NATS_PASS", "FLYWHEEL_DB_", "FLYWHEEL_S3_SECRET"))
    }
    assert "FLYWHEEL_NATS_PASSWORD" in secrets
    url = f"{listener.url}/collect"
    hostile = {
        "bearer-nats": Target(
            http=HttpTarget(url=url, header_envs={"Authorization": "Bearer ${FLYWHEEL_NATS_PASSWORD}"})
        ),
        "header-db": Target(http=HttpTarget(url=url, header_envs={"X-Db": "FLYWHEEL_DB_URL"})),
        "mixed": Target(
            http=HttpTarget(url=url, header_envs={"X": "${FLYWHEEL_TARGET_PROBE_KEY}${FLYWHEEL_S3_SECRET_KEY}"})
        ),
        "llm-key": Target(
            llm=LlmTarget(model="openai/x", api_base=f"{listener.url}/v1", api_key_env="FLYWHEEL_NATS_PASSWORD")
        ),
        "userinfo": Target(http=HttpTarget(url=f"http://user:pw@127.0.0.1:{listener.port}/")),
        **{f"py-{p}": Target(python_callable=p) for p in DANGEROUS},
    }
    requests = [request(rid, target) for rid, target in hostile.items()]
    for path in DANGEROUS:
        metric = Metric(name="mine", type=MetricType.METRIC_TYPE_CUSTOM, callable=path)
        requests.append(request(f"metric-{path}", Target(python_callable=ECHO), metrics=[metric]))
    requests.append(request("nan-input", Target(python_callable=ECHO), x=float("nan")))
    # The name passes (an allowed module), what it resolves to (time.sleep) does not: refused at call time.
    requests.append(request("py-reach-through", Target(python_callable="flywheel.evaluator.examples:time.sleep")))
    # Controls: an allowed credential to the listener arrives; a metric that raises gets a result.
    probe = {"Authorization": "Bearer ${FLYWHEEL_TARGET_PROBE_KEY}"}
    good = Target(http=HttpTarget(url=url, header_envs=probe, response_path="output"))
    requests.append(request("good", good))
    boom = Metric(name="boom", type=MetricType.METRIC_TYPE_CUSTOM, callable=FAILING_METRIC)
    exact = Metric(name="exact", type=MetricType.METRIC_TYPE_EXACT_MATCH)
    requests.append(
        request(
            "metric-raises",
            Target(python_callable=ECHO),
            metrics=[exact, boom],
            question="hi",
            expected={"answer": "hi"},
        )
    )

    answered = ("good", "metric-raises", "py-reach-through")
    refused_ids = [r.request_id for r in requests if r.request_id not in answered]
    reasons, results = await publish_and_collect(nats_client, isolation["namespace"], requests, len(refused_ids))

    assert sorted(reasons) == sorted(refused_ids)
    assert (
        "target.http.header_envs[Authorization]: FLYWHEEL_NATS_PASSWORD is one of the services'"
        in reasons["bearer-nats"]
    )
    assert "target.http.header_envs[X-Db]: FLYWHEEL_DB_URL" in reasons["header-db"]
    assert "FLYWHEEL_S3_SECRET_KEY" in reasons["mixed"]
    assert "target.llm.api_key_env: FLYWHEEL_NATS_PASSWORD" in reasons["llm-key"]
    assert "target.http.url: the URL holds user info" in reasons["userinfo"] and "pw" not in reasons["userinfo"]
    for path in DANGEROUS:
        assert f"target.python_callable: {path!r}: module" in reasons[f"py-{path}"]
        assert f"metrics[0] (mine).callable: {path!r}" in reasons[f"metric-{path}"]
    assert "test_case.input.x is nan" in reasons["nan-input"]

    # Every request got a result (so its run would count it), the refused ones with the reason.
    assert set(results) == {r.request_id for r in requests}
    for rid in refused_ids:
        assert results[rid].error, rid
    assert not results["good"].error and results["good"].output == "pong"
    reach = results["py-reach-through"]
    assert "examples:time.sleep' resolves to a function of module time" in reach.error and reach.attempts == 1
    raised = results["metric-raises"]
    assert not raised.error and dict(raised.components) == {"exact": 1.0} and raised.score == 1.0
    assert "raised TypeError" in raised.metric_errors["boom"]

    # The listener saw the control request only, with the allowed credential and no secret.
    assert len(listener.requests) == 1, listener.requests
    _, path, headers, _ = listener.requests[0]
    assert path == "/collect" and headers["Authorization"] == "Bearer probe-value"
    seen = json.dumps([(h, body.decode()) for _, _, h, body in listener.requests])
    for value in secrets.values():
        assert value not in seen


async def test_a_host_allow_list_keeps_requests_off_other_hosts(launch, nats_client, isolation, listener):
    launch(
        "evaluator",
        env={"FLYWHEEL_RUN_POLICY_ALLOWED_HOSTS": "api.example.com", "FLYWHEEL_TARGET_PROBE_KEY": "probe-value"},
    )
    header = {"Authorization": "Bearer ${FLYWHEEL_TARGET_PROBE_KEY}"}
    requests = [
        request("direct", Target(http=HttpTarget(url=f"{listener.url}/x", header_envs=header))),
        request("userinfo", Target(http=HttpTarget(url=f"http://api.example.com@127.0.0.1:{listener.port}/x"))),
        request("backslash", Target(http=HttpTarget(url=f"http://127.0.0.1:{listener.port}\\@api.example.com/x"))),
        request(
            "llm",
            Target(
                llm=LlmTarget(model="openai/x", api_base=f"{listener.url}/v1", api_key_env="FLYWHEEL_TARGET_PROBE_KEY")
            ),
        ),
        request("llm-no-base", Target(llm=LlmTarget(model="openai/gpt-4o-mini"))),
    ]
    reasons, results = await publish_and_collect(nats_client, isolation["namespace"], requests, len(requests))
    assert f"target.http.url: host 127.0.0.1:{listener.port} is not one targets may reach" in reasons["direct"]
    assert "user info" in reasons["userinfo"] and "backslash" in reasons["backslash"]
    assert "target.llm.api_base: host 127.0.0.1" in reasons["llm"]
    assert "must name its api_base" in reasons["llm-no-base"]
    assert all(r.error for r in results.values()) and len(results) == len(requests)
    assert listener.requests == []


async def test_a_run_whose_custom_metric_raises_finishes(launch):
    """Before: each evaluation raised in the evaluator, was retried five times and dead-lettered
    with no result, and the run waited forever."""
    optimizer = launch("optimizer")
    launch("evaluator")
    metrics = {
        "correct": {"type": "exact_match", "weight": 0.5},
        "boom": {"type": "custom", "callable": FAILING_METRIC},
    }
    config = run_config({"kind": "python", "callable": ECHO}, evaluation__metrics=metrics)
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        stub = pb_grpc.RunServiceStub(channel)
        run_id = (await stub.StartRun(pb.StartRunRequest(config=struct(config)))).run.run_id
        async with asyncio.timeout(60):
            async for update in stub.WatchRun(pb.WatchRunRequest(run_id=run_id)):
                last = update.progress
        assert last.state == runs_pb2.RUN_STATE_SUCCEEDED
        assert last.evaluations_done == last.evaluations_total == 2
        run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id))).run
        # Scored by the metric that works: the echo matches the expected answer without a prefix.
        assert run.best_score == (1.0 if run.best_config["prefix"] == "" else 0.0)
