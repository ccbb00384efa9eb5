"""The society's tables: RLP steps, proposals and the experience buffer; SAO rounds and
datasets. Everything RLP learns lives here, so a restarted society (or another replica)
goes on where it was, and runs over the same search space share one buffer."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, Index, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.core.db import Base


class SocietyBase(Base):
    __abstract__ = True


class RlpStepRow(SocietyBase):
    """One RLP step: the thoughts written before one generation of one run. ``state`` goes
    proposed -> rewarded, or failed with ``reason`` (the model answered prose, nothing, timed
    out...). Unique per (run, generation): a redelivered progress event makes no second step."""

    __tablename__ = "rlp_steps"

    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    generation: Mapped[int] = mapped_column(Integer)
    space_fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16))  # proposed | rewarded | failed
    reason: Mapped[str] = mapped_column(Text, default="")  # failure kind: llm_timeout, no_prediction...
    detail: Mapped[str] = mapped_column(Text, default="")
    model: Mapped[str] = mapped_column(String(256), default="")
    # The prompt the thoughts were written for (the "context" of the information gain).
    context: Mapped[str] = mapped_column(Text, default="")
    # [{"text": ..., "proposals": [{"params", "predicted_score", "sigma", "key"}]}]
    thoughts: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    resolved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    __table_args__ = (UniqueConstraint("run_id", "generation", name="uq_rlp_steps_run_generation"),)


class RlpProposalRow(SocietyBase):
    """A config an RLP thought proposed and that was sent to the run; its observed score and
    whether it beat its generation's median once the generation's results are in."""

    __tablename__ = "rlp_proposals"

    proposal_id: Mapped[str] = mapped_column(String(64), primary_key=True)  # the ProposalEvent's event id
    step_id: Mapped[str] = mapped_column(String(64), index=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    generation: Mapped[int] = mapped_column(Integer)
    thought_index: Mapped[int] = mapped_column(Integer)
    config_key: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    predicted_score: Mapped[float] = mapped_column(Float)
    observed_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    generation_median: Mapped[float | None] = mapped_column(Float, nullable=True)
    hit: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RlpExperienceRow(SocietyBase):
    """One rewarded thought: the experience buffer. At most ``buffer_size`` per search space
    (the oldest go first); few-shot examples and GRPO datasets are drawn from it."""

    __tablename__ = "rlp_experiences"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    space_fingerprint: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str] = mapped_column(String(64))
    generation: Mapped[int] = mapped_column(Integer)
    step_id: Mapped[str] = mapped_column(String(64))
    thought_index: Mapped[int] = mapped_column(Integer)
    context: Mapped[str] = mapped_column(Text)
    thought: Mapped[str] = mapped_column(Text)
    # The observed results written as text (the outcome whose likelihood is the reward).
    outcome: Mapped[str] = mapped_column(Text)
    reward: Mapped[float] = mapped_column(Float)
    # "logprobs", "prediction_gain" or "prediction_loglik", and the baseline used.
    definition: Mapped[str] = mapped_column(String(32))
    baseline: Mapped[str] = mapped_column(Text, default="")
    normalized_reward: Mapped[float] = mapped_column(Float)
    # A = G/(G-1) (r - mean r) within the step's group, and GAE over the run's generations.
    advantage: Mapped[float] = mapped_column(Float)
    gae_advantage: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        UniqueConstraint("step_id", "thought_index", name="uq_rlp_experiences_thought"),
        Index("ix_rlp_experiences_space_id", "space_fingerprint", "id"),
    )


class RlpPolicyRow(SocietyBase):
    """Per search space: the reward normaliser's running state and the reasoning policy in use
    (the base model, or the adapter a GRPO job trained on this space's buffer)."""

    __tablename__ = "rlp_policies"

    space_fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    normalizer: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    policy_model: Mapped[str] = mapped_column(String(256), default="")
    training_job_id: Mapped[str] = mapped_column(String(64), default="")
    # Buffer size when the last GRPO job was submitted (the next waits for enough new ones).
    trained_at_size: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class SaoRoundRow(SocietyBase):
    """An SAO round queued by StartSaoRound or a run: queued -> running -> succeeded | failed."""

    __tablename__ = "sao_rounds"

    round_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    dataset_id: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[str] = mapped_column(String(64), default="")
    # What was asked: SaoConfig fields, endpoint, train.
    request: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # RoundStats.to_dict() per iterative round.
    rounds: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class SaoDatasetRow(SocietyBase):
    """A registered SAO dataset: its manifest in S3 (the trace store's export format)."""

    __tablename__ = "sao_datasets"

    dataset_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    manifest_uri: Mapped[str] = mapped_column(Text)
    train_rows: Mapped[int] = mapped_column(Integer)
    validation_rows: Mapped[int] = mapped_column(Integer)
    unique_prompts: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))  # sao | import
    stats: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    training_job_id: Mapped[str] = mapped_column(String(64), default="")
    run_id: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)
