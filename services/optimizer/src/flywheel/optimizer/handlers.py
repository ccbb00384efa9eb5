"""Event handlers of the optimizer."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.core.validation import check_numbers, check_string, check_timestamp
from flywheel.optimizer import service
from flywheel.optimizer.service import DECISION_ID_CHARS, ENDPOINT_CHARS, EVENT_ID_CHARS, FeedbackItem


def feedback_item(e: FeedbackEvent) -> FeedbackItem:
    """The event as a feedback item, its fields checked (raises Invalid naming the field)."""
    # Empty ids are refused by service._check, with the message the SDK's users know.
    check_string(e.meta.event_id, "meta.event_id", max_len=EVENT_ID_CHARS)
    check_string(e.decision_id, "decision_id", max_len=DECISION_ID_CHARS)
    check_string(e.endpoint, "endpoint", max_len=ENDPOINT_CHARS)
    check_timestamp(e.meta.time, "meta.time")
    check_numbers(e.signals, "signals")
    return FeedbackItem(
        event_id=e.meta.event_id,
        decision_id=e.decision_id,
        reward=e.reward if e.HasField("reward") else None,
        signals=dict(e.signals),
        endpoint=e.endpoint,
    )


class FeedbackHandler:
    """Applies a batch of feedback events in one transaction. Invalid, unknown or expired
    feedback is dead-lettered; feedback for a decision not flushed yet is retried."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], window: timedelta) -> None:
        self._sessions = sessions
        self._window = window

    async def __call__(self, batch: list[tuple[FeedbackEvent, Delivery]]) -> list[BaseException | None]:
        results: list[BaseException | None] = [None] * len(batch)
        items: list[tuple[int, FeedbackItem]] = []
        for i, (event, _) in enumerate(batch):
            try:
                items.append((i, feedback_item(event)))
            except InvalidArgument as exc:  # refused before it reaches SQL; the others go on
                results[i] = Reject(str(exc))
        if not items:
            return results
        async with self._sessions() as session:
            outcomes = await service.apply_feedback_batch(session, items=[it for _, it in items], window=self._window)
        for (i, _), o in zip(items, outcomes, strict=True):
            if isinstance(o, InvalidArgument | NotFound):
                results[i] = Reject(str(o))
            elif isinstance(o, Exception):
                results[i] = o
        return results
