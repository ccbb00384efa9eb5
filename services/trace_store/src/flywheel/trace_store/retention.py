"""Erasure and retention: deleting traces from the index *and* from their segments.

A deletion rewrites each touched segment with the erased lines replaced by ``null``
(or removes the object when no live span is left) and then deletes the index rows, in
one transaction under an advisory lock (one eraser at a time across replicas). The
objects change before the commit: if the commit fails, the index points at erased
lines, which reads skip, so erased data never comes back.

The sweep applies a TTL per agent (``FLYWHEEL_TRACE_STORE_RETENTION_DAYS``, a JSON map,
with ``DEFAULT_RETENTION_DAYS`` for the rest) and removes segment objects that no
committed index row refers to (left by a crash between PUT and commit).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from flywheel.core.logging import get_logger
from flywheel.trace_store.segments import SegmentStore

log = get_logger(__name__)
_LOCK = "SELECT pg_advisory_xact_lock(hashtext('flywheel.trace_store.erasure'))"
_CHUNK = 500


@dataclass(frozen=True)
class Deleted:
    traces: int
    spans: int


class Eraser:
    def __init__(self, engine: AsyncEngine, segments: SegmentStore) -> None:
        self._engine = engine
        self._segments = segments

    async def delete_traces(self, trace_ids: list[str]) -> Deleted:
        """Delete these traces (ids that are not stored are ignored)."""
        if not trace_ids:
            return Deleted(0, 0)
        async with self._engine.connect() as sa_conn:
            conn = (await sa_conn.get_raw_connection()).driver_connection
            async with conn.transaction():  # type: ignore[union-attr]
                await conn.execute(_LOCK)  # type: ignore[union-attr]
                rows = await conn.fetch(  # type: ignore[union-attr]
                    "DELETE FROM spans WHERE trace_id = ANY($1::text[]) RETURNING segment, line", trace_ids
                )
                traces = await conn.fetch(  # type: ignore[union-attr]
                    "DELETE FROM traces WHERE trace_id = ANY($1::text[]) RETURNING trace_id", trace_ids
                )
                lines: dict[str, set[int]] = defaultdict(set)
                for segment, line in rows:
                    lines[segment].add(line)
                left = await conn.fetch(  # type: ignore[union-attr]
                    "UPDATE segments s SET live_spans = s.live_spans - d.n "
                    "FROM unnest($1::text[], $2::int4[]) AS d(key, n) WHERE s.key = d.key "
                    "RETURNING s.key, s.live_spans",
                    list(lines),
                    [len(v) for v in lines.values()],
                )
                empty = [k for k, live in left if live <= 0]
                await asyncio.gather(
                    *(self._segments.delete(k) for k in empty),
                    *(self._segments.erase_lines(k, lines[k]) for k, live in left if live > 0),
                )
                await conn.execute("DELETE FROM segments WHERE key = ANY($1::text[])", empty)  # type: ignore[union-attr]
        return Deleted(traces=len(traces), spans=len(rows))

    async def _ids(self, sql: str, *args: object) -> list[str]:
        async with self._engine.connect() as sa_conn:
            conn = (await sa_conn.get_raw_connection()).driver_connection
            return [r[0] for r in await conn.fetch(sql, *args)]  # type: ignore[union-attr]

    async def delete_user(self, user_id: str) -> Deleted:
        """Delete every trace that carries this user id."""
        total = Deleted(0, 0)
        while ids := await self._ids("SELECT trace_id FROM traces WHERE user_id = $1 LIMIT $2", user_id, _CHUNK):
            done = await self.delete_traces(ids)
            total = Deleted(total.traces + done.traces, total.spans + done.spans)
        return total

    async def expire(self, *, retention_days: dict[str, float], default_days: float) -> Deleted:
        """Delete traces that ended longer ago than their agent's TTL (0 days: keep forever)."""
        now = datetime.now(UTC)
        total = Deleted(0, 0)
        rules: list[tuple[str, tuple[object, ...]]] = [
            ("agent = $1 AND end_time < $2", (agent, now - timedelta(days=days)))
            for agent, days in retention_days.items()
            if days > 0
        ]
        if default_days > 0:
            rules.append(
                (
                    "agent <> ALL($1::text[]) AND end_time < $2",
                    (list(retention_days), now - timedelta(days=default_days)),
                )
            )
        for where, args in rules:
            sql = f"SELECT trace_id FROM traces WHERE {where} LIMIT {_CHUNK}"  # noqa: S608 - constant clauses
            while ids := await self._ids(sql, *args):
                done = await self.delete_traces(ids)
                total = Deleted(total.traces + done.traces, total.spans + done.spans)
        return total

    async def remove_orphans(self, *, older_than: timedelta) -> int:
        """Delete segment objects no committed index refers to (crash between PUT and commit)."""
        keys = await self._segments.keys_older_than(datetime.now(UTC) - older_than)
        if not keys:
            return 0
        known = set(await self._ids("SELECT key FROM segments WHERE key = ANY($1::text[])", keys))
        orphans = [k for k in keys if k not in known]
        await asyncio.gather(*(self._segments.delete(k) for k in orphans))
        return len(orphans)


async def sweep_forever(
    eraser: Eraser, *, retention_days: dict[str, float], default_days: float, interval_s: float
) -> None:
    """The background retention sweep; a failed round is logged and retried next interval."""
    while True:
        try:
            expired = await eraser.expire(retention_days=retention_days, default_days=default_days)
            orphans = await eraser.remove_orphans(older_than=timedelta(hours=1))
            if expired.traces or orphans:
                log.info("retention sweep", traces=expired.traces, spans=expired.spans, orphan_segments=orphans)
        except Exception as exc:  # noqa: BLE001 - S3 or PostgreSQL away: try again later
            log.warning("retention sweep failed", error=repr(exc))
        await asyncio.sleep(interval_s)
