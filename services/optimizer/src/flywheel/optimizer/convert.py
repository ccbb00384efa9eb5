"""Conversions between protobuf messages and the optimizer's values."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.struct_pb2 import ListValue, Struct, Value

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.core.validation import check_enum, struct_to_dict
from flywheel.optimizer.snapshot import EndpointSnapshot
from flywheel.optimizer.spec import (
    ACTIVE,
    BETA,
    CANARY,
    GAUSSIAN,
    IDS,
    LINEAR,
    MAX_PARAMS_BYTES,
    RETIRED,
    THOMPSON,
    ArmSpec,
    EndpointSpec,
    PolicyConfig,
)

_STATUS_TO_PB = {ACTIVE: pb.ARM_STATUS_ACTIVE, CANARY: pb.ARM_STATUS_CANARY, RETIRED: pb.ARM_STATUS_RETIRED}
_STATUS_FROM_PB = {v: k for k, v in _STATUS_TO_PB.items()}
_KIND_TO_PB = {
    BETA: pb.POLICY_KIND_THOMPSON_BETA,
    GAUSSIAN: pb.POLICY_KIND_THOMPSON_GAUSSIAN,
    LINEAR: pb.POLICY_KIND_LINEAR_THOMPSON,
}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()} | {pb.POLICY_KIND_UNSPECIFIED: BETA}
_ALLOCATION_TO_PB = {THOMPSON: pb.ALLOCATION_THOMPSON, IDS: pb.ALLOCATION_IDS}
_ALLOCATION_FROM_PB = {v: k for k, v in _ALLOCATION_TO_PB.items()} | {pb.ALLOCATION_UNSPECIFIED: THOMPSON}


def struct(value: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(value)
    return s


def from_struct(value: Struct) -> dict[str, Any]:
    """The Struct as plain Python values, as ``json_format.MessageToDict`` gives them (numbers are
    floats; NaN and infinities are refused), without its generic per-field machinery."""
    return {key: _from_value(v) for key, v in value.fields.items()}


def _from_list(value: ListValue) -> list[Any]:
    return [_from_value(v) for v in value.values]


def _from_value(value: Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        number = value.number_value
        if math.isinf(number) or math.isnan(number):
            raise ValueError(f"Fail to serialize {number} for Value.number_value")
        return number
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return _from_list(value.list_value)
    return None


def arm_spec(arm: pb.Arm, field: str = "arm") -> ArmSpec:
    """The arm as plain values; its params and status are checked here (``field`` names it in
    the error: ``endpoint.arms[2].params.model: contains a NUL byte``)."""
    check_enum(arm.status, pb.ArmStatus, f"{field}.status")
    return ArmSpec(
        arm_id=arm.arm_id,
        params=struct_to_dict(arm.params, f"{field}.params", max_bytes=MAX_PARAMS_BYTES),
        status=_STATUS_FROM_PB[arm.status] if arm.status else ACTIVE,
        traffic_cap=arm.traffic_cap or 1.0,
    )


def policy_config(spec: pb.PolicySpec, field: str = "endpoint.policy") -> PolicyConfig:
    """Fill the proto's zero values with the defaults (enums checked, naming ``field``)."""
    check_enum(spec.kind, pb.PolicyKind, f"{field}.kind")
    check_enum(spec.allocation, pb.Allocation, f"{field}.allocation")
    d = PolicyConfig()
    return PolicyConfig(
        kind=_KIND_FROM_PB.get(spec.kind, f"unknown({spec.kind})"),
        exploration_floor=spec.exploration_floor,
        half_life_s=spec.half_life_s,
        window_s=spec.window_s,
        half_life_decisions=spec.half_life_decisions,
        window_decisions=spec.window_decisions,
        segment_key=spec.segment_key,
        segment_prior_strength=spec.segment_prior_strength or d.segment_prior_strength,
        sticky_sessions=spec.sticky_sessions,
        sticky_ttl_s=spec.sticky_ttl_s or d.sticky_ttl_s,
        context_features=tuple(spec.context_features),
        ridge_lambda=spec.ridge_lambda or d.ridge_lambda,
        incumbent_min_pulls=spec.incumbent.min_pulls or d.incumbent_min_pulls,
        incumbent_max_interval_width=spec.incumbent.max_interval_width or d.incumbent_max_interval_width,
        incumbent_min_margin=spec.incumbent.min_margin or d.incumbent_min_margin,
        canary_min_pulls=spec.canary.min_pulls or d.canary_min_pulls,
        canary_promote_probability=spec.canary.promote_probability or d.canary_promote_probability,
        canary_retire_probability=spec.canary.retire_probability or d.canary_retire_probability,
        allocation=_ALLOCATION_FROM_PB.get(spec.allocation, f"unknown({spec.allocation})"),
    )


