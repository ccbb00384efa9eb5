"""Decisions: ids that tell their age, and a log that batches rows and events.

Select must not wait for PostgreSQL or JetStream. Decisions go to an in-memory buffer
that a background task flushes every ``flush_interval_s`` while it holds any (sooner when it
fills; with nothing buffered it sleeps until the next decision, so an idle replica spends
nothing here):
one INSERT of every row, which also advances each endpoint's decision clock
(``endpoints.decisions_total``) by them, then one ``DecisionBatch`` message per endpoint (a
JetStream message per decision cost more CPU than the Select that made it). A batch that
fails is retried as it was, so its messages keep their dedup ids; its rows are written again
with ``INSERT ... ON CONFLICT DO NOTHING``, because the failed try may have committed (its
answer lost with the connection), and a row already there must count once. SIGTERM flushes
what is left. A hard crash can lose the last interval's decisions (about 20 ms); feedback for
those is dead-lettered as "decision never logged", never applied blindly.

Bounds: the log holds at most ``max_pending`` decisions not yet written; past that, ``record``
from a worker thread waits up to ``room_wait_s`` (1 s) for a flush to make room (not while
flushes fail), then raises ResourceExhausted (Select answers RESOURCE_EXHAUSTED) and appends
nothing, so an outage of PostgreSQL or NATS costs bounded memory and no waiting. One bad row never stalls the rest: when
the batch INSERT fails because of its data (not the connection), the batch is bisected until
the rows at fault are found; they are dead-lettered on ``<ns>.deadletter.optimizer-decision-log``
with the database's reason and the others are written. The same for a decision event the bus
refuses. Select's door validation makes both rare; the normal path pays nothing for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from nats.errors import MaxPayloadError
from nats.js.errors import BadRequestError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.optimizer.v1 import events_pb2
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.publisher import Publisher
from flywheel.core.errors import ResourceExhausted, rejects_the_data
from flywheel.core.logging import get_logger

if TYPE_CHECKING:  # provisional.py imports this module
    from flywheel.optimizer.provisional import RecentDecisions
log = get_logger(__name__)

# Where decisions that can never be written or published go, with the reason.
DEAD_LETTER_NAME = "optimizer-decision-log"

# A batch's first try: one plain INSERT of the rows, sent as two parameters, both made by one
# json.dumps each (in C) and taken apart in the server: the rows as a jsonb array of arrays,
# and their contexts as a json array (``json``, not jsonb, so each context is stored as the
# text json.dumps wrote: jsonb would reorder its keys). The decision clock's increments
# (counted here) go in the same statement, so rows and clock commit together. One statement,
# one round trip: under load the event loop waits for the GIL after each round trip (the sync
# server's 8 workers hold it), and a binary COPY in a transaction (5 round trips), though
# cheaper in CPU, wrote a batch about 2x slower there (bench/select/flush_micro.py
# --busy-threads 8). Until issue 20 the rows went as a text[]/float8[]/... parameter per
# column: asyncpg's array encoder checks every element against collections.abc's ABCs (about
# 15 isinstance calls through ABCMeta a row, 14% of the event loop's samples under
# bench/select's load); as JSON the rows cost the event loop half the CPU per decision in
# batches of 1,000 and a quarter less in batches of 50, and PostgreSQL no more
# (flush_micro.py). created_at goes as integer microseconds since the epoch (exact: interval *
# int8 is exact below 2**53 us, the year 2255). No ON CONFLICT: its
# speculative insertion costs PostgreSQL CPU on every row, and a decision id is new on a first
# try (random); if one is not, the statement fails whole and the retry's INSERT below skips
# it. Endpoint rows are locked in name order: two replicas cannot deadlock.
_ROWS = """
INSERT INTO decisions (decision_id, endpoint, arm_id, probability, user_id, session_id, segment,
                       context, features, sticky, created_at)
SELECT r ->> 0, r ->> 1, r ->> 2, (r ->> 3)::float8, r ->> 4, r ->> 5, r ->> 6, c.context,
       CASE WHEN jsonb_typeof(r -> 7) = 'array'
            THEN ARRAY(SELECT jsonb_array_elements_text(r -> 7)::float8) END,
       (r ->> 8)::bool, timestamptz 'epoch' + (r ->> 9)::int8 * interval '1 microsecond'
FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS j(r, n)
JOIN json_array_elements($2::json) WITH ORDINALITY AS c(context, n) USING (n)
"""
_FIRST = f"""
WITH inserted AS ({_ROWS}),
locked AS (SELECT e.name, c.n FROM endpoints e JOIN unnest($3::text[], $4::int8[]) AS c(name, n) USING (name)
           ORDER BY e.name FOR NO KEY UPDATE OF e)
UPDATE endpoints SET decisions_total = endpoints.decisions_total + locked.n
FROM locked WHERE endpoints.name = locked.name
"""  # noqa: S608 - constants only

# A retried batch (its first try may have committed, its answer lost): the same rows, ON CONFLICT
# DO NOTHING, and the clock advanced by the rows the statement inserted, so a row already there
# counts once.
_INSERT = f"""{_ROWS}ON CONFLICT (decision_id) DO NOTHING
RETURNING endpoint
"""

# The same statement advances each endpoint's decision clock by the rows it inserted (a retried
# batch's rows conflict and count nothing), so the clock and the rows commit together. Endpoint
# rows are locked in name order: two replicas flushing the same endpoints cannot deadlock.
_INSERT_AND_COUNT = f"""
WITH inserted AS ({_INSERT}),
counted AS (SELECT endpoint, count(*) AS n FROM inserted GROUP BY endpoint),
locked AS (SELECT e.name, c.n FROM endpoints e JOIN counted c ON c.endpoint = e.name
           ORDER BY e.name FOR NO KEY UPDATE OF e)
