"""Policy registry tables: versions, a per-name version counter, and the status history."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.core.db import Base
from flywheel.trainer.registry.rules import Status


class TrainerBase(Base):
    __abstract__ = True


class PolicyCounterRow(TrainerBase):
    """The last version number given out per name. Incremented in the registering transaction
    and never decremented, so a number is never reused, even after versions are deleted; its
    row lock also serialises status changes of one name."""

    __tablename__ = "policy_counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_version: Mapped[int] = mapped_column(Integer)


class PolicyRow(TrainerBase):
    __tablename__ = "policies"
    __table_args__ = (
        UniqueConstraint("name", "version", name="uq_policies_name_version"),
        # One active version per name, enforced by the database as well as by the rules.
        Index(
            "uq_policies_one_active",
            "name",
            unique=True,
            postgresql_where=text(f"status = {int(Status.ACTIVE)}"),
        ),
        # The canary follower's scan (migration 0003).
        Index("ix_policies_served_endpoint", "endpoint", postgresql_where=text("endpoint <> ''")),
    )

    policy_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[int] = mapped_column(SmallInteger)
    base_model: Mapped[str] = mapped_column(Text)
    checkpoint_uri: Mapped[str] = mapped_column(Text)
    dataset_uri: Mapped[str] = mapped_column(Text)
    job_id: Mapped[str] = mapped_column(String(64))
    parent_policy_id: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[int] = mapped_column(SmallInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Where the version is served (migration 0003): its canary arm, and the model name the
    # model server serves its adapter under; empty until it is enrolled.
    endpoint: Mapped[str] = mapped_column(Text, server_default="", default="")
    arm_id: Mapped[str] = mapped_column(Text, server_default="", default="")
    served_model: Mapped[str] = mapped_column(Text, server_default="", default="")


class PolicyHistoryRow(TrainerBase):
    """Append-only: every status a version took (registration included), who, why and when.
    ``published_at`` is set once its PolicyChangedEvent is on the bus (an outbox: rows left
    unpublished by a crash or a bus outage are published again)."""

    __tablename__ = "policy_history"
    __table_args__ = (Index("ix_policy_history_unpublished", "id", postgresql_where=text("published_at IS NULL")),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    policy_id: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    previous_status: Mapped[int] = mapped_column(SmallInteger)
    status: Mapped[int] = mapped_column(SmallInteger)
    # The event's id and JetStream dedup id: a republished change is stored once.
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    actor: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
