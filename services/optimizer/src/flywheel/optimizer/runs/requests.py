"""From a validated run config to the evaluator's work items.

Everything an EvaluationRequest needs except the candidate's config and the test case is
the same for the whole run; ``RequestTemplate`` builds that part once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.struct_pb2 import Struct

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.evaluator.v1 import events_pb2 as ev
from flywheel.optimizer.runconfig import RunConfig, TestCase

_METRIC_TYPES = {
    "exact_match": ev.METRIC_TYPE_EXACT_MATCH,
    "similarity": ev.METRIC_TYPE_SIMILARITY,
    "latency": ev.METRIC_TYPE_LATENCY,
    "cost": ev.METRIC_TYPE_COST,
    "custom": ev.METRIC_TYPE_CUSTOM,
    "llm_judge": ev.METRIC_TYPE_LLM_JUDGE,
}


def request_id(run_id: str, candidate_id: str, test_case_id: str) -> str:
    """Deterministic, so a request published again (after a restart) is the same request:
    JetStream drops the duplicate by its message id, and its result lands on the same row."""
    digest = hashlib.blake2b(f"{candidate_id}\0{test_case_id}".encode(), digest_size=10).hexdigest()
    return f"{run_id}.{digest}"


def struct_of(value: dict[str, Any] | None) -> Struct:
    """A dict as a protobuf Struct (None or empty: an empty Struct)."""
    out = Struct()
    if value:
        out.update(value)
    return out


def _as_mapping(value: Any, key: str) -> dict[str, Any]:
    """Test-case input/expected as a Struct-able mapping (a bare string becomes {key: s})."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    return {key: value}


def model_urls(config: RunConfig) -> dict[str, str]:
    """The Convergence's model registry (``api.models``): model key -> URL, for an http target
    whose URL is picked by the candidate's ``model`` parameter (Azure deployments)."""
    api = config.api
    if api.kind != "http" or api.endpoint or not api.models:
        return {}
    return {key: str(entry["endpoint"]) for key, entry in api.models.items()}


@dataclass(frozen=True)
class RequestTemplate:
    run_id: str
    target: ev.Target
    metrics: list[ev.Metric]
    rubric: str
    timeout_s: float
    cases: dict[str, TestCase]
    urls: dict[str, str] = field(default_factory=dict)
    max_attempts: int = 0  # 0: the evaluator's default
    retry_backoff_s: float = 0.0

    @classmethod
    def of(cls, run_id: str, config: RunConfig) -> RequestTemplate:
        api = config.api
        target = ev.Target()
        if api.kind == "python":
            target.python_callable = api.callable or ""
        elif api.kind == "llm":
            target.llm.model = api.model or ""
            target.llm.api_base = api.api_base or ""
            target.llm.api_key_env = api.auth.token_env or ""
        else:
            target.http.url = api.endpoint or ""
            target.http.method = str(api.request.get("method", "POST"))
            body = api.request.get("body_template", api.request.get("body"))
            if body is not None:
                target.http.body_template = body if isinstance(body, str) else json.dumps(body)
            # result_field is The Convergence's name ("choices[0].message.content")
            target.http.response_path = str(
                api.response.get("path", api.response.get("output_path", api.response.get("result_field", "")))
            )
            headers = api.request.get("headers")
            if isinstance(headers, dict):
                target.http.headers.update({str(k): str(v) for k, v in headers.items()})
            if api.auth.type == "bearer" and api.auth.token_env:
                target.http.header_envs["Authorization"] = f"Bearer ${{{api.auth.token_env}}}"
            elif api.auth.type == "api_key" and api.auth.token_env:
                target.http.header_envs[api.auth.header_name] = api.auth.token_env
        metrics = []
        rubric = ""
        for name, spec in config.evaluation.metrics.items():
            metric = ev.Metric(name=name, type=_METRIC_TYPES[spec.type], weight=spec.weight or 0.0)
            if spec.callable:
                metric.callable = spec.callable
                if spec.signature == "convergence":
                    metric.method = "convergence"
            if spec.rubric:
                metric.rubric = spec.rubric
                rubric = rubric or spec.rubric
            if spec.type in ("latency", "cost") and spec.threshold:
                metric.target = spec.threshold
            metrics.append(metric)
        cases = {c.id: c for c in config.test_cases()}
        return cls(
            run_id=run_id,
            target=target,
            metrics=metrics,
            rubric=rubric,
            timeout_s=config.timeout_s(),
            cases=cases,
            urls=model_urls(config),
            max_attempts=config.max_attempts(),
            retry_backoff_s=config.optimization.execution.retry_delay_seconds or 0.0,
        )

    def build(self, candidate_id: str, config: dict[str, Any], test_case_id: str) -> ev.EvaluationRequest:
        case = self.cases[test_case_id]
        rid = request_id(self.run_id, candidate_id, test_case_id)
        target = self.target
        if self.urls:  # the candidate's model picks the URL (checked at StartRun)
            target = ev.Target()
            target.CopyFrom(self.target)
            target.http.url = self.urls.get(str(config.get("model")), "")
        return ev.EvaluationRequest(
            meta=EventMeta(event_id=rid, source="optimizer"),
            request_id=rid,
            run_id=self.run_id,
            candidate_id=candidate_id,
            config=struct_of(config),
            test_case=ev.TestCase(
                test_case_id=test_case_id,
                input=struct_of(_as_mapping(case.input, "prompt")),
                expected=struct_of(_as_mapping(case.expected, "answer")),
            ),
            target=target,
            rubric=self.rubric,
            metrics=self.metrics,
            timeout_s=self.timeout_s,
            max_attempts=self.max_attempts,
            retry_backoff_s=self.retry_backoff_s,
        )
