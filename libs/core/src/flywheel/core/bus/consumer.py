"""A durable pull consumer that never lets one bad message stop the ones behind it.

For each fetched batch: decode every message by Content-Type, hand the decoded events
to the handler, then settle each message by its own outcome. A payload that does not
decode, or that the handler rejects with :class:`Reject`, is published to the
dead-letter subject with the reason and then acked. Any other exception is a transient
failure: the message is nak'ed with a backoff and redelivered, and after ``max_deliver``
attempts it is dead-lettered too. Handlers must therefore be idempotent (the
optimizer's dedups by event id inside the same transaction).

A handler takes one event (``handler=``), or a whole batch (``batch_handler=``) when
one transaction per batch is what makes it fast; it then returns one outcome per event
(None for done, or the exception for that event).

One bad event never takes its batch down with it: when a batch handler raises (rather than
returning per-event outcomes) for any reason but a dependency being away, the batch is
bisected and each half handled again, until the event at fault is alone; the good events are
applied and only that one fails. An event whose data the database refuses (too long for its
column, a NUL byte, a value out of range) is dead-lettered at once with the database's reason,
since redelivering it cannot help.

A handler that expects an event to succeed within moments (its decision is being written by
another process, say) returns :class:`Deferred` with a future of the event's final outcome,
instead of :class:`Retry`: the message is left unsettled and the fetch loop goes on at once; a
background task settles it, by the same rules, when the future resolves. Those tasks are bounded
(``max_deferred`` groups, one group per fetched batch); past the bound a deferral is settled as a
Retry. ``stop()`` waits for them, then cancels the rest: a message never settled is redelivered
by JetStream after ``ack_wait``, so nothing is lost. Deferrals must be short next to ``ack_wait``.

By default a batch is fetched, handled and settled before the next fetch; only while there is a
backlog (the batch's last message says more wait behind it) is the next batch's fetch sent before
the batch is handled, so that it runs while the batch is (one batch ahead at most). With ``prefetch`` a
fetching task goes on while a batch is handled (holding at most ``batch_size`` messages), and what
it holds is handled next as one batch; ``max_batches`` > 1 also handles that many batches at once
(the handler must be safe to run concurrently with itself). Each event's way through the consumer
is timed in stages (``flywheel_event_lag_seconds{consumer,stage}``: busy, fetch, queue, handle,
ack, total; docs/operations.md), for one event in ``lag_sample_every`` (8).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from flywheel.api.common.v1.common_pb2 import DeadLetter
from flywheel.api.subjects import Catalogue, ConsumerSpec
from flywheel.core.bus.codec import MalformedEvent, decode
from flywheel.core.bus.connection import ensure_consumer
from flywheel.core.bus.publisher import Publisher
from flywheel.core.errors import describe, is_transient, rejects_the_data
from flywheel.core.logging import bound, get_logger
from flywheel.core.metrics import EVENT_AGE, EVENT_LAG, EVENT_SECONDS, EVENTS_TOTAL, PENDING

log = get_logger(__name__)
M = TypeVar("M", bound=Message)

# The lag stages are observed for one event in this many (by stream sequence, which says nothing
# about an event's lag, so the quantiles stay unbiased): six histogram observations per event
# cost about 15 us of CPU, more than the rest of the consumer's own work per event.
LAG_SAMPLE_EVERY = 8


class Reject(Exception):
    """Raised by a handler for an event that can never succeed (unknown decision, bad
    value): it is dead-lettered with this message as the reason, not retried."""


class Retry(Exception):
    """Returned by a handler for an event that is expected to succeed shortly (its decision is
    not written yet, say): redelivered after ``delay_s`` and logged at debug level only, since
    it is routine; ``max_deliver`` still bounds it."""

    def __init__(self, reason: str, *, delay_s: float = 0.1) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class Deferred(Exception):
    """Returned by a handler for an event whose outcome it will know shortly: ``outcome`` is a
    future (already scheduled, owned by the handler) of the final outcome, None for done or the
    exception for the event. The message is settled when it resolves, without holding up the
    fetch loop. If the consumer cannot wait (too many deferrals in flight, or a second
    deferral), the message is redelivered after ``delay_s`` like a :class:`Retry`."""

    def __init__(self, outcome: asyncio.Future[BaseException | None], reason: str, *, delay_s: float = 0.1) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.delay_s = delay_s


@dataclass(frozen=True)
class _Parcel:
    """The messages of one fetch, when (epoch seconds) it was requested and when it returned."""

    messages: list[Msg]
    requested: float
    fetched: float


@dataclass(frozen=True)
class Delivery:
    """Transport facts about one message, handed to the handler beside the event."""

    subject: str
    headers: dict[str, str]
    stream_sequence: int
    num_delivered: int


Handler = Callable[[M, Delivery], Awaitable[None]]
BatchHandler = Callable[[list[tuple[M, Delivery]]], Awaitable[list[BaseException | None]]]


def per_event(handler: Handler[M]) -> BatchHandler[M]:
    """Run a one-event handler over a batch, one event after another."""

    async def run(items: list[tuple[M, Delivery]]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = []
        for event, delivery in items:
            try:
                await handler(event, delivery)
                outcomes.append(None)
            except Exception as exc:  # noqa: BLE001 - settled per message by the consumer
                outcomes.append(exc)
        return outcomes

    return run


class EventConsumer(Generic[M]):
    """Runs one handler over one durable consumer until stopped."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        catalogue: Catalogue,
        spec: ConsumerSpec,
        message_type: type[M],
        handler: Handler[M] | None = None,
        batch_handler: BatchHandler[M] | None = None,
        batch_size: int = 256,
        fetch_timeout_s: float = 0.5,
        max_deferred: int = 64,
        prefetch: bool = False,
        max_batches: int = 1,
        lag_sample_every: int = LAG_SAMPLE_EVERY,
    ) -> None:
        self._js = js
        self._catalogue = catalogue
        self._spec = spec
        self._message_type = message_type
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler and batch_handler")
        self._handle_batch = batch_handler or per_event(handler)  # type: ignore[arg-type]
        self._publisher = Publisher(js)
        self._batch_size = batch_size
        self._fetch_timeout_s = fetch_timeout_s
        # prefetch: fetch on while a batch is handled (see _run); _held counts what waits in hand.
        # max_batches > 1 (batches handled at once; implies prefetch) needs a handler that is safe
        # to run concurrently with itself (the optimizer's: dedup by event id, rows locked in order).
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        self._max_batches = max_batches
        if lag_sample_every < 1:
            raise ValueError(f"lag_sample_every must be >= 1, got {lag_sample_every}")
        self._lag_every = lag_sample_every
        self._prefetch = prefetch or max_batches > 1
        self._held = 0
        self._room = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Background tasks settling deferred messages, one per fetched batch that had any.
        self._deferred: set[asyncio.Task[None]] = set()
        self._max_deferred = max_deferred
        self._sub: JetStreamContext.PullSubscription | None = None
        self._backoff = 0.1  # seconds before the next fetch after a failed one (``_fetch``)
        # Metric children resolved once: labels() per message is a measurable share of the hot path.
        name = spec.durable
        self._age = EVENT_AGE.labels(name)
        self._pending = PENDING.labels(name)
        self._seconds = EVENT_SECONDS.labels(name)
        self._acked = EVENTS_TOTAL.labels(name, "ack")
        self._retried = EVENTS_TOTAL.labels(name, "retry")
        self._dead_lettered = EVENTS_TOTAL.labels(name, "deadletter")
        self._lag_busy = EVENT_LAG.labels(name, "busy")
        self._lag_fetch = EVENT_LAG.labels(name, "fetch")
        self._lag_queue = EVENT_LAG.labels(name, "queue")
        self._lag_handle = EVENT_LAG.labels(name, "handle")
        self._lag_ack = EVENT_LAG.labels(name, "ack")
        self._lag_total = EVENT_LAG.labels(name, "total")

    @property
    def name(self) -> str:
        return self._spec.durable

    async def start(self) -> None:
        """Declare the durable consumer and start pulling."""
        await ensure_consumer(self._js, self._spec)
        self._sub = await self._js.pull_subscribe_bind(self._spec.durable, self._spec.stream)
        self._task = asyncio.create_task(self._run(self._sub), name=f"consumer:{self.name}")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop fetching; let the batch in hand and the deferred messages finish within
        ``timeout_s`` (what is left unsettled is redelivered later)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout_s)
            except TimeoutError:
                self._task.cancel()
        if self._deferred:
            _, late = await asyncio.wait(set(self._deferred), timeout=max(0.0, deadline - time.monotonic()))
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        if self._sub is not None:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await self._sub.unsubscribe()

    async def _run(self, sub: JetStreamContext.PullSubscription) -> None:
        if not self._prefetch:
            await self._fetch_loop(sub, None)
            return
        # Fetching goes on while a batch is handled: what arrives meanwhile is in hand when the
        # handler is free, instead of waiting for a fetch that starts only then. Batches are
        # handled in the order fetched, ``max_batches`` at a time (one: one after another); at most
        # ``batch_size`` messages are held beside them.
        parcels: asyncio.Queue[_Parcel | None] = asyncio.Queue()
        fetcher = asyncio.create_task(self._fetch_loop(sub, parcels), name=f"consumer:{self.name}:fetch")
        slots = asyncio.Semaphore(self._max_batches)
        handling: set[asyncio.Task[None]] = set()
        try:
            done = False
            while not done:
                await slots.acquire()  # first a free slot: what arrives meanwhile joins the next batch
                first = await parcels.get()
                if first is None:
                    break
                batch = [first]
                while not parcels.empty():  # everything else already fetched joins this batch
                    more = parcels.get_nowait()
                    if more is None:
                        done = True
                        break
                    batch.append(more)
                self._held -= sum(len(p.messages) for p in batch)
                self._room.set()
                if self._max_batches == 1:
                    try:
                        await self._process_parcels(batch)
                    finally:
                        slots.release()
                    continue
                task = asyncio.create_task(self._process_in_slot(batch, slots), name=f"consumer:{self.name}:batch")
                handling.add(task)
                task.add_done_callback(handling.discard)
            if handling:
                await asyncio.wait(set(handling))
        finally:
            fetcher.cancel()
            for task in handling:  # cancelled (stop() gave up): unsettled, so redelivered later
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fetcher

    async def _process_in_slot(self, batch: list[_Parcel], slots: asyncio.Semaphore) -> None:
        """One of several batches handled at once; a failure to settle is logged (what was not
        settled is redelivered after ``ack_wait``) rather than lost in a task nobody awaits."""
        try:
            await self._process_parcels(batch)
        except Exception as exc:  # noqa: BLE001 - NATS away while settling, say
            log.warning("a batch could not be settled", consumer=self.name, error=repr(exc))
        finally:
            slots.release()

    async def _fetch_loop(
        self, sub: JetStreamContext.PullSubscription, parcels: asyncio.Queue[_Parcel | None] | None
    ) -> None:
        """Fetch until stopped; each batch is processed here (``parcels`` None) or handed over
        to ``_run``'s handling loop, holding at most ``batch_size`` messages not yet taken."""
        if parcels is None:
            await self._serial_loop(sub)
            return
        try:
            while not self._stopping.is_set():
                room = self._batch_size - self._held
                if room <= 0:
                    self._room.clear()
                    await self._room.wait()
                    continue
                parcel = await self._fetch(sub, room)
                if parcel is not None:
                    self._held += len(parcel.messages)
                    parcels.put_nowait(parcel)
        finally:
            parcels.put_nowait(None)  # the handling loop ends once it has handled the rest

    async def _serial_loop(self, sub: JetStreamContext.PullSubscription) -> None:
        """Fetch a batch, handle and settle it, then the next. While there is a backlog (the
        batch's last message says more wait behind it), the next batch's fetch is sent before this
        one is handled and runs while it is: fetching and handling overlap only then. A consumer
        that keeps up fetches only between batches, as before (the prefetch loop fetches all the
        time, which cost latency on busy cores: bench/service-regret/README.md)."""
        ahead: asyncio.Task[_Parcel | None] | None = None
        try:
            while True:
                if ahead is not None:  # fetched while the batch before was handled
                    parcel, ahead = await ahead, None
                elif self._stopping.is_set():
                    return
                else:
                    parcel = await self._fetch(sub, self._batch_size)
                if parcel is None:
                    continue
                if not self._stopping.is_set() and _behind(parcel.messages):
                    ahead = asyncio.create_task(self._fetch(sub, self._batch_size), name=f"consumer:{self.name}:ahead")
                await self._process_parcels([parcel])
        finally:
            if ahead is not None:  # cancelled by stop(): what it fetched is redelivered after ack_wait
                ahead.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ahead

    async def _fetch(self, sub: JetStreamContext.PullSubscription, n: int) -> _Parcel | None:
        """One fetch of at most ``n`` messages; None when none came (an idle pull timed out) or
        the fetch failed (NATS down or reconnecting: logged, then a backoff of 0.1 s doubling to
        2 s between failures)."""
        requested = time.time()
        try:
            messages = await sub.fetch(n, timeout=self._fetch_timeout_s)
        except (TimeoutError, NatsTimeoutError):
            return None
        except Exception as exc:  # noqa: BLE001 - NATS down or reconnecting; readiness reports it
            log.warning("fetch failed", consumer=self.name, error=str(exc))
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, 2.0)
            return None
        self._backoff = 0.1
        return _Parcel(messages, requested, time.time())

    async def _process(self, messages: list[Msg], requested: float | None = None) -> None:
        """Decode, handle and settle one fetched batch; ``requested`` is when (epoch seconds) the
        fetch that brought it was sent (None: now), splitting each event's wait into "busy" and
        "fetch" stages."""
        now = time.time()
        await self._process_parcels([_Parcel(messages, min(requested or now, now), now)])

    async def _process_parcels(self, parcels: list[_Parcel]) -> None:
        """Decode, handle (as one batch) and settle the messages of one or more fetches."""
        started = time.perf_counter()
        decoded: list[tuple[Msg, M, Delivery]] = []
        stored_at: list[float | None] = []
        fetched_at: list[float] = []
        pending: int | None = None
        for parcel in parcels:
            now, requested = parcel.fetched, parcel.requested
            for msg in parcel.messages:
                sequence, delivered, stored, pending = _facts(msg)
                if stored is not None:
                    self._age.observe(max(0.0, now - stored))
                    if sequence % self._lag_every:
                        stored = None  # not in the lag sample: no stage is observed for it
                    else:
                        # Stored before the fetch was sent: the consumer was not fetching then.
                        self._lag_busy.observe(max(0.0, requested - stored))
                        self._lag_fetch.observe(max(0.0, now - max(stored, requested)))
                # The message's own headers dict (nats-py builds one per message; no copy needed).
                delivery = Delivery(msg.subject, msg.headers or {}, sequence, delivered)
                try:
                    decoded.append((msg, decode(msg.data, delivery.headers, self._message_type), delivery))
                    stored_at.append(stored)
                    fetched_at.append(now)
                except MalformedEvent as exc:
                    await self._dead_letter(msg, delivery, str(exc))
                except Exception as exc:  # noqa: BLE001 - a parser error of another kind: still malformed
                    await self._dead_letter(msg, delivery, f"cannot decode the payload: {describe(exc)}")
        if pending is not None:  # the last message's: what is left behind this batch
            self._pending.set(pending)
        if not decoded:
            return
        handling = time.time()
        outcomes = await self._handle([(event, delivery) for _, event, delivery in decoded])
        handled = time.time()
        later: list[tuple[Msg, Delivery, Deferred]] = []
        acked = 0
        try:
            for (msg, _, delivery), outcome, stored, fetched in zip(
                decoded, outcomes, stored_at, fetched_at, strict=True
            ):
                if stored is not None:  # in the lag sample
                    self._lag_queue.observe(max(0.0, handling - fetched))
                    self._lag_handle.observe(handled - handling)
                if outcome is None:  # the hot path: ack, counted once per batch below
                    await msg.ack()
                    acked += 1
                    if stored is not None:
                        self._observe_settled(handled, stored)
                elif isinstance(outcome, Deferred):
                    later.append((msg, delivery, outcome))
                else:
                    await self._settle(msg, delivery, outcome)
        finally:
            if acked:
                self._acked.inc(acked)
        if later:
            await self._defer(later)
        self._seconds.observe((time.perf_counter() - started) / len(decoded))

    async def _defer(self, group: list[tuple[Msg, Delivery, Deferred]]) -> None:
        """Settle ``group`` in a background task as each outcome resolves; past the bound on such
        tasks, settle it now as a Retry (the handler's own work goes on; handlers are idempotent)."""
        if len(self._deferred) >= self._max_deferred or self._stopping.is_set():
            for msg, delivery, deferred in group:
                deferred.outcome.add_done_callback(_consume)
                await self._settle(msg, delivery, Retry(str(deferred), delay_s=deferred.delay_s))
            return
        task = asyncio.create_task(self._settle_later(group), name=f"consumer:{self.name}:deferred")
        self._deferred.add(task)
        task.add_done_callback(self._deferred.discard)

    async def _settle_later(self, group: list[tuple[Msg, Delivery, Deferred]]) -> None:
        for msg, delivery, deferred in group:
            try:
                outcome = await deferred.outcome
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # stop() gave up on it: JetStream redelivers the rest after ack_wait
                outcome = Retry(f"{deferred}; its deferred outcome was cancelled", delay_s=deferred.delay_s)
            except Exception as exc:  # noqa: BLE001 - the handler's failure is this event's outcome
                outcome = exc
            if isinstance(outcome, Deferred):  # deferred once already: no second wait
                outcome.outcome.add_done_callback(_consume)
                outcome = Retry(str(outcome), delay_s=outcome.delay_s)
            resolved = time.time()
            try:
                await self._settle(msg, delivery, outcome)
                sequence, _, stored, _ = _facts(msg)
                if outcome is None and stored is not None and not sequence % self._lag_every:
                    self._observe_settled(resolved, stored)
            except Exception as exc:  # noqa: BLE001 - NATS away: unsettled, so redelivered after ack_wait
                log.warning("could not settle a deferred message", consumer=self.name, error=repr(exc))

    def _observe_settled(self, handled: float, stored: float) -> None:
        """An event of the lag sample acked now, its outcome known at ``handled``: the "ack" and
        "total" stages."""
        acked = time.time()
        self._lag_ack.observe(max(0.0, acked - handled))
        self._lag_total.observe(max(0.0, acked - stored))

    async def _handle(self, items: list[tuple[M, Delivery]]) -> list[BaseException | None]:
        """The handler's outcomes for ``items``; when it raises for the whole batch, the batch is
        bisected (unless a dependency is away: then every event is retried later as it is)."""
        try:
            return await self._handle_batch(items)
        except Exception as exc:  # noqa: BLE001 - settled per message by the caller
            if len(items) == 1 or is_transient(exc):
                return [exc] * len(items)
            log.warning("batch failed; bisecting it to find the event at fault", consumer=self.name, error=repr(exc))
            half = len(items) // 2
            return await self._handle(items[:half]) + await self._handle(items[half:])

    async def _settle(self, msg: Msg, delivery: Delivery, outcome: BaseException | None) -> None:
        if outcome is None:  # the hot path logs nothing, so it binds no log context
            await msg.ack()
            self._acked.inc()
            return
        with bound(consumer=self.name, subject=delivery.subject, seq=delivery.stream_sequence):
            if isinstance(outcome, Reject):
                await self._dead_letter(msg, delivery, str(outcome))
            elif rejects_the_data(outcome):
                await self._dead_letter(msg, delivery, f"the event cannot be stored: {describe(outcome)}")
            elif delivery.num_delivered >= self._spec.max_deliver:
                reason = f"failed {delivery.num_delivered} times, last error: {outcome!r}"
                await self._dead_letter(msg, delivery, reason)
            elif isinstance(outcome, Retry):
                log.debug("event not ready; will retry", reason=str(outcome), attempt=delivery.num_delivered)
                self._retried.inc()
                await msg.nak(delay=outcome.delay_s)
            else:
                log.warning("handler failed; will retry", error=repr(outcome), attempt=delivery.num_delivered)
                self._retried.inc()
                await msg.nak(delay=min(0.2 * 2**delivery.num_delivered, 10.0))

    @property
    def deferred_groups(self) -> int:
        """Background tasks settling deferred messages now (a gauge for tests and debugging)."""
        return len(self._deferred)

    async def _dead_letter(self, msg: Msg, delivery: Delivery, reason: str) -> None:
        letter = DeadLetter(
            subject=delivery.subject,
            consumer=self.name,
            reason=reason,
            payload=msg.data,
            headers=delivery.headers,
            stream_sequence=delivery.stream_sequence,
        )
        now = Timestamp()
        now.GetCurrentTime()
        letter.time.CopyFrom(now)
        # The dedup id makes a redelivered message dead-letter once even if we die before acking.
        await self._publisher.publish(
            self._catalogue.dead_letter(self.name),
            letter,
            msg_id=f"{self.name}:{delivery.stream_sequence}",
        )
        await msg.ack()
        self._dead_lettered.inc()
        log.warning("dead-lettered", reason=reason)


