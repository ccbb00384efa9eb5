"""Metrics: each turns one evaluation into a score in [0, 1]; the evaluation's score is
the weighted mean of the metrics that could be computed (one that could not, say the
judge being down, is left out and reported, never counted as a zero)."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any

from flywheel.api.evaluator.v1.events_pb2 import Metric, MetricType
from flywheel.api.reward.v1 import reward_judge_service_pb2 as judge_pb
from flywheel.core.run_policy import RunPolicySettings
from flywheel.core.text_metrics import exact_match, token_f1
from flywheel.evaluator.judge import JudgeClient, JudgeUnavailable
from flywheel.evaluator.targets import CallResult, TargetError, resolve_callable

TYPE_NAMES = {
    "exact_match": MetricType.METRIC_TYPE_EXACT_MATCH,
    "similarity": MetricType.METRIC_TYPE_SIMILARITY,
    "latency": MetricType.METRIC_TYPE_LATENCY,
    "cost": MetricType.METRIC_TYPE_COST,
    "custom": MetricType.METRIC_TYPE_CUSTOM,
    "llm_judge": MetricType.METRIC_TYPE_LLM_JUDGE,
}


def lower_is_better(value: float, target: float) -> float:
    """1 at zero, 0 at or beyond ``target``, linear between."""
    return max(0.0, min(1.0, 1.0 - value / target))


def expected_text(expected: dict[str, Any]) -> str | None:
    """The reference answer of a test case: ``expected.output`` / ``answer`` / ``text``, the
    only value when there is one, else the whole object as JSON; None when empty."""
    if not expected:
        return None
    for key in ("output", "answer", "text", "expected"):
        if isinstance(expected.get(key), str):
            return str(expected[key])
    if len(expected) == 1:
        (only,) = expected.values()
        return only if isinstance(only, str) else json.dumps(only)
    return json.dumps(expected, sort_keys=True)


def default_metrics(has_expected: bool) -> list[Metric]:
    if has_expected:
        return [Metric(name="similarity", type=MetricType.METRIC_TYPE_SIMILARITY, weight=1.0)]
    return [Metric(name="llm_judge", type=MetricType.METRIC_TYPE_LLM_JUDGE, weight=1.0)]


@dataclass
class Scored:
    """Metric scores, the ones left out with why, and the judge's verdicts for the trace."""

    components: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    judged: dict[str, str] = field(default_factory=dict)

    def score(self, weights: dict[str, float]) -> float:
        total = sum(weights[name] for name in self.components)
        if total <= 0:
            return 0.0
        return sum(weights[name] * value for name, value in self.components.items()) / total


@dataclass(frozen=True)
class Targets:
    """Service defaults for metrics that set no target."""

    latency_ms: float
    cost_usd: float


async def compute(
    metrics: list[Metric],
    *,
    call: CallResult,
    input_: dict[str, Any],
    expected: dict[str, Any],
    rubric: str,
    judge: JudgeClient,
    defaults: Targets,
    policy: RunPolicySettings,
    timeout_s: float = 30.0,
    config: dict[str, Any] | None = None,
) -> Scored:
    """Score one successful call with every metric. A metric that cannot be computed (the
    judge away, a custom metric that raises, times out or is not allowed) is left out of the
    score and its reason put in ``errors``; it never fails the evaluation."""
    scored = Scored()
    reference = expected_text(expected)
    for metric in metrics:
        name = metric.name
        try:
            value, note = await _one(
                metric, call, input_, expected, reference, rubric, judge, defaults, policy, timeout_s, config or {}
            )
        except (JudgeUnavailable, _Skip, TargetError) as exc:
            scored.errors[name] = str(exc)
            continue
        if not math.isfinite(value):
            scored.errors[name] = f"{name} gave {value}, not a number in [0, 1]"
            continue
        scored.components[name] = max(0.0, min(1.0, value))
        if note:
            scored.judged[name] = note
    return scored


