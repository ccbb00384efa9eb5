"""Wiring of the society: NATS (run progress in, proposals and dataset events out), PostgreSQL
(RLP's steps and buffer, SAO's rounds and datasets) and S3 (SAO datasets) -> SocietyService,
RLP's run-progress consumer, the SAO round workers, the sweeps and the metrics refresh.

Startup stays light: LiteLLM is imported (on a thread) by the first SAO round that needs it,
torch never."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from flywheel.api.optimizer.v1.events_pb2 import RunProgressEvent
from flywheel.api.society.v1 import society_service_pb2 as pb
from flywheel.api.society.v1 import society_service_pb2_grpc as pb_grpc
from flywheel.core import entrypoint, retention
from flywheel.core.bus.work_queue import WorkQueueConsumer
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.judge_client import JudgeClient
from flywheel.core.lifecycle import ServiceParts
from flywheel.society import metrics
from flywheel.society.clients import OptimizerRuns, TrainerJobs
from flywheel.society.grpc_api import SocietyServicer
from flywheel.society.rlp.service import RlpService
from flywheel.society.sao.llm import LiteLlm, Llm
from flywheel.society.sao.service import SaoRounds
from flywheel.society.sao.traces import TracePrompts
from flywheel.society.settings import SocietySettings

NAME = "society"
MIGRATIONS = Path(__file__).parent / "migrations"
RUN_PROGRESS = "society-run-progress"
# Run-progress events handled at once (each may wait on the reasoning model).
RLP_CONCURRENCY = 4
RETENTION_INTERVAL_S = 3600.0


def judge_client(settings: SocietySettings) -> JudgeClient | None:
    """The reward judge SAO ranks pairs with, or None when none is configured."""
    if not settings.judge_address:
        return None
    return JudgeClient(
        settings.judge_address,
        auth_token=settings.link_token("judge"),
        tls=settings.link_tls("judge"),
        timeout_s=settings.judge_timeout_s,
        address_setting=SocietySettings.env_var("judge_address"),
        wait_for_ready=True,  # a round outlives a judge restart (each call waits up to judge_timeout_s)
    )


def policy_models(settings: SocietySettings) -> Callable[[str], Awaitable[Llm]]:
    """``llm_for(model)``: the policy model of an SAO round through LiteLLM, with the
    society's key and base URL (never the run's); the self-ranking is asked for as JSON under
    ``response_format`` when ``sao_structured_output`` is on."""

    async def llm_for(model: str) -> Llm:
        from flywheel.core.llm import LlmClient, load_litellm

        await load_litellm()  # on a thread: the import takes seconds
        client = LlmClient(settings.llm.model_copy(update={"model": model or settings.llm.model}))
        return LiteLlm(client, structured_output=settings.sao_structured_output)

    return llm_for


def retention_rules(settings: SocietySettings) -> list[retention.Rule]:
    """SAO rounds (finished ones) and datasets older than ``retention_days``; their S3 objects
    stay, since trained policies name them as lineage."""
    return [
        retention.Rule("sao_rounds", "created_at", settings.retention_days, where="state IN ('succeeded', 'failed')"),
        retention.Rule("sao_datasets", "created_at", settings.retention_days),
    ]


async def build(settings: SocietySettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    database = connect_database(settings.db, parts=parts)
    objects = connect_objects(settings.s3, parts=parts)
    runs, trainer, traces = OptimizerRuns(settings), TrainerJobs(settings), TracePrompts(settings)
    parts.closers += [runs.close, trainer.close, traces.close]
    judge = judge_client(settings)
    if judge is not None:
        parts.closers.append(judge.close)

    rounds = SaoRounds(
        settings=settings,
        engine=database.engine,
        sessions=database.sessions,
        publisher=bus.publisher,
        catalogue=bus.catalogue,
        objects=objects,
        llm_for=policy_models(settings),
        judge=judge,
        trainer=trainer,
        traces=traces,
    )
    parts.servicers.append(
        (
            pb_grpc.add_SocietyServiceServicer_to_server,
            SocietyServicer(settings=settings, sessions=database.sessions, rounds=rounds, objects=objects),
            pb.DESCRIPTOR.services_by_name["SocietyService"].full_name,
        )
    )
    parts.background += [rounds.work_forever] * settings.sao_concurrency
    parts.background.append(rounds.sweep_forever)

    rlp = RlpService(
        settings=settings,
        sessions=database.sessions,
        publisher=bus.publisher,
        catalogue=bus.catalogue,
        runs=runs,
        trainer=trainer,
        objects=objects,
        start_sao=rounds.start_for_run,
    )
    spec = bus.catalogue.consumer(RUN_PROGRESS)
    parts.consumers.append(
        WorkQueueConsumer(
            concurrency=RLP_CONCURRENCY,
            heartbeat_s=spec.ack_wait.total_seconds() / 3,
            js=bus.js,
            catalogue=bus.catalogue,
            spec=spec,
            message_type=RunProgressEvent,
            handler=rlp.on_progress,
        )
    )
    parts.background += rlp.tasks

    async def refresh_metrics() -> None:
        await metrics.refresh_forever(database.sessions)

    async def sweep_old_rows() -> None:
        await retention.sweep_forever(
            database.engine, retention_rules(settings), interval_s=RETENTION_INTERVAL_S, service=NAME
        )

    parts.background += [refresh_metrics, sweep_old_rows]


def main() -> None:
    """Entry point of ``python -m flywheel.society [serve|migrate|check-config]``."""
    entrypoint.run(name=NAME, settings_cls=SocietySettings, build=build, migrations=MIGRATIONS)
