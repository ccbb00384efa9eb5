"""Policy registry: versions, per-name version counters, status history.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ACTIVE = 3  # PolicyStatus.POLICY_STATUS_ACTIVE


def upgrade() -> None:
    op.create_table(
        "policy_counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("last_version", sa.Integer, nullable=False),
    )
    op.create_table(
        "policies",
        sa.Column("policy_id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("kind", sa.SmallInteger, nullable=False),
        sa.Column("base_model", sa.Text, nullable=False),
        sa.Column("checkpoint_uri", sa.Text, nullable=False),
        sa.Column("dataset_uri", sa.Text, nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("parent_policy_id", sa.String(64), nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("status", sa.SmallInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("name", "version", name="uq_policies_name_version"),
    )
    op.create_index(
        "uq_policies_one_active", "policies", ["name"], unique=True, postgresql_where=sa.text(f"status = {ACTIVE}")
    )
    op.create_table(
        "policy_history",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("policy_id", sa.String(64), nullable=False, index=True),
        sa.Column("name", sa.String(64), nullable=False, index=True),
        sa.Column("previous_status", sa.SmallInteger, nullable=False),
        sa.Column("status", sa.SmallInteger, nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
    )
    # The outbox sweep looks for unpublished rows only.
    op.create_index(
        "ix_policy_history_unpublished", "policy_history", ["id"], postgresql_where=sa.text("published_at IS NULL")
    )


def downgrade() -> None:
    op.drop_table("policy_history")
    op.drop_index("uq_policies_one_active", table_name="policies")
    op.drop_table("policies")
    op.drop_table("policy_counters")