class _Skip(Exception):
    """This metric cannot be computed for this test case (e.g. no expected answer)."""


async def _one(
    metric: Metric,
    call: CallResult,
    input_: dict[str, Any],
    expected: dict[str, Any],
    reference: str | None,
    rubric: str,
    judge: JudgeClient,
    defaults: Targets,
    policy: RunPolicySettings,
    timeout_s: float,
    config: dict[str, Any],
) -> tuple[float, str]:
    kind = metric.type
    if kind == MetricType.METRIC_TYPE_LATENCY:
        return lower_is_better(call.latency_ms, metric.target or defaults.latency_ms), ""
    if kind == MetricType.METRIC_TYPE_COST:
        return lower_is_better(call.cost_usd, metric.target or defaults.cost_usd), ""
    if kind == MetricType.METRIC_TYPE_CUSTOM:
        if metric.method == "convergence":
            return await _convergence_custom(metric, call, expected, config, policy, timeout_s), ""
        return await _custom(metric, call, input_, expected, policy, timeout_s), ""
    if kind == MetricType.METRIC_TYPE_LLM_JUDGE:
        got = await judge.score(
            prompt=call.prompt, response=call.output, rubric=metric.rubric or rubric, reference=reference or ""
        )
        note = got.judge_id + (f" (fallback: {got.fallback_reason})" if got.fallback_reason else "")
        return got.score, note
    if reference is None:
        raise _Skip("the test case has no expected answer")
    if kind == MetricType.METRIC_TYPE_EXACT_MATCH:
        return exact_match(call.output, reference), ""
    if metric.method == "embedding":
        got = await judge.score(
            prompt="", response=call.output, rubric="", reference=reference, judge=judge_pb.JUDGE_KIND_EMBEDDING
        )
        return got.score, got.judge_id
    return token_f1(call.output, reference), ""


async def _custom(
    metric: Metric,
    call: CallResult,
    input_: dict[str, Any],
    expected: dict[str, Any],
    policy: RunPolicySettings,
    timeout_s: float,
    *,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> float:
    """A user's metric ``fn(output, expected, input)``, off the event loop when it is sync;
    whatever it raises (or a value that is not a number) is a TargetError naming it."""
    what = f"metric {metric.name} callable"
    fn = resolve_callable(metric.callable, what=what, policy=policy)
    args = args if args is not None else (call.output, expected, input_)
    kwargs = kwargs or {}
    try:
        if inspect.iscoroutinefunction(fn):
            value = await asyncio.wait_for(fn(*args, **kwargs), timeout_s)
        else:
            value = await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), timeout_s)
        if inspect.isawaitable(value):
            value = await asyncio.wait_for(value, timeout_s)
        if isinstance(value, dict):  # a Convergence evaluator may score several metrics at once
            value = value.get(metric.name, value.get("score"))
        return float(value)
    except TimeoutError:
        raise TargetError(f"{what} {metric.callable} timed out after {timeout_s:g}s", retryable=False) from None
    except Exception as exc:  # noqa: BLE001 - the user's metric failed; that is the outcome
        text = " ".join(str(exc).split())[:300]
        raise TargetError(f"{what} {metric.callable} raised {type(exc).__name__}: {text}", retryable=False) from None


async def _convergence_custom(
    metric: Metric,
    call: CallResult,
    expected: dict[str, Any],
    config: dict[str, Any],
    policy: RunPolicySettings,
    timeout_s: float,
) -> float:
    """A Convergence custom evaluator, ``fn(result, expected, params, metric=name)``: result is
    the target's output parsed as JSON where it is JSON; a dict it returns is read at the
    metric's name (else ``score``)."""
    try:
        result: Any = json.loads(call.output)
    except ValueError:
        result = call.output
    return await _custom(
        metric, call, {}, expected, policy, timeout_s, args=(result, expected, config), kwargs={"metric": metric.name}
    )
