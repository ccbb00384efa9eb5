"""Endpoints, arms with Beta posteriors, decisions, applied feedback.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "endpoints",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("description", sa.String, nullable=False, server_default=""),
        sa.Column("policy_kind", sa.String(32), nullable=False),
        sa.Column("exploration_floor", sa.Float, nullable=False, server_default="0"),
        sa.Column("reward_spec", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "arms",
        sa.Column("endpoint", sa.String(64), sa.ForeignKey("endpoints.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("arm_id", sa.String(128), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("traffic_cap", sa.Float, nullable=False, server_default="1"),
        sa.Column("alpha", sa.Float, nullable=False, server_default="1"),
        sa.Column("beta", sa.Float, nullable=False, server_default="1"),
        sa.Column("pulls", sa.Integer, nullable=False, server_default="0"),
        sa.Column("reward_sum", sa.Float, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "decisions",
        sa.Column("decision_id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(64), nullable=False, index=True),
        sa.Column("arm_id", sa.String(128), nullable=False),
        sa.Column("probability", sa.Float, nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("session_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("context", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "applied_feedback",
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("decision_id", sa.String(64), nullable=False, index=True),
        sa.Column("reward", sa.Float, nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    for table in ("applied_feedback", "decisions", "arms", "endpoints"):
        op.drop_table(table)
