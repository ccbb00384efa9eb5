"""PostgreSQL through SQLAlchemy 2 async (asyncpg), one schema per deployment.

The schema is put on the connection's search_path, so models and migrations never
name it: production uses ``public`` (or whatever is configured), each test a fresh one.

A pooled connection is checked before it is handed out only when it may have gone stale: one
the driver knows is closed (PostgreSQL restarted or ended it) is replaced at once, and one idle
for longer than ``ping_idle_s`` is pinged first. ``pool_pre_ping`` pinged every checkout: three
round trips (BEGIN, ``;``, ROLLBACK through SQLAlchemy's asyncpg adapter) in front of every
feedback batch's transaction, while a connection checked in moments ago is as alive as its last
statement showed. A connection that dies while in use fails its statement with a disconnect
error; SQLAlchemy then invalidates it and every connection older than it, as with pre-ping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import event, exc, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase

from flywheel.core.settings import DatabaseSettings

# A pooled connection idle longer than this (seconds) is pinged before it is handed out.
PING_IDLE_S = 1.0
_CHECKED_IN = "flywheel_checked_in"  # connection record info key: monotonic time of the last checkin


class Base(DeclarativeBase):
    """Declarative base; each service keeps its own MetaData by subclassing it."""


def create_engine(settings: DatabaseSettings, *, ping_idle_s: float | None = PING_IDLE_S) -> AsyncEngine:
    """An async engine whose connections live in the configured schema. Pooled connections are
    pinged before use when idle for longer than ``ping_idle_s`` (0: at every checkout, as
    ``pool_pre_ping``; None: never, only the driver's closed flag is checked)."""
    engine = create_async_engine(
        settings.url.get_secret_value(),
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        connect_args={
            "timeout": 3,
            "server_settings": {
                "search_path": settings.schema_name,
                "statement_timeout": str(settings.statement_timeout_ms),
                "application_name": "flywheel",
            },
        },
    )
    _check_on_checkout(engine, ping_idle_s)
    return engine


def _check_on_checkout(engine: AsyncEngine, ping_idle_s: float | None) -> None:
    """A PostgreSQL restart must not leave dead connections in the pool (see the module's doc)."""
    pool = engine.sync_engine.pool
    dialect = engine.sync_engine.dialect

    @event.listens_for(pool, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info[_CHECKED_IN] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and driver.is_closed():
            # Closed under us (PostgreSQL restarted): replace it, and every connection as old.
            raise exc.InvalidatePoolError("the pooled connection was closed")
        last = record.info.get(_CHECKED_IN)
        if last is None or ping_idle_s is None or time.monotonic() - last <= ping_idle_s:
            return  # new (just connected), or in use moments ago
        try:
            dialect.do_ping(dbapi_connection)  # runs in SQLAlchemy's greenlet: awaits the driver
        except Exception as error:
            raise exc.InvalidatePoolError(f"the pooled connection did not answer a ping: {error!r}") from error


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(engine: AsyncEngine, *, timeout_s: float = 2.0) -> None:
    """Raise unless PostgreSQL answers ``select 1`` within the timeout."""

    async def _select_one() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("select 1"))

    await asyncio.wait_for(_select_one(), timeout_s)
