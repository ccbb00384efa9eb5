"""Event handlers of the optimizer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta

from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.consumer import Deferred, Delivery, Reject, Retry
from flywheel.core.errors import InvalidArgument, NotFound, is_transient
from flywheel.core.validation import (
    MAX_TIMESTAMP_S,
    MIN_TIMESTAMP_S,
    check_numbers,
    check_string,
    check_timestamp,
)
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
DEFERRED = Counter(
    "flywheel_optimizer_feedback_deferred_total",
    "Feedback events held back in this replica (not redelivered) until another replica wrote their decision",
)

# How long feedback for a decision that another replica has not written yet is held back here
# before it bounces (a JetStream redelivery). That replica writes its buffer every flush interval
# (20 ms) and the INSERT takes a few ms, so 0.25 s covers a slow write several times over; it is
# short beside the consumer's ack_wait (30 s), and a decision that will never be written (its
# replica crashed) costs only this moment before the usual redeliveries and dead letter.
DEFER_DEADLINE_S = 0.25
# With a longer flush interval (replicas share their settings), three intervals: the buffer's
# age, its write, and as much again; capped at a third of ack_wait so the message never expires
# unsettled while deferred.
DEFER_DEADLINE_INTERVALS = 3
MAX_DEFER_DEADLINE_S = 10.0
# The first retry waits this many flush intervals: one interval plus the time its write takes.
DEFER_AFTER_INTERVALS = 1.5
DEFAULT_FLUSH_INTERVAL_S = 0.02
MAX_NANOS = 999_999_999


def feedback_item(e: FeedbackEvent) -> FeedbackItem:
    """The event as a feedback item, its fields checked (raises Invalid naming the field)."""
    meta = e.meta
    event_id, decision_id, endpoint = meta.event_id, e.decision_id, e.endpoint
    ts = meta.time
    seconds, nanos = ts.seconds, ts.nanos
    joined = event_id + decision_id + endpoint
    # The common case (no signals, ASCII ids that fit, a timestamp in range) in a few
    # operations, about a quarter of the checks' cost; anything else takes the checks below,
    # which say what is wrong. Protobuf attribute reads cost ~0.1-0.2 us each, so each is read once.
    if (
        not e.signals
        and len(event_id) <= EVENT_ID_CHARS
        and len(decision_id) <= DECISION_ID_CHARS
        and len(endpoint) <= ENDPOINT_CHARS
        and joined.isascii()
        and "\x00" not in joined
        and MIN_TIMESTAMP_S <= seconds <= MAX_TIMESTAMP_S
        and 0 <= nanos <= MAX_NANOS
    ):
        return FeedbackItem(event_id, decision_id, e.reward if e.HasField("reward") else None, {}, endpoint)
    # Empty ids are refused by service._check, with the message the SDK's users know.
    check_string(event_id, "meta.event_id", max_len=EVENT_ID_CHARS)
    check_string(decision_id, "decision_id", max_len=DECISION_ID_CHARS)
    check_string(endpoint, "endpoint", max_len=ENDPOINT_CHARS)
    check_timestamp(ts, "meta.time")
    check_numbers(e.signals, "signals")
    return FeedbackItem(
        event_id=event_id,
        decision_id=decision_id,
        reward=e.reward if e.HasField("reward") else None,
        signals=dict(e.signals),
        endpoint=endpoint,
    )


class FeedbackHandler:
    """Applies a batch of feedback events in one transaction. Invalid, unknown or expired
    feedback is dead-lettered. Feedback for a decision still in this replica's buffer (a
    product that reports within the 20 ms flush interval) is applied at once: the buffer is
    flushed and those events applied again. Feedback for a decision buffered by another replica
    is deferred (the message stays unsettled, the consumer fetches on): applied again, in one
    transaction per deferred batch, every 1.5 flush intervals until ``defer_deadline_s``
    (0.25 s, or three flush intervals if longer); only what is still missing then waits for a redelivery (a bounce,
    counted, logged at debug level)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        window: timedelta,
        decisions: DecisionLog | None = None,
        folds: FoldSink | None = None,
        *,
        defer_deadline_s: float | None = None,
    ) -> None:
        self._sessions = sessions
        self._window = window
        self._decisions = decisions
        # The posterior cache: applied feedback is folded into it right after each commit.
        self._folds = folds
        interval = decisions.flush_interval_s if decisions is not None else DEFAULT_FLUSH_INTERVAL_S
        self._defer_after_s = DEFER_AFTER_INTERVALS * interval
        if defer_deadline_s is None:
            defer_deadline_s = min(max(DEFER_DEADLINE_S, DEFER_DEADLINE_INTERVALS * interval), MAX_DEFER_DEADLINE_S)
        self._defer_deadline_s = defer_deadline_s  # 0: no deferral, every early event bounces
        # Deferred batches being applied again; held here since the loop keeps tasks weakly.
        self._late: set[asyncio.Task[None]] = set()

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
        late: list[tuple[int, FeedbackItem, int]] = []
        for (i, item), o in zip(items, outcomes, strict=True):
            if type(o) is FeedbackOutcome:
                continue  # applied or a duplicate (the common case): acked, results[i] stays None
            attempt = batch[i][1].num_delivered
            if isinstance(o, NotLoggedYet) and self._defer_deadline_s > 0:
                late.append((i, item, attempt))  # in another replica's buffer: written within moments
            else:
                results[i] = _result(o, attempt)
        if late:
            futures = self._defer([it for _, it, _ in late], [a for _, _, a in late])
            for (i, item, attempt), future in zip(late, futures, strict=True):
                reason = f"decision {item.decision_id!r} is not logged yet; deferred"
                results[i] = Deferred(future, reason, delay_s=_bounce_delay(attempt))
        return results

    def _defer(self, items: list[FeedbackItem], attempts: list[int]) -> list[asyncio.Future[BaseException | None]]:
        """Apply ``items`` again shortly, in the background; one future of each one's outcome."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[BaseException | None]] = [loop.create_future() for _ in items]
        DEFERRED.inc(len(items))
        task = asyncio.create_task(self._apply_later(items, attempts, futures), name="feedback:deferred")
        self._late.add(task)
        task.add_done_callback(self._late.discard)
        return futures

    async def _apply_later(
        self, items: list[FeedbackItem], attempts: list[int], futures: list[asyncio.Future[BaseException | None]]
    ) -> None:
        """Apply the events whose decisions were missing again every 1.5 flush intervals until
        the deadline (the last round at it), each round one transaction (folded like the first apply, deduplicated by
        event id); what is still missing at the deadline bounces."""
        deadline = time.monotonic() + self._defer_deadline_s
        waiting = list(range(len(items)))
        try:
            while waiting:
                await asyncio.sleep(max(0.0, min(self._defer_after_s, deadline - time.monotonic())))
                outcomes = await self._apply_once([items[i] for i in waiting])
                expired = time.monotonic() >= deadline
                still = []
                for i, o in zip(waiting, outcomes, strict=True):
                    if isinstance(o, NotLoggedYet) and not expired:
                        still.append(i)
                    else:
                        futures[i].set_result(_result(o, attempts[i]))
                waiting = still
        except Exception as exc:  # noqa: BLE001 - each event's outcome; the consumer settles it
            # A dependency away: retried with backoff as usual. Anything else: a plain redelivery,
            # where the consumer can bisect the batch to find the event at fault.
            outcome = exc if is_transient(exc) else Retry(f"deferred feedback failed: {exc!r}")
            _resolve(futures, lambda i: outcome)
        finally:  # cancelled (shutdown): redelivered, as if never deferred
            _resolve(futures, lambda i: Retry("deferred feedback abandoned", delay_s=_bounce_delay(attempts[i])))

    async def _apply_once(self, items: list[FeedbackItem]) -> list[FeedbackOutcome | Exception]:
        async with self._sessions() as session:
            outcomes = await service.apply_feedback_batch(session, items=items, window=self._window, folds=self._folds)
        return list(outcomes)

    async def _apply(self, items: list[FeedbackItem]) -> list[FeedbackOutcome | Exception]:
        if self._decisions is not None and self._decisions.holds_any({it.decision_id for it in items}):
            # A decision of this batch is still in this replica's buffer (feedback within the
            # flush interval): write it first, so the batch is applied in one transaction rather
            # than applied, flushed and applied again (bench/service-regret/lag.py: 40% of
            # batches at 200 decisions/s were applied twice).
            await self._decisions.flush()
        outcomes = await self._apply_once(items)
        early = [i for i, o in enumerate(outcomes) if isinstance(o, NotLoggedYet)]
        if early and self._decisions is not None:
            # Their decisions may have been made meanwhile, or be being written by the flusher
            # right now: flush() takes the same lock, so it returns once both are in PostgreSQL.
            await self._decisions.flush()
            again = await self._apply_once([items[i] for i in early])
            for i, o in zip(early, again, strict=True):
                outcomes[i] = o
        return outcomes


def _bounce_delay(attempt: int) -> float:
    # 50 ms, then x4: the other replica writes within its flush interval (20 ms), and the
    # consumer's 5 deliveries still wait 4 s in all for a slow write.
    return min(0.05 * 4 ** (attempt - 1), 5.0)


def _result(o: FeedbackOutcome | Exception, attempt: int) -> BaseException | None:
    """The consumer's outcome for one event's result (None when applied or a duplicate)."""
    if isinstance(o, InvalidArgument | NotFound):
        return Reject(str(o))
    if isinstance(o, NotLoggedYet):
        BOUNCES.inc()
        return Retry(str(o), delay_s=_bounce_delay(attempt))
    if isinstance(o, Exception):
        return o
    return None


def _resolve(
    futures: list[asyncio.Future[BaseException | None]], outcome: Callable[[int], BaseException | None]
) -> None:
    """Resolve every future not resolved yet with ``outcome(i)``."""
    for i, future in enumerate(futures):
        if not future.done():
            future.set_result(outcome(i))
