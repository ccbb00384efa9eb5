"""Indexes for the log retention sweep (decision_log, feedback_log deleted by age).

Built CONCURRENTLY so ingestion is not blocked.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_decision_log_recorded_at", "decision_log", ["recorded_at"]),
    ("ix_feedback_log_recorded_at", "feedback_log", ["recorded_at"]),
)


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, table, columns in INDEXES:
            op.create_index(name, table, columns, postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name, table, _ in INDEXES:
            op.drop_index(name, table_name=table, postgresql_concurrently=True, if_exists=True)
