"""A trigram index for QueryTraces' text search (substring of the task, any case).

Revision ID: 0003
Revises: 0002

pg_trgm ships with PostgreSQL's contrib modules. The extension is created once per
database, in its own schema ``flywheel_ext`` (service schemas come and go; an extension
inside one would take every other schema's index with it when dropped), unless it is
installed already, wherever that is. Where the role may not create it (a managed database
without the extension allow-listed), the index is skipped with a warning: text search still
works, as a sequential scan. Once a DBA has installed pg_trgm, the index can be added by
hand: ``CREATE INDEX ix_traces_task_trgm ON traces USING gin (lower(task) gin_trgm_ops)``.
"""

import logging

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

_EXTENSION_SCHEMA = (
    "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_trgm'"
)


def _trigram_schema(bind: sa.Connection) -> str | None:
    schema = bind.exec_driver_sql(_EXTENSION_SCHEMA).scalar()
    if schema is not None:
        return schema
    try:
        with bind.begin_nested():  # a refusal must not abort the migration's transaction
            bind.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS flywheel_ext")
            bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA flywheel_ext")
    except sa.exc.DBAPIError as exc:
        schema = bind.exec_driver_sql(_EXTENSION_SCHEMA).scalar()  # a concurrent migration may have won
        if schema is None:
            log.warning("pg_trgm unavailable (%s); QueryTraces text search stays unindexed", exc.orig)
        return schema
    return bind.exec_driver_sql(_EXTENSION_SCHEMA).scalar()


def upgrade() -> None:
    schema = _trigram_schema(op.get_bind())
    if schema is not None:
        op.execute(f'CREATE INDEX ix_traces_task_trgm ON traces USING gin (lower(task) "{schema}".gin_trgm_ops)')


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_traces_task_trgm")
