"""The decision clock: forgetting measured in an endpoint's decisions (policies/drift.py).

``endpoints.decisions_total`` counts the decisions the DecisionLog has written for the
endpoint (incremented in the statement that inserts them); ``arm_stats.as_of_decisions`` is
the clock a row's evidence is valid at, as ``as_of`` is its time. Both start at 0, so rows
written before this revision are valid at clock 0, which is where the clock starts too.
Adding a column with a constant default is a catalog change in PostgreSQL 11+: no rewrite.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("decisions_total", sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("arm_stats", sa.Column("as_of_decisions", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("arm_stats", "as_of_decisions")
    op.drop_column("endpoints", "decisions_total")
