"""The Convergence's runtime API on Flywheel: move over by changing an import.

    # from convergence import configure_runtime, runtime_select, runtime_update
    from flywheel.sdk.convergence import configure_runtime, runtime_select, runtime_update

    await configure_runtime("my_endpoint", config=config)
    selection = await runtime_select("my_endpoint", user_id="user_123")
    # use selection.params in your application
    await runtime_update("my_endpoint", user_id="user_123", decision_id=selection.decision_id, reward=0.8)

Where the state lives. The Convergence kept arms and posteriors in a storage backend of
the caller's; Flywheel keeps them in the optimizer, shared by every process and replica.
So ``configure_runtime`` makes sure the endpoint exists on the optimizer: it creates it
from ``config`` when it is missing, and otherwise reuses it, adding the config's arms that
the endpoint lacks (a concurrent ``ALREADY_EXISTS`` means reuse as well). It does not
change the policy or reward of a live endpoint, nor retire arms: that is
``flywheel endpoint apply``'s job. ``storage=`` is accepted and ignored.

Where the optimizer is. A module-level client is built on first use from the environment
(``FLYWHEEL_OPTIMIZER_ADDRESS``, ``FLYWHEEL_AUTH_TOKEN``, ``FLYWHEEL_NATS_URL``,
``FLYWHEEL_NATS_USER``, ``FLYWHEEL_NATS_PASSWORD``, ``FLYWHEEL_NATS_NAMESPACE``, and for
TLS ``FLYWHEEL_TLS_CA_FILE``, ``FLYWHEEL_TLS_CERT_FILE`` with ``FLYWHEEL_TLS_KEY_FILE`` for
mTLS, ``FLYWHEEL_TLS_SERVER_NAME``); keyword
arguments of ``configure_runtime`` (``target``, ``auth_token``, ``nats_url``, ...) override
them. ``runtime_client()`` returns that client (for ``decide()`` or NATS feedback) and
``close_runtime()`` closes it. gRPC channels belong to one event loop, so a call from a
different loop than the last one gets a fresh client.

``config`` may be:

- The Convergence's ``RuntimeConfig`` (or its dict): ``default_arms`` (``arm_id``,
  ``params``; ``name`` and ``description`` are ignored) become the arms;
  ``selection_strategy``'s stability rule maps to the policy's incumbent rule
  (``stability_min_pulls`` -> ``min_pulls``, ``stability_confidence_threshold`` ->
  ``max_interval_width``, ``stability_improvement_threshold`` -> ``min_margin``; in
  Flywheel it decides the *reported* incumbent, not each selection);
  ``reward_evaluator.metrics`` weights become ``reward.signal_weights``. ``system``,
  ``agent_type``, ``min_arms``, ``cache_ttl_seconds`` and the exploration bonus have no
  Flywheel counterpart and are ignored (use ``policy.exploration_floor`` for a floor).
- Flywheel's endpoint-file shape without ``name`` (see ``flywheel.sdk.endpoint_file``):
  ``{"arms": [{"arm_id": "a", "params": {...}}], "policy": {...}, "reward": {...}}``.
- A list of param dicts: the arms are named ``arm-0``, ``arm-1``, ...

Per-user learning. The Convergence kept one posterior per user (and agent type); a
Flywheel endpoint keeps one for everyone unless its policy names a ``segment_key``.
``configure_runtime(..., per_user=True)`` creates the endpoint with ``segment_key:
user_id``: each user gets a posterior of their own, which starts from the endpoint's
(borrowing at most ``segment_prior_strength`` pulls, 10 by default) instead of from a flat
prior, so a new user is served the arm that works for most users until their own feedback
says otherwise. A live endpoint keeps its policy: ``per_user=True`` against one without
``segment_key: user_id`` raises ``ValueError`` (change it with ``flywheel endpoint apply``).
Without ``per_user`` the endpoint's policy decides.

Integer params. Params travel as protobuf ``Struct`` numbers (doubles); the selection's
``params`` turn every integral number within +-2**53 back into an ``int``, so
``max_tokens: 256`` is ``256`` again, as OpenAI requires (``float()`` a param that must be
a float; the rule is in ``flywheel.sdk.decision``).

Errors and fallbacks, as The Convergence returned them:

- ``runtime_select`` falls back instead of raising when the optimizer cannot serve the
  endpoint (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``NOT_FOUND``, ``FAILED_PRECONDITION``,
  ``RESOURCE_EXHAUSTED``): the first arm of the config given to ``configure_runtime``
  (else the endpoint's first live arm seen then, else ``arm_id="default"`` with empty
  params), with ``decision_id=None``, ``probability=1.0`` and ``metadata["fallback"] =
  True`` plus ``metadata["error"]``, as The Convergence's ``_fallback_selection`` did.
  A refused call (bad token, bad request) still raises; ``fallback=False`` raises always.
  ``configure_runtime`` itself raises when the optimizer cannot be reached, after noting
  the config's first arm, so an application that catches that serves the arm meanwhile.
- ``runtime_update`` returns ``{"success": False, "error": ..., "code": ..., "reward": ...,
  "engagement_score": ..., "grading_score": ...}`` for feedback the optimizer refuses
  (an unknown decision, one older than the feedback window, a bad value: gRPC
  ``NOT_FOUND``, ``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``) and for a fallback
  selection's ``decision_id=None``. A transport failure (``UNAVAILABLE``, a timeout)
  raises ``grpc.RpcError``: retry it, which is safe (next point).
- A retried ``runtime_update`` counts once. Its ``feedback_id`` is derived from the
  ``decision_id`` (and ``idempotency_key`` when given), not drawn at random, and the
  optimizer applies each feedback id at most once: by default a decision takes one update,
  as in The Convergence, and a repeat returns ``success: True, applied: False`` with the
  arm's current stats. Pass a distinct ``idempotency_key`` per update to report several
  outcomes of one decision.

Other differences, on purpose:

- ``runtime_update`` goes over gRPC ``Update`` (so it works without NATS).
- The reward is ``reward``, else ``engagement_score`` (The Convergence's order). With
  neither, the endpoint's reward spec combines ``signals`` on the server (the weighted
  mean of the declared signals present: a missing signal is not a zero). With none of the
  three it raises ``ValueError`` instead of inventing a neutral 0.5. With a scalar reward,
  ``engagement_score`` and ``grading_score`` are sent as signals of those names, recorded
  but not changing the reward. ``metadata`` is accepted and ignored.
- ``agent_type`` of ``runtime_select`` is passed as context key ``agent_type`` (use it as
  the policy's ``segment_key`` for per-agent posteriors; one endpoint has one segment key,
  so per user *and* agent type means one endpoint per agent type).
- ``RuntimeSelection`` carries ``probability`` (the policy's probability of the chosen
  arm, logged for off-policy evaluation); ``sampled_value`` is None and ``arms_state`` empty.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.api.optimizer.v1.endpoint_admin_service_pb2_grpc import EndpointAdminServiceStub
from flywheel.sdk._transport import tls_from_env
from flywheel.sdk.client import FlywheelClient
from flywheel.sdk.decision import Decision, plain_number
from flywheel.sdk.endpoint_file import EndpointFile, parse_endpoint

__all__ = [
    "RuntimeSelection",
    "close_runtime",
    "configure_runtime",
    "endpoint_from_config",
    "feedback_id_for",
    "runtime_client",
    "runtime_select",
    "runtime_update",
]

log = logging.getLogger("flywheel.sdk.convergence")

# Select errors that mean "the optimizer cannot serve this now": fall back like The Convergence.
_FALLBACK_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
# Update errors that refuse this feedback for good: The Convergence's ``success: False``.
_REFUSED_CODES = frozenset(
    {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
)

# The Convergence's RuntimeConfig keys that have no Flywheel counterpart.
_IGNORED_KEYS = {"system", "agent_type", "min_arms", "cache_ttl_seconds"}
_STABILITY_TO_INCUMBENT = {
    "stability_min_pulls": "min_pulls",
    "stability_confidence_threshold": "max_interval_width",
    "stability_improvement_threshold": "min_margin",
}


@dataclass(frozen=True)
class RuntimeSelection:
    """What ``runtime_select`` returns (The Convergence's shape, plus ``probability``)."""

    decision_id: str | None  # None for a fallback selection (nothing was logged)
    arm_id: str
    params: dict[str, Any]
    probability: float
    endpoint: str = ""
    sampled_value: float | None = None
    arms_state: list[Any] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


class _Runtime:
    def __init__(self) -> None:
        self.overrides: dict[str, Any] = {}
        self.client: FlywheelClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fallbacks: dict[str, tuple[str, dict[str, Any]]] = {}  # system -> (arm_id, params)


_runtime = _Runtime()


def _settings() -> dict[str, Any]:
    env = os.environ
    settings: dict[str, Any] = {
        "target": env.get("FLYWHEEL_OPTIMIZER_ADDRESS"),
        "auth_token": env.get("FLYWHEEL_AUTH_TOKEN") or None,
        "nats_url": env.get("FLYWHEEL_NATS_URL") or None,
        "nats_user": env.get("FLYWHEEL_NATS_USER") or None,
        "nats_password": env.get("FLYWHEEL_NATS_PASSWORD") or None,
        "namespace": env.get("FLYWHEEL_NATS_NAMESPACE") or "flywheel",
        **tls_from_env(env),
    }
    settings.update(_runtime.overrides)
    if not settings["target"]:
        raise RuntimeError(
            "no optimizer address: set FLYWHEEL_OPTIMIZER_ADDRESS or pass target= to configure_runtime()"
        )
    return settings


async def runtime_client() -> FlywheelClient:
    """The module's client for the running event loop (built from the environment on first use)."""
    loop = asyncio.get_running_loop()
    if _runtime.client is None or _runtime.loop is not loop:
        _runtime.client = FlywheelClient(**_settings())
        _runtime.loop = loop
    return _runtime.client


async def close_runtime() -> None:
    """Close the module's client; the next call builds a new one."""
    client, loop = _runtime.client, _runtime.loop
    _runtime.client = _runtime.loop = None
    if client is not None and loop is asyncio.get_running_loop():
        await client.close()


def _as_mapping(value: Any) -> Any:
    if hasattr(value, "model_dump"):  # pydantic v2 models (The Convergence's RuntimeConfig)
        return value.model_dump(exclude_none=True)
    if hasattr(value, "dict") and callable(value.dict) and not isinstance(value, Mapping):  # pydantic v1
        return {k: v for k, v in value.dict().items() if v is not None}
    return value


def _arm(i: int, item: Any) -> dict[str, Any]:
    item = _as_mapping(item)
    if not isinstance(item, Mapping):
        raise ValueError(f"arm {i}: expected a mapping of params or an arm with arm_id and params, got {item!r}")
    if "arm_id" in item or "params" in item:
        arm = {k: v for k, v in item.items() if k not in ("name", "description")}
        arm.setdefault("arm_id", f"arm-{i}")
        return arm
    return {"arm_id": f"arm-{i}", "params": dict(item)}


def endpoint_from_config(endpoint: str, config: Any, *, per_user: bool = False) -> EndpointFile:
    """Turn a Convergence runtime config (or Flywheel's shape, or a list of params) into an endpoint.

    ``per_user`` sets the policy's ``segment_key`` to ``user_id`` (a posterior per user)."""
    config = _as_mapping(config)
    if isinstance(config, Sequence) and not isinstance(config, str | bytes):
        config = {"arms": list(config)}
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a RuntimeConfig, a mapping or a list of params, not {type(config).__name__}")
    data = {k: _as_mapping(v) for k, v in config.items() if k not in _IGNORED_KEYS}
    if data.get("name", endpoint) != endpoint:
        raise ValueError(f"config names endpoint {data['name']!r} but configure_runtime was given {endpoint!r}")
    data["name"] = endpoint

    arms = data.pop("default_arms", None)
    if "arms" not in data and arms is not None:
        data["arms"] = arms
    data["arms"] = [_arm(i, a) for i, a in enumerate(data.get("arms") or [])]

    strategy = _as_mapping(data.pop("selection_strategy", None)) or {}
    incumbent = {
        ours: strategy[theirs]
        for theirs, ours in _STABILITY_TO_INCUMBENT.items()
        if strategy.get(theirs)  # zero means "the default" in Flywheel
    }
    if incumbent:
        policy = dict(_as_mapping(data.get("policy")) or {})
        policy["incumbent"] = {**incumbent, **(_as_mapping(policy.get("incumbent")) or {})}
        data["policy"] = policy

    evaluator = _as_mapping(data.pop("reward_evaluator", None)) or {}
    metrics = _as_mapping(evaluator.get("metrics")) or {}
    if metrics:
        weights = {}
        for name, metric in metrics.items():
            metric = _as_mapping(metric)
            weights[name] = metric["weight"] if isinstance(metric, Mapping) else metric
        reward = dict(_as_mapping(data.get("reward")) or {})
        reward["signal_weights"] = {**weights, **(reward.get("signal_weights") or {})}
        data["reward"] = reward
    if per_user:
        policy = dict(_as_mapping(data.get("policy")) or {})
        if policy.get("segment_key", "user_id") != "user_id":
            raise ValueError(
                f"per_user=True means policy.segment_key 'user_id', but the config sets {policy['segment_key']!r}"
            )
        policy["segment_key"] = "user_id"
        data["policy"] = policy
    return parse_endpoint(data, source=f"runtime config of {endpoint!r}")


async def configure_runtime(
    system: str,
    config: Any = None,
    *,
    storage: Any = None,
    target: str | None = None,
    auth_token: str | None = None,
    nats_url: str | None = None,
    nats_user: str | None = None,
    nats_password: str | None = None,
    namespace: str | None = None,
    tls_root_certificates: bytes | None = None,
    tls_certificate_chain: bytes | None = None,
    tls_private_key: bytes | None = None,
    tls_server_name: str | None = None,
    timeout_s: float = 10.0,
    per_user: bool = False,
) -> None:
    """Point the module at an optimizer (keyword overrides) and make sure ``system`` exists there.

    ``system`` is the endpoint name. Creates the endpoint from ``config`` when missing;
    otherwise adds the config's arms that it lacks. ``per_user=True`` learns a posterior
    per user (``segment_key: user_id``; a live endpoint must already have it). ``storage``
    is ignored (the optimizer keeps the state). See the module docstring for the config
    shapes, the fallback arm and the error shapes.
    """
    del storage
    overrides = {
        "target": target,
        "auth_token": auth_token,
        "nats_url": nats_url,
        "nats_user": nats_user,
        "nats_password": nats_password,
        "namespace": namespace,
        "tls_root_certificates": tls_root_certificates,
        "tls_certificate_chain": tls_certificate_chain,
        "tls_private_key": tls_private_key,
        "tls_server_name": tls_server_name,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides and overrides.items() - _runtime.overrides.items():
        _runtime.overrides.update(overrides)
        await close_runtime()
    client = await runtime_client()
    admin = EndpointAdminServiceStub(client._channel)
    call = {"timeout": timeout_s, "metadata": client._metadata}

    async def live() -> pb.Endpoint | None:
        try:
            return (await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=system), **call)).endpoint
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    wanted = endpoint_from_config(system, config, per_user=per_user) if _has_arms(config) else None
    if wanted is not None:
        first = wanted.arms[0]
        _runtime.fallbacks[system] = (first.arm_id, plain_number(dict(first.params)))
    current = await live()
    if current is None:
        if wanted is None:
            raise ValueError(f"endpoint {system!r} does not exist; pass a config with arms to create it")
        try:
            await admin.CreateEndpoint(admin_pb.CreateEndpointRequest(endpoint=wanted.to_proto()), **call)
            return
        except grpc.aio.AioRpcError:
            # ALREADY_EXISTS, or a lost insert race (which the optimizer may report as
            # UNKNOWN): if the endpoint exists now, another process created it; reuse it.
            current = await live()
            if current is None:
                raise
    if per_user and current.policy.segment_key != "user_id":
        key = current.policy.segment_key
        raise ValueError(
            f"endpoint {system!r} learns {f'per {key!r}' if key else 'one posterior for all users'}, not per "
            "user; configure_runtime does not change a live endpoint's policy: set policy.segment_key "
            "to user_id with `flywheel endpoint apply`, or call without per_user=True"
        )
    if system not in _runtime.fallbacks:
        live_arms = [a for a in current.arms if a.status != pb.ARM_STATUS_RETIRED]
        if live_arms:
            params = json_format.MessageToDict(live_arms[0].params)
            _runtime.fallbacks[system] = (live_arms[0].arm_id, plain_number(params))
    if wanted is None:
        return
    have = {a.arm_id for a in current.arms}
    for arm in wanted.arms:
        if arm.arm_id in have:
            continue
        try:
            await admin.AddArm(admin_pb.AddArmRequest(endpoint=system, arm=arm.to_proto()), **call)
        except grpc.aio.AioRpcError:
            now = await live()  # added concurrently by another process: fine
            if now is None or arm.arm_id not in {a.arm_id for a in now.arms}:
                raise


