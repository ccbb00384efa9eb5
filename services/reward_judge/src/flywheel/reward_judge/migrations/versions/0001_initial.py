"""Rubrics, judgement cache, judge stats, human labels.

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
        "rubrics",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "judgement_cache",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON, nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_judgement_cache_expires_at", "judgement_cache", ["expires_at"])
    op.create_table(
        "judge_stats",
        sa.Column("judge_id", sa.String(256), primary_key=True),
        sa.Column("judgements", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("fallbacks", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("swap_pairs", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("swap_agree", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "human_labels",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("judge_id", sa.String(256), nullable=False),
        sa.Column("judge_score", sa.Float, nullable=False),
        sa.Column("human_score", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_human_labels_judge_id", "human_labels", ["judge_id"])


def downgrade() -> None:
    op.drop_table("human_labels")
    op.drop_table("judge_stats")
    op.drop_index("ix_judgement_cache_expires_at", "judgement_cache")
    op.drop_table("judgement_cache")
    op.drop_table("rubrics")
