"""Alembic, shared: each service owns its tables and its migrations folder, and keeps
its own version table (``alembic_version_<service>``) so services migrate independently
in one database. Migrations are an explicit step: ``python -m flywheel.<svc> migrate``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command, context
from alembic.config import Config
from sqlalchemy import MetaData, text
from sqlalchemy.engine import Connection

from flywheel.core.db import create_engine
from flywheel.core.settings import DatabaseSettings


def _config(settings: DatabaseSettings, script_location: Path, service: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.attributes["db_settings"] = settings
    cfg.attributes["version_table"] = f"alembic_version_{service}"
    return cfg


def upgrade(settings: DatabaseSettings, *, script_location: Path, service: str, revision: str = "head") -> None:
    """Apply the service's migrations up to ``revision`` (synchronous; not inside a loop)."""
    command.upgrade(_config(settings, script_location, service), revision)


def downgrade(settings: DatabaseSettings, *, script_location: Path, service: str, revision: str) -> None:
    command.downgrade(_config(settings, script_location, service), revision)


def run_env(target_metadata: MetaData) -> None:
    """Body of every service's ``migrations/env.py``: online migrations over asyncpg."""
    cfg = context.config
    settings: DatabaseSettings = cfg.attributes["db_settings"]
    version_table: str = cfg.attributes["version_table"]

    def run(conn: Connection) -> None:
        context.configure(connection=conn, target_metadata=target_metadata, version_table=version_table)
        with context.begin_transaction():
            context.run_migrations()

    async def main() -> None:
        engine = create_engine(settings)
        try:
            async with engine.connect() as conn:
                await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{settings.schema_name}"'))
                await conn.commit()
                await conn.run_sync(run)
                await conn.commit()
        finally:
            await engine.dispose()

    asyncio.run(main())
