"""Wiring of the trainer: NATS (the training work queue, policy events), PostgreSQL (the
policy registry) and S3 (checkpoints) -> TrainerService. The job consumer and the training
code (torch/trl/peft, an optional extra) arrive with the rest of the trainer issue."""

from __future__ import annotations

from pathlib import Path

from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.core import entrypoint
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.trainer.grpc_api import TrainerServicer
from flywheel.trainer.registry.events import PolicyEvents
from flywheel.trainer.settings import TrainerSettings

NAME = "trainer"
MIGRATIONS = Path(__file__).parent / "migrations"


async def build(settings: TrainerSettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    database = connect_database(settings.db, parts=parts)
    connect_objects(settings.s3, parts=parts)
    events = PolicyEvents(database.sessions, bus.publisher, bus.catalogue)
    parts.servicers.append(
        (
            pb_grpc.add_TrainerServiceServicer_to_server,
            TrainerServicer(database.sessions, events),
            pb.DESCRIPTOR.services_by_name["TrainerService"].full_name,
        )
    )

    async def sweep_policy_events() -> None:
        await events.sweep_forever(interval_s=settings.policy_event_sweep_s, grace_s=settings.policy_event_grace_s)

    parts.background.append(sweep_policy_events)


def main() -> None:
    """Entry point of ``python -m flywheel.trainer [serve|migrate|check-config]``."""
    entrypoint.run(name=NAME, settings_cls=TrainerSettings, build=build, migrations=MIGRATIONS)
