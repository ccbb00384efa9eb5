"""Endpoints, arms, additive arm statistics, decisions, applied feedback.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _times() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    ]


def upgrade() -> None:
    op.create_table(
        "endpoints",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("description", sa.String, nullable=False, server_default=""),
        sa.Column("policy_kind", sa.String(32), nullable=False),
        sa.Column("policy", sa.JSON, nullable=False),
        sa.Column("reward_spec", sa.JSON, nullable=False),
        sa.Column("incumbent_arm_id", sa.String(128), nullable=False, server_default=""),
        *_times(),
    )
    op.create_table(
        "arms",
        sa.Column("endpoint", sa.String(64), sa.ForeignKey("endpoints.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("arm_id", sa.String(128), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("traffic_cap", sa.Float, nullable=False, server_default="1"),
        sa.Column("pulls", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("reward_sum", sa.Float, nullable=False, server_default="0"),
        *_times(),
    )
    op.create_table(
        "arm_stats",
        sa.Column("endpoint", sa.String(64), primary_key=True),
        sa.Column("arm_id", sa.String(128), primary_key=True),
        sa.Column("segment", sa.String(256), primary_key=True, server_default=""),
        sa.Column("bucket", sa.BigInteger, primary_key=True, server_default="0"),
        sa.Column("w", sa.Float, nullable=False, server_default="0"),
        sa.Column("s", sa.Float, nullable=False, server_default="0"),
        sa.Column("ss", sa.Float, nullable=False, server_default="0"),
        sa.Column("xtx", ARRAY(sa.Float), nullable=True),
        sa.Column("xty", ARRAY(sa.Float), nullable=True),
        sa.Column("as_of", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.ForeignKeyConstraint(["endpoint", "arm_id"], ["arms.endpoint", "arms.arm_id"], ondelete="CASCADE"),
    )
    op.create_table(
        "decisions",
        sa.Column("decision_id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("arm_id", sa.String(128), nullable=False),
        sa.Column("probability", sa.Float, nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("session_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("segment", sa.String(256), nullable=False, server_default=""),
        sa.Column("context", sa.JSON, nullable=False),
        sa.Column("features", ARRAY(sa.Float), nullable=True),
        sa.Column("sticky", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_decisions_endpoint_time", "decisions", ["endpoint", "created_at"])
    op.create_index("ix_decisions_session", "decisions", ["endpoint", "session_id"])
    op.create_table(
        "applied_feedback",
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("decision_id", sa.String(64), nullable=False, index=True),
        sa.Column("reward", sa.Float, nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    for table in ("applied_feedback", "decisions", "arm_stats", "arms", "endpoints"):
        op.drop_table(table)
