"""Policy registry operations (session passed explicitly, keyword-only). Each change commits
its own transaction and returns the history rows it wrote; the caller publishes their events
after the commit (flywheel.trainer.registry.events)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.errors import NotFound
from flywheel.core.validation import Invalid
from flywheel.trainer.registry import rules
from flywheel.trainer.registry.models import PolicyCounterRow, PolicyHistoryRow, PolicyRow
from flywheel.trainer.registry.rules import Status

MAX_LISTED = 1000


@dataclass(frozen=True)
class Registration:
    name: str
    kind: int
    base_model: str = ""
    checkpoint_uri: str = ""
    dataset_uri: str = ""
    job_id: str = ""
    parent_policy_id: str = ""
    metrics: dict[str, float] | None = None


@dataclass(frozen=True)
class Outcome:
    """The versions a change touched, as they stand after it, and the history it wrote."""

    policies: dict[str, PolicyRow]
    history: list[PolicyHistoryRow]


def _version(row: PolicyRow) -> rules.Version:
    return rules.Version(row.policy_id, row.version, Status(row.status))


def _history(row: PolicyRow, previous: int, *, actor: str, reason: str) -> PolicyHistoryRow:
    return PolicyHistoryRow(
        policy_id=row.policy_id,
        name=row.name,
        previous_status=previous,
        status=row.status,
        event_id=uuid.uuid4().hex,
        actor=actor,
        reason=reason,
    )


async def register(session: AsyncSession, *, registration: Registration, actor: str, reason: str) -> Outcome:
    """Store a new version of ``registration.name`` with the next version number. The counter
    row is incremented with an upsert in this transaction, so concurrent registrations get
    distinct numbers and a number is never given out twice."""
    r = registration
    if r.parent_policy_id:
        parent = await session.get(PolicyRow, r.parent_policy_id)
        if parent is None or parent.name != r.name:
            raise Invalid("parent_policy_id", f"{r.parent_policy_id!r} is not a version of {r.name!r}")
    version = (
        await session.execute(
            insert(PolicyCounterRow)
            .values(name=r.name, last_version=1)
            .on_conflict_do_update(index_elements=["name"], set_={"last_version": PolicyCounterRow.last_version + 1})
            .returning(PolicyCounterRow.last_version)
        )
    ).scalar_one()
    row = PolicyRow(
        policy_id=uuid.uuid4().hex,
        name=r.name,
        version=version,
        kind=r.kind,
        base_model=r.base_model,
        checkpoint_uri=r.checkpoint_uri,
        dataset_uri=r.dataset_uri,
        job_id=r.job_id,
        parent_policy_id=r.parent_policy_id,
        metrics=dict(r.metrics or {}),
        status=int(Status.REGISTERED),
    )
    session.add(row)
    await session.flush()
    history = _history(row, 0, actor=actor, reason=reason or "registered")
    session.add(history)
    await session.commit()
    await session.refresh(row)
    return Outcome({row.policy_id: row}, [history])


async def get_policy(session: AsyncSession, *, policy_id: str) -> PolicyRow:
    row = await session.get(PolicyRow, policy_id)
    if row is None:
        raise NotFound(f"policy_id: no policy version {policy_id!r}")
    return row


async def list_policies(session: AsyncSession, *, name: str = "") -> Sequence[PolicyRow]:
    """Versions of ``name`` (every name if empty), newest first."""
    query = select(PolicyRow).order_by(PolicyRow.name, PolicyRow.version.desc()).limit(MAX_LISTED)
    if name:
        query = query.where(PolicyRow.name == name)
    return (await session.scalars(query)).all()


async def history(session: AsyncSession, *, policy_id: str) -> Sequence[PolicyHistoryRow]:
    return (
        await session.scalars(
            select(PolicyHistoryRow).where(PolicyHistoryRow.policy_id == policy_id).order_by(PolicyHistoryRow.id)
        )
    ).all()


async def _lock_name(session: AsyncSession, name: str) -> None:
    # The counter row's lock serialises status changes of one name (two promotions at once
    # would otherwise both read the same active version).
    await session.execute(select(PolicyCounterRow.name).where(PolicyCounterRow.name == name).with_for_update())


async def _state(
    session: AsyncSession, name: str
) -> tuple[dict[str, PolicyRow], PolicyRow | None, list[rules.Version]]:
    """Every version of ``name``, the active one, and its activations newest first."""
    # populate_existing: rows loaded before the lock are read again, as they are now.
    query = select(PolicyRow).where(PolicyRow.name == name).execution_options(populate_existing=True)
    rows = {r.policy_id: r for r in (await session.scalars(query)).all()}
    active = next((r for r in rows.values() if r.status == Status.ACTIVE), None)
    activated = (
        await session.scalars(
            select(PolicyHistoryRow.policy_id)
            .where(PolicyHistoryRow.name == name, PolicyHistoryRow.status == int(Status.ACTIVE))
            .order_by(PolicyHistoryRow.id.desc())
        )
    ).all()
    seen: set[str] = set()
    activations = []
    for pid in activated:
        if pid not in seen and pid in rows:
            seen.add(pid)
            activations.append(_version(rows[pid]))
    return rows, active, activations


async def _apply(
    session: AsyncSession, rows: dict[str, PolicyRow], changes: list[rules.Change], *, actor: str, reason: str
) -> Outcome:
    written = []
    # In plan order: the old active version leaves ACTIVE before the new one enters it (the
    # partial unique index allows one active version per name at every statement).
    for change in changes:
        row = rows[change.policy_id]
        row.status = int(change.status)
        row.updated_at = func.now()  # type: ignore[assignment]
        history = _history(row, int(change.previous), actor=actor, reason=reason)
        session.add(history)
        written.append(history)
        await session.flush()
    await session.commit()
    touched = {c.policy_id: rows[c.policy_id] for c in changes}
    for row in touched.values():
        await session.refresh(row)
    return Outcome(touched, written)


async def _change(
    session: AsyncSession, *, policy_id: str, plan: Any, actor: str, reason: str
) -> tuple[PolicyRow, Outcome]:
    target = await get_policy(session, policy_id=policy_id)
    await _lock_name(session, target.name)
    rows, active, activations = await _state(session, target.name)
    target = rows[policy_id]
    changes = plan(_version(target), _version(active) if active is not None else None, activations)
    return target, await _apply(session, rows, changes, actor=actor, reason=reason)


async def promote(session: AsyncSession, *, policy_id: str, actor: str, reason: str) -> Outcome:
    """Make the version active; the previously active version of its name is retired."""
    _, outcome = await _change(
        session, policy_id=policy_id, plan=lambda v, a, _: rules.promote(v, a), actor=actor, reason=reason
    )
    return outcome


async def rollback(session: AsyncSession, *, name: str, actor: str, reason: str) -> Outcome:
    """The active version of ``name`` becomes rolled back; the previous active one returns."""
    exists = await session.scalar(select(PolicyCounterRow.name).where(PolicyCounterRow.name == name))
    if exists is None:
        raise NotFound(f"name: no policy named {name!r}")
    await _lock_name(session, name)
    rows, active, activations = await _state(session, name)
    changes = rules.rollback(_version(active) if active is not None else None, activations)
    return await _apply(session, rows, changes, actor=actor, reason=reason)


async def set_status(session: AsyncSession, *, policy_id: str, status: Status, actor: str, reason: str) -> Outcome:
    """SetPolicyStatus with the rules checked (ACTIVE promotes, ROLLED_BACK of the active
    version rolls back)."""
    _, outcome = await _change(
        session,
        policy_id=policy_id,
        plan=lambda v, a, acts: rules.set_status(v, status, a, acts),
        actor=actor,
        reason=reason,
    )
    return outcome


async def enrol(
    session: AsyncSession, *, policy_id: str, endpoint: str, arm_id: str, served_model: str, actor: str, reason: str
) -> Outcome:
    """Record where the version is served and make it a canary, in one transaction."""
    target = await get_policy(session, policy_id=policy_id)
    await _lock_name(session, target.name)
    rows, active, activations = await _state(session, target.name)
    target = rows[policy_id]
    changes = rules.set_status(_version(target), Status.CANARY, _version(active) if active else None, activations)
    target.endpoint, target.arm_id, target.served_model = endpoint, arm_id, served_model
    return await _apply(session, rows, changes, actor=actor, reason=reason)


async def served(session: AsyncSession) -> Sequence[PolicyRow]:
    """Canary and active versions enrolled in an endpoint (what the canary follower checks)."""
    return (
        await session.scalars(
            select(PolicyRow)
            .where(PolicyRow.endpoint != "", PolicyRow.status.in_([int(Status.CANARY), int(Status.ACTIVE)]))
            .order_by(PolicyRow.name, PolicyRow.version)
        )
    ).all()


async def unpublished(session: AsyncSession, *, older_than: datetime, limit: int = 100) -> Sequence[PolicyHistoryRow]:
    """History rows whose event is not known to be on the bus (the outbox sweep's work)."""
    return (
        await session.scalars(
            select(PolicyHistoryRow)
            .where(PolicyHistoryRow.published_at.is_(None), PolicyHistoryRow.at < older_than)
            .order_by(PolicyHistoryRow.id)
            .limit(limit)
        )
    ).all()


async def mark_published(session: AsyncSession, *, ids: Sequence[int]) -> None:
    if ids:
        await session.execute(
            update(PolicyHistoryRow).where(PolicyHistoryRow.id.in_(ids)).values(published_at=func.now())
        )
        await session.commit()
