"""Span index, traces, segments and datasets.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "spans",
        sa.Column("trace_id", sa.String(32), primary_key=True),
        sa.Column("span_id", sa.String(16), primary_key=True),
        sa.Column("parent_span_id", sa.String(16), nullable=False),
        sa.Column("kind", sa.SmallInteger, nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("start_time", TS, nullable=False),
        sa.Column("status", sa.SmallInteger, nullable=False),
        sa.Column("segment", sa.String(256), nullable=False, index=True),
        sa.Column("line", sa.Integer, nullable=False),
    )
    op.create_table(
        "traces",
        sa.Column("trace_id", sa.String(32), primary_key=True),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False, index=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False, index=True),
        sa.Column("start_time", TS, nullable=False),
        sa.Column("end_time", TS, nullable=False),
        sa.Column("span_count", sa.Integer, nullable=False),
        sa.Column("error_count", sa.Integer, nullable=False),
        sa.Column("reward_sum", sa.Float, nullable=False),
        sa.Column("reward_count", sa.Integer, nullable=False),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("task_time", TS, nullable=True),
        sa.Column("response", sa.Text, nullable=False),
        sa.Column("response_rank", sa.SmallInteger, nullable=False),
        sa.Column("response_time", TS, nullable=True),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_traces_agent_start", "traces", ["agent", "start_time", "trace_id"])
    op.create_index("ix_traces_start", "traces", ["start_time", "trace_id"])
    op.create_table(
        "segments",
        sa.Column("key", sa.String(256), primary_key=True),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("spans", sa.Integer, nullable=False),
        sa.Column("live_spans", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "datasets",
        sa.Column("dataset_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("manifest_uri", sa.String(512), nullable=False),
        sa.Column("train_rows", sa.Integer, nullable=False),
        sa.Column("validation_rows", sa.Integer, nullable=False),
        sa.Column("source_traces", sa.Integer, nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    for table in ("datasets", "segments", "traces", "spans"):
        op.drop_table(table)
