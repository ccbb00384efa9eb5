"""Fast tests of the evaluator's pure parts: templating, metrics, validation, retries."""

from __future__ import annotations

import pytest

from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest, Metric, MetricType, Target
from flywheel.core.run_policy import RunPolicySettings
from flywheel.evaluator.metrics import exact_match, expected_text, token_f1
from flywheel.evaluator.targets import CallResult, TargetError, call_with_retries
from flywheel.evaluator.templating import TemplateError, lookup, render_body
from flywheel.evaluator.validation import problems


def test_body_template_keeps_types_and_escapes_text() -> None:
    ctx = {"temperature": 0.3, "input": {"question": 'say "hi"\n'}, "config": {"n": 2}}
    body = render_body('{"t": "{{temperature}}", "q": "Q: {{input.question}}", "n": ["{{ config.n }}"]}', ctx)
    assert body == {"t": 0.3, "q": 'Q: say "hi"\n', "n": [2]}
    with pytest.raises(TemplateError, match=r"'input\.missing' is not in"):
        render_body('{"q": "{{input.missing}}"}', ctx)
    assert lookup("$.choices[0].message.content", {"choices": [{"message": {"content": "ok"}}]}) == "ok"


def test_exact_match_and_token_f1() -> None:
    assert exact_match("  Paris. ", "paris") == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0
    assert token_f1("the cat sat", "the cat sat") == 1.0
    assert token_f1("paris france", "paris") == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    assert expected_text({"answer": "Paris"}) == "Paris" and expected_text({}) is None


def test_validation_lists_every_problem() -> None:
    req = EvaluationRequest(
        run_id="bad run",
        target=Target(python_callable="nocolon"),
        metrics=[Metric(name="m", type=MetricType.METRIC_TYPE_CUSTOM, weight=-1)],
    )
    found = " | ".join(problems(req, policy=RunPolicySettings()))
    for part in (
        "request_id is empty",
        "run_id 'bad run'",
        "test_case_id is empty",
        "python_callable 'nocolon'",
        "weight -1.0",
        "needs callable",
    ):
        assert part in found


async def test_retries_transient_failures_then_gives_up_on_permanent_ones() -> None:
    calls = []

    async def flaky() -> CallResult:
        calls.append(1)
        if len(calls) < 3:
            raise TargetError("503", retryable=True)
        return CallResult(output="ok", prompt="", latency_ms=1.0)

    done = await call_with_retries(flaky, attempts=3, timeout_s=1, backoff_s=0.001)
    assert done.output == "ok" and done.attempts == 3

    async def refused() -> CallResult:
        raise TargetError("400 bad request", retryable=False)

    with pytest.raises(TargetError, match=r"400 bad request \(attempt 1 of 5\)") as info:
        await call_with_retries(refused, attempts=5, timeout_s=1, backoff_s=0.001)
    assert info.value.attempts == 1
