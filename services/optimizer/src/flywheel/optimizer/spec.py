"""What an endpoint is, as plain values: arms, policy and reward spec, and their validation.

The gRPC layer and the YAML CLI both build these; the service stores them."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from flywheel.core.errors import InvalidArgument
from flywheel.core.validation import check_string, string_problem

ENDPOINT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ARM_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
ACTIVE, CANARY, RETIRED = "active", "canary", "retired"
BETA, GAUSSIAN, LINEAR = "thompson_beta", "thompson_gaussian", "linear_thompson"
POLICY_KINDS = (BETA, GAUSSIAN, LINEAR)
THOMPSON, IDS = "thompson", "ids"
ALLOCATIONS = (THOMPSON, IDS)
# Rewards of an unbounded (thompson_gaussian) endpoint must lie in [-MAX_ABS_REWARD,
# MAX_ABS_REWARD]; larger ones are refused. The posterior keeps sums of squared rewards in
# float64: with 1e9 that is 1e18 per pull, far from overflow, where 1e300 made it NaN.
MAX_ABS_REWARD = 1e9
# Serialized size of an arm's params: every decision event carries them (with the context), and
# one decision must fit NATS's max payload (1 MiB by default) with room to spare.
MAX_PARAMS_BYTES = 64 * 1024
# The ways to forget old evidence; an endpoint uses at most one.
FORGETTING = ("half_life_s", "window_s", "half_life_decisions", "window_decisions")


@dataclass(frozen=True)
class ArmSpec:
    arm_id: str
    params: dict[str, Any]
    status: str = ACTIVE
    traffic_cap: float = 1.0


@dataclass(frozen=True)
class PolicyConfig:
    """The PolicySpec of endpoints.proto with its defaults filled in."""

    kind: str = BETA
    exploration_floor: float = 0.0
    half_life_s: float = 0.0
    window_s: float = 0.0
    # Forgetting measured in the endpoint's decisions instead of seconds (policies/drift.py).
    half_life_decisions: float = 0.0
    window_decisions: float = 0.0
    segment_key: str = ""
    segment_prior_strength: float = 10.0
    sticky_sessions: bool = False
    sticky_ttl_s: float = 1800.0
    context_features: tuple[str, ...] = ()
    ridge_lambda: float = 1.0
    incumbent_min_pulls: int = 10
    incumbent_max_interval_width: float = 0.2
    incumbent_min_margin: float = 0.1
    canary_min_pulls: int = 30
    canary_promote_probability: float = 0.95
    canary_retire_probability: float = 0.05
    # "thompson", or "ids": information-directed sampling from the same posterior draws.
    allocation: str = THOMPSON

    @property
    def bucket_s(self) -> int:
        """Width of a sliding-window time bucket: a twentieth of the window, at least 1 s."""
        return max(1, int(self.window_s / 20)) if self.window_s > 0 else 0

    @property
    def bucket_decisions(self) -> int:
        """Width of a sliding-window decision bucket: a twentieth of the window, at least 1 decision."""
        return max(1, int(self.window_decisions / 20)) if self.window_decisions > 0 else 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["context_features"] = list(self.context_features)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PolicyConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "context_features" in values:
            values["context_features"] = tuple(values["context_features"])
        return cls(**values)


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    arms: list[ArmSpec]
    description: str = ""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    signal_weights: dict[str, float] = field(default_factory=dict)
    bounded: bool = True


def _finite_nonneg(value: float, what: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{what} must be a finite number >= 0, got {value}")


def check_arm(arm: ArmSpec) -> None:
    if not ARM_ID.fullmatch(arm.arm_id):
        raise InvalidArgument(f"arm_id {arm.arm_id!r} must be 1-128 chars of [A-Za-z0-9_.-]")
    if arm.status not in (ACTIVE, CANARY):
        raise InvalidArgument(f"arm {arm.arm_id!r}: a new arm is active or canary, not {arm.status!r}")
    if not 0 < arm.traffic_cap <= 1:
        raise InvalidArgument(f"arm {arm.arm_id!r}: traffic_cap must be in (0, 1]")


def check_policy(policy: PolicyConfig, *, n_arms: int, bounded: bool) -> None:
    if policy.kind not in POLICY_KINDS:
        raise InvalidArgument(f"policy {policy.kind!r} is not available; use one of {list(POLICY_KINDS)}")
    if policy.kind == BETA and not bounded:
        raise InvalidArgument("thompson_beta needs bounded rewards in [0, 1]; use thompson_gaussian for unbounded")
    if policy.allocation not in ALLOCATIONS:
        raise InvalidArgument(f"allocation {policy.allocation!r} is not available; use one of {list(ALLOCATIONS)}")
    if policy.allocation == IDS and policy.kind == LINEAR:
        raise InvalidArgument("allocation 'ids' applies to thompson_beta and thompson_gaussian, not linear_thompson")
    for name in ("exploration_floor", *FORGETTING, "segment_prior_strength", "sticky_ttl_s"):
        _finite_nonneg(getattr(policy, name), name)
    if policy.exploration_floor * n_arms > 1:
        raise InvalidArgument("exploration_floor times the number of arms must be at most 1")
    chosen = [name for name in FORGETTING if getattr(policy, name) > 0]
    if len(chosen) > 1:
        raise InvalidArgument(
            f"set at most one of {' and '.join(chosen)} (an endpoint forgets in one way: {', '.join(FORGETTING)})"
        )
    if policy.kind == LINEAR:
        if not policy.context_features:
            raise InvalidArgument("linear_thompson needs context_features (the numeric context keys, in order)")
        if policy.ridge_lambda <= 0:
            raise InvalidArgument("ridge_lambda must be > 0")
        if policy.segment_key or policy.window_s > 0 or policy.window_decisions > 0:
            raise InvalidArgument(
                "linear_thompson supports half_life_s and half_life_decisions but not segments or windows"
            )
    elif policy.context_features:
        raise InvalidArgument("context_features only apply to linear_thompson")
    if len(set(policy.context_features)) != len(policy.context_features):
        raise InvalidArgument("context_features has duplicates")
    if not 0 < policy.canary_retire_probability < policy.canary_promote_probability < 1:
        raise InvalidArgument("canary probabilities need 0 < retire_probability < promote_probability < 1")
    for name in ("incumbent_min_pulls", "canary_min_pulls"):
        if getattr(policy, name) < 0:
            raise InvalidArgument(f"{name} must be >= 0, got {getattr(policy, name)}")
    if not math.isfinite(policy.incumbent_max_interval_width) or policy.incumbent_max_interval_width <= 0:
        raise InvalidArgument(
            f"incumbent_max_interval_width must be a finite number > 0, got {policy.incumbent_max_interval_width}"
        )
    _finite_nonneg(policy.incumbent_min_margin, "incumbent_min_margin")
    if not math.isfinite(policy.ridge_lambda):
        raise InvalidArgument(f"ridge_lambda must be a finite number, got {policy.ridge_lambda}")
    for i, name in enumerate(policy.context_features):
        problem = string_problem(name, max_len=256)
        if problem is not None or not name:
            raise InvalidArgument(f"context_features[{i}] {problem or 'is empty'}")
    problem = string_problem(policy.segment_key, max_len=256)
    if problem is not None:
        raise InvalidArgument(f"segment_key {problem}")


def validate_endpoint(spec: EndpointSpec) -> None:
    """Raise InvalidArgument naming the first problem of an endpoint definition."""
    if not ENDPOINT_NAME.fullmatch(spec.name):
        raise InvalidArgument(f"endpoint name {spec.name!r} must be 1-64 chars of [A-Za-z0-9_-]")
    if not spec.arms:
        raise InvalidArgument(f"endpoint {spec.name!r} needs at least one arm")
    ids = [a.arm_id for a in spec.arms]
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"endpoint {spec.name!r} has duplicate arm ids")
    for arm in spec.arms:
        check_arm(arm)
    if all(a.status == CANARY for a in spec.arms):
        raise InvalidArgument(f"endpoint {spec.name!r} needs at least one active (non-canary) arm")
    check_policy(spec.policy, n_arms=len(spec.arms), bounded=spec.bounded)
    check_string(spec.description, "description", max_len=4096)
    if any(not math.isfinite(w) or w < 0 for w in spec.signal_weights.values()):
        raise InvalidArgument("signal weights must be finite and non-negative")
    for name in spec.signal_weights:
        problem = string_problem(name, max_len=256)
        if problem is not None:
            raise InvalidArgument(f"reward_spec.signal_weights: key {name[:40]!r} {problem}")
