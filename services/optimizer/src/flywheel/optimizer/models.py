"""Optimizer tables.

- ``endpoints``: a decision point, its policy (JSON of the PolicySpec) and reward spec.
- ``arms``: its arms with status, traffic cap and all-time counters.
- ``arm_stats``: additive sufficient statistics of each arm's posterior, per segment
  ('' is endpoint-wide) and per time bucket (0 unless the endpoint has a sliding window):
  effective count ``w``, reward sum ``s``, sum of squares ``ss`` and, for linear Thompson
  sampling, ``xtx``/``xty``. Discounted endpoints store them as of ``as_of`` (and of
  ``as_of_decisions`` on the endpoint's decision clock, ``endpoints.decisions_total``) and
  decay them on every update. They only ever change by SQL increments (no read-modify-write).
- ``decisions``: every Select, with the propensity of the chosen arm (for OPE).
- ``applied_feedback``: one row per applied event id; it makes feedback exactly-once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    String,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.core.db import Base


class OptimizerBase(Base):
    __abstract__ = True


class EndpointRow(OptimizerBase):
    __tablename__ = "endpoints"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(String, default="")
    policy_kind: Mapped[str] = mapped_column(String(32))
    # The rest of the PolicySpec (floor, half-life, window, segments, stickiness, features, rules).
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    # {"signal_weights": {...}, "bounded": true}
    reward_spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Remembered so the stability rule can keep it; '' when none.
    incumbent_arm_id: Mapped[str] = mapped_column(String(128), default="")
    # The decision clock: decisions written for this endpoint so far (the DecisionLog adds to it
    # in the statement that inserts them); forgetting by decisions is measured on it.
    decisions_total: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ArmRow(OptimizerBase):
    __tablename__ = "arms"
    __table_args__ = (ForeignKeyConstraint(["endpoint"], ["endpoints.name"], ondelete="CASCADE"),)

    endpoint: Mapped[str] = mapped_column(String(64), primary_key=True)
    arm_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Arms are listed in the order they were declared or added.
    position: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    traffic_cap: Mapped[float] = mapped_column(Float, default=1.0)
    # All-time counters, never discounted.
    pulls: Mapped[int] = mapped_column(BigInteger, default=0)
    reward_sum: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ArmStatsRow(OptimizerBase):
    __tablename__ = "arm_stats"
    __table_args__ = (
        ForeignKeyConstraint(["endpoint", "arm_id"], ["arms.endpoint", "arms.arm_id"], ondelete="CASCADE"),
    )

    endpoint: Mapped[str] = mapped_column(String(64), primary_key=True)
    arm_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    segment: Mapped[str] = mapped_column(String(256), primary_key=True, default="")
    # Start of the time bucket (epoch seconds) for windowed endpoints, else 0.
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True, default=0)
    w: Mapped[float] = mapped_column(Float, default=0.0)
    s: Mapped[float] = mapped_column(Float, default=0.0)
    ss: Mapped[float] = mapped_column(Float, default=0.0)
    xtx: Mapped[list[float] | None] = mapped_column(ARRAY(Float), nullable=True)
    xty: Mapped[list[float] | None] = mapped_column(ARRAY(Float), nullable=True)
    as_of: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # The endpoint's decision clock the values are valid at (``as_of`` in decisions).
    as_of_decisions: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class DecisionRow(OptimizerBase):
    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_endpoint_time", "endpoint", "created_at"),
        Index("ix_decisions_session", "endpoint", "session_id"),
    )

    decision_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    arm_id: Mapped[str] = mapped_column(String(128))
    probability: Mapped[float] = mapped_column(Float)
    user_id: Mapped[str] = mapped_column(String(256), default="")
    session_id: Mapped[str] = mapped_column(String(256), default="")
    segment: Mapped[str] = mapped_column(String(256), default="")
    context: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Feature vector used by linear Thompson sampling (None otherwise).
    features: Mapped[list[float] | None] = mapped_column(ARRAY(Float), nullable=True)
    # A sticky decision repeats the session's arm; its propensity is 1 and OPE skips it.
    sticky: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class AppliedFeedbackRow(OptimizerBase):
    """One row per applied feedback event: the primary key makes updates exactly-once."""

    __tablename__ = "applied_feedback"

    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    decision_id: Mapped[str] = mapped_column(String(64), index=True)
    reward: Mapped[float] = mapped_column(Float)
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


# -- batch optimization runs ---------------------------------------------------------------
#
# - ``runs``: one row per run: its config, state, the search state (JSON, saved with every
#   step so a restarted optimizer resumes where the last one stopped) and its artifacts.
# - ``run_candidates``: every config the search proposed (or a proposer injected).
# - ``run_requests``: every evaluation request published; a request without a result is
#   in flight, and is re-published when the run resumes.
# - ``run_evaluations``: one row per (run, candidate, test case): the primary key is what
#   makes a redelivered or duplicated result count once.


class RunRow(OptimizerBase):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    state: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    search_state: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    generations_total: Mapped[int] = mapped_column(Integer, default=0)
    evaluations_done: Mapped[int] = mapped_column(BigInteger, default=0)
    evaluations_budget: Mapped[int] = mapped_column(BigInteger, default=0)
    best_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    artifacts: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    error: Mapped[str] = mapped_column(String, default="")
    stopped_because: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RunCandidateRow(OptimizerBase):
    __tablename__ = "run_candidates"
    __table_args__ = (ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),)

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    candidate_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    origin: Mapped[str] = mapped_column(String(32), default="search")


class RunRequestRow(OptimizerBase):
    __tablename__ = "run_requests"
    __table_args__ = (
        ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),
        Index("ix_run_requests_pair", "run_id", "candidate_id", "test_case_id", unique=True),
    )

    request_id: Mapped[str] = mapped_column(String(96), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    candidate_id: Mapped[str] = mapped_column(String(64))
    test_case_id: Mapped[str] = mapped_column(String(256))
    published_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RunEvaluationRow(OptimizerBase):
    __tablename__ = "run_evaluations"
    __table_args__ = (ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),)

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    candidate_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    test_case_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(96))
    # Increasing per row, so the run driver folds new results in order and exactly once.
    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=False), unique=True)
    score: Mapped[float] = mapped_column(Float)
    components: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    output: Mapped[str] = mapped_column(String, default="")
    error: Mapped[str] = mapped_column(String, default="")
    trace_id: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RunInjectionRow(OptimizerBase):
    """Configs an outside proposer (the society) sent for a run; the driver injects them into
    the running generation at its next step and marks them applied."""

    __tablename__ = "run_injections"
    __table_args__ = (ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),)

    injection_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    configs: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    origin: Mapped[str] = mapped_column(String(32), default="injected")
    applied: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
