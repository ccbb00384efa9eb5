"""Event handlers of the optimizer."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.consumer import Delivery, Reject, Retry
from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.core.validation import check_numbers, check_string, check_timestamp
from flywheel.optimizer import service
from flywheel.optimizer.decisions import DecisionLog
from flywheel.optimizer.service import (
    DECISION_ID_CHARS,
    ENDPOINT_CHARS,
    EVENT_ID_CHARS,
    FeedbackItem,
    FeedbackOutcome,
    FoldSink,
    NotLoggedYet,
)

BOUNCES = Counter(
    "flywheel_optimizer_feedback_bounces_total",
    "Feedback events redelivered because their decision was not written yet (in another replica's buffer)",
)


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
    feedback is dead-lettered. Feedback for a decision still in this replica's buffer (a
    product that reports within the 20 ms flush interval) is applied at once: the buffer is
    flushed and those events applied again. Only a decision buffered by another replica makes
    its feedback wait for a redelivery (counted, logged at debug level)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        window: timedelta,
        decisions: DecisionLog | None = None,
        folds: FoldSink | None = None,
    ) -> None:
        self._sessions = sessions
        self._window = window
        self._decisions = decisions
        # The posterior cache: applied feedback is folded into it right after each commit.
        self._folds = folds

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
        outcomes = await self._apply([it for _, it in items])
        for (i, _), o in zip(items, outcomes, strict=True):
            attempt = batch[i][1].num_delivered
            if isinstance(o, InvalidArgument | NotFound):
                results[i] = Reject(str(o))
            elif isinstance(o, NotLoggedYet):
                BOUNCES.inc()
                # 50 ms, then x4: the other replica writes within its flush interval (20 ms), and
                # the consumer's 5 deliveries still wait 4 s in all for a slow write.
                results[i] = Retry(str(o), delay_s=min(0.05 * 4 ** (attempt - 1), 5.0))
            elif isinstance(o, Exception):
                results[i] = o
        return results

    async def _apply(self, items: list[FeedbackItem]) -> list[FeedbackOutcome | Exception]:
        async with self._sessions() as session:
            outcomes: list[FeedbackOutcome | Exception] = list(
                await service.apply_feedback_batch(session, items=items, window=self._window, folds=self._folds)
            )
        early = [i for i, o in enumerate(outcomes) if isinstance(o, NotLoggedYet)]
        if early and self._decisions is not None:
            # Their decisions may be in this replica's buffer, or being written by its flusher
            # right now: flush() takes the same lock, so it returns once both are in PostgreSQL.
            await self._decisions.flush()
            async with self._sessions() as session:
                retried = [items[i] for i in early]
                again = await service.apply_feedback_batch(
                    session, items=retried, window=self._window, folds=self._folds
                )
            for i, o in zip(early, again, strict=True):
                outcomes[i] = o
        return outcomes
