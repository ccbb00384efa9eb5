"""Jobs in PostgreSQL: create, read, claim, record progress, finish, cancel, purge.

Keyword-only functions that take the session; the caller commits. State changes that race
(a CancelJob against the runner's finish, two replicas handed the same redelivered job) lock
the row with SELECT ... FOR UPDATE, so the last word is consistent."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.json_format import ParseDict
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.errors import FailedPrecondition, NotFound
from flywheel.trainer.jobs.models import CANCELLED, FAILED, FINAL, QUEUED, RUNNING, SUCCEEDED, JobRow

STATE_VALUES = {
    QUEUED: jobs_pb2.JOB_STATE_QUEUED,
    RUNNING: jobs_pb2.JOB_STATE_RUNNING,
    SUCCEEDED: jobs_pb2.JOB_STATE_SUCCEEDED,
    FAILED: jobs_pb2.JOB_STATE_FAILED,
    CANCELLED: jobs_pb2.JOB_STATE_CANCELLED,
}
STATE_NAMES = {v: k for k, v in STATE_VALUES.items()}


def now() -> datetime:
    return datetime.now(UTC)


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Numbers only, finite only: what a proto map<string, double> and JSON both hold."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


async def create(session: AsyncSession, *, job_id: str, kind: str, spec: dict[str, Any], total_steps: int) -> JobRow:
    row = JobRow(
        job_id=job_id,
        kind=kind,
        spec=spec,
        state=QUEUED,
        step=0,
        total_steps=total_steps,
        metrics={},
        policy_id="",
        error="",
        cancel_requested=False,
        checkpoint_uri="",
        adapter_uri="",
        attempts=0,
        worker="",
    )
    session.add(row)
    await session.flush()
    return row


async def get(session: AsyncSession, *, job_id: str, lock: bool = False) -> JobRow:
    query = select(JobRow).where(JobRow.job_id == job_id)
    if lock:
        query = query.with_for_update()
    row = (await session.execute(query)).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no training job {job_id!r}")
    return row


async def list_jobs(session: AsyncSession, *, state: str = "", limit: int = 100) -> Sequence[JobRow]:
    query = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.job_id).limit(limit)
    if state:
        query = query.where(JobRow.state == state)
    return (await session.execute(query)).scalars().all()


async def mark_queued(session: AsyncSession, *, job_ids: Sequence[str]) -> None:
    await session.execute(update(JobRow).where(JobRow.job_id.in_(job_ids)).values(queued_at=func.now()))


async def unqueued(session: AsyncSession, *, older_than: datetime, limit: int = 100) -> Sequence[JobRow]:
    """Jobs committed but never published (the bus was away): the sweep publishes them."""
    query = (
        select(JobRow)
        .where(JobRow.queued_at.is_(None), JobRow.state == QUEUED, JobRow.created_at < older_than)
        .order_by(JobRow.created_at)
        .limit(limit)
    )
    return (await session.execute(query)).scalars().all()


async def request_cancel(session: AsyncSession, *, job_id: str) -> JobRow:
    """A queued job is cancelled at once (the runner skips it); a running one is asked to
    stop at its next step (it keeps its last checkpoint); a finished one is refused."""
    row = await get(session, job_id=job_id, lock=True)
    if row.state in FINAL:
        raise FailedPrecondition(f"job {job_id} already ended ({row.state}); nothing to cancel")
    if row.state == QUEUED:
        row.state = CANCELLED
        row.finished_at = now()
        row.error = "cancelled before it started"
    row.cancel_requested = True
    row.updated_at = now()
    return row


@dataclass(frozen=True)
class Claim:
    """What the runner should do with a delivered job: ``run`` it (``resume_from`` the stored
    checkpoint when a previous attempt died), or ``skip`` it (already ended or cancelled)."""

    action: str
    row: JobRow
    reason: str = ""


async def claim(session: AsyncSession, *, job_id: str, worker: str, max_attempts: int) -> Claim:
    """Take a delivered job for ``worker``: count the attempt, mark it running."""
    row = await get(session, job_id=job_id, lock=True)
    if row.state in FINAL:
        return Claim("skip", row, f"already {row.state}")
    if row.cancel_requested:
        row.state, row.finished_at, row.updated_at = CANCELLED, now(), now()
        row.error = row.error or "cancelled"
        return Claim("skip", row, "cancelled")
    if row.attempts >= max_attempts:
        row.state, row.finished_at, row.updated_at = FAILED, now(), now()
        row.error = f"gave up after {row.attempts} attempts: the trainer running it died each time (last: {row.worker})"
        return Claim("skip", row, row.error)
    row.attempts += 1
    row.state = RUNNING
    row.worker = worker
    row.started_at = row.started_at or now()
    row.updated_at = now()
    return Claim("run", row)


async def record_progress(
    session: AsyncSession, *, job_id: str, step: int, total_steps: int, metrics: dict[str, Any]
) -> None:
    await session.execute(
        update(JobRow)
        .where(JobRow.job_id == job_id, JobRow.state == RUNNING)
        .values(step=step, total_steps=total_steps, metrics=finite_metrics(metrics), updated_at=func.now())
    )


async def record_checkpoint(session: AsyncSession, *, job_id: str, uri: str) -> None:
    await session.execute(
        update(JobRow).where(JobRow.job_id == job_id).values(checkpoint_uri=uri, updated_at=func.now())
    )


async def is_cancel_requested(session: AsyncSession, *, job_id: str) -> bool:
    value = (await session.execute(select(JobRow.cancel_requested).where(JobRow.job_id == job_id))).scalar()
    return bool(value)


async def finish(
    session: AsyncSession,
    *,
    job_id: str,
    state: str,
    error: str = "",
    policy_id: str = "",
    adapter_uri: str = "",
    metrics: dict[str, Any] | None = None,
    step: int | None = None,
) -> JobRow:
    row = await get(session, job_id=job_id, lock=True)
    row.state = state
    row.error = error[:4000]
    row.policy_id = policy_id or row.policy_id
    row.adapter_uri = adapter_uri or row.adapter_uri
    if metrics is not None:
        row.metrics = {**(row.metrics or {}), **finite_metrics(metrics)}
    if step is not None:
        row.step = step
    row.finished_at = now()
    row.updated_at = now()
    return row


async def purge(session: AsyncSession, *, older_than: timedelta) -> int:
    """Delete finished jobs older than ``older_than`` (their policies keep their lineage)."""
    cutoff = now() - older_than
    result = await session.execute(delete(JobRow).where(JobRow.state.in_(FINAL), JobRow.finished_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)


def _timestamp(field: Any, value: datetime | None) -> None:
    if value is not None:
        field.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))


def job_message(row: JobRow) -> jobs_pb2.TrainingJob:
    """The TrainingJob a client sees."""
    job = jobs_pb2.TrainingJob(
        job_id=row.job_id,
        spec=ParseDict(row.spec, jobs_pb2.TrainingJobSpec(), ignore_unknown_fields=True),
        state=STATE_VALUES[row.state],  # type: ignore[arg-type]
        step=row.step,
        total_steps=row.total_steps,
        metrics=finite_metrics(row.metrics or {}),
        policy_id=row.policy_id,
        error=row.error,
        cancel_requested=row.cancel_requested,
        checkpoint_uri=row.checkpoint_uri,
        adapter_uri=row.adapter_uri,
        attempts=row.attempts,
        worker=row.worker,
    )
    _timestamp(job.created_at, row.created_at)
    _timestamp(job.updated_at, row.updated_at)
    _timestamp(job.started_at, row.started_at)
    _timestamp(job.finished_at, row.finished_at)
    return job
