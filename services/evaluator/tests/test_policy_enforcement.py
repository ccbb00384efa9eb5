"""The run policy enforced by the evaluator's own parts: validation of a request, and again at
call time in targets and metrics (so nothing is read, imported or sent even if validation
were skipped). The end-to-end view, over NATS, is tests/integration/test_run_policy.py."""

from __future__ import annotations

import httpx
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.evaluator.v1.events_pb2 import (
    EvaluationRequest,
    HttpTarget,
    LlmTarget,
    Metric,
    MetricType,
    Target,
)
from flywheel.api.evaluator.v1.events_pb2 import TestCase as CaseMessage
from flywheel.core.run_policy import RunPolicySettings
from flywheel.evaluator import metrics
from flywheel.evaluator.judge import JudgeClient
from flywheel.evaluator.targets import CallContext, CallResult, TargetError, call_http, call_llm, call_python
from flywheel.evaluator.validation import problems

EXAMPLES = "flywheel.evaluator.examples"
POLICY = RunPolicySettings(callable_modules=[EXAMPLES], credential_env_prefix="FLYWHEEL_TARGET_")
CTX = CallContext(input={"question": "hi"}, config={}, test_case_id="tc")


def request(target: Target, *, metrics_: list[Metric] | None = None, input_: dict | None = None) -> EvaluationRequest:
    values = Struct()
    values.update(input_ or {"question": "hi"})
    return EvaluationRequest(
        request_id="r1",
        run_id="run-1",
        test_case=CaseMessage(test_case_id="tc", input=values),
        target=target,
        metrics=metrics_ or [],
    )


@pytest.mark.parametrize("path", ["builtins:exec", "os:system", "subprocess:run", "json:loads"])
def test_validation_refuses_callables_outside_the_policy(path: str) -> None:
    as_target = " | ".join(problems(request(Target(python_callable=path)), policy=POLICY))
    assert as_target.startswith(f"target.python_callable: {path!r}")
    metric = Metric(name="mine", type=MetricType.METRIC_TYPE_CUSTOM, callable=path)
    as_metric = " | ".join(
        problems(request(Target(python_callable=f"{EXAMPLES}:echo"), metrics_=[metric]), policy=POLICY)
    )
    assert as_metric.startswith(f"metrics[0] (mine).callable: {path!r}")
    assert not problems(request(Target(python_callable=f"{EXAMPLES}:echo")), policy=POLICY)


def test_validation_refuses_service_secrets_and_hosts() -> None:
    llm = Target(
        llm=LlmTarget(model="openai/x", api_base="http://127.0.0.1:9/v1", api_key_env="FLYWHEEL_NATS_PASSWORD")
    )
    assert problems(request(llm), policy=POLICY) == [
        "target.llm.api_key_env: FLYWHEEL_NATS_PASSWORD is one of the services' own settings or infrastructure"
        " secrets; a run may never name it"
    ]
    http = Target(
        http=HttpTarget(
            url="http://api.example.com@127.0.0.1:9/", header_envs={"Authorization": "Bearer ${FLYWHEEL_DB_URL}"}
        )
    )
    found = problems(request(http), policy=POLICY)
    assert [p.split(":")[0] for p in found] == ["target.http.header_envs[Authorization]", "target.http.url"]
    hosts = RunPolicySettings(allowed_hosts=["api.example.com"])
    elsewhere = Target(http=HttpTarget(url="http://127.0.0.1:9/"))
    assert "host 127.0.0.1:9 is not one targets may reach" in problems(request(elsewhere), policy=hosts)[0]


def test_nan_in_the_input_is_a_problem_not_a_crash() -> None:
    found = problems(
        request(Target(python_callable=f"{EXAMPLES}:echo"), input_={"x": [1, float("nan")]}), policy=POLICY
    )
    assert found == ["test_case.input.x[1] is nan; numbers must be finite"]


async def test_targets_refuse_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_DB_URL", "postgresql://flywheel:hunter2@db/flywheel")
    sent: list[httpx.Request] = []
    client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(200, json="ok"))
    )
    leak = HttpTarget(url="http://collector.test/", header_envs={"X-Key": "FLYWHEEL_DB_URL"})
    with pytest.raises(TargetError, match=r"header_envs\[X-Key\]: FLYWHEEL_DB_URL is one of the services' own"):
        await call_http(leak, CTX, client, policy=POLICY)
    with pytest.raises(TargetError, match="is not one targets may reach"):
        await call_http(
            HttpTarget(url="http://collector.test/"), CTX, client, policy=RunPolicySettings(allowed_hosts=["a.test"])
        )
    assert sent == []  # nothing left the evaluator
    await call_http(HttpTarget(url="http://collector.test/"), CTX, client, policy=POLICY)
    assert len(sent) == 1
    with pytest.raises(TargetError, match="api_key_env: FLYWHEEL_DB_URL"):
        await call_llm(
            LlmTarget(model="openai/x", api_base="http://collector.test", api_key_env="FLYWHEEL_DB_URL"),
            CTX,
            policy=POLICY,
        )
    for path in ("builtins:exec", "os:system", "subprocess:run", f"{EXAMPLES}:time.sleep"):
        with pytest.raises(TargetError, match=r"target\.python_callable"):
            await call_python(path, CTX, policy=POLICY)
    assert (await call_python(f"{EXAMPLES}:echo", CTX, policy=POLICY)).output == "hi"


async def test_a_custom_metric_that_raises_is_reported_not_fatal() -> None:
    def metric(name: str, path: str) -> Metric:
        return Metric(name=name, type=MetricType.METRIC_TYPE_CUSTOM, callable=path)

    scored = await metrics.compute(
        [
            metric("len", f"{EXAMPLES}:length_ratio"),
            metric("boom", f"{EXAMPLES}:fail"),  # fail(a, b) takes two arguments: a TypeError
            metric("exec", "builtins:exec"),
        ],
        call=CallResult(output="Paris", prompt="", latency_ms=1.0),
        input_={"question": "capital?"},
        expected={"answer": "Paris"},
        rubric="",
        judge=JudgeClient(""),
        defaults=metrics.Targets(1000, 0.01),
        policy=POLICY,
    )
    assert scored.components == {"len": 1.0}
    assert "raised TypeError" in scored.errors["boom"]
    assert "module builtins may never be named" in scored.errors["exec"]
