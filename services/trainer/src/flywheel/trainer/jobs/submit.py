"""SubmitJob: check a job (at the door, then against its data and the registry), estimate
it for a dry run, or store it and put it on the work queue.

Storing comes first, publishing second: a job committed while the bus is away has no
``queued_at`` and the sweep publishes it later; JetStream deduplicates on the job id, so a
job published twice is run once (and the runner's claim skips a job that already ended)."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.subjects import Catalogue
from flywheel.api.trainer.v1 import events_pb2, jobs_pb2
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.core.bus.publisher import Publisher
from flywheel.core.errors import NotFound
from flywheel.core.logging import get_logger
from flywheel.core.objects import ObjectStore
from flywheel.core.validation import Invalid
from flywheel.trainer.jobs import service, storage
from flywheel.trainer.jobs.finish import reward_policy_problem
from flywheel.trainer.jobs.models import JobRow
from flywheel.trainer.jobs.spec import ONLINE, JobRequest, parse_job, placeholder_reward
from flywheel.trainer.registry import service as registry
from flywheel.trainer.settings import TrainerSettings
from flywheel.trainer.training.spec import RewardFunction

log = get_logger(__name__)


def outside_roots(base: str, roots: list[Path]) -> str | None:
    """Why a local base model may not be used (symlinks resolved), or None."""
    path = Path(base).resolve()
    resolved = [Path(r).resolve() for r in roots]
    if any(path.is_relative_to(root) for root in resolved):
        return None
    return (
        f"{base!r} is outside the folders local models may come from "
        f"({TrainerSettings.env_var('model_roots')}: {', '.join(map(str, resolved)) or 'none'})"
    )


class Submitter:
    """SubmitJob's work, and the sweep that queues jobs the bus missed."""

    def __init__(
        self,
        *,
        settings: TrainerSettings,
        sessions: async_sessionmaker[AsyncSession],
        objects: ObjectStore,
        publisher: Publisher,
        catalogue: Catalogue,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._objects = objects
        self._publisher = publisher
        self._catalogue = catalogue

    async def submit(self, request: pb.SubmitJobRequest) -> pb.SubmitJobResponse:
        job = parse_job(request.spec, policy=self._settings.policy)
        await self._check_lineage(job)
        await self._check_base_model(job)
        from flywheel.trainer.jobs.datasets import DatasetError, check_reward_columns, check_rows, load_dataset

        try:
            dataset = await load_dataset(self._objects, job.dataset_uri)
            warnings = check_rows(job.kind, dataset.train, dataset.validation)
        except (DatasetError, ValueError) as exc:
            raise Invalid("spec.dataset_uri", str(exc)) from None
        check_reward_columns(job.rewards, dataset.train, dataset.validation)
        placeholder = (RewardFunction(fn=placeholder_reward),) if job.kind in ONLINE else ()
        spec = job.train_spec(samples=len(dataset.train), rewards=placeholder)
        if request.dry_run:
            from flywheel.trainer.jobs.dry_run import estimate, to_proto

            dry = await asyncio.to_thread(self._estimate, estimate, spec, dataset.train, dataset.validation)
            report = to_proto(dry)
            report.warnings.extend(w for w in [*dataset.warnings, *warnings] if w not in report.warnings)
            return pb.SubmitJobResponse(dry_run=report)
        job_id = f"job-{datetime.now(UTC):%Y%m%d}-{uuid.uuid4().hex[:12]}"
        async with self._sessions() as session:
            row = await service.create(
                session, job_id=job_id, kind=job.kind, spec=job.spec_json, total_steps=spec.max_steps
            )
            await session.commit()
            await session.refresh(row)
        message = service.job_message(row)
        await self._queue([row])
        log.info("job submitted", job_id=job_id, kind=job.kind, steps=spec.max_steps, samples=len(dataset.train))
        return pb.SubmitJobResponse(job=message)

    def _estimate(self, estimate: Any, spec: Any, train: list[Any], validation: list[Any]) -> Any:
        """The dry run; an s3:// base contributes its config and tokenizer files only (never
        its weights), fetched into a temporary folder."""
        if not spec.base_model.startswith("s3://"):
            try:
                return estimate(spec, train, validation)
            except FileNotFoundError as exc:
                raise Invalid("spec.base_model", str(exc)) from None
        from flywheel.trainer.jobs.dry_run import base_config, base_tokenizer

        with tempfile.TemporaryDirectory() as folder:
            storage.download_prefix(self._objects.client, spec.base_model, Path(folder), skip=storage.WEIGHT_FILES)
            try:
                tokenizer, config = base_tokenizer(folder), base_config(folder)
            except (OSError, ValueError) as exc:
                raise Invalid("spec.base_model", f"{spec.base_model}: no readable config/tokenizer ({exc})") from None
            return estimate(spec, train, validation, tokenizer=tokenizer, config=config)

    async def _check_lineage(self, job: JobRequest) -> None:
        async with self._sessions() as session:
            for i, source in enumerate(job.rewards):
                if not source.reward_policy_id:
                    continue
                field = "spec.reward_policy_id" if i == 0 and source.weight == 1.0 else f"spec.rewards[{i}]"
                try:
                    row = await registry.get_policy(session, policy_id=source.reward_policy_id)
                except NotFound:
                    raise Invalid(field, f"no policy version {source.reward_policy_id!r} in the registry") from None
                problem = reward_policy_problem(row)
                if problem:
                    raise Invalid(field, problem)
            if job.parent_policy_id:
                try:
                    await registry.get_policy(session, policy_id=job.parent_policy_id)
                except NotFound:
                    raise Invalid(
                        "spec.parent_policy_id", f"no policy version {job.parent_policy_id!r} in the registry"
                    ) from None

    async def _check_base_model(self, job: JobRequest) -> None:
        if job.base_model.startswith("/"):
            problem = outside_roots(job.base_model, self._settings.model_roots)
            if problem:
                raise Invalid("spec.base_model", problem)
            return
        if not job.base_model.startswith("s3://"):
            return  # the built-in names
        try:
            bucket, prefix = storage.split_uri(job.base_model)
            keys = await asyncio.to_thread(
                lambda: next(iter(self._objects.client.list_objects(bucket, prefix=f"{prefix}/")), None)
            )
        except Exception as exc:  # noqa: BLE001 - no such bucket, access refused: all "not there"
            raise Invalid("spec.base_model", f"{job.base_model}: cannot be read ({exc})") from None
        if keys is None:
            raise Invalid("spec.base_model", f"{job.base_model}: no objects under this prefix")

    async def _queue(self, rows: list[JobRow]) -> int:
        """Publish jobs on the work queue and mark them queued; a failure leaves them for the
        sweep (logged, not raised: the job is stored)."""
        done = []
        for row in rows:
            event = events_pb2.TrainingJobEvent(
                meta=EventMeta(event_id=row.job_id, source="trainer"),
                job=jobs_pb2.TrainingJob(job_id=row.job_id, state=jobs_pb2.JOB_STATE_QUEUED),
            )
            event.meta.time.GetCurrentTime()
            try:
                await self._publisher.publish(self._catalogue.training_job(row.kind), event, msg_id=row.job_id)
            except Exception as exc:  # noqa: BLE001 - the outbox sweep publishes it later
                log.warning("job stored but not queued yet; the sweep retries", job_id=row.job_id, error=repr(exc))
                continue
            done.append(row.job_id)
        if done:
            async with self._sessions() as session:
                await service.mark_queued(session, job_ids=done)
                await session.commit()
        return len(done)

    async def sweep_forever(self, *, interval_s: float = 10.0, grace_s: float = 5.0) -> None:
        """Queue the jobs a bus outage left unqueued, and purge finished jobs past retention."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                async with self._sessions() as session:
                    left = list(
                        await service.unqueued(session, older_than=datetime.now(UTC) - timedelta(seconds=grace_s))
                    )
                    purged = await service.purge(session, older_than=timedelta(days=self._settings.job_retention_days))
                    await session.commit()
                if left and (queued := await self._queue(left)):
                    log.info("jobs queued by the sweep", count=queued, left=len(left) - queued)
                if purged:
                    log.info("finished jobs purged", count=purged)
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("job sweep failed", error=repr(exc))
