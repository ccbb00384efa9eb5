"""Endpoint administration and off-policy evaluation over gRPC (blocking), and the
declarative ``apply`` of an endpoint file that ``flywheel endpoint apply`` runs.

    with AdminClient(target="127.0.0.1:50051") as admin:
        plan = plan_apply(load_endpoint_file("endpoint.yaml"), admin.find("support-bot"))
        for line in plan.describe():
            print(line)
        apply_plan(admin, plan)

``plan_apply`` compares the file with the live endpoint: a missing endpoint is created;
otherwise description, policy and reward spec go through one ``UpdateEndpoint`` when any
differs, arms in the file but not live are added (``AddArm``) and live arms missing from
the file are retired (``RetireArm``), in that order: the update, the call most likely to
be refused, comes before any arm changes, and arms are added before others are retired.
Applying the same file twice changes nothing the second time. Arms are immutable, so an
arm whose params differ from the live arm's is a conflict: the plan refuses to run and
says to give the changed arm a new id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import grpc
from google.protobuf import json_format

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.api.optimizer.v1.endpoint_admin_service_pb2_grpc import EndpointAdminServiceStub
from flywheel.api.optimizer.v1.off_policy_service_pb2_grpc import OffPolicyServiceStub
from flywheel.sdk import _transport
from flywheel.sdk.endpoint_file import STATUS_NAMES, ArmFile, EndpointFile, PolicyFile

__all__ = ["AdminClient", "ApplyConflict", "Plan", "apply_plan", "plan_apply"]


class AdminClient(_transport.BlockingClient):
    """Blocking client for EndpointAdminService and OffPolicyService."""

    def _bind(self, channel: grpc.Channel) -> None:
        self._admin = EndpointAdminServiceStub(channel)
        self._ope = OffPolicyServiceStub(channel)

    def get(self, name: str) -> pb.Endpoint:
        return self._call(self._admin.GetEndpoint, admin_pb.GetEndpointRequest(name=name)).endpoint

    def find(self, name: str) -> pb.Endpoint | None:
        """The endpoint, or None when it does not exist."""
        try:
            return self.get(name)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def list(self) -> list[pb.Endpoint]:
        return list(self._call(self._admin.ListEndpoints, admin_pb.ListEndpointsRequest()).endpoints)

    def create(self, endpoint: pb.Endpoint) -> pb.Endpoint:
        return self._call(self._admin.CreateEndpoint, admin_pb.CreateEndpointRequest(endpoint=endpoint)).endpoint

    def update(self, endpoint: pb.Endpoint) -> pb.Endpoint:
        """Replace description, policy and reward spec (arms are left as they are)."""
        return self._call(self._admin.UpdateEndpoint, admin_pb.UpdateEndpointRequest(endpoint=endpoint)).endpoint

    def add_arm(self, endpoint: str, arm: pb.Arm) -> pb.Endpoint:
        return self._call(self._admin.AddArm, admin_pb.AddArmRequest(endpoint=endpoint, arm=arm)).endpoint

    def retire_arm(self, endpoint: str, arm_id: str) -> pb.Endpoint:
        return self._call(self._admin.RetireArm, admin_pb.RetireArmRequest(endpoint=endpoint, arm_id=arm_id)).endpoint

    def estimate(
        self,
        endpoint: str,
        *,
        arm_id: str | None = None,
        distribution: dict[str, float] | None = None,
        current_posterior: bool = False,
        since: datetime | None = None,
        until: datetime | None = None,
        confidence: float = 0.95,
    ) -> ope_pb.EstimatePolicyValueResponse:
        """Off-policy estimates (IPS, SNIPS, DR) of one candidate policy on the logged decisions."""
        if sum((arm_id is not None, distribution is not None, current_posterior)) != 1:
            raise ValueError("give exactly one of arm_id, distribution, current_posterior")
        candidate = ope_pb.CandidatePolicy()
        if arm_id is not None:
            candidate.arm_id = arm_id
        elif distribution is not None:
            candidate.distribution.probabilities.update(distribution)
        else:
            candidate.current_posterior = True
        request = ope_pb.EstimatePolicyValueRequest(endpoint=endpoint, candidate=candidate, confidence=confidence)
        if since is not None:
            request.since.FromDatetime(since)
        if until is not None:
            request.until.FromDatetime(until)
        return self._call(self._ope.EstimatePolicyValue, request)


class ApplyConflict(ValueError):
    """The file asks for something apply cannot do (change an arm in place)."""


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(f"{prefix}.{k}", v)
    else:
        yield prefix, value


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else repr(value)


def _settings(description: str, policy: PolicyFile, weights: dict[str, float], bounded: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description}
    out.update(_flatten("policy", policy.model_dump()))
    out["reward.signal_weights"] = dict(sorted(weights.items()))
    out["reward.bounded"] = bounded
    return out


@dataclass
class Plan:
    """What ``apply_plan`` will do to make the live endpoint match the file."""

    file: EndpointFile
    create: bool = False
    settings: list[tuple[str, Any, Any]] = field(default_factory=list)  # (field, live, wanted)
    add: list[ArmFile] = field(default_factory=list)
    retire: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.settings or self.add or self.retire)

    def describe(self) -> list[str]:
        """One line per change, in the order ``apply_plan`` makes them."""
        if self.create:
            arms = ", ".join(a.arm_id + (" (canary)" if a.status == "canary" else "") for a in self.file.arms)
            return [f"+ create endpoint {self.file.name!r} ({self.file.policy.kind}) with arms {arms}"]
        lines = [f"~ {name}: {_show(live)} -> {_show(wanted)}" for name, live, wanted in self.settings]
        lines += [f"+ add arm {a.arm_id!r}{_arm_extra(a)} params {_show(a.params)}" for a in self.add]
        lines += [f"- retire arm {arm_id!r}" for arm_id in self.retire]
        return lines


def _arm_extra(arm: ArmFile) -> str:
    return f" as canary (traffic_cap {arm.traffic_cap})" if arm.status == "canary" else ""


def plan_apply(file: EndpointFile, live: pb.Endpoint | None) -> Plan:
    """Compare the file with the live endpoint (None: it does not exist)."""
    plan = Plan(file=file)
    if live is None:
        plan.create = True
        return plan
    wanted = _settings(file.description, file.policy, file.reward.signal_weights, file.bounded)
    current = _settings(
        live.description,
        PolicyFile.from_proto(live.policy),
        dict(live.reward_spec.signal_weights),
        live.reward_spec.bounded,
    )
    plan.settings = [(k, current.get(k), v) for k, v in wanted.items() if current.get(k) != v]

    live_arms = {a.arm_id: a for a in live.arms}
    for arm in file.arms:
        found = live_arms.get(arm.arm_id)
        if found is None:
            plan.add.append(arm)
            continue
        status = STATUS_NAMES.get(found.status, "unknown")
        if status == "retired":
            plan.notes.append(
                f"arm {arm.arm_id!r} is retired (arm ids are never reused): remove it from the file "
                "or give it a new arm_id"
            )
            continue
        live_params = json_format.MessageToDict(found.params)
        if live_params != arm.params:
            plan.conflicts.append(
                f"arm {arm.arm_id!r}: params {_show(arm.params)} differ from the live arm's {_show(live_params)}; "
                "arms are immutable, so add the new params under a new arm_id and remove this one"
            )
    in_file = {a.arm_id for a in file.arms}
    plan.retire = [a.arm_id for a in live.arms if a.arm_id not in in_file and a.status != pb.ARM_STATUS_RETIRED]
    return plan


def apply_plan(admin: AdminClient, plan: Plan, *, echo: Callable[[str], None] = print) -> pb.Endpoint | None:
    """Make the changes, echoing each as it is made. Conflicts raise before anything changes."""
    if plan.conflicts:
        raise ApplyConflict("\n".join(plan.conflicts))
    file = plan.file
    result = None
    if plan.create:
        result = admin.create(file.to_proto())
        echo(plan.describe()[0])
        return result
    if plan.settings:  # first: the call most likely to be refused, before any arm changes
        update = pb.Endpoint(
            name=file.name,
            description=file.description,
            policy=file.policy.to_proto(),
            reward_spec=file.reward_proto(),
        )
        result = admin.update(update)
        for name, live, wanted in plan.settings:
            echo(f"~ {name}: {_show(live)} -> {_show(wanted)}")
    for arm in plan.add:  # before retiring, so the endpoint never runs out of active arms
        result = admin.add_arm(file.name, arm.to_proto())
        echo(f"+ added arm {arm.arm_id!r}{_arm_extra(arm)} params {_show(arm.params)}")
    for arm_id in plan.retire:
        result = admin.retire_arm(file.name, arm_id)
        echo(f"- retired arm {arm_id!r}")
    return result
