"""Trace store tables: the decision log and feedback, the span index, traces, segments and datasets."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, Integer, SmallInteger, String, Text, func
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


class SpanRow(TraceStoreBase):
    """Index row of one span; the span itself lives in a segment object (``segment``, ``line``).

    Keyed by (trace_id, span_id), so a redelivered span is stored once."""

    __tablename__ = "spans"

    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    span_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    parent_span_id: Mapped[str] = mapped_column(String(16))
    kind: Mapped[int] = mapped_column(SmallInteger)
    agent: Mapped[str] = mapped_column(String(64))
    start_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[int] = mapped_column(SmallInteger)
    segment: Mapped[str] = mapped_column(String(256), index=True)
    line: Mapped[int] = mapped_column(Integer)


class TraceRow(TraceStoreBase):
    """One row per trace, folded from its spans as they arrive (counts and sums are SQL
    increments, so redelivery never counts a span twice: only newly inserted spans add)."""

    __tablename__ = "traces"

    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    agent: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(256), index=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    decision_id: Mapped[str] = mapped_column(String(64), index=True)
    start_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    end_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    span_count: Mapped[int] = mapped_column(Integer)
    error_count: Mapped[int] = mapped_column(Integer)
    reward_sum: Mapped[float] = mapped_column(Float)
    reward_count: Mapped[int] = mapped_column(Integer)
    task: Mapped[str] = mapped_column(Text)
    task_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    response: Mapped[str] = mapped_column(Text)
    response_rank: Mapped[int] = mapped_column(SmallInteger)
    response_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class SegmentRow(TraceStoreBase):
    """A segment object (compressed JSONL of spans) whose index rows are committed."""

    __tablename__ = "segments"

    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent: Mapped[str] = mapped_column(String(64))
    day: Mapped[str] = mapped_column(String(10))
    spans: Mapped[int] = mapped_column(Integer)
    live_spans: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class DatasetRow(TraceStoreBase):
    """An exported dataset: where its manifest is and how many rows it has."""

    __tablename__ = "datasets"

    dataset_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    manifest_uri: Mapped[str] = mapped_column(String(512))
    train_rows: Mapped[int] = mapped_column(Integer)
    validation_rows: Mapped[int] = mapped_column(Integer)
    source_traces: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
