"""The endpoint file that ``flywheel endpoint apply`` reads, and its validation.

Schema (YAML; every key but ``name`` and ``arms`` is optional, unknown keys are errors)::

    name: support-bot              # 1-64 chars of [A-Za-z0-9_-]
    description: "Answers support tickets"
    arms:                          # at least one; at least one arm is not a canary
      - arm_id: small              # 1-128 chars of [A-Za-z0-9_.-], unique
        params: {model: gpt-4o-mini, temperature: 0.2}   # any mapping, handed back by Select
      - arm_id: tuned-v2
        params: {model: ft:gpt-4o-mini:v2}
        status: canary             # active (default) | canary
        traffic_cap: 0.1           # canaries: largest share of traffic, in (0, 1]
    policy:
      kind: thompson_beta          # thompson_beta (default) | thompson_gaussian | linear_thompson
      allocation: thompson         # thompson (default) | ids: information-directed sampling (not linear_thompson)
      exploration_floor: 0.0       # minimum probability per arm; times the number of arms <= 1
      half_life_s: 0               # drift: evidence halves every half_life_s seconds (0 = off)
      window_s: 0                  # drift: only the last window_s seconds count (0 = off)
      half_life_decisions: 0       # drift by the endpoint's decisions, whatever the traffic rate (0 = off)
      window_decisions: 0          # drift: only feedback at the last window_decisions decisions counts (0 = off)
                                   # (set at most one of half_life_s, window_s, half_life_decisions, window_decisions)
      segment_key: ""              # per-segment posteriors keyed by this context key ("user_id" = the user)
      segment_prior_strength: 10   # a segment borrows the endpoint posterior worth at most this many pulls
      sticky_sessions: false       # a session keeps its first arm ...
      sticky_ttl_s: 1800           # ... for this long
      context_features: []         # linear_thompson only: numeric context keys, in order
      ridge_lambda: 1.0            # linear_thompson only: ridge prior precision (> 0)
      incumbent:                   # when the reported incumbent changes
        min_pulls: 10
        max_interval_width: 0.2
        min_margin: 0.1
      canary:                      # when a canary is promoted or retired
        min_pulls: 30
        promote_probability: 0.95
        retire_probability: 0.05   # 0 < retire < promote < 1
    reward:
      signal_weights: {quality: 1.0}   # reward = weighted mean of the declared signals present
      bounded: true                # rewards in [0, 1]; default true, false for thompson_gaussian

The defaults are the optimizer's (``flywheel.optimizer.spec.PolicyConfig``); ``apply``
always sends every value, so the file, not the server's defaults, says what is stored.

Arms are immutable: an arm's params never change under the same id (its history would
mean something else), and a retired id is never reused. To change an arm, add one with a
new id and remove the old one from the file. ``status`` and ``traffic_cap`` apply when an
arm is added; later the optimizer promotes or retires canaries by their posterior.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb

ENDPOINT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ARM_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
PolicyKindName = Literal["thompson_beta", "thompson_gaussian", "linear_thompson"]
AllocationName = Literal["thompson", "ids"]

KIND_TO_PB = {
    "thompson_beta": pb.POLICY_KIND_THOMPSON_BETA,
    "thompson_gaussian": pb.POLICY_KIND_THOMPSON_GAUSSIAN,
    "linear_thompson": pb.POLICY_KIND_LINEAR_THOMPSON,
}
KIND_FROM_PB = {v: k for k, v in KIND_TO_PB.items()} | {pb.POLICY_KIND_UNSPECIFIED: "thompson_beta"}
ALLOCATION_TO_PB = {"thompson": pb.ALLOCATION_THOMPSON, "ids": pb.ALLOCATION_IDS}
ALLOCATION_FROM_PB = {v: k for k, v in ALLOCATION_TO_PB.items()} | {pb.ALLOCATION_UNSPECIFIED: "thompson"}
STATUS_NAMES = {pb.ARM_STATUS_ACTIVE: "active", pb.ARM_STATUS_CANARY: "canary", pb.ARM_STATUS_RETIRED: "retired"}

NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Probability = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]


class EndpointFileError(ValueError):
    """An endpoint file that cannot be read or is invalid; ``str()`` lists every problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


