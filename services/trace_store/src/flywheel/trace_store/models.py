"""Trace store tables: the decision log and the feedback joined to it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, String, func
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.core.db import Base


class TraceStoreBase(Base):
    __abstract__ = True


class DecisionLogRow(TraceStoreBase):
    __tablename__ = "decision_log"

    decision_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(64), index=True)
    arm_id: Mapped[str] = mapped_column(String(128))
    probability: Mapped[float] = mapped_column(Float)
    user_id: Mapped[str] = mapped_column(String(256))
    context: Mapped[dict[str, Any]] = mapped_column(JSON)
    decided_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class FeedbackLogRow(TraceStoreBase):
    """Feedback by event id; it may arrive before its decision (different streams)."""

    __tablename__ = "feedback_log"

    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    decision_id: Mapped[str] = mapped_column(String(64), index=True)
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    signals: Mapped[dict[str, float]] = mapped_column(JSON)
    sent_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
