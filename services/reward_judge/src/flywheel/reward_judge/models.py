"""Reward judge tables.

- ``rubrics``: custom rubrics, one row per version (the presets are package data).
- ``judgement_cache``: judgements by content hash with an expiry, shared by replicas.
- ``judge_stats``: per judge, counters only ever changed by SQL increments.
- ``human_labels``: a judge's score beside a human's, for rank correlation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, Integer, String, func
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.core.db import Base


class JudgeBase(Base):
    __abstract__ = True


class RubricRow(JudgeBase):
    __tablename__ = "rubrics"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class CacheRow(JudgeBase):
    __tablename__ = "judgement_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class JudgeStatsRow(JudgeBase):
    __tablename__ = "judge_stats"

    judge_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    judgements: Mapped[int] = mapped_column(BigInteger, default=0)
    fallbacks: Mapped[int] = mapped_column(BigInteger, default=0)
    swap_pairs: Mapped[int] = mapped_column(BigInteger, default=0)
    swap_agree: Mapped[int] = mapped_column(BigInteger, default=0)


class HumanLabelRow(JudgeBase):
    __tablename__ = "human_labels"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    judge_id: Mapped[str] = mapped_column(String(256), index=True)
    judge_score: Mapped[float] = mapped_column(Float)
    human_score: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
