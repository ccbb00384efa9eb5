"""Wiring of the evaluator: settings -> NATS -> judge client, HTTP client, evaluator ->
the work-queue consumer of evaluation requests."""

from __future__ import annotations

import httpx

from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest
from flywheel.core import entrypoint
from flywheel.core.bus.connection import with_ack_wait
from flywheel.core.bus.work_queue import WorkQueueConsumer
from flywheel.core.infra import connect_bus
from flywheel.core.lifecycle import ServiceParts
from flywheel.evaluator.handlers import EvaluationHandler
from flywheel.evaluator.judge import ADDRESS_SETTING, JudgeClient
from flywheel.evaluator.service import Evaluator
from flywheel.evaluator.settings import EvaluatorSettings

NAME = "evaluator"
DURABLE = "evaluator-requests"


async def build(settings: EvaluatorSettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    judge = JudgeClient(
        settings.judge_address,
        auth_token=settings.link_token("judge"),
        tls=settings.link_tls("judge"),
        timeout_s=settings.judge_timeout_s,
        address_setting=ADDRESS_SETTING,
    )
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=settings.concurrency * 2), trust_env=False)
    parts.closers += [judge.close, http.aclose]
    spec = with_ack_wait(bus.catalogue.consumer(DURABLE), settings.ack_wait_s)
    evaluator = Evaluator(settings, judge, http)
    parts.consumers.append(
        WorkQueueConsumer(
            js=bus.js,
            catalogue=bus.catalogue,
            spec=spec,
            message_type=EvaluationRequest,
            handler=EvaluationHandler(evaluator, bus.publisher, bus.catalogue),
            concurrency=settings.concurrency,
            heartbeat_s=spec.ack_wait.total_seconds() / 3,
        )
    )


def main() -> None:
    """Entry point of ``python -m flywheel.evaluator``."""
    entrypoint.run(name=NAME, settings_cls=EvaluatorSettings, build=build)
