"""Conversions between protobuf messages and the optimizer's domain values."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.optimizer import policy
from flywheel.optimizer.models import ArmRow, EndpointRow
from flywheel.optimizer.service import ACTIVE, CANARY, RETIRED, ArmSpec, EndpointSpec, incumbent

_STATUS_TO_PB = {ACTIVE: pb.ARM_STATUS_ACTIVE, CANARY: pb.ARM_STATUS_CANARY, RETIRED: pb.ARM_STATUS_RETIRED}
_STATUS_FROM_PB = {v: k for k, v in _STATUS_TO_PB.items()}
_POLICY_FROM_PB = {
    pb.POLICY_KIND_UNSPECIFIED: "thompson_beta",
    pb.POLICY_KIND_THOMPSON_BETA: "thompson_beta",
    pb.POLICY_KIND_THOMPSON_GAUSSIAN: "thompson_gaussian",
    pb.POLICY_KIND_LINEAR_THOMPSON: "linear_thompson",
}
_POLICY_TO_PB = {"thompson_beta": pb.POLICY_KIND_THOMPSON_BETA}


def struct(value: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(value)
    return s


def from_struct(value: Struct) -> dict[str, Any]:
    return json_format.MessageToDict(value)


def arm_spec(arm: pb.Arm) -> ArmSpec:
    return ArmSpec(
        arm_id=arm.arm_id,
        params=from_struct(arm.params),
        status=_STATUS_FROM_PB.get(arm.status, ACTIVE) if arm.status else ACTIVE,
        traffic_cap=arm.traffic_cap or 1.0,
    )


def endpoint_spec(ep: pb.Endpoint) -> EndpointSpec:
    return EndpointSpec(
        name=ep.name,
        description=ep.description,
        arms=[arm_spec(a) for a in ep.arms],
        policy_kind=_POLICY_FROM_PB.get(ep.policy.kind, "unknown"),
        exploration_floor=ep.policy.exploration_floor,
        signal_weights=dict(ep.reward_spec.signal_weights),
        # proto3 bools default to false; an endpoint without a reward spec is bounded.
        bounded=ep.reward_spec.bounded or not ep.HasField("reward_spec"),
    )


def endpoint_message(row: EndpointRow, arms: list[ArmRow]) -> pb.Endpoint:
    msg = pb.Endpoint(
        name=row.name,
        description=row.description,
        policy=pb.PolicySpec(
            kind=_POLICY_TO_PB.get(row.policy_kind, pb.POLICY_KIND_UNSPECIFIED), exploration_floor=row.exploration_floor
        ),
        reward_spec=pb.RewardSpec(
            signal_weights=row.reward_spec.get("signal_weights", {}), bounded=row.reward_spec.get("bounded", True)
        ),
        incumbent_arm_id=incumbent(arms),
    )
    msg.created_at.FromDatetime(row.created_at)
    for a in arms:
        msg.arms.append(
            pb.Arm(arm_id=a.arm_id, params=struct(a.params), status=_STATUS_TO_PB[a.status], traffic_cap=a.traffic_cap)
        )
        msg.stats.append(arm_stats(a))
    return msg


def arm_stats(a: ArmRow) -> pb.ArmStats:
    s = policy.summarize(a.alpha, a.beta)
    return pb.ArmStats(
        arm_id=a.arm_id,
        pulls=a.pulls,
        alpha=a.alpha,
        beta=a.beta,
        mean=s.mean,
        ci_low=s.ci_low,
        ci_high=s.ci_high,
        reward_sum=a.reward_sum,
    )
