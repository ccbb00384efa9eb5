"""Where a policy version is served: the optimizer endpoint and arm it was enrolled in as a
canary, and the model name the model server serves its adapter under.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for column in ("endpoint", "arm_id", "served_model"):
        op.add_column("policies", sa.Column(column, sa.Text, nullable=False, server_default=""))
    # The canary follower reads the enrolled versions every few seconds.
    op.create_index("ix_policies_served_endpoint", "policies", ["endpoint"], postgresql_where=sa.text("endpoint <> ''"))


def downgrade() -> None:
    op.drop_index("ix_policies_served_endpoint", table_name="policies")
    for column in ("served_model", "arm_id", "endpoint"):
        op.drop_column("policies", column)
