"""Retention of append-only tables: delete rows older than a TTL, in bounded chunks.

Each chunk is its own short transaction (``DELETE .. WHERE ctid = ANY(ARRAY(SELECT ctid ..
LIMIT n))``) with a ``lock_timeout``, so a sweep never holds locks for long or waits long
behind a writer, and a per-table advisory lock keeps replicas from sweeping the same table
at once (the one that does not get it skips that table this round). The sweep is
``sweep_forever``: a failed round is logged and tried again next interval.

Services list their tables as :class:`Rule` s; the trace store's traces, which also live
in S3 segments, have their own eraser (flywheel.trace_store.retention).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from flywheel.api.subjects import Catalogue
from flywheel.core.logging import get_logger

log = get_logger(__name__)
_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def stream_max_age_days(*areas: str) -> float:
    """The longest JetStream max age, in days, of the streams carrying these subject areas
    (``"product.feedback"``, ``"optimizer.decision"``): a table that deduplicates those
    events by id must keep its rows at least this long, or a redelivery is stored twice."""
    ages = [
        spec.max_age.total_seconds() / 86400
        for spec in Catalogue().streams.values()
        if any(f".{area}." in subject for area in areas for subject in spec.subjects)
    ]
    if not ages:
        raise ValueError(f"no stream carries {areas}")
    return max(ages)


@dataclass(frozen=True)
class Rule:
    """Rows of ``table`` whose ``column`` (a timestamptz) is older than ``days`` go.

    ``days`` 0 keeps them forever. ``where`` is an extra constant SQL condition (e.g. only
    finished runs); ``chunk`` rows per transaction (smaller where a row cascades to many).
    """

    table: str
    column: str
    days: float
    where: str = ""
    chunk: int = 5000

    def __post_init__(self) -> None:
        for name in (self.table, self.column):
            if not _IDENT.fullmatch(name):
                raise ValueError(f"retention rule: {name!r} is not a plain SQL identifier")
        if self.days < 0 or self.chunk < 1:
            raise ValueError(f"retention rule for {self.table}: days must be >= 0 and chunk >= 1")


async def delete_older_than(
    engine: AsyncEngine,
    rule: Rule,
    *,
    now: datetime | None = None,
    lock_timeout_ms: int = 2000,
    max_chunks: int | None = None,
) -> int:
    """Delete the rule's expired rows chunk by chunk; returns how many went. Stops early
    when another replica holds the table's sweep lock (it is sweeping it)."""
    if rule.days <= 0:
        return 0
    cutoff = (now or datetime.now(UTC)) - timedelta(days=rule.days)
    extra = f" AND ({rule.where})" if rule.where else ""
    # Identifiers are checked in Rule; values are bound.
    delete = text(
        f"DELETE FROM {rule.table} WHERE ctid = ANY(ARRAY("  # noqa: S608
        f"SELECT ctid FROM {rule.table} WHERE {rule.column} < :cutoff{extra} LIMIT :n))"
    )
    total = chunks = 0
    while max_chunks is None or chunks < max_chunks:
        async with engine.begin() as conn:
            await conn.execute(text(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}"))
            got = await conn.scalar(
                text("SELECT pg_try_advisory_xact_lock(hashtext(:key))"), {"key": f"flywheel.retention.{rule.table}"}
            )
            if not got:
                break
            deleted = (await conn.execute(delete, {"cutoff": cutoff, "n": rule.chunk})).rowcount or 0
        total += deleted
        chunks += 1
        if deleted < rule.chunk:
            break
        await asyncio.sleep(0)  # let the service's own work in between chunks
    return total


async def sweep(engine: AsyncEngine, rules: Sequence[Rule], *, now: datetime | None = None) -> dict[str, int]:
    """One round over every rule: rows deleted per table."""
    return {rule.table: await delete_older_than(engine, rule, now=now) for rule in rules}


async def sweep_forever(engine: AsyncEngine, rules: Sequence[Rule], *, interval_s: float, service: str) -> None:
    """The background retention task of a service; a failed round is retried next interval."""
    if not any(r.days > 0 for r in rules):
        return
    while True:
        try:
            deleted = await sweep(engine, rules)
            if any(deleted.values()):
                log.info("retention sweep", service=service, **{f"deleted_{k}": v for k, v in deleted.items()})
        except Exception as exc:  # noqa: BLE001 - PostgreSQL away or a lock held: try next time
            log.warning("retention sweep failed", service=service, error=repr(exc))
        await asyncio.sleep(interval_s)
