"""Batch optimization runs: runs, candidates, published requests, evaluations, injections.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False, server_default=""),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("search_state", sa.JSON, nullable=True),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
        sa.Column("generations_total", sa.Integer, nullable=False, server_default="0"),
        sa.Column("evaluations_done", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("evaluations_budget", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("best_score", sa.Float, nullable=True),
        sa.Column("best_config", sa.JSON, nullable=True),
        sa.Column("artifacts", sa.JSON, nullable=False, server_default="{}"),
        sa.Column("error", sa.String, nullable=False, server_default=""),
        sa.Column("stopped_because", sa.String(256), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_runs_state", "runs", ["state"])
    op.create_table(
        "run_candidates",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("candidate_id", sa.String(64), primary_key=True),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("origin", sa.String(32), nullable=False, server_default="search"),
    )
    op.create_table(
        "run_requests",
        sa.Column("request_id", sa.String(96), primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
        sa.Column("candidate_id", sa.String(64), nullable=False),
        sa.Column("test_case_id", sa.String(256), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_run_requests_pair", "run_requests", ["run_id", "candidate_id", "test_case_id"], unique=True)
    op.create_table(
        "run_evaluations",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("candidate_id", sa.String(64), primary_key=True),
        sa.Column("test_case_id", sa.String(256), primary_key=True),
        sa.Column("request_id", sa.String(96), nullable=False),
        sa.Column("seq", sa.BigInteger, sa.Identity(always=False), nullable=False, unique=True),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("components", sa.JSON, nullable=False, server_default="{}"),
        sa.Column("latency_ms", sa.Float, nullable=False, server_default="0"),
        sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
        sa.Column("output", sa.String, nullable=False, server_default=""),
        sa.Column("error", sa.String, nullable=False, server_default=""),
        sa.Column("trace_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "run_injections",
        sa.Column("injection_id", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
        sa.Column("configs", sa.JSON, nullable=False),
        sa.Column("origin", sa.String(32), nullable=False, server_default="injected"),
        sa.Column("applied", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    for table in ("run_injections", "run_evaluations", "run_requests", "run_candidates", "runs"):
        op.drop_table(table)