def _facts(msg: Msg) -> tuple[int, int, float | None, int | None]:
    """(stream sequence, deliveries so far, stored at in epoch seconds, messages pending) of a
    JetStream message, read from its reply subject as nats-py's ``Msg.metadata`` reads them, but
    without the datetime and the two dataclasses it builds per message (a quarter of this
    consumer's own CPU per message). Anything else falls back to ``metadata``."""
    reply = getattr(msg, "reply", None)
    if reply:
        t = reply.split(".")
        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>; the v2 form adds
        # <domain>.<account hash> after ACK (and may end with a random token).
        n = len(t)
        o = 0 if n == 9 else 2 if n >= 11 else -1
        if o >= 0 and t[0] == "$JS" and t[1] == "ACK":
            return int(t[5 + o]), int(t[4 + o]), int(t[7 + o]) / 1e9, int(t[8 + o])
    meta = msg.metadata
    stored = getattr(meta, "timestamp", None)
    return (
        meta.sequence.stream,
        meta.num_delivered,
        stored.timestamp() if stored is not None else None,
        getattr(meta, "num_pending", None),
    )


def _behind(messages: list[Msg]) -> bool:
    """Whether more messages wait in the stream behind this fetch (its last message's pending
    count; unknown counts as none)."""
    if not messages:
        return False
    pending = _facts(messages[-1])[3]
    return pending is not None and pending > 0


def _consume(future: asyncio.Future[BaseException | None]) -> None:
    """Mark a deferred outcome nobody awaits as retrieved (no "never retrieved" warning)."""
    if not future.cancelled():
        future.exception()
