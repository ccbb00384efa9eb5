"""What makes an evaluation request malformed or not allowed. Such a request can never
succeed, so it is dead-lettered with every problem listed, not retried; its run still gets
an error result (see handlers). The run policy (which credential variables, callables and
hosts a request may name) is :mod:`flywheel.core.run_policy`, the same one StartRun applies:
a request published straight on the bus is held to it here, before anything is called."""

from __future__ import annotations

import math

from google.protobuf.struct_pb2 import ListValue, Struct, Value

from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest, Metric, MetricType
from flywheel.api.subjects import subject_token
from flywheel.core.run_policy import RunPolicySettings, policy_problems
from flywheel.core.validation import string_problem

SIMILARITY_METHODS = ("", "token_f1", "embedding")
# Ids are stored in the optimizer's run_evaluations and named in NATS message ids.
MAX_ID_CHARS = 200


def metric_name(metric: Metric) -> str:
    """The metric's name, or its type's short name ("llm_judge") when it has none."""
    return metric.name or MetricType.Name(metric.type).removeprefix("METRIC_TYPE_").lower()


def problems(req: EvaluationRequest, *, policy: RunPolicySettings) -> list[str]:
    """Every reason the request cannot be run (empty when it can), policy refusals included."""
    found: list[str] = []
    if not req.request_id:
        found.append("request_id is empty (it is the idempotency key of the result)")
    for field, value in (
        ("request_id", req.request_id),
        ("candidate_id", req.candidate_id),
        ("test_case.test_case_id", req.test_case.test_case_id),
    ):
        problem = string_problem(value, max_len=MAX_ID_CHARS)
        if problem:
            found.append(f"{field} {problem}")
    try:
        subject_token(req.run_id, what="run_id")
    except ValueError as exc:
        found.append(str(exc))
    if not req.test_case.test_case_id:
        found.append("test_case.test_case_id is empty")
    target_problems = _target_problems(req)
    found += target_problems
    for where, struct in (
        ("config", req.config),
        ("test_case.input", req.test_case.input),
        ("test_case.expected", req.test_case.expected),
    ):
        found += _non_finite(struct, where)
    if not (math.isfinite(req.timeout_s) and req.timeout_s >= 0):
        found.append(f"timeout_s {req.timeout_s} must be a finite number >= 0")
    if req.max_attempts < 0:
        found.append(f"max_attempts {req.max_attempts} must be >= 0")
    if not (math.isfinite(req.retry_backoff_s) and 0 <= req.retry_backoff_s <= 600):
        found.append(f"retry_backoff_s {req.retry_backoff_s} must be a finite number in [0, 600]")
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
        elif metric.callable:
            found += policy_problems(policy, callables=[(f"{where}.callable", metric.callable)])
        if metric.type == MetricType.METRIC_TYPE_CUSTOM:
            if metric.method not in ("", "convergence"):
                found.append(f"{where}: method {metric.method!r} of a custom metric must be empty or convergence")
        elif metric.method not in SIMILARITY_METHODS:
            found.append(f"{where}: method {metric.method!r} must be token_f1 or embedding")
    for name, weight in req.test_case.metric_weights.items():
        if not (math.isfinite(weight) and weight >= 0):
            found.append(f"test_case.metric_weights[{name}] = {weight} must be a finite number >= 0")
    if not target_problems:
        found += _target_policy_problems(req, policy)
    return found


def _target_policy_problems(req: EvaluationRequest, policy: RunPolicySettings) -> list[str]:
    """What the target names that the run policy refuses (checked on a well-formed target)."""
    target = req.target
    kind = target.WhichOneof("kind")
    if kind == "llm":
        envs = [("target.llm.api_key_env", target.llm.api_key_env)] if target.llm.api_key_env else []
        return policy_problems(policy, env_vars=envs, llm_api_bases=[("target.llm.api_base", target.llm.api_base)])
    if kind == "http":
        envs = [(f"target.http.header_envs[{name}]", ref) for name, ref in sorted(target.http.header_envs.items())]
        return policy_problems(policy, env_vars=envs, urls=[("target.http.url", target.http.url)])
    return policy_problems(policy, callables=[("target.python_callable", target.python_callable)])


def _non_finite(value: Struct | ListValue | Value, where: str, limit: int = 5) -> list[str]:
    """Paths of NaN or infinite numbers (JSON has no such numbers: the target and metrics
    could not be given them), at most ``limit``."""
    found: list[str] = []
    stack: list[tuple[Struct | ListValue | Value, str]] = [(value, where)]
    while stack and len(found) < limit:
        item, path = stack.pop()
        if isinstance(item, Struct):
            stack += [(v, f"{path}.{k}") for k, v in item.fields.items()]
        elif isinstance(item, ListValue):
            stack += [(v, f"{path}[{i}]") for i, v in enumerate(item.values)]
        elif item.WhichOneof("kind") == "number_value" and not math.isfinite(item.number_value):
            found.append(f"{path} is {item.number_value}; numbers must be finite")
        elif item.WhichOneof("kind") in ("struct_value", "list_value"):
            stack.append((getattr(item, item.WhichOneof("kind")), path))
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
        if not target.http.url.lower().startswith(("http://", "https://")):
            return [f"target.http.url {target.http.url!r} must start with http:// or https://"]
        if target.http.method and target.http.method.upper() not in ("GET", "POST", "PUT", "PATCH"):
            return [f"target.http.method {target.http.method!r} must be GET, POST, PUT or PATCH"]
    elif kind == "python_callable":
        module, sep, attr = target.python_callable.partition(":")
        if not (module and sep and attr):
            return [f"target.python_callable {target.python_callable!r} must look like 'package.module:function'"]
    return []
