"""Decision log and feedback log.

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
        "decision_log",
        sa.Column("decision_id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(64), nullable=False, index=True),
        sa.Column("arm_id", sa.String(128), nullable=False),
        sa.Column("probability", sa.Float, nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("context", sa.JSON, nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "feedback_log",
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("decision_id", sa.String(64), nullable=False, index=True),
        sa.Column("reward", sa.Float, nullable=True),
        sa.Column("signals", sa.JSON, nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("feedback_log")
    op.drop_table("decision_log")
