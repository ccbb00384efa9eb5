"""Runs one training job per delivered work-queue message.

For each job: claim it in PostgreSQL (count the attempt; skip it if it already ended or was
cancelled), fetch its dataset, base model and reward models, resume from its last checkpoint
in S3 when an earlier attempt died, train in a worker thread while the event loop keeps the
message alive (in-progress acks), publishes progress and watches for CancelJob, upload every
checkpoint as it is written, then hand the result to :mod:`flywheel.trainer.jobs.finish`.

Outcomes, and what happens to the message:
- succeeded, failed (bad data, a trainer error), cancelled: the row says so, acked;
- the replica is stopping (SIGTERM): training stops at its next step after saving a
  checkpoint, and the message is handed back (nak) so another replica resumes it;
- the replica dies (kill -9): nothing is acked, JetStream redelivers after ack_wait.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.subjects import Catalogue
from flywheel.api.trainer.v1.events_pb2 import TrainingJobEvent
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.bus.publisher import Publisher
from flywheel.core.errors import NotFound, describe
from flywheel.core.logging import get_logger
from flywheel.core.objects import ObjectStore
from flywheel.trainer.jobs import service, storage
from flywheel.trainer.jobs.finish import Finisher
from flywheel.trainer.jobs.models import CANCELLED, FAILED, RUNNING
from flywheel.trainer.jobs.progress import ProgressReporter
from flywheel.trainer.jobs.spec import JobRequest, job_from_json
from flywheel.trainer.settings import TrainerSettings

log = get_logger(__name__)


class Draining(Exception):
    """The replica is stopping: the job was checkpointed and goes back on the queue."""


@dataclass
class Prepared:
    """What a job needs on local disk before training starts."""

    job: JobRequest
    train_rows: list[dict[str, Any]]
    validation_rows: list[dict[str, Any]]
    base_model: str  # 'tiny', 'smollm2' or a local path
    manifest_sha256: str
    resume_from: Path | None
    resumed_step: int
    out_dir: Path


def checkpoint_uploader(runner: JobRunner, job_id: str, loop: asyncio.AbstractEventLoop) -> Any:
    """A TrainerCallback: each checkpoint goes to S3 as it is written (in the training thread,
    so training goes on only once it is safe), its URI onto the job row, and the previous one
    is deleted (a job keeps one checkpoint in S3, not one per save). Built on first use, so
    the service starts without importing transformers."""
    from transformers import TrainerCallback

    class CheckpointUploader(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.previous: str | None = None

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not folder.is_dir():
                return
            uri = runner.upload_checkpoint(job_id, folder)
            future = asyncio.run_coroutine_threadsafe(runner.record_checkpoint(job_id, uri), loop)
            future.result(timeout=60)
            if self.previous and self.previous != uri:
                runner.delete_prefix(self.previous)
            self.previous = uri

    return CheckpointUploader()


class JobRunner:
    """The handler of the trainer-jobs work queue (one job at a time per replica)."""

    def __init__(
        self,
        *,
        settings: TrainerSettings,
        sessions: async_sessionmaker[AsyncSession],
        objects: ObjectStore,
        publisher: Publisher,
        catalogue: Catalogue,
        finisher: Finisher,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._objects = objects
        self._publisher = publisher
        self._catalogue = catalogue
        self._finisher = finisher
        self._draining = threading.Event()
        self.worker = settings.worker
        self.checkpoint_bucket = objects.bucket(storage.CHECKPOINTS)

    def drain(self) -> None:
        """Ask the running job (if any) to checkpoint and stop: the replica is stopping."""
        self._draining.set()

    # -- the handler ---------------------------------------------------------------------------

    async def __call__(self, event: TrainingJobEvent, delivery: Delivery) -> None:
        job_id = event.job.job_id
        if not job_id:
            raise Reject("a training job event without job.job_id")
        if self._draining.is_set():
            raise Draining(f"replica {self.worker} is stopping")
        async with self._sessions() as session:
            try:
                claim = await service.claim(
                    session, job_id=job_id, worker=self.worker, max_attempts=self._settings.max_attempts
                )
            except NotFound:
                raise Reject(f"job {job_id} is not in the database (submitted elsewhere, or purged)") from None
            await session.commit()
        loop = asyncio.get_running_loop()
        reporter = ProgressReporter(
            job_id=job_id,
            worker=self.worker,
            sessions=self._sessions,
            publisher=self._publisher,
            catalogue=self._catalogue,
            loop=loop,
        )
        row = claim.row
        if claim.action == "skip":
            log.info("job skipped", job_id=job_id, reason=claim.reason)
            if row.state in (CANCELLED, FAILED) and row.finished_at is not None:
                await reporter.state(row.state, step=row.step, total_steps=row.total_steps, message=claim.reason)
            return
        log.info("job started", job_id=job_id, kind=row.kind, attempt=row.attempts)
        reporter.start()
        await reporter.state(
            RUNNING, step=row.step, total_steps=row.total_steps, message=f"attempt {row.attempts} on {self.worker}"
        )
        try:
            await self._run(job_id, row.spec, row.checkpoint_uri, reporter)
        except Draining:
            await reporter.state(RUNNING, step=_step(reporter), total_steps=row.total_steps, message="handed back")
            raise
        except Exception as exc:  # noqa: BLE001 - the job fails with its reason; the trainer goes on
            reason = describe(exc, limit=2000)
            log.warning("job failed", job_id=job_id, error=reason)
            await self._end(job_id, FAILED, reporter, error=reason)
        finally:
            await reporter.close()

    async def _run(
        self, job_id: str, spec_json: dict[str, Any], checkpoint_uri: str, reporter: ProgressReporter
    ) -> None:
        cancel = threading.Event()
        watcher = asyncio.create_task(self._watch_cancel(job_id, cancel))
        try:
            prepared = await self._prepare(job_id, spec_json, checkpoint_uri)
            if prepared.resume_from is not None:
                await reporter.state(
                    RUNNING,
                    step=prepared.resumed_step,
                    total_steps=0,
                    message=f"resumed from the checkpoint at step {prepared.resumed_step} ({checkpoint_uri})",
                )
            rewards = await self._finisher.rewards(prepared, job_id=job_id, work_dir=self._job_dir(job_id))
            uploader = checkpoint_uploader(self, job_id, asyncio.get_running_loop())
            extra: dict[str, Any] = {}
            if "save_steps" not in prepared.job.hyperparameters:
                extra["save_steps"] = self._settings.save_steps
            if prepared.job.multi_turn_environment:
                extra["multi_turn"] = self._multi_turn(prepared.job)
            spec = prepared.job.train_spec(
                samples=len(prepared.train_rows), rewards=rewards, base_model=prepared.base_model, **extra
            )
            from flywheel.trainer.training.run import train

            result = await asyncio.to_thread(
                train,
                spec,
                prepared.train_rows,
                prepared.out_dir,
                on_progress=reporter.report,
                should_stop=lambda: cancel.is_set() or self._draining.is_set(),
                resume_from=prepared.resume_from,
                callbacks=[uploader],
            )
        finally:
            watcher.cancel()
        if result.stopped and cancel.is_set():
            await self._end(job_id, CANCELLED, reporter, error="cancelled", step=result.global_step)
            return
        if result.stopped:
            raise Draining(f"replica {self.worker} stopped at step {result.global_step}; checkpoint kept")
        outcome = await self._finisher.finish(job_id=job_id, prepared=prepared, result=result, reporter=reporter)
        shutil.rmtree(self._job_dir(job_id), ignore_errors=True)
        log.info("job succeeded", job_id=job_id, policy_id=outcome.policy_id, step=result.global_step)

    async def _prepare(self, job_id: str, spec_json: dict[str, Any], checkpoint_uri: str) -> Prepared:
        from flywheel.trainer.jobs.datasets import check_rows, load_dataset

        job = job_from_json(spec_json, policy=self._settings.policy)
        dataset = await load_dataset(self._objects, job.dataset_uri)
        check_rows(job.kind, dataset.train, dataset.validation)
        base = await self._finisher.local_base(job.base_model)
        folder = self._job_dir(job_id)
        out_dir = folder / "out"
        resume_from, resumed_step = None, 0
        if checkpoint_uri:
            name = checkpoint_uri.rstrip("/").rsplit("/", 1)[-1]
            local = out_dir / "checkpoints" / name
            if local.is_dir():
                shutil.rmtree(local)
            await asyncio.to_thread(storage.download_prefix, self._objects.client, checkpoint_uri, local)
            resume_from = local
            resumed_step = int(name.rsplit("-", 1)[-1]) if name.rsplit("-", 1)[-1].isdigit() else 0
        return Prepared(
            job=job,
            train_rows=dataset.train,
            validation_rows=dataset.validation,
            base_model=base,
            manifest_sha256=dataset.manifest_sha256,
            resume_from=resume_from,
            resumed_step=resumed_step,
            out_dir=out_dir,
        )

    def _multi_turn(self, job: JobRequest) -> Any:
        """The job's simulated user or environment, resolved under the run policy."""
        from flywheel.core.callables import resolve_callable
        from flywheel.trainer.training.spec import MultiTurnSpec

        environment = resolve_callable(
            job.multi_turn_environment, what="spec.multi_turn.environment", policy=self._settings.policy
        )
        return MultiTurnSpec(environment=environment, max_turns=job.multi_turn_max_turns)

    async def _watch_cancel(self, job_id: str, cancel: threading.Event) -> None:
        while not cancel.is_set():
            await asyncio.sleep(self._settings.cancel_poll_s)
            try:
                async with self._sessions() as session:
                    if await service.is_cancel_requested(session, job_id=job_id):
                        cancel.set()
            except Exception as exc:  # noqa: BLE001 - try again next poll
                log.warning("cancel check failed", job_id=job_id, error=repr(exc))

    async def _end(
        self, job_id: str, state: str, reporter: ProgressReporter, *, error: str = "", step: int | None = None
    ) -> None:
        async with self._sessions() as session:
            row = await service.finish(session, job_id=job_id, state=state, error=error, step=step)
            await session.commit()
        await reporter.state(state, step=row.step, total_steps=row.total_steps, message=error)

    # -- files ---------------------------------------------------------------------------------

    def _job_dir(self, job_id: str) -> Path:
        return self._settings.work_dir / "jobs" / job_id

    def upload_checkpoint(self, job_id: str, folder: Path) -> str:
        return storage.upload_dir(self._objects.client, self.checkpoint_bucket, f"jobs/{job_id}/{folder.name}", folder)

    def delete_prefix(self, uri: str) -> None:
        bucket, prefix = storage.split_uri(uri)
        try:
            for obj in self._objects.client.list_objects(bucket, prefix=f"{prefix}/", recursive=True):
                self._objects.client.remove_object(bucket, obj.object_name or "")
        except Exception as exc:  # noqa: BLE001 - an old checkpoint left behind costs space, not correctness
            log.warning("could not delete an old checkpoint", uri=uri, error=repr(exc))

    async def record_checkpoint(self, job_id: str, uri: str) -> None:
        async with self._sessions() as session:
            await service.record_checkpoint(session, job_id=job_id, uri=uri)
            await session.commit()


def _step(reporter: ProgressReporter) -> int:
    return reporter.last.step if reporter.last is not None else 0