UPDATE endpoints SET decisions_total = endpoints.decisions_total + locked.n
FROM locked WHERE endpoints.name = locked.name
"""  # noqa: S608 - constants only


# The random part of decision ids is cut from os.urandom drawn _ID_DRAW ids at a time, per thread.
# os.urandom releases the GIL for its syscall, and on the sync server's busy worker threads every
# release is a hand-off: another thread takes the GIL and the worker waits to get it back (py-spy
# --native under bench/select's load: the largest GIL wait in a Select's own code). One draw now
# serves 256 ids; the bytes are the same kernel CSPRNG's.
_ID_DRAW = 256
_ids = threading.local()


def _random_hex20() -> str:
    try:
        return next(_ids.chunks)
    except (AttributeError, StopIteration):  # this thread's first id, or its draw is used up
        pool = os.urandom(10 * _ID_DRAW).hex()
        _ids.chunks = chunks = iter([pool[i : i + 20] for i in range(0, len(pool), 20)])
        return next(chunks)


# A forked child must not hand out the ids left in its parent's draw.
os.register_at_fork(after_in_child=lambda: _ids.__dict__.clear())


def new_decision_id() -> str:
    """32 hex chars: 12 of milliseconds since the epoch, then 20 random."""
    return f"{int(time.time() * 1000):012x}{_random_hex20()}"


def decision_age_s(decision_id: str) -> float | None:
    """Seconds since the decision was made, from its id (None if not one of ours)."""
    try:
        return time.time() - int(decision_id[:12], 16) / 1000 if len(decision_id) == 32 else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Decision:
    decision_id: str
    endpoint: str
    arm_id: str
    params: dict[str, Any]
    probability: float
    user_id: str = ""
    session_id: str = ""
    segment: str = ""
    context: dict[str, Any] = field(default_factory=dict)
    features: list[float] | None = None
    sticky: bool = False
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    # The same params and context as protobuf Structs when the caller has them (the snapshot's
    # prebuilt params, the request's context): the response and the event copy them as they are.
    params_struct: Struct | None = field(default=None, compare=False, repr=False)
    context_struct: Struct | None = field(default=None, compare=False, repr=False)


class DecisionLog:
    """Buffers decisions and flushes them to PostgreSQL and JetStream in batches."""

    def __init__(
        self,
        engine: AsyncEngine,
        publisher: Publisher,
        catalogue: Catalogue,
        *,
        flush_interval_s: float = 0.02,
        max_batch: int = 1000,
        max_pending: int | None = None,
        room_wait_s: float = 1.0,
        recent: RecentDecisions | None = None,
    ) -> None:
        self._engine = engine
        # Remembers every recorded decision for the provisional fold of its feedback.
        self._recent = recent
        # One connection held for the log's lifetime: a pool checkout per flush (with its
        # pre-ping round trip) cost more than the INSERT of a typical 20 ms batch.
        self._conn: AsyncConnection | None = None
        self._driver: Any = None  # its asyncpg connection
        self._publisher = publisher
        self._catalogue = catalogue
        self._interval = flush_interval_s
        self._max_batch = max_batch
        self._buffer: list[Decision] = []
        self._unsent: list[Decision] = []  # a batch whose write or publish failed: retried first
        self._subjects: dict[str, str] = {}  # endpoint -> its decision subject
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()
        # record() may be called from the sync gRPC server's worker threads.
        self._buffer_lock = threading.Lock()
        self._room = threading.Condition(self._buffer_lock)
        self._high_water = max_pending or 10 * max_batch
        self._room_wait_s = room_wait_s
        self._failing = False  # the last flush failed: callers at the bound are refused at once
        self._unsent_n = 0  # len(self._unsent), read by record() under the lock
        self._woken = False
        # Set while the flusher sleeps on an empty buffer; the first record() after it wakes it.
        self._idle = False
        self._nonempty = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = threading.get_ident()

    def record(self, decision: Decision) -> None:
        """Buffer a decision for the next flush; when ``max_pending`` decisions are already
        waiting to be written, wait up to ``room_wait_s`` for room, then raise ResourceExhausted
        (and keep nothing)."""
        self.record_many([decision])

    def record_many(self, decisions: list[Decision], *, wait_s: float | None = None) -> None:
        """Buffer all of ``decisions`` or none: when they do not all fit under ``max_pending``,
        wait up to ``room_wait_s`` for a flush to make room (from a worker thread; never on the
        event loop, which the flush needs), then raise ResourceExhausted. SelectBatch records its
        decisions this way, so a call refused halfway leaves no decision in the log that its
        caller never received. ``wait_s`` shortens the wait (the time left before the caller's
        deadline: a decision logged after its caller gave up would never be answered)."""
        limit = self._room_wait_s if wait_s is None else min(wait_s, self._room_wait_s)
        with self._room:
            if not self._fits(len(decisions)) and not self._wait_for_room(len(decisions), limit):
                # Refuse rather than grow: waiting without a bound, then appending anyway, made
                # an outage grow the buffer without limit.
                raise ResourceExhausted(
                    f"the decision log is full: {self._high_water} decisions at most may wait to be written "
                    f"and {len(decisions)} more do not fit (PostgreSQL or NATS is unreachable or slow); "
                    "retry with backoff"
                )
            self._buffer.extend(decisions)
            if self._recent is not None:
                self._recent.add_many(decisions)
            # Wake the flusher once per full buffer: from a worker thread each wake-up is a byte on
            # the loop's self-pipe, which is also its signal wake-up fd (a full pipe loses SIGTERM).
            wake = len(self._buffer) >= self._max_batch and not self._woken
            if wake:
                self._woken = True
            start = self._idle  # the first decision after a quiet spell: start the flush timer
            self._idle = False
        if start:
            self._signal(self._nonempty)
        if wake:
            self._signal(self._full)

    def _fits(self, n: int) -> bool:
        return len(self._buffer) + self._unsent_n + n <= self._high_water

    def _wait_for_room(self, n: int, limit: float) -> bool:
        """Under ``self._room``: wait until ``n`` more decisions fit, at most ``limit`` seconds.
        A burst (SelectBatch at saturation) then slows down to what the log writes, instead of
        being refused: the waiting workers also free the GIL for the event loop that flushes.
        While flushes fail (an outage) nobody waits: refused at once, as without the wait."""
        if limit <= 0 or threading.get_ident() == self._loop_thread or n > self._high_water:
            return False
        deadline = time.monotonic() + limit
        while not self._fits(n):
            left = deadline - time.monotonic()
            if left <= 0 or self._failing:  # PostgreSQL or NATS away: no flush will make room soon
                return False
            self._room.wait(left)
        return True

    def _set_failing(self, failing: bool) -> None:
        with self._room:
            if failing != self._failing:
                self._failing = failing
                self._room.notify_all()  # the callers waiting for room: refused now

    def _signal(self, event: asyncio.Event) -> None:
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(event.set)
        else:
            event.set()

    async def run(self) -> None:
        """Flush forever (a background task); failures keep the batch for the next try."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        while True:
            await self._until_nonempty()
            # Until the interval ends or the buffer fills. A timer that sets the event, rather
            # than asyncio.wait_for (a task, its timeout and callbacks each time): about 20 us
            # less of the loop's CPU a flush (bench/select/README.md).
            timer = self._loop.call_later(self._interval, self._full.set)
            try:
                await self._full.wait()
            finally:
                timer.cancel()
            self._full.clear()
            try:
                await self.flush()
                self._set_failing(False)
            except Exception as exc:  # noqa: BLE001 - PostgreSQL or NATS away: retry next tick
                self._set_failing(True)
                log.warning("decision flush failed; will retry", error=repr(exc), pending=self.pending)
                await asyncio.sleep(0.5)

    async def _until_nonempty(self) -> None:
        """Sleep while there is nothing to write, instead of waking every interval: an idle
        replica then costs no CPU here. A decision made meanwhile is flushed one interval later,
        as before."""
        with self._room:
            if self._buffer or self._unsent:
                return
            self._idle = True
        # A record() between the lock and clear() schedules set() on this loop, which runs after
        # clear() (this coroutine does not yield in between): the wake-up is never lost.
        self._nonempty.clear()
        await self._nonempty.wait()

    async def flush(self) -> int:
        """Write and publish everything buffered so far; returns how many."""
        async with self._lock:
            written = 0
            if self._unsent:
                # The batch that failed last time, exactly as it was: the same messages with the
                # same dedup ids, so JetStream keeps one copy of whatever it had already stored.
                await self._write(self._unsent, retry=True)
                written = len(self._unsent)
                self._set_unsent([])
            with self._room:
                batch, self._buffer = self._buffer, []
                # Counted as unsent in the same breath, so record() never sees room that is not there.
                self._unsent, self._unsent_n = batch, len(batch)
                self._woken = False
                self._room.notify_all()
            if batch:
                # Kept until written, also on cancellation (SIGTERM): rows are inserted ON CONFLICT
                # DO NOTHING and messages dedup by id, so writing a batch again is harmless.
                await self._write(batch)
                self._set_unsent([])
                written += len(batch)
            return written

    def _set_unsent(self, batch: list[Decision]) -> None:
        with self._room:
            self._unsent, self._unsent_n = batch, len(batch)
            self._room.notify_all()  # written: room for the callers waiting in record_many

    @property
    def flush_interval_s(self) -> float:
        """How long a decision waits in the buffer at most before its flush starts."""
        return self._interval

    def holds_any(self, decision_ids: set[str]) -> bool:
        """Whether any of ``decision_ids`` is made here and not written yet (buffered, or in the
        batch being written). Feedback that arrives this early would miss its decision in
        PostgreSQL; flushing first saves applying its batch twice."""
        with self._room:
            return any(d.decision_id in decision_ids for d in self._unsent) or any(
                d.decision_id in decision_ids for d in self._buffer
            )

    @property
    def pending(self) -> int:
        """Decisions made but not yet written and published."""
        return len(self._buffer) + len(self._unsent)

    async def close(self) -> None:
        """Flush what is buffered (on shutdown), then give the connection back."""
        try:
            await self.flush()
        finally:
            await self._drop_connection()

    async def _drop_connection(self, *, broken: bool = False) -> None:
        conn, self._conn, self._driver = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                if broken:  # never hand a connection in an unknown state back to the pool
                    await conn.invalidate()
                await conn.close()

    async def _write(self, batch: list[Decision], *, retry: bool = False) -> None:
        """Insert the rows, then publish the events. Rows or events that can never be written
        (found by bisecting a failed batch) are dead-lettered and left out; any other failure
        (connection, timeout) raises, and the whole batch is retried later (``retry``: some of
        its rows may be in already)."""
        refused = await self._insert(batch, retry=retry)
        if refused:
            bad = {d.decision_id for d, _ in refused}
            batch = [d for d in batch if d.decision_id not in bad]
        # Rows first: a consumer of the event may look the decision up.
        refused += await self._publish(batch)
        if refused:
            await self._dead_letter(refused)

    async def _insert(self, batch: list[Decision], *, retry: bool = False) -> list[tuple[Decision, str]]:
        """Insert ``batch`` (with ``retry``, by the INSERT that skips rows already written);
        returns the rows refused for their data, with the reason."""
        if not batch:
            return []
        if self._conn is None:
            self._conn = await self._engine.connect()
        try:
            driver = self._driver
            if driver is None:  # looked up once per connection (a greenlet hop each time otherwise)
                driver = self._driver = (await self._conn.get_raw_connection()).driver_connection
            if retry:
                await driver.execute(_INSERT_AND_COUNT, *_rows(batch))
            else:
                counts: dict[str, int] = {}
                for d in batch:
                    counts[d.endpoint] = counts.get(d.endpoint, 0) + 1
                await driver.execute(_FIRST, *_rows(batch), list(counts), list(counts.values()))
        except Exception as exc:
            if not retry and _duplicate(exc):
                # A row already written (never by this log's first try: ids are random): write
                # the batch the way that skips it. The transaction rolled back; nothing counted.
                return await self._insert(batch, retry=True)
            if not rejects_the_data(exc):
                await self._drop_connection(broken=True)  # PostgreSQL restarted or unreachable
                raise
            # A row the database refuses (too long, NUL, bad JSON): the statement or transaction
            # changed nothing, so halve and try again.
            if len(batch) == 1:
                return [(batch[0], f"the decision log refused the row: {type(exc).__name__}: {exc}")]
            half = len(batch) // 2
            return await self._insert(batch[:half], retry=retry) + await self._insert(batch[half:], retry=retry)
        except BaseException:
            await self._drop_connection(broken=True)  # cancelled mid-write: state unknown
            raise
        return []

    async def _publish(self, batch: list[Decision]) -> list[tuple[Decision, str]]:
        """Publish the decision events of ``batch``; returns the decisions the bus refuses."""
        refused: list[tuple[Decision, str]] = []
        messages = []
        for endpoint, message in self._messages(batch):
            if len(message.decisions) == 1 and message.ByteSize() > MAX_MESSAGE_BYTES:
                reason = (
                    f"its decision event is {message.ByteSize()} bytes, more than the bus takes ({MAX_MESSAGE_BYTES})"
                )
                refused.append((_decision_of(batch, message), reason))
            else:
                messages.append((endpoint, message))
        try:
            await self._publisher.publish_many([self._item(e, m) for e, m in messages])
        except (BadRequestError, MaxPayloadError):
            # One message the server refuses (a stream's max_msg_size, a smaller max_payload):
            # send them one at a time, a refused batch split to single decisions.
            for endpoint, message in messages:
                refused += await self._publish_alone(batch, endpoint, message)
        return refused

    async def _publish_alone(
        self, batch: list[Decision], endpoint: str, message: events_pb2.DecisionBatch
    ) -> list[tuple[Decision, str]]:
        try:
            await self._publisher.publish_many([self._item(endpoint, message)])
            return []
        except (BadRequestError, MaxPayloadError) as exc:
            if len(message.decisions) == 1:
                return [(_decision_of(batch, message), f"the bus refused its decision event: {exc!r}")]
        refused = []
        by_id = {d.decision_id: d for d in batch}
        for event in message.decisions:
            [single] = self._batch_messages([by_id[event.decision_id]])
            refused += await self._publish_alone(batch, endpoint, single)
        return refused

    def _item(self, endpoint: str, message: events_pb2.DecisionBatch) -> tuple[str, events_pb2.DecisionBatch, str]:
        return self._subject(endpoint), message, message.meta.event_id

    async def _dead_letter(self, refused: list[tuple[Decision, str]]) -> None:
        """Publish each refused decision on the dead-letter subject with its reason (its event as
        the payload when that fits), deduplicated by decision id, so a retried flush sends it once."""
        subject = self._catalogue.dead_letter(DEAD_LETTER_NAME)
        now = Timestamp()
        now.GetCurrentTime()
        for decision, reason in refused:
            event = events_pb2.DecisionEvent()
            _fill_event(event, decision)
            payload = event.SerializeToString()
            letter = DeadLetter(
                subject=self._subject(decision.endpoint),
                consumer=DEAD_LETTER_NAME,
                reason=f"decision {decision.decision_id}: {reason}",
                payload=payload if len(payload) <= MAX_MESSAGE_BYTES // 2 else b"",
                time=now,
            )
            await self._publisher.publish(subject, letter, msg_id=f"{DEAD_LETTER_NAME}:{decision.decision_id}")
            log.warning("decision dead-lettered", decision_id=decision.decision_id, reason=reason)

    def _subject(self, endpoint: str) -> str:
        subject = self._subjects.get(endpoint)
        if subject is None:
            subject = self._subjects[endpoint] = self._catalogue.decision(endpoint)
        return subject

    def _messages(self, batch: list[Decision]) -> list[tuple[str, events_pb2.DecisionBatch]]:
        """One DecisionBatch per endpoint and ``max_batch`` decisions, in decision order; each
        named after its first and last decision, so the same decisions give the same id."""
        by_endpoint: dict[str, list[Decision]] = {}
        for d in batch:
            by_endpoint.setdefault(d.endpoint, []).append(d)
        out = []
        for endpoint, decisions in by_endpoint.items():
            for start in range(0, len(decisions), self._max_batch):
                out.extend((endpoint, m) for m in self._batch_messages(decisions[start : start + self._max_batch]))
        return out

    def _batch_messages(self, decisions: list[Decision]) -> list[events_pb2.DecisionBatch]:
        message = events_pb2.DecisionBatch(
            meta=EventMeta(
                event_id=f"decisions-{decisions[0].decision_id}-{decisions[-1].decision_id}-{len(decisions)}",
                time=_timestamp(decisions[-1].created_at),
                source="optimizer",
            )
        )
        for d in decisions:
            _fill_event(message.decisions.add(), d)
        if message.ByteSize() > MAX_MESSAGE_BYTES and len(decisions) > 1:  # large contexts: halve it
            half = len(decisions) // 2
            return self._batch_messages(decisions[:half]) + self._batch_messages(decisions[half:])
        return [message]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _rows(batch: list[Decision]) -> tuple[str, str]:
    """``_ROWS``'s parameters: the rows as one JSON array (a row an array, its columns in order,
    the context left out) and the contexts as another."""
    try:  # every timestamp aware and every number finite: one C-encoded dumps
        rows = json.dumps(
            [
                (
                    d.decision_id,
                    d.endpoint,
                    d.arm_id,
                    d.probability,
                    d.user_id,
                    d.session_id,
                    d.segment,
                    d.features,
                    d.sticky,
                    (d.created_at - _EPOCH) // _MICROSECOND,
                )
                for d in batch
            ],
            allow_nan=False,
        )
    except (TypeError, ValueError):
        rows = json.dumps([_row(d) for d in batch])
    return rows, json.dumps([d.context for d in batch])


