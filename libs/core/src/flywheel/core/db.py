"""PostgreSQL through SQLAlchemy 2 async (asyncpg), one schema per deployment.

The schema is put on the connection's search_path, so models and migrations never
name it: production uses ``public`` (or whatever is configured), each test a fresh one.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase

from flywheel.core.settings import DatabaseSettings


class Base(DeclarativeBase):
    """Declarative base; each service keeps its own MetaData by subclassing it."""


def create_engine(settings: DatabaseSettings) -> AsyncEngine:
    """An async engine whose connections live in the configured schema."""
    return create_async_engine(
        settings.url.get_secret_value(),
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        pool_pre_ping=True,  # a PostgreSQL restart must not leave dead connections in the pool
        connect_args={
            "timeout": 3,
            "server_settings": {
                "search_path": settings.schema_name,
                "statement_timeout": str(settings.statement_timeout_ms),
                "application_name": "flywheel",
            },
        },
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(engine: AsyncEngine, *, timeout_s: float = 2.0) -> None:
    """Raise unless PostgreSQL answers ``select 1`` within the timeout."""

    async def _select_one() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("select 1"))

    await asyncio.wait_for(_select_one(), timeout_s)
