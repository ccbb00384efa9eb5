"""Optimizer domain operations. Keyword-only functions that take the session explicitly;
they raise flywheel.core.errors exceptions, never touch gRPC or NATS."""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import select as sql_select
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.errors import AlreadyExists, InvalidArgument, NotFound
from flywheel.optimizer import policy
from flywheel.optimizer.models import AppliedFeedbackRow, ArmRow, DecisionRow, EndpointRow

ENDPOINT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ARM_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
ACTIVE, CANARY, RETIRED = "active", "canary", "retired"
POLICIES = {"thompson_beta"}


@dataclass(frozen=True)
class ArmSpec:
    arm_id: str
    params: dict[str, Any]
    status: str = ACTIVE
    traffic_cap: float = 1.0


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    arms: list[ArmSpec]
    description: str = ""
    policy_kind: str = "thompson_beta"
    exploration_floor: float = 0.0
    signal_weights: dict[str, float] = field(default_factory=dict)
    bounded: bool = True


@dataclass(frozen=True)
class Decision:
    decision_id: str
    endpoint: str
    arm_id: str
    params: dict[str, Any]
    probability: float


@dataclass(frozen=True)
class FeedbackOutcome:
    applied: bool
    arm: ArmRow


def _check_arm(arm: ArmSpec) -> None:
    if not ARM_ID.fullmatch(arm.arm_id):
        raise InvalidArgument(f"arm_id {arm.arm_id!r} must be 1-128 chars of [A-Za-z0-9_.-]")
    if arm.status not in (ACTIVE, CANARY):
        raise InvalidArgument(f"arm {arm.arm_id!r}: a new arm is active or canary, not {arm.status!r}")
    if not 0 < arm.traffic_cap <= 1:
        raise InvalidArgument(f"arm {arm.arm_id!r}: traffic_cap must be in (0, 1]")


def validate_endpoint(spec: EndpointSpec) -> None:
    if not ENDPOINT_NAME.fullmatch(spec.name):
        raise InvalidArgument(f"endpoint name {spec.name!r} must be 1-64 chars of [A-Za-z0-9_-]")
    if not spec.arms:
        raise InvalidArgument(f"endpoint {spec.name!r} needs at least one arm")
    ids = [a.arm_id for a in spec.arms]
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"endpoint {spec.name!r} has duplicate arm ids")
    for arm in spec.arms:
        _check_arm(arm)
    if spec.policy_kind not in POLICIES:
        raise InvalidArgument(f"policy {spec.policy_kind!r} is not available; use one of {sorted(POLICIES)}")
    if spec.policy_kind == "thompson_beta" and not spec.bounded:
        raise InvalidArgument("thompson_beta needs bounded rewards in [0, 1]")
    if not 0 <= spec.exploration_floor * len(spec.arms) <= 1:
        raise InvalidArgument("exploration_floor times the number of arms must be within [0, 1]")
    if any(not math.isfinite(w) or w < 0 for w in spec.signal_weights.values()):
        raise InvalidArgument("signal weights must be finite and non-negative")


async def create_endpoint(session: AsyncSession, *, spec: EndpointSpec) -> EndpointRow:
    validate_endpoint(spec)
    if await session.get(EndpointRow, spec.name) is not None:
        raise AlreadyExists(f"endpoint {spec.name!r} already exists")
    row = EndpointRow(
        name=spec.name,
        description=spec.description,
        policy_kind=spec.policy_kind,
        exploration_floor=spec.exploration_floor,
        reward_spec={"signal_weights": spec.signal_weights, "bounded": spec.bounded},
    )
    session.add(row)
    await session.flush()
    session.add_all(
        ArmRow(
            endpoint=spec.name,
            arm_id=a.arm_id,
            position=i,
            params=a.params,
            status=a.status,
            traffic_cap=a.traffic_cap,
            alpha=1.0,
            beta=1.0,
            pulls=0,
            reward_sum=0.0,
        )
        for i, a in enumerate(spec.arms)
    )
    await session.commit()
    return row


async def get_endpoint(session: AsyncSession, *, name: str) -> tuple[EndpointRow, list[ArmRow]]:
    if not name:
        raise InvalidArgument("endpoint name is empty")
    row = await session.get(EndpointRow, name)
    if row is None:
        raise NotFound(f"endpoint {name!r} does not exist")
    arms = (await session.scalars(sql_select(ArmRow).where(ArmRow.endpoint == name).order_by(ArmRow.position))).all()
    return row, list(arms)


async def list_endpoints(session: AsyncSession) -> list[tuple[EndpointRow, list[ArmRow]]]:
    names = (await session.scalars(sql_select(EndpointRow.name).order_by(EndpointRow.name))).all()
    return [await get_endpoint(session, name=n) for n in names]


