"""The judgement cache: judgements by content hash, with a time to live.

In PostgreSQL so every replica shares it. Only judgements of the judge that was asked
for are cached; a fallback's answer is not, so the next request tries the LLM again."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.reward_judge.metrics import CACHE


def content_key(*parts: Any) -> str:
    """SHA-256 of the parts' canonical JSON: the same inputs give the same key on any replica."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class JudgementCache(Protocol):
    async def get(self, key: str) -> dict[str, Any] | None: ...
    async def put(self, key: str, value: dict[str, Any]) -> None: ...


class NoCache:
    """Caching off."""

    async def get(self, key: str) -> dict[str, Any] | None:
        return None

    async def put(self, key: str, value: dict[str, Any]) -> None:
        return None


class MemoryCache:
    """In-process cache (tests, the calibration script)."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl = ttl_s
        self._items: dict[str, tuple[float, dict[str, Any]]] = {}

    async def get(self, key: str) -> dict[str, Any] | None:
        hit = self._items.get(key)
        if hit is None or hit[0] < time.monotonic():
            CACHE.labels("miss").inc()
            return None
        CACHE.labels("hit").inc()
        return hit[1]

    async def put(self, key: str, value: dict[str, Any]) -> None:
        self._items[key] = (time.monotonic() + self._ttl, value)


_GET = text("SELECT value FROM judgement_cache WHERE key = :key AND expires_at > now()")
_PUT = text(
    "INSERT INTO judgement_cache (key, value, expires_at) VALUES (:key, CAST(:value AS json), :expires_at) "
    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at"
)
# In chunks (short transactions, like flywheel.core.retention): a week of expired rows
# in one statement would hold its locks for as long as it takes.
_PURGE_CHUNK = 5000
_PURGE = text(
    "DELETE FROM judgement_cache WHERE ctid = ANY(ARRAY("
    "SELECT ctid FROM judgement_cache WHERE expires_at <= now() LIMIT :n))"
)


class PostgresCache:
    """The shared cache; expired rows are ignored on read and purged in the background."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl_s: float) -> None:
        self._sessions = sessions
        self._ttl = timedelta(seconds=ttl_s)

    async def get(self, key: str) -> dict[str, Any] | None:
        async with self._sessions() as s:
            value = (await s.execute(_GET, {"key": key})).scalar_one_or_none()
        CACHE.labels("hit" if value is not None else "miss").inc()
        return value

    async def put(self, key: str, value: dict[str, Any]) -> None:
        async with self._sessions() as s, s.begin():
            await s.execute(_PUT, {"key": key, "value": json.dumps(value), "expires_at": datetime.now(UTC) + self._ttl})

    async def purge(self) -> int:
        """Delete expired judgements; returns how many went."""
        total = 0
        while True:
            async with self._sessions() as s, s.begin():
                result = await s.execute(_PURGE, {"n": _PURGE_CHUNK})
            deleted = int(result.rowcount or 0)  # type: ignore[attr-defined]
            total += deleted
            if deleted < _PURGE_CHUNK:
                return total
