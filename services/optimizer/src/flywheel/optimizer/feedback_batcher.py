"""Group commit for gRPC Update: concurrent calls share one feedback transaction.

Every Update of a busy endpoint increments the same few ``arm_stats`` rows, and a transaction
holds their row locks until it commits, so one transaction per call serialises on those locks
(about 70 Updates/s at 64 in flight, `bench/select/update_rate.py`). The JetStream path never
had this problem because it applies a fetched batch in one transaction; this gives gRPC callers
the same: the first call starts a transaction at once (no added latency when idle), calls that
arrive meanwhile wait for the next one, which applies all of them with
`service.apply_feedback_batch` (duplicates inside a batch still count once).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.core.errors import Unavailable
from flywheel.optimizer import service
from flywheel.optimizer.service import FeedbackItem, FeedbackOutcome

Applied = tuple[FeedbackOutcome, float]  # the outcome, and when its transaction committed

BATCHES = Counter("flywheel_optimizer_feedback_batches_total", "Feedback transactions run for gRPC Update calls")
BATCHED = Counter("flywheel_optimizer_feedback_batched_updates_total", "gRPC Update calls in those transactions")


class FeedbackBatcher:
    """Applies feedback items in group-committed batches of at most ``max_batch``."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        window: timedelta,
        *,
        max_batch: int = 500,
        folds: service.FoldSink | None = None,
    ) -> None:
        self._sessions = sessions
        self._window = window
        self._folds = folds  # the posterior cache, told of each batch's increments after its commit
        self._max_batch = max_batch
        self._waiting: list[tuple[FeedbackItem, asyncio.Future[Applied]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def apply(self, item: FeedbackItem) -> Applied:
        """Apply one item (with whatever else is waiting); raises the item's own error. Returns
        its outcome and when its transaction committed (``time.monotonic()``): the same moment
        for the whole batch, so its callers can share one fresh read of the posterior."""
        future: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        self._waiting.append((item, future))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        # Shielded: a caller that goes away leaves its item in the batch, like a call cancelled
        # after its transaction began; the item's event id still makes a retry count once.
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        batch: list[tuple[FeedbackItem, asyncio.Future[Applied]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
                try:
                    async with self._sessions() as session:
                        outcomes = await service.apply_feedback_batch(
                            session, items=[item for item, _ in batch], window=self._window, folds=self._folds
                        )
                except Exception as exc:  # noqa: BLE001 - PostgreSQL away: each caller gets the error
                    _settle(batch, [exc] * len(batch))
                    continue
                committed = time.monotonic()
                BATCHES.inc()
                BATCHED.inc(len(batch))
                _settle(batch, [o if isinstance(o, Exception) else (o, committed) for o in outcomes])
        except asyncio.CancelledError:  # shutdown: nobody is left waiting forever
            stopping = Unavailable("the optimizer is shutting down; retry")
            _settle(batch + self._waiting, [stopping] * (len(batch) + len(self._waiting)))
            self._waiting = []
            raise
        finally:
            self._drainer = None


def _retrieved(future: asyncio.Future[Applied]) -> None:
    # The caller may have gone away; its error is then nobody's to report.
    if not future.cancelled():
        future.exception()


def _settle(
    batch: list[tuple[FeedbackItem, asyncio.Future[Applied]]],
    outcomes: list[Applied | Exception],
) -> None:
    for (_, future), outcome in zip(batch, outcomes, strict=True):
        if future.done():
            continue
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
