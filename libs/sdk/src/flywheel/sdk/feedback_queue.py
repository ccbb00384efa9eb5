"""Feedback published in the background: the product's request path never waits for JetStream.

``FlywheelClient.feedback_nowait`` hands the event to a ``FeedbackQueue`` and returns its event
id at once. A few publisher tasks send the queued events concurrently, each awaiting its
JetStream acknowledgement (so throughput is ``max_in_flight`` round trips at a time instead of
one), retrying a failed publish with the same event id (JetStream's dedup window and the
optimizer's applied-feedback table make a retry count once) until ``retry_deadline_s``.

Memory is bounded: at most ``max_pending`` events wait; past that ``feedback_nowait`` raises
``FeedbackQueueFull`` (the caller chooses to drop, or to ``await flush()`` and try again).
``flush()`` waits until every event queued so far has been acknowledged or has failed;
``close()`` flushes, then stops the publishers. Failures are counted and the last few kept
(``stats``), never raised into the product's request path. ``stats`` also keeps how long the
latest events took from ``feedback_nowait`` to JetStream's acknowledgement (the SDK's share of the
feedback lag; bench/service-regret/lag.py reads it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# (endpoint, decision id, reward, signals, event id) -> awaited until JetStream stored the event
Publish = Callable[[str, str, float | None, dict[str, float] | None, str], Awaitable[object]]


class FeedbackQueueFull(RuntimeError):
    """``max_pending`` events are already waiting: drop this one, or flush and retry."""


# How many of the latest acknowledged events' latencies ``FeedbackQueueStats`` keeps.
ACK_SECONDS_KEPT = 8192


@dataclass
class FeedbackQueueStats:
    queued: int = 0
    acked: int = 0
    retried: int = 0
    failed: int = 0
    last_errors: deque[str] = field(default_factory=lambda: deque(maxlen=10))
    # Seconds from queued to acknowledged by JetStream (retries included), latest events only.
    ack_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=ACK_SECONDS_KEPT))

    @property
    def pending(self) -> int:
        return self.queued - self.acked - self.failed

    def ack_quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1, nearest rank) of ``ack_seconds``; None before any ack."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within [0, 1], got {q}")
        if not self.ack_seconds:
            return None
        ordered = sorted(self.ack_seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class _Item:
    endpoint: str
    decision_id: str
    reward: float | None
    signals: dict[str, float] | None
    event_id: str
    queued_at: float  # time.monotonic() when feedback_nowait queued it


class FeedbackQueue:
    """A bounded queue of feedback events and the tasks that publish them (see the module)."""

    def __init__(
        self,
        publish: Publish,
        *,
        max_pending: int = 10_000,
        max_in_flight: int = 64,
        retry_deadline_s: float = 30.0,
    ) -> None:
        if max_pending < 1 or max_in_flight < 1 or retry_deadline_s <= 0:
            raise ValueError("max_pending and max_in_flight must be >= 1 and retry_deadline_s > 0")
        self._publish = publish
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=max_pending)
        self._max_in_flight = max_in_flight
        self._retry_deadline_s = retry_deadline_s
        self._workers: list[asyncio.Task[None]] = []
        self.stats = FeedbackQueueStats()

    def put_nowait(
        self, *, endpoint: str, decision_id: str, reward: float | None, signals: dict[str, float] | None, event_id: str
    ) -> None:
        """Queue one event; raises ``FeedbackQueueFull`` when ``max_pending`` are waiting."""
        if not self._workers:  # started lazily, inside the caller's event loop
            self._workers = [asyncio.create_task(self._run()) for _ in range(self._max_in_flight)]
        try:
            self._queue.put_nowait(_Item(endpoint, decision_id, reward, signals, event_id, time.monotonic()))
        except asyncio.QueueFull:
            raise FeedbackQueueFull(
                f"{self._queue.maxsize} feedback events are waiting for JetStream; drop this one or flush()"
            ) from None
        self.stats.queued += 1

    async def flush(self) -> None:
        """Wait until every event queued so far is acknowledged or has failed."""
        if self._workers:
            await self._queue.join()

    async def close(self) -> None:
        """Flush, then stop the publisher tasks."""
        await self.flush()
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers = []

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self._send(item)
            finally:
                self._queue.task_done()

    async def _send(self, item: _Item) -> None:
        deadline = time.monotonic() + self._retry_deadline_s
        delay = 0.05
        while True:
            try:
                await self._publish(item.endpoint, item.decision_id, item.reward, item.signals, item.event_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any publish failure is retried, then counted
                if time.monotonic() + delay >= deadline:
                    self.stats.failed += 1
                    self.stats.last_errors.append(f"{item.event_id}: {type(exc).__name__}: {exc}")
                    log.warning("feedback %s not published before its deadline: %s", item.event_id, exc)
                    return
                self.stats.retried += 1
                await asyncio.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter, not a secret
                delay = min(delay * 2, 2.0)
            else:
                self.stats.acked += 1
                self.stats.ack_seconds.append(time.monotonic() - item.queued_at)
                return
