"""RLP steps, proposals, experience buffer and policies; SAO rounds and datasets.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _created() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def upgrade() -> None:
    op.create_table(
        "rlp_steps",
        sa.Column("step_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("space_fingerprint", sa.String(64), nullable=False, index=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
        sa.Column("model", sa.String(256), nullable=False, server_default=""),
        sa.Column("context", sa.Text, nullable=False, server_default=""),
        sa.Column("thoughts", sa.JSON, nullable=False),
        _created(),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("run_id", "generation", name="uq_rlp_steps_run_generation"),
    )
    op.create_table(
        "rlp_proposals",
        sa.Column("proposal_id", sa.String(64), primary_key=True),
        sa.Column("step_id", sa.String(64), nullable=False, index=True),
        sa.Column("run_id", sa.String(64), nullable=False, index=True),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("thought_index", sa.Integer, nullable=False),
        sa.Column("config_key", sa.Text, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("predicted_score", sa.Float, nullable=False),
        sa.Column("observed_score", sa.Float, nullable=True),
        sa.Column("generation_median", sa.Float, nullable=True),
        sa.Column("hit", sa.Boolean, nullable=True),
        _created(),
    )
    op.create_table(
        "rlp_experiences",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("space_fingerprint", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("thought_index", sa.Integer, nullable=False),
        sa.Column("context", sa.Text, nullable=False),
        sa.Column("thought", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("reward", sa.Float, nullable=False),
        sa.Column("definition", sa.String(32), nullable=False),
        sa.Column("baseline", sa.Text, nullable=False, server_default=""),
        sa.Column("normalized_reward", sa.Float, nullable=False),
        sa.Column("advantage", sa.Float, nullable=False),
        sa.Column("gae_advantage", sa.Float, nullable=False, server_default="0"),
        _created(),
        sa.UniqueConstraint("step_id", "thought_index", name="uq_rlp_experiences_thought"),
    )
    op.create_index("ix_rlp_experiences_space_id", "rlp_experiences", ["space_fingerprint", "id"])
    op.create_table(
        "rlp_policies",
        sa.Column("space_fingerprint", sa.String(64), primary_key=True),
        sa.Column("normalizer", sa.JSON, nullable=False),
        sa.Column("policy_model", sa.String(256), nullable=False, server_default=""),
        sa.Column("training_job_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("trained_at_size", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "sao_rounds",
        sa.Column("round_id", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("dataset_id", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("rounds", sa.JSON, nullable=False),
        sa.Column("error", sa.Text, nullable=False, server_default=""),
        _created(),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "sao_datasets",
        sa.Column("dataset_id", sa.String(128), primary_key=True),
        sa.Column("manifest_uri", sa.Text, nullable=False),
        sa.Column("train_rows", sa.Integer, nullable=False),
        sa.Column("validation_rows", sa.Integer, nullable=False),
        sa.Column("unique_prompts", sa.Integer, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("stats", sa.JSON, nullable=False),
        sa.Column("training_job_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("run_id", sa.String(64), nullable=False, server_default=""),
        _created(),
    )
    op.create_index("ix_sao_datasets_created_at", "sao_datasets", ["created_at"])


def downgrade() -> None:
    for table in ("sao_datasets", "sao_rounds", "rlp_policies", "rlp_experiences", "rlp_proposals", "rlp_steps"):
        op.drop_table(table)