class ArmFile(_Strict):
    arm_id: str
    params: dict[str, Any] = Field(default_factory=dict)
    status: Literal["active", "canary"] = "active"
    traffic_cap: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)

    @field_validator("arm_id", mode="before")
    @classmethod
    def _arm_id_is_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v

    @field_validator("arm_id")
    @classmethod
    def _arm_id_shape(cls, v: str) -> str:
        if not ARM_ID.fullmatch(v):
            raise ValueError("must be 1-128 chars of [A-Za-z0-9_.-]")
        return v

    def to_proto(self) -> pb.Arm:
        arm = pb.Arm(
            arm_id=self.arm_id,
            status=pb.ARM_STATUS_CANARY if self.status == "canary" else pb.ARM_STATUS_ACTIVE,
            traffic_cap=self.traffic_cap,
        )
        arm.params.update(self.params)
        return arm


class IncumbentFile(_Strict):
    min_pulls: int = Field(default=10, ge=1)
    max_interval_width: float = Field(default=0.2, gt=0, allow_inf_nan=False)
    min_margin: float = Field(default=0.1, gt=0, allow_inf_nan=False)


class CanaryFile(_Strict):
    min_pulls: int = Field(default=30, ge=1)
    promote_probability: Probability = 0.95
    retire_probability: Probability = 0.05

    @model_validator(mode="after")
    def _ordered(self) -> CanaryFile:
        if not self.retire_probability < self.promote_probability:
            raise ValueError(
                f"retire_probability ({self.retire_probability}) must be below "
                f"promote_probability ({self.promote_probability})"
            )
        return self


class PolicyFile(_Strict):
    kind: PolicyKindName = "thompson_beta"
    allocation: AllocationName = "thompson"
    exploration_floor: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    half_life_s: NonNegative = 0.0
    window_s: NonNegative = 0.0
    half_life_decisions: NonNegative = 0.0
    window_decisions: NonNegative = 0.0
    segment_key: str = ""
    segment_prior_strength: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    sticky_sessions: bool = False
    sticky_ttl_s: float = Field(default=1800.0, gt=0, allow_inf_nan=False)
    context_features: list[str] = Field(default_factory=list)
    ridge_lambda: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    incumbent: IncumbentFile = Field(default=IncumbentFile())
    canary: CanaryFile = Field(default=CanaryFile())

    @model_validator(mode="after")
    def _consistent(self) -> PolicyFile:
        forgetting = ("half_life_s", "window_s", "half_life_decisions", "window_decisions")
        chosen = [name for name in forgetting if getattr(self, name) > 0]
        if len(chosen) > 1:
            raise ValueError(f"set at most one of {' and '.join(chosen)} (an endpoint forgets in one way)")
        if self.kind == "linear_thompson":
            if not self.context_features:
                raise ValueError("context_features: linear_thompson needs the numeric context keys, in order")
            if self.segment_key or self.window_s > 0 or self.window_decisions > 0:
                raise ValueError(
                    "linear_thompson supports half_life_s and half_life_decisions but not segment_key or windows"
                )
            if self.allocation == "ids":
                raise ValueError("allocation: ids applies to thompson_beta and thompson_gaussian, not linear_thompson")
        elif self.context_features:
            raise ValueError(f"context_features only apply to linear_thompson, not {self.kind}")
        if len(set(self.context_features)) != len(self.context_features):
            raise ValueError("context_features has duplicates")
        return self

    def to_proto(self) -> pb.PolicySpec:
        return pb.PolicySpec(
            kind=KIND_TO_PB[self.kind],
            exploration_floor=self.exploration_floor,
            half_life_s=self.half_life_s,
            window_s=self.window_s,
            half_life_decisions=self.half_life_decisions,
            window_decisions=self.window_decisions,
            segment_key=self.segment_key,
            segment_prior_strength=self.segment_prior_strength,
            sticky_sessions=self.sticky_sessions,
            sticky_ttl_s=self.sticky_ttl_s,
            context_features=self.context_features,
            ridge_lambda=self.ridge_lambda,
            incumbent=pb.IncumbentRule(**self.incumbent.model_dump()),
            canary=pb.CanaryRule(**self.canary.model_dump()),
            allocation=ALLOCATION_TO_PB[self.allocation],
        )

    @classmethod
    def from_proto(cls, spec: pb.PolicySpec) -> PolicyFile:
        """The live policy, zero values read as the defaults (as the optimizer does)."""
        d = cls()
        return cls.model_construct(
            kind=KIND_FROM_PB.get(spec.kind, f"unknown({spec.kind})"),
            allocation=ALLOCATION_FROM_PB.get(spec.allocation, f"unknown({spec.allocation})"),
            exploration_floor=spec.exploration_floor,
            half_life_s=spec.half_life_s,
            window_s=spec.window_s,
            half_life_decisions=spec.half_life_decisions,
            window_decisions=spec.window_decisions,
            segment_key=spec.segment_key,
            segment_prior_strength=spec.segment_prior_strength or d.segment_prior_strength,
            sticky_sessions=spec.sticky_sessions,
            sticky_ttl_s=spec.sticky_ttl_s or d.sticky_ttl_s,
            context_features=list(spec.context_features),
            ridge_lambda=spec.ridge_lambda or d.ridge_lambda,
            incumbent=IncumbentFile.model_construct(
                min_pulls=spec.incumbent.min_pulls or d.incumbent.min_pulls,
                max_interval_width=spec.incumbent.max_interval_width or d.incumbent.max_interval_width,
                min_margin=spec.incumbent.min_margin or d.incumbent.min_margin,
            ),
            canary=CanaryFile.model_construct(
                min_pulls=spec.canary.min_pulls or d.canary.min_pulls,
                promote_probability=spec.canary.promote_probability or d.canary.promote_probability,
                retire_probability=spec.canary.retire_probability or d.canary.retire_probability,
            ),
        )


