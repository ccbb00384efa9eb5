"""What makes an evaluation request malformed. Such a request can never succeed, so it
is dead-lettered with every problem listed, not retried."""

from __future__ import annotations

import math

from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest, Metric, MetricType
from flywheel.api.subjects import subject_token

SIMILARITY_METHODS = ("", "token_f1", "embedding")


def metric_name(metric: Metric) -> str:
    """The metric's name, or its type's short name ("llm_judge") when it has none."""
    return metric.name or MetricType.Name(metric.type).removeprefix("METRIC_TYPE_").lower()


def problems(req: EvaluationRequest) -> list[str]:
    """Every reason the request cannot be run (empty when it can)."""
    found: list[str] = []
    if not req.request_id:
        found.append("request_id is empty (it is the idempotency key of the result)")
    elif len(req.request_id) > 200:
        found.append("request_id is longer than 200 characters")
    try:
        subject_token(req.run_id, what="run_id")
    except ValueError as exc:
        found.append(str(exc))
    if not req.test_case.test_case_id:
        found.append("test_case.test_case_id is empty")
    found += _target_problems(req)
    if not (math.isfinite(req.timeout_s) and req.timeout_s >= 0):
        found.append(f"timeout_s {req.timeout_s} must be a finite number >= 0")
    names: set[str] = set()
    for i, metric in enumerate(req.metrics):
        name = metric_name(metric)
        where = f"metrics[{i}] ({name})"
        if metric.type == MetricType.METRIC_TYPE_UNSPECIFIED or metric.type not in MetricType.values():
            found.append(f"{where}: type must be one of exact_match, similarity, latency, cost, custom, llm_judge")
        if name in names:
            found.append(f"{where}: the name is used twice")
        names.add(name)
        if not (math.isfinite(metric.weight) and metric.weight >= 0):
            found.append(f"{where}: weight {metric.weight} must be a finite number >= 0")
        if not (math.isfinite(metric.target) and metric.target >= 0):
            found.append(f"{where}: target {metric.target} must be a finite number >= 0")
        if metric.type == MetricType.METRIC_TYPE_CUSTOM and ":" not in metric.callable:
            found.append(f"{where}: a custom metric needs callable 'package.module:function'")
        if metric.method not in SIMILARITY_METHODS:
            found.append(f"{where}: method {metric.method!r} must be token_f1 or embedding")
    for name, weight in req.test_case.metric_weights.items():
        if not (math.isfinite(weight) and weight >= 0):
            found.append(f"test_case.metric_weights[{name}] = {weight} must be a finite number >= 0")
    return found


def _target_problems(req: EvaluationRequest) -> list[str]:
    target = req.target
    kind = target.WhichOneof("kind")
    if kind is None:
        return ["target is empty: set llm, http or python_callable"]
    if kind == "llm":
        config_model = req.config.fields.get("model")
        if not target.llm.model and not (config_model and config_model.string_value):
            return ["target.llm.model is empty (and the config has no model)"]
    elif kind == "http":
        if not target.http.url.startswith(("http://", "https://")):
            return [f"target.http.url {target.http.url!r} must start with http:// or https://"]
        if target.http.method and target.http.method.upper() not in ("GET", "POST", "PUT", "PATCH"):
            return [f"target.http.method {target.http.method!r} must be GET, POST, PUT or PATCH"]
    elif kind == "python_callable":
        module, sep, attr = target.python_callable.partition(":")
        if not (module and sep and attr):
            return [f"target.python_callable {target.python_callable!r} must look like 'package.module:function'"]
    return []
