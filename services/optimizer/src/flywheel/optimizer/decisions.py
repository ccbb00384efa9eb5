"""Decisions: ids that tell their age, and a log that batches rows and events.

Select must not wait for PostgreSQL or JetStream. Decisions go to an in-memory buffer
that a background task flushes every ``flush_interval_s`` (or sooner when it fills):
one multi-row INSERT and one batch of JetStream publishes awaited together. SIGTERM
flushes what is left. A hard crash can lose the last interval's decisions (about 20 ms);
feedback for those is dead-lettered as "decision never logged", never applied blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import events_pb2
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.publisher import Publisher
from flywheel.core.logging import get_logger

log = get_logger(__name__)

# One prepared statement, executed for every row of a batch (asyncpg's executemany runs in one
# transaction and pipelines the rows): no SQL compiled per flush, and no bind-parameter limit.
_INSERT = (
    "INSERT INTO decisions (decision_id, endpoint, arm_id, probability, user_id, session_id, segment,"
    " context, features, sticky, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8::json, $9, $10, $11)"
    " ON CONFLICT (decision_id) DO NOTHING"
)


def new_decision_id() -> str:
    """32 hex chars: 12 of milliseconds since the epoch, then 20 random."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(10)}"


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
    ) -> None:
        self._engine = engine
        # One connection held for the log's lifetime: a pool checkout per flush (with its
        # pre-ping round trip) cost more than the INSERT of a typical 20 ms batch.
        self._conn: AsyncConnection | None = None
        self._publisher = publisher
        self._catalogue = catalogue
        self._interval = flush_interval_s
        self._max_batch = max_batch
        self._buffer: list[Decision] = []
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()

    def record(self, decision: Decision) -> None:
        self._buffer.append(decision)
        if len(self._buffer) >= self._max_batch:
            self._full.set()

    async def run(self) -> None:
        """Flush forever (a background task); failures keep the batch for the next try."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self._interval)
            self._full.clear()
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - PostgreSQL or NATS away: retry next tick
                log.warning("decision flush failed; will retry", error=repr(exc), pending=len(self._buffer))
                await asyncio.sleep(0.5)

    async def flush(self) -> int:
        """Write and publish everything buffered so far; returns how many."""
        async with self._lock:
            batch, self._buffer = self._buffer, []
            if not batch:
                return 0
            try:
                await self._write(batch)
            except BaseException:
                # Put it back on any failure, cancellation (SIGTERM) included: a retried
                # batch is harmless (rows ON CONFLICT DO NOTHING, events dedup by id).
                self._buffer[:0] = batch
                raise
            return len(batch)

    async def close(self) -> None:
        """Flush what is buffered (on shutdown), then give the connection back."""
        try:
            await self.flush()
        finally:
            await self._drop_connection()

    async def _drop_connection(self, *, broken: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                if broken:  # never hand a connection in an unknown state back to the pool
                    await conn.invalidate()
                await conn.close()

    async def _write(self, batch: list[Decision]) -> None:
        rows = [
            (
                d.decision_id,
                d.endpoint,
                d.arm_id,
                d.probability,
                d.user_id,
                d.session_id,
                d.segment,
                json.dumps(d.context),
                d.features,
                d.sticky,
                d.created_at,
            )
            for d in batch
        ]
        if self._conn is None:
            self._conn = await self._engine.connect()
        try:
            raw = await self._conn.get_raw_connection()
            await raw.driver_connection.executemany(_INSERT, rows)  # type: ignore[union-attr]
        except BaseException:
            await self._drop_connection(broken=True)  # PostgreSQL restarted, or cancelled mid-write
            raise
        # Rows first: a consumer of the event may look the decision up. A retried batch is
        # harmless: rows are inserted once and events carry the decision id as Nats-Msg-Id.
        await self._publisher.publish_many(
            [(self._catalogue.decision(d.endpoint), self._event(d), d.decision_id) for d in batch]
        )

    @staticmethod
    def _event(d: Decision) -> events_pb2.DecisionEvent:
        stamp = Timestamp()
        stamp.FromDatetime(d.created_at)
        params, context = d.params_struct, d.context_struct
        if params is None:
            params = Struct()
            params.update(d.params)
        if context is None:
            context = Struct()
            context.update(d.context)
        return events_pb2.DecisionEvent(
            meta=EventMeta(event_id=d.decision_id, time=stamp, source="optimizer"),
            decision_id=d.decision_id,
            endpoint=d.endpoint,
            arm_id=d.arm_id,
            params=params,
            probability=d.probability,
            user_id=d.user_id,
            context=context,
            session_id=d.session_id,
        )
