"""Running one evaluation request: call the target (with retries), compute the metrics,
and assemble the result and its trace. Nothing here touches the bus."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest, EvaluationResult
from flywheel.api.traces.v1.spans_pb2 import Span
from flywheel.api.values import struct_to_plain
from flywheel.core.run_policy import RunPolicySettings
from flywheel.evaluator import metrics as metric_fns
from flywheel.evaluator.judge import JudgeClient
from flywheel.evaluator.settings import EvaluatorSettings
from flywheel.evaluator.targets import CallContext, CallResult, TargetError, call_http, call_llm, call_python
from flywheel.evaluator.targets import call_with_retries as retrying
from flywheel.evaluator.tracing import build_spans, trace_id_for
from flywheel.evaluator.validation import metric_name


def result_event_id(request_id: str) -> str:
    """The result's event id (and JetStream dedup id): the same for every delivery of a request."""
    return f"evaluation-result:{request_id}"


@dataclass
class Evaluation:
    result: EvaluationResult
    spans: list[Span]


class Evaluator:
    """Evaluates requests against their targets; safe to run many at once."""

    def __init__(self, settings: EvaluatorSettings, judge: JudgeClient, http: httpx.AsyncClient) -> None:
        self._settings = settings
        self._judge = judge
        self._http = http
        self.replica = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self._defaults = metric_fns.Targets(settings.latency_target_ms, settings.cost_target_usd)
        self._policy = settings.policy

    @property
    def policy(self) -> RunPolicySettings:
        """What requests may name (credential variables, callables, hosts)."""
        return self._policy

    def empty_result(self, req: EvaluationRequest) -> EvaluationResult:
        """A result carrying the request's ids and nothing measured yet."""
        now = Timestamp()
        now.GetCurrentTime()
        return EvaluationResult(
            meta=EventMeta(
                event_id=result_event_id(req.request_id),
                time=now,
                source=f"evaluator/{self.replica}",
                trace_id=trace_id_for(req),
            ),
            request_id=req.request_id,
            run_id=req.run_id,
            candidate_id=req.candidate_id,
            test_case_id=req.test_case.test_case_id,
            trace_id=trace_id_for(req),
        )

    async def evaluate(self, req: EvaluationRequest) -> Evaluation:
        """Run one (valid) request; a target that fails for good gives a result with ``error``."""
        started = datetime.now(UTC)
        ctx = CallContext(
            input=struct_to_plain(req.test_case.input),
            config=struct_to_plain(req.config),
            test_case_id=req.test_case.test_case_id,
        )
        result = self.empty_result(req)
        call_started = datetime.now(UTC)
        try:
            call = await retrying(
                lambda: self._call_once(req, ctx),
                # a run may ask for fewer attempts or another first delay, never for more attempts
                attempts=min(req.max_attempts or self._settings.max_attempts, self._settings.max_attempts),
                timeout_s=req.timeout_s or self._settings.call_timeout_s,
                backoff_s=req.retry_backoff_s or self._settings.retry_backoff_s,
            )
        except TargetError as exc:
            result.error = str(exc)
            result.attempts = exc.attempts
            spans = build_spans(
                req,
                result,
                started=started,
                call_started=call_started,
                call_ended=datetime.now(UTC),
                prompt="",
                model="",
                judged={},
            )
            return Evaluation(result, spans)
        call_ended = datetime.now(UTC)
        self._fill_call(result, call)
        wanted = list(req.metrics) or metric_fns.default_metrics(bool(MessageToDict(req.test_case.expected)))
        for metric in wanted:
            metric.name = metric_name(metric)
        scored = await metric_fns.compute(
            wanted,
            call=call,
            input_=ctx.input,
            expected=struct_to_plain(req.test_case.expected),
            rubric=req.rubric,
            judge=self._judge,
            defaults=self._defaults,
            policy=self._policy,
            timeout_s=req.timeout_s or self._settings.call_timeout_s,
            config=ctx.config,
        )
        weights = {m.name: req.test_case.metric_weights.get(m.name, m.weight or 1.0) for m in wanted}
        result.components.update(scored.components)
        result.metric_errors.update(scored.errors)
        for name, note in scored.judged.items():
            if "fallback" in note:
                result.metric_errors[name] = f"scored by {note}"
        result.score = scored.score(weights)
        spans = build_spans(
            req,
            result,
            started=started,
            call_started=call_started,
            call_ended=call_ended,
            prompt=call.prompt,
            model=call.model,
            judged=scored.judged,
        )
        return Evaluation(result, spans)

    async def _call_once(self, req: EvaluationRequest, ctx: CallContext) -> CallResult:
        kind = req.target.WhichOneof("kind")
        if kind == "llm":
            return await call_llm(req.target.llm, ctx, policy=self._policy)
        if kind == "http":
            return await call_http(req.target.http, ctx, self._http, policy=self._policy)
        return await call_python(req.target.python_callable, ctx, policy=self._policy)

    @staticmethod
    def _fill_call(result: EvaluationResult, call: CallResult) -> None:
        result.output = call.output
        result.latency_ms = call.latency_ms
        result.cost_usd = call.cost_usd
        result.input_tokens = call.input_tokens
        result.output_tokens = call.output_tokens
        result.attempts = call.attempts
