"""The training_jobs table: one row per submitted job, its state and where its files are."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Index, Integer, String, Text, func, text
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.trainer.registry.models import TrainerBase

# JobState values (flywheel.api.trainer.v1.JobState), stored as their names' suffixes.
QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
FINAL = (SUCCEEDED, FAILED, CANCELLED)


class JobRow(TrainerBase):
    """A training job. ``spec`` is the submitted TrainingJobSpec as proto3 JSON; ``queued_at``
    is set once the job is on the work queue (an outbox: a job committed but not published,
    the bus being away, is published again by the sweep)."""

    __tablename__ = "training_jobs"
    __table_args__ = (
        Index("ix_training_jobs_created", "created_at"),
        Index("ix_training_jobs_unqueued", "job_id", postgresql_where=text("queued_at IS NULL")),
    )

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer, default=0)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    policy_id: Mapped[str] = mapped_column(String(64), default="")
    error: Mapped[str] = mapped_column(Text, default="")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    checkpoint_uri: Mapped[str] = mapped_column(Text, default="")
    adapter_uri: Mapped[str] = mapped_column(Text, default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
