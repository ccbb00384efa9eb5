"""Wiring of the trainer: NATS (the training work queue, progress and policy events),
PostgreSQL (jobs and the policy registry) and S3 (datasets, base models, checkpoints,
adapters) -> TrainerService, the job runner, the canary follower and the outbox sweeps."""

from __future__ import annotations

from pathlib import Path

from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.api.trainer.v1.events_pb2 import TrainingJobEvent
from flywheel.core import entrypoint
from flywheel.core.bus.connection import with_ack_wait
from flywheel.core.bus.work_queue import WorkQueueConsumer
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.trainer.grpc_api import TrainerServicer
from flywheel.trainer.jobs.finish import Finisher
from flywheel.trainer.jobs.storage import CHECKPOINTS
from flywheel.trainer.jobs.submit import Submitter
from flywheel.trainer.registry.events import PolicyEvents
from flywheel.trainer.settings import TrainerSettings

NAME = "trainer"
MIGRATIONS = Path(__file__).parent / "migrations"
DURABLE = "trainer-jobs"


class JobConsumer(WorkQueueConsumer[TrainingJobEvent]):
    """One job at a time; on stop, the running job checkpoints and is handed back first."""

    def __init__(self, *, runner: object, drain_timeout_s: float, **kwargs: object) -> None:
        super().__init__(concurrency=1, **kwargs)  # type: ignore[arg-type]
        self._runner = runner
        self._drain_timeout_s = drain_timeout_s

    async def stop(self, timeout_s: float = 5.0) -> None:
        self._runner.drain()  # type: ignore[attr-defined]
        await super().stop(max(timeout_s, self._drain_timeout_s))


async def build(settings: TrainerSettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    database = connect_database(settings.db, parts=parts)
    objects = connect_objects(settings.s3, parts=parts)
    await objects.ensure_bucket(CHECKPOINTS)
    events = PolicyEvents(database.sessions, bus.publisher, bus.catalogue)
    submitter = Submitter(
        settings=settings,
        sessions=database.sessions,
        objects=objects,
        publisher=bus.publisher,
        catalogue=bus.catalogue,
    )
    parts.servicers.append(
        (
            pb_grpc.add_TrainerServiceServicer_to_server,
            TrainerServicer(database.sessions, events, submitter),
            pb.DESCRIPTOR.services_by_name["TrainerService"].full_name,
        )
    )
    canaries = _canaries(settings, database, events, parts)

    if settings.run_jobs:
        from flywheel.trainer.jobs.runner import JobRunner

        finisher = Finisher(
            settings=settings, sessions=database.sessions, objects=objects, events=events, canaries=canaries
        )
        runner = JobRunner(
            settings=settings,
            sessions=database.sessions,
            objects=objects,
            publisher=bus.publisher,
            catalogue=bus.catalogue,
            finisher=finisher,
        )
        spec = with_ack_wait(bus.catalogue.consumer(DURABLE), settings.ack_wait_s)
        parts.consumers.append(
            JobConsumer(
                runner=runner,
                drain_timeout_s=settings.drain_timeout_s,
                js=bus.js,
                catalogue=bus.catalogue,
                spec=spec,
                message_type=TrainingJobEvent,
                handler=runner,
                heartbeat_s=min(settings.heartbeat_s, spec.ack_wait.total_seconds() / 3),
            )
        )

    async def sweep_policy_events() -> None:
        await events.sweep_forever(interval_s=settings.policy_event_sweep_s, grace_s=settings.policy_event_grace_s)

    async def sweep_jobs() -> None:
        await submitter.sweep_forever(interval_s=settings.policy_event_sweep_s, grace_s=settings.policy_event_grace_s)

    parts.background += [sweep_policy_events, sweep_jobs]


def _canaries(settings: TrainerSettings, database: object, events: PolicyEvents, parts: ServiceParts) -> object:
    """The canary enrolment and follower, when an optimizer is configured."""
    if not settings.optimizer_address:
        return None
    from flywheel.trainer.registry.canary import Canaries

    canaries = Canaries.from_settings(database.sessions, events, settings)  # type: ignore[attr-defined]

    async def follow() -> None:
        await canaries.follow_forever(interval_s=settings.canary_follow_s)

    parts.background.append(follow)
    parts.closers.append(canaries.close)
    return canaries


def main() -> None:
    """Entry point of ``python -m flywheel.trainer [serve|migrate|check-config]``."""
    entrypoint.run(name=NAME, settings_cls=TrainerSettings, build=build, migrations=MIGRATIONS)