def _row(d: Decision) -> tuple[object, ...]:
    """One row stored as the parameter arrays stored it before issue 20: a naive created_at is
    local time (asyncpg's rule), a non-finite probability PostgreSQL's 'NaN' or 'Infinity'. NaN
    in the features (JSON has none) is refused by the server, as it was: the batch is bisected
    and the row dead-lettered."""
    p = d.probability
    if isinstance(p, float) and not math.isfinite(p):
        p = "NaN" if math.isnan(p) else ("Infinity" if p > 0 else "-Infinity")
    created = d.created_at if d.created_at.tzinfo is not None else d.created_at.astimezone(UTC)
    return (
        d.decision_id,
        d.endpoint,
        d.arm_id,
        p,
        d.user_id,
        d.session_id,
        d.segment,
        d.features,
        d.sticky,
        (created - _EPOCH) // _MICROSECOND,
    )


def _duplicate(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps) is a unique violation: a decision id already written."""
    import asyncpg  # here: asyncpg stays out of imports that never write

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, asyncpg.UniqueViolationError):
            return True
        current = getattr(current, "orig", None) or current.__cause__
    return False


# Below NATS's default max_payload (1 MiB), with room for headers.
MAX_MESSAGE_BYTES = 900 * 1024


def _decision_of(batch: list[Decision], message: events_pb2.DecisionBatch) -> Decision:
    decision_id = message.decisions[0].decision_id
    return next(d for d in batch if d.decision_id == decision_id)


def _timestamp(moment: datetime) -> Timestamp:
    # Timestamp.FromDatetime goes through utctimetuple() and calendar.timegm(): 4x slower.
    micros = round(moment.timestamp() * 1_000_000)
    return Timestamp(seconds=micros // 1_000_000, nanos=(micros % 1_000_000) * 1000)


def _fill_event(event: events_pb2.DecisionEvent, d: Decision) -> None:
    """Set ``event`` (one of a batch's) from ``d``, copying the prebuilt Structs when it has them."""
    meta = event.meta
    meta.event_id = d.decision_id
    micros = round(d.created_at.timestamp() * 1_000_000)
    meta.time.seconds, meta.time.nanos = micros // 1_000_000, (micros % 1_000_000) * 1000
    meta.source = "optimizer"
    event.decision_id = d.decision_id
    event.endpoint = d.endpoint
    event.arm_id = d.arm_id
    event.probability = d.probability
    event.user_id = d.user_id
    event.session_id = d.session_id
    if d.params_struct is not None:
        event.params.CopyFrom(d.params_struct)
    else:
        event.params.update(d.params)
    if d.context_struct is not None:
        event.context.CopyFrom(d.context_struct)
    elif d.context:
        event.context.update(d.context)
