"""Wiring of the society. It serves health and readiness on the bus; its run-progress
consumer and RLP/SAO proposers arrive with the society issue."""

from __future__ import annotations

from flywheel.core import entrypoint
from flywheel.core.infra import connect_bus
from flywheel.core.lifecycle import ServiceParts
from flywheel.society.settings import SocietySettings

NAME = "society"


async def build(settings: SocietySettings, parts: ServiceParts) -> None:
    await connect_bus(settings.nats, name=NAME, parts=parts)


def main() -> None:
    """Entry point of ``python -m flywheel.society``."""
    entrypoint.run(name=NAME, settings_cls=SocietySettings, build=build)