def _has_arms(config: Any) -> bool:
    """Whether a config defines arms (without any, it can only refer to an existing endpoint)."""
    config = _as_mapping(config)
    if isinstance(config, Mapping):
        return bool(config.get("arms") or config.get("default_arms"))
    return isinstance(config, Sequence) and not isinstance(config, str | bytes) and len(config) > 0


async def runtime_select(
    system: str,
    *,
    user_id: str = "",
    agent_type: str | None = None,
    context: dict[str, Any] | None = None,
    fallback: bool = True,
) -> RuntimeSelection:
    """Choose an arm of endpoint ``system`` for this request.

    When the optimizer cannot serve it (see the module docstring) and ``fallback`` is on,
    returns the fallback arm with ``decision_id=None`` and ``metadata["fallback"]``."""
    ctx = dict(context or {})
    if agent_type is not None:
        ctx.setdefault("agent_type", agent_type)
    client = await runtime_client()
    try:
        d = await client.select(system, user_id=user_id or "", context=ctx)
    except grpc.aio.AioRpcError as exc:
        if not fallback or exc.code() not in _FALLBACK_CODES:
            raise
        return _fallback_selection(system, exc)
    return RuntimeSelection(
        decision_id=d.decision_id,
        arm_id=d.arm_id,
        params=d.params,
        probability=d.probability,
        endpoint=system,
        metadata={"system": system, "decision_id": d.decision_id, "probability": d.probability},
    )


