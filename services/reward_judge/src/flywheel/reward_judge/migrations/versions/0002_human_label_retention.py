"""Index for the human-label retention sweep (human_labels deleted by age).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_human_labels_created_at",
            "human_labels",
            ["created_at"],
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_human_labels_created_at", table_name="human_labels", postgresql_concurrently=True, if_exists=True
        )
