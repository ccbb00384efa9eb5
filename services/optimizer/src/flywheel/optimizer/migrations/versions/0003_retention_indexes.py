"""Indexes for the retention sweep (flywheel.optimizer.retention): it deletes by age.

``decisions`` had (endpoint, created_at), which an age-only scan cannot use; the sweep's
chunks would each scan the table. Built CONCURRENTLY so writers are not blocked.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_decisions_created_at", "decisions", ["created_at"]),
    ("ix_applied_feedback_applied_at", "applied_feedback", ["applied_at"]),
    ("ix_runs_updated_at", "runs", ["updated_at"]),
)


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, table, columns in INDEXES:
            op.create_index(name, table, columns, postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name, table, _ in INDEXES:
            op.drop_index(name, table_name=table, postgresql_concurrently=True, if_exists=True)
