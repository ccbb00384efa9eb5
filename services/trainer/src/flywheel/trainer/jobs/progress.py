"""Progress of a running job, from the training thread to the bus and the database.

The training thread must never wait on the network for a report, so reports go into a
bounded queue (the oldest are dropped, and counted, if the bus falls 1,000 steps behind). A
task on the event loop publishes each, in order, as a TrainingProgressEvent on
``flywheel.trainer.progress.<job_id>`` and stores the latest on the job's row, which is what
GetJob (and the CLI's progress bar) reads. A state change (evaluating, succeeded, failed...)
is published only after every step report before it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.subjects import Catalogue
from flywheel.api.trainer.v1 import events_pb2
from flywheel.core.bus.publisher import Publisher
from flywheel.core.logging import get_logger
from flywheel.trainer.jobs import service
from flywheel.trainer.jobs.models import RUNNING

if TYPE_CHECKING:
    from flywheel.trainer.training.progress import Progress

log = get_logger(__name__)
SOURCE = "trainer"
MAX_PENDING = 1000


def progress_metrics(report: Progress) -> dict[str, float]:
    """A step report as the flat metrics map of events and the job row."""
    fields = ("loss", "reward", "kl", "learning_rate", "tokens_per_s", "eta_s", "flat_groups", "groups")
    return service.finite_metrics({name: getattr(report, name) for name in fields})


def progress_event(
    *,
    job_id: str,
    state: str,
    step: int,
    total_steps: int,
    metrics: dict[str, Any] | None = None,
    message: str = "",
    worker: str = "",
) -> events_pb2.TrainingProgressEvent:
    clean = service.finite_metrics(metrics or {})
    event = events_pb2.TrainingProgressEvent(
        meta=EventMeta(event_id=uuid.uuid4().hex, source=f"{SOURCE}/{worker}" if worker else SOURCE),
        job_id=job_id,
        state=service.STATE_VALUES[state],  # type: ignore[arg-type]
        step=step,
        total_steps=total_steps,
        metrics=clean,
        message=message[:2000],
        eta_s=clean.get("eta_s", 0.0),
    )
    event.meta.time.GetCurrentTime()
    return event


class ProgressReporter:
    """Publishes one job's step reports and state changes; ``report`` is thread-safe."""

    def __init__(
        self,
        *,
        job_id: str,
        worker: str,
        sessions: async_sessionmaker[AsyncSession],
        publisher: Publisher,
        catalogue: Catalogue,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.job_id = job_id
        self._worker = worker
        self._sessions = sessions
        self._publisher = publisher
        self._subject = catalogue.training_progress(job_id)
        self._loop = loop
        self._pending: deque[Progress] = deque()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.last: Progress | None = None
        self.dropped = 0

    def start(self) -> None:
        self._task = self._loop.create_task(self._pump(), name=f"progress:{self.job_id}")

    def report(self, progress: Progress) -> None:
        """Called from the training thread at every logged step."""
        if len(self._pending) >= MAX_PENDING:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(progress)  # deque appends and pops are thread-safe
        self.last = progress
        self._loop.call_soon_threadsafe(self._wake.set)

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Publish every pending step report, in order; store the latest on the job row."""
        async with self._lock:
            reports = []
            while self._pending:
                reports.append(self._pending.popleft())
            for report in reports:
                await self._publish(
                    RUNNING, step=report.step, total_steps=report.max_steps, metrics=progress_metrics(report)
                )
            if reports:
                await self._store(reports[-1])

    async def _store(self, report: Progress) -> None:
        try:
            async with self._sessions() as session:
                await service.record_progress(
                    session,
                    job_id=self.job_id,
                    step=report.step,
                    total_steps=report.max_steps,
                    metrics=progress_metrics(report),
                )
                await session.commit()
        except Exception as exc:  # noqa: BLE001 - progress is best effort; the job goes on
            log.warning("could not store progress", job_id=self.job_id, error=repr(exc))

    async def state(
        self, state: str, *, step: int, total_steps: int, metrics: dict[str, Any] | None = None, message: str = ""
    ) -> None:
        """Publish a state change with its message, after the step reports before it."""
        await self.flush()
        async with self._lock:
            await self._publish(state, step=step, total_steps=total_steps, metrics=metrics, message=message)

    async def _publish(
        self, state: str, *, step: int, total_steps: int, metrics: dict[str, Any] | None = None, message: str = ""
    ) -> None:
        event = progress_event(
            job_id=self.job_id,
            state=state,
            step=step,
            total_steps=total_steps,
            metrics=metrics,
            message=message,
            worker=self._worker,
        )
        try:
            await self._publisher.publish(self._subject, event)
        except Exception as exc:  # noqa: BLE001 - the row in PostgreSQL stays the record
            log.warning("could not publish progress", job_id=self.job_id, error=repr(exc))

    async def close(self) -> None:
        """Send what is pending, then stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
