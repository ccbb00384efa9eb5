"""Wiring of the evaluator. It serves health and readiness on the bus it will consume
evaluation requests from; the work-queue consumer arrives with the batch-optimization
issue (a consumer that acked work it cannot do would lose it)."""

from __future__ import annotations

from flywheel.core import entrypoint
from flywheel.core.infra import connect_bus
from flywheel.core.lifecycle import ServiceParts
from flywheel.evaluator.settings import EvaluatorSettings

NAME = "evaluator"


async def build(settings: EvaluatorSettings, parts: ServiceParts) -> None:
    await connect_bus(settings.nats, name=NAME, parts=parts)


def main() -> None:
    """Entry point of ``python -m flywheel.evaluator``."""
    entrypoint.run(name=NAME, settings_cls=EvaluatorSettings, build=build)
