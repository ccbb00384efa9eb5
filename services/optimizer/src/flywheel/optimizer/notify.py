"""Replicas tell each other their feedback increments through PostgreSQL LISTEN/NOTIFY.

The feedback transaction itself calls ``pg_notify`` (``announce``), so a notification is
delivered only if, and right after, the increments commit; it carries the transaction's id so
that a receiver can tell whether a full read already counted it (``fold.PgSnapshot``). Each
replica listens on one dedicated connection (``IncrementListener``), skips its own
notifications and folds the others'. Notifications are not durable: one sent while a
listener is disconnected is lost, so every (re)connect is followed by a full refresh, and the
periodic refresh bounds any other loss.

The channel is named after the deployment's schema (``current_schema()``), so deployments
sharing one PostgreSQL database never hear each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import Counter
from sqlalchemy import String, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from flywheel.core.logging import get_logger
from flywheel.optimizer import fold
from flywheel.optimizer.stats import Increment

log = get_logger(__name__)

CHANNEL_SQL = "('flywheel_posteriors_' || md5(current_schema()))"

# One round trip inside the feedback transaction: its id and now(), and one notification per
# endpoint whose text PostgreSQL completes with both (so they are exactly the committed ones)
# and with the moment it was sent ("k", clock_timestamp(): the transaction's last statement, just
# before its commit), from which the receiver times its fold (``cache.FOLD_LAG``).
_ANNOUNCE = text(  # CHANNEL_SQL is a constant: nothing from a request is formatted in
    "SELECT pg_current_xact_id()::text AS x, extract(epoch from now())::text AS t, "  # noqa: S608
    f"(SELECT count(pg_notify({CHANNEL_SQL}, "
    "'{\"x\":' || pg_current_xact_id()::text || ',\"t\":' || extract(epoch from now())::text || "
    "',\"k\":' || extract(epoch from clock_timestamp())::text || ',' || b)) "
    "FROM unnest(:bodies) AS b) AS sent"
).bindparams(bindparam("bodies", type_=ARRAY(String)))

LISTENER_EVENTS = Counter(
    "flywheel_optimizer_increment_listener_events_total",
    "The increment listener's connection: connected, lost, and notifications received from other replicas",
    ["event"],
)


async def announce(
    session: AsyncSession,
    *,
    replica: str | None,
    endpoints: Mapping[str, Mapping[str, Increment]],
    clocks: Mapping[str, float] | None = None,
    settled: Iterable[str] = (),
) -> tuple[int, float]:
    """Inside a feedback transaction: notify the other replicas of its endpoint-wide increments
    and each endpoint's decision clock, and of the event ids it settled (nothing is sent when
    ``replica`` is None), and return the transaction's id and now(). The settled ids go first:
    a replica that folded one of them provisionally drops that fold before it adds the
    increments, so between the two notices it undercounts for a moment, never double counts."""
    clocks = clocks or {}
    bodies = (
        [
            *fold.settled_bodies(replica, settled),
            *(fold.body(replica, e, arms, clocks.get(e, 0.0)) for e, arms in sorted(endpoints.items())),
        ]
        if replica is not None
        else []
    )
    xid, at, _ = (await session.execute(_ANNOUNCE, {"bodies": bodies})).one()
    return int(xid), float(at)


async def announce_reload(engine: AsyncEngine, *, replica: str, endpoint: str) -> None:
    """Ask the other replicas to reload one endpoint (after an administrative change here)."""
    async with engine.connect() as conn:
        await conn.execute(
            text(f"SELECT pg_notify({CHANNEL_SQL}, :payload)"),
            {"payload": "{" + fold.reload_body(replica, endpoint)},
        )
        await conn.commit()


class IncrementListener:
    """LISTENs for other replicas' increments on a connection of its own and hands each
    notification to ``on_notice``; after every (re)connect ``on_connect`` runs (a full refresh:
    notifications sent meanwhile were lost). Reconnects with backoff, and pings the connection
    so that a silently dead one is noticed within ``ping_s``."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        replica: str,
        on_notice: Callable[[fold.Notice], None],
        on_connect: Callable[[], Any],
        ping_s: float = 5.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._engine = engine
        self._replica = replica
        self._on_notice = on_notice
        self._on_connect = on_connect
        self._ping_s = ping_s
        self._max_backoff_s = max_backoff_s
        self.connected = asyncio.Event()

    async def run(self) -> None:
        """Listen forever (a background task of the service)."""
        backoff = 0.2
        while True:
            try:
                await self._listen_once()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - PostgreSQL away: the periodic refresh covers the gap
                log.warning("increment listener lost its connection", error=repr(exc), retry_in_s=backoff)
            self.connected.clear()
            LISTENER_EVENTS.labels("lost").inc()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    async def _listen_once(self) -> None:
        conn = await self._engine.connect()
        try:
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None
            lost = asyncio.Event()
            raw.add_termination_listener(lambda _c: lost.set())
            channel = await raw.fetchval(f"SELECT {CHANNEL_SQL}")
            await raw.add_listener(channel, self._received)
            self.connected.set()
            LISTENER_EVENTS.labels("connected").inc()
            result = self._on_connect()
            if asyncio.iscoroutine(result):
                await result
            while not lost.is_set():
                try:
                    await asyncio.wait_for(lost.wait(), self._ping_s)
                except TimeoutError:
                    await asyncio.wait_for(raw.fetchval("SELECT 1"), self._ping_s)
            raise ConnectionError("the listening connection closed")
        finally:
            # Never back to the pool: it still LISTENs.
            await conn.invalidate()
            await conn.close()

    def _received(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            notice = fold.decode(payload)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable increment notification", error=repr(exc), payload=payload[:200])
            return
        if notice.replica == self._replica:
            return  # folded already, right after its own commit
        LISTENER_EVENTS.labels("notification").inc()
        self._on_notice(notice)
