"""Trace store domain operations (session passed explicitly, keyword-only)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.trace_store.models import DecisionLogRow, FeedbackLogRow


async def record_decisions(session: AsyncSession, decisions: list[dict[str, Any]]) -> int:
    """Store each decision once, in one statement; returns how many were new.

    Each item has the columns of ``decision_log`` (decision_id, endpoint, arm_id, probability,
    user_id, context, decided_at); an item without decision_id, endpoint or arm_id is refused
    before anything is written.
    """
    for i, d in enumerate(decisions):
        if not d.get("decision_id") or not d.get("endpoint") or not d.get("arm_id"):
            raise InvalidArgument(f"decision {i} needs decision_id, endpoint and arm_id")
    if not decisions:
        return 0
    result = await session.execute(
        insert(DecisionLogRow)
        .values(decisions)
        .on_conflict_do_nothing(index_elements=["decision_id"])
        .returning(DecisionLogRow.decision_id)
    )
    await session.commit()
    return len(result.all())


async def record_feedback(
    session: AsyncSession,
    *,
    event_id: str,
    decision_id: str,
    reward: float | None,
    signals: dict[str, float],
    sent_at: datetime,
) -> bool:
    """Store feedback once per event id; returns False for a duplicate."""
    if not event_id or not decision_id:
        raise InvalidArgument("feedback needs meta.event_id and decision_id")
    result = await session.execute(
        insert(FeedbackLogRow)
        .values(event_id=event_id, decision_id=decision_id, reward=reward, signals=signals, sent_at=sent_at)
        .on_conflict_do_nothing(index_elements=["event_id"])
        .returning(FeedbackLogRow.event_id)
    )
    await session.commit()
    return result.first() is not None


async def get_decision(session: AsyncSession, *, decision_id: str) -> tuple[DecisionLogRow, list[FeedbackLogRow]]:
    if not decision_id:
        raise InvalidArgument("decision_id is empty")
    row = await session.get(DecisionLogRow, decision_id)
    if row is None:
        raise NotFound(f"decision {decision_id!r} is not recorded")
    feedback = (
        await session.scalars(
            select(FeedbackLogRow).where(FeedbackLogRow.decision_id == decision_id).order_by(FeedbackLogRow.sent_at)
        )
    ).all()
    return row, list(feedback)
