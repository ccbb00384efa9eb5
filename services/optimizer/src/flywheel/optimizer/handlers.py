"""Event handlers of the optimizer."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.core.logging import bound, get_logger
from flywheel.optimizer import service

log = get_logger(__name__)


class FeedbackHandler:
    """Applies feedback events to posteriors. Invalid, unknown or expired feedback is
    dead-lettered; feedback for a decision not flushed yet is retried (Unavailable)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], window: timedelta) -> None:
        self._sessions = sessions
        self._window = window

    async def __call__(self, event: FeedbackEvent, delivery: Delivery) -> None:
        with bound(event_id=event.meta.event_id, decision_id=event.decision_id):
            try:
                async with self._sessions() as session:
                    outcome = await service.apply_feedback(
                        session,
                        event_id=event.meta.event_id,
                        decision_id=event.decision_id,
                        reward=event.reward if event.HasField("reward") else None,
                        signals=dict(event.signals),
                        window=self._window,
                    )
            except (InvalidArgument, NotFound) as exc:
                raise Reject(str(exc)) from None
            if not outcome.applied:
                log.info("duplicate feedback ignored")