async def add_arm(session: AsyncSession, *, endpoint: str, arm: ArmSpec) -> None:
    _, arms = await get_endpoint(session, name=endpoint)
    _check_arm(arm)
    if await session.get(ArmRow, (endpoint, arm.arm_id)) is not None:
        raise AlreadyExists(f"arm {arm.arm_id!r} already exists in {endpoint!r}")
    session.add(
        ArmRow(
            endpoint=endpoint,
            arm_id=arm.arm_id,
            position=len(arms),
            params=arm.params,
            status=arm.status,
            traffic_cap=arm.traffic_cap,
            alpha=1.0,
            beta=1.0,
            pulls=0,
            reward_sum=0.0,
        )
    )
    await session.commit()


async def retire_arm(session: AsyncSession, *, endpoint: str, arm_id: str) -> None:
    _, arms = await get_endpoint(session, name=endpoint)
    if arm_id not in {a.arm_id for a in arms}:
        raise NotFound(f"arm {arm_id!r} does not exist in {endpoint!r}")
    if all(a.status == RETIRED or a.arm_id == arm_id for a in arms):
        raise InvalidArgument(f"cannot retire {arm_id!r}: it is the last selectable arm of {endpoint!r}")
    await session.execute(
        update(ArmRow).where(ArmRow.endpoint == endpoint, ArmRow.arm_id == arm_id).values(status=RETIRED)
    )
    await session.commit()


def incumbent(arms: list[ArmRow], *, min_pulls: int = 10) -> str:
    """The selectable arm with the best posterior mean among those with enough evidence."""
    ranked = [a for a in arms if a.status != RETIRED and a.pulls >= min_pulls]
    if not ranked:
        return ""
    return max(ranked, key=lambda a: a.alpha / (a.alpha + a.beta)).arm_id


async def select(
    session: AsyncSession,
    *,
    endpoint: str,
    user_id: str,
    session_id: str,
    context: dict[str, Any],
    rng: np.random.Generator,
) -> Decision:
    """Thompson-sample an arm, log the decision, and return it."""
    row, arms = await get_endpoint(session, name=endpoint)
    live = [a for a in arms if a.status != RETIRED]
    chosen, probability = policy.choose(
        np.array([a.alpha for a in live]), np.array([a.beta for a in live]), rng, row.exploration_floor
    )
    arm = live[chosen]
    decision = Decision(
        decision_id=uuid.uuid4().hex, endpoint=endpoint, arm_id=arm.arm_id, params=arm.params, probability=probability
    )
    session.add(
        DecisionRow(
            decision_id=decision.decision_id,
            endpoint=endpoint,
            arm_id=arm.arm_id,
            probability=probability,
            user_id=user_id,
            session_id=session_id,
            context=context,
        )
    )
    await session.commit()
    return decision


async def apply_feedback(
    session: AsyncSession,
    *,
    event_id: str,
    decision_id: str,
    reward: float | None,
    signals: dict[str, float],
    window: timedelta,
) -> FeedbackOutcome:
    """Apply one feedback event to its arm's posterior, at most once per event id.

    The dedup row and the counter increments commit in one transaction, and counters
    change by ``x = x + r`` in SQL, so concurrent replicas never lose an update.
    """
    if not event_id:
        raise InvalidArgument("feedback has no event id (meta.event_id / feedback_id)")
    if not decision_id:
        raise InvalidArgument("feedback has no decision_id")
    values = [reward] if reward is not None else []
    if any(not math.isfinite(v) for v in [*values, *signals.values()]):
        raise InvalidArgument("reward and signals must be finite numbers")
    decision = await session.get(DecisionRow, decision_id)
    if decision is None:
        raise NotFound(f"decision {decision_id!r} is unknown")
    if datetime.now(UTC) - decision.created_at > window:
        raise InvalidArgument(f"decision {decision_id!r} is older than the feedback window ({window})")
    endpoint = await session.get(EndpointRow, decision.endpoint)
    assert endpoint is not None  # decisions are only written for existing endpoints
    try:
        value = policy.combine_reward(reward, signals, endpoint.reward_spec.get("signal_weights", {}))
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if endpoint.reward_spec.get("bounded", True):
        value = min(1.0, max(0.0, value))

    inserted = await session.execute(
        insert(AppliedFeedbackRow)
        .values(event_id=event_id, decision_id=decision_id, reward=value)
        .on_conflict_do_nothing(index_elements=["event_id"])
        .returning(AppliedFeedbackRow.event_id)
    )
    applied = inserted.first() is not None
    if applied:
        await session.execute(
            update(ArmRow)
            .where(ArmRow.endpoint == decision.endpoint, ArmRow.arm_id == decision.arm_id)
            .values(
                alpha=ArmRow.alpha + value,
                beta=ArmRow.beta + (1 - value),
                pulls=ArmRow.pulls + 1,
                reward_sum=ArmRow.reward_sum + value,
            )
        )
    await session.commit()
    arm = await session.get(ArmRow, (decision.endpoint, decision.arm_id), populate_existing=True)
    assert arm is not None
    return FeedbackOutcome(applied=applied, arm=arm)
