"""Wiring of the trainer. It serves health and readiness on NATS (the training work
queue), PostgreSQL (policy registry) and S3 (checkpoints); TrainerService, the job
consumer and the training code (torch/trl/peft, an optional extra) arrive with the
trainer issue."""

from __future__ import annotations

from flywheel.core import entrypoint
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.trainer.settings import TrainerSettings

NAME = "trainer"


async def build(settings: TrainerSettings, parts: ServiceParts) -> None:
    await connect_bus(settings.nats, name=NAME, parts=parts)
    connect_database(settings.db, parts=parts)
    connect_objects(settings.s3, parts=parts)


def main() -> None:
    """Entry point of ``python -m flywheel.trainer``."""
    entrypoint.run(name=NAME, settings_cls=TrainerSettings, build=build)
