"""Optimizer tables: endpoints, arms with their posteriors, decisions, applied feedback."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKeyConstraint, Integer, String, func
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.core.db import Base


class OptimizerBase(Base):
    __abstract__ = True


class EndpointRow(OptimizerBase):
    __tablename__ = "endpoints"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(String, default="")
    policy_kind: Mapped[str] = mapped_column(String(32))
    exploration_floor: Mapped[float] = mapped_column(Float, default=0.0)
    # {"signal_weights": {...}, "bounded": true}
    reward_spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ArmRow(OptimizerBase):
    """An arm and its Beta posterior; counters change only by atomic increments."""

    __tablename__ = "arms"
    __table_args__ = (ForeignKeyConstraint(["endpoint"], ["endpoints.name"], ondelete="CASCADE"),)

    endpoint: Mapped[str] = mapped_column(String(64), primary_key=True)
    arm_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Arms are listed in the order they were declared or added.
    position: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    traffic_cap: Mapped[float] = mapped_column(Float, default=1.0)
    alpha: Mapped[float] = mapped_column(Float, default=1.0)
    beta: Mapped[float] = mapped_column(Float, default=1.0)
    pulls: Mapped[int] = mapped_column(Integer, default=0)
    reward_sum: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class DecisionRow(OptimizerBase):
    __tablename__ = "decisions"

    decision_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(64), index=True)
    arm_id: Mapped[str] = mapped_column(String(128))
    probability: Mapped[float] = mapped_column(Float)
    user_id: Mapped[str] = mapped_column(String(256), default="")
    session_id: Mapped[str] = mapped_column(String(256), default="")
    context: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class AppliedFeedbackRow(OptimizerBase):
    """One row per applied feedback event: the primary key is what makes updates exactly-once."""

    __tablename__ = "applied_feedback"

    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    decision_id: Mapped[str] = mapped_column(String(64), index=True)
    reward: Mapped[float] = mapped_column(Float)
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