def _fallback_selection(system: str, exc: grpc.aio.AioRpcError) -> RuntimeSelection:
    """The Convergence's ``_fallback_selection``: the first known arm, nothing logged."""
    error = f"{exc.code().name}: {exc.details() or ''}".strip()
    log.warning("runtime_select(%r) fell back to the default arm: %s", system, error)
    known = _runtime.fallbacks.get(system)
    arm_id, params = known if known is not None else ("default", {})
    return RuntimeSelection(
        decision_id=None,
        arm_id=arm_id,
        params=dict(params),
        probability=1.0,
        endpoint=system,
        sampled_value=0.5 if known is not None else 0.0,
        metadata={"system": system, "fallback": True, "error": error},
    )


def feedback_id_for(decision_id: str, idempotency_key: str | None = None) -> str:
    """The feedback id ``runtime_update`` sends: the same for a retried call, so it counts once."""
    digest = hashlib.sha256(f"{decision_id}\0{idempotency_key or ''}".encode()).hexdigest()
    return f"rt-{digest[:40]}"


async def runtime_update(
    system: str,
    *,
    decision_id: str | None,
    reward: float | None = None,
    signals: dict[str, float] | None = None,
    user_id: str | None = None,
    agent_type: str | None = None,
    engagement_score: float | None = None,
    grading_score: float | None = None,
    metadata: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Report how a decision went, over gRPC ``Update``; a retried call counts once.

    Returns The Convergence's dict: ``success`` with the arm's stats, or ``success: False``
    with ``error`` for feedback the optimizer refuses (module docstring)."""
    del user_id, agent_type, metadata  # the decision knows its user; kept for call compatibility
    scalar = reward if reward is not None else engagement_score
    sent = dict(signals or {})
    if scalar is not None:
        extras = {"engagement_score": engagement_score, "grading_score": grading_score}
        sent.update({k: v for k, v in extras.items() if v is not None and k not in sent})
    if scalar is None and not sent:
        raise ValueError("runtime_update needs a reward, an engagement_score or signals")
    echo = {"reward": scalar, "engagement_score": engagement_score, "grading_score": grading_score}
    if not decision_id:
        return {
            "success": False,
            "error": "no decision_id: a fallback selection is not logged and takes no feedback",
            "code": "NO_DECISION",
            **echo,
        }
    client = await runtime_client()
    decision = Decision(decision_id=decision_id, endpoint=system, arm_id="", params={}, probability=0.0)
    try:
        resp = await client.update(
            decision, reward=scalar, signals=sent or None, feedback_id=feedback_id_for(decision_id, idempotency_key)
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in _REFUSED_CODES:
            raise
        return {"success": False, "error": exc.details() or exc.code().name, "code": exc.code().name, **echo}
    return {
        "success": True,
        "applied": resp.applied,
        "decision_id": decision_id,
        "arm_id": resp.stats.arm_id,
        **echo,
        "stats": {
            "pulls": resp.stats.pulls,
            "mean": resp.stats.mean,
            "ci_low": resp.stats.ci_low,
            "ci_high": resp.stats.ci_high,
        },
    }