class RewardFile(_Strict):
    signal_weights: dict[str, NonNegative] = Field(default_factory=dict)
    bounded: bool | None = None  # None: true, except for thompson_gaussian


class EndpointFile(_Strict):
    name: str
    description: str = ""
    arms: list[ArmFile] = Field(min_length=1)
    policy: PolicyFile = Field(default=PolicyFile())
    reward: RewardFile = Field(default=RewardFile())

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not ENDPOINT_NAME.fullmatch(v):
            raise ValueError("must be 1-64 chars of [A-Za-z0-9_-] (it is a NATS subject token)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> EndpointFile:
        ids = [a.arm_id for a in self.arms]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"arms: duplicate arm_id {', '.join(map(repr, duplicates))}")
        if all(a.status == "canary" for a in self.arms):
            raise ValueError("arms: at least one arm must be active (not a canary)")
        if self.policy.exploration_floor * len(self.arms) > 1:
            raise ValueError(
                f"policy.exploration_floor: {self.policy.exploration_floor} times {len(self.arms)} arms "
                "must be at most 1"
            )
        if self.policy.kind == "thompson_beta" and self.reward.bounded is False:
            raise ValueError(
                "reward.bounded: thompson_beta needs bounded rewards in [0, 1]; use thompson_gaussian for unbounded"
            )
        return self

    @property
    def bounded(self) -> bool:
        if self.reward.bounded is not None:
            return self.reward.bounded
        return self.policy.kind != "thompson_gaussian"

    def reward_proto(self) -> pb.RewardSpec:
        return pb.RewardSpec(signal_weights=self.reward.signal_weights, bounded=self.bounded)

    def to_proto(self) -> pb.Endpoint:
        return pb.Endpoint(
            name=self.name,
            description=self.description,
            arms=[a.to_proto() for a in self.arms],
            policy=self.policy.to_proto(),
            reward_spec=self.reward_proto(),
        )


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: Any, data: Any) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith(("function-", "constrained-"))))
    msg = error["msg"].removeprefix("Value error, ")
    where = _where(loc)
    if len(loc) >= 2 and loc[0] == "arms" and isinstance(loc[1], int):  # name the arm, not just its index
        try:
            arm_id = data["arms"][loc[1]]["arm_id"]
            where = where.replace(f"arms[{loc[1]}]", f"arms[{loc[1]}] ({arm_id!r})", 1)
        except (KeyError, IndexError, TypeError):
            pass
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field (check the spelling; see the schema in flywheel.sdk.endpoint_file)"
    if error["type"] == "missing":
        return f"{where}: required field is missing"
    if "input" in error and error["type"] not in ("model_type", "dict_type", "list_type") and loc:
        value = error["input"]
        if not isinstance(value, dict | list) and not (isinstance(value, float) and math.isnan(value)):
            msg = f"{msg} (got {value!r})"
    return f"{where}: {msg}" if where else msg


def parse_endpoint(data: Any, *, source: str = "endpoint file") -> EndpointFile:
    """Validate a mapping; raise EndpointFileError listing each problem with its field path."""
    if not isinstance(data, dict):
        raise EndpointFileError(f"{source}: expected a mapping with name, arms, policy, reward")
    try:
        return EndpointFile.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(e, data) for e in exc.errors(include_url=False)]
        raise EndpointFileError(f"{source} is invalid:\n" + "\n".join(f"  {p}" for p in problems)) from None


def load_endpoint_file(path: str | Path) -> EndpointFile:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise EndpointFileError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise EndpointFileError(f"{path}:{where}: not valid YAML: {problem}") from None
    return parse_endpoint(data, source=str(path))
