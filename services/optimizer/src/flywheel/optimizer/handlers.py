"""Event handlers of the optimizer."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.optimizer import service
from flywheel.optimizer.service import FeedbackItem


class FeedbackHandler:
    """Applies a batch of feedback events in one transaction. Invalid, unknown or expired
    feedback is dead-lettered; feedback for a decision not flushed yet is retried."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], window: timedelta) -> None:
        self._sessions = sessions
        self._window = window

    async def __call__(self, batch: list[tuple[FeedbackEvent, Delivery]]) -> list[BaseException | None]:
        items = [
            FeedbackItem(
                event_id=e.meta.event_id,
                decision_id=e.decision_id,
                reward=e.reward if e.HasField("reward") else None,
                signals=dict(e.signals),
            )
            for e, _ in batch
        ]
        async with self._sessions() as session:
            outcomes = await service.apply_feedback_batch(session, items=items, window=self._window)
        return [
            Reject(str(o)) if isinstance(o, InvalidArgument | NotFound) else o if isinstance(o, Exception) else None
            for o in outcomes
        ]