def policy_message(p: PolicyConfig) -> pb.PolicySpec:
    return pb.PolicySpec(
        kind=_KIND_TO_PB[p.kind],
        exploration_floor=p.exploration_floor,
        half_life_s=p.half_life_s,
        window_s=p.window_s,
        half_life_decisions=p.half_life_decisions,
        window_decisions=p.window_decisions,
        segment_key=p.segment_key,
        segment_prior_strength=p.segment_prior_strength,
        sticky_sessions=p.sticky_sessions,
        sticky_ttl_s=p.sticky_ttl_s,
        context_features=list(p.context_features),
        ridge_lambda=p.ridge_lambda,
        incumbent=pb.IncumbentRule(
            min_pulls=p.incumbent_min_pulls,
            max_interval_width=p.incumbent_max_interval_width,
            min_margin=p.incumbent_min_margin,
        ),
        canary=pb.CanaryRule(
            min_pulls=p.canary_min_pulls,
            promote_probability=p.canary_promote_probability,
            retire_probability=p.canary_retire_probability,
        ),
        allocation=_ALLOCATION_TO_PB[p.allocation],
    )


def endpoint_spec(ep: pb.Endpoint) -> EndpointSpec:
    bounded = ep.reward_spec.bounded or not ep.HasField("reward_spec")
    if ep.policy.kind == pb.POLICY_KIND_THOMPSON_GAUSSIAN and not ep.HasField("reward_spec"):
        bounded = False  # Gaussian endpoints exist for unbounded rewards
    return EndpointSpec(
        name=ep.name,
        description=ep.description,
        arms=[arm_spec(a, f"endpoint.arms[{i}]") for i, a in enumerate(ep.arms)],
        policy=policy_config(ep.policy),
        signal_weights=dict(ep.reward_spec.signal_weights),
        bounded=bounded,
    )


def endpoint_message(snap: EndpointSnapshot) -> pb.Endpoint:
    msg = pb.Endpoint(
        name=snap.name,
        description=snap.description,
        policy=policy_message(snap.policy),
        reward_spec=pb.RewardSpec(
            signal_weights=snap.reward_spec.get("signal_weights", {}), bounded=snap.reward_spec.get("bounded", True)
        ),
        incumbent_arm_id=snap.incumbent,
    )
    msg.created_at.FromDatetime(snap.created_at)
    for i, arm_id in enumerate(snap.arm_ids):
        msg.arms.append(
            pb.Arm(
                arm_id=arm_id,
                params=struct(snap.params[i]),
                status=_STATUS_TO_PB[snap.statuses[i]],
                traffic_cap=float(snap.caps[i]),
            )
        )
        msg.stats.append(arm_stats(snap, i))
    return msg


def arm_stats(snap: EndpointSnapshot, i: int) -> pb.ArmStats:
    w, s = float(snap.stats.w[i]), float(snap.stats.s[i])
    return pb.ArmStats(
        arm_id=snap.arm_ids[i],
        pulls=int(snap.pulls[i]),
        alpha=1.0 + s,
        beta=1.0 + max(w - s, 0.0),
        mean=float(snap.means[i]),
        ci_low=float(snap.ci_low[i]),
        ci_high=float(snap.ci_high[i]),
        reward_sum=float(snap.reward_sums[i]),
        selection_probability=float(snap.probabilities[i]),
        probability_best=float(snap.probability_best[i]),
        effective_pulls=w,
    )
