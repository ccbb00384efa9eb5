"""Wiring of the reward judge: settings -> PostgreSQL (rubrics, cache, reliability),
S3 (reward-model checkpoints), the LLM judge, fallbacks -> RewardJudgeService."""

from __future__ import annotations

import asyncio
from pathlib import Path

from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as pb_grpc
from flywheel.core import entrypoint, retention
from flywheel.core.infra import connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.core.logging import get_logger
from flywheel.reward_judge.bounded import ModelCalls
from flywheel.reward_judge.cache import NoCache, PostgresCache
from flywheel.reward_judge.fallback import shared_embedder
from flywheel.reward_judge.grpc_api import RequestLimits, RewardJudgeServicer
from flywheel.reward_judge.llm_judge import LlmJudge, LlmJudgeConfig
from flywheel.reward_judge.reliability import PostgresStats
from flywheel.reward_judge.reward_model import RewardModelJudge
from flywheel.reward_judge.rubric_store import RubricStore
from flywheel.reward_judge.service import JudgeService, Limits
from flywheel.reward_judge.settings import RewardJudgeSettings

NAME = "reward_judge"
MIGRATIONS = Path(__file__).parent / "migrations"
PURGE_INTERVAL_S = 600
log = get_logger(__name__)


def llm_judge(settings: RewardJudgeSettings) -> LlmJudge:
    return LlmJudge(
        LlmJudgeConfig(
            model=settings.llm_model,
            api_base=settings.llm_api_base,
            api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
            timeout_s=settings.llm_timeout_s,
            attempts=settings.llm_attempts,
            backoff_s=settings.llm_backoff_s,
            max_tokens=settings.llm_max_tokens,
        )
    )


async def build(settings: RewardJudgeSettings, parts: ServiceParts) -> None:
    database = connect_database(settings.db, parts=parts)
    objects = connect_objects(settings.s3, parts=parts)
    store = RubricStore(database.sessions)
    stats = PostgresStats(database.sessions)
    cache = PostgresCache(database.sessions, settings.cache_ttl_s) if settings.cache_ttl_s > 0 else None
    reward_model = (
        RewardModelJudge(settings.reward_model, batch_size=settings.reward_model_batch_size, s3_client=objects.client)
        if settings.reward_model
        else None
    )
    llm = llm_judge(settings)
    embedder = shared_embedder() if settings.embeddings else None
    models = ModelCalls(settings.model_calls_in_flight)
    judge = JudgeService(
        rubrics=store,
        llm=llm,
        cache=cache or NoCache(),
        stats=stats,
        embedder=embedder,
        reward_model=reward_model,
        limits=Limits(
            max_text_chars=settings.max_text_chars,
            max_group_size=settings.max_group_size,
            llm_deadline_s=settings.llm_deadline_s,
            embedding_deadline_s=settings.embedding_deadline_s,
            reward_model_deadline_s=settings.reward_model_deadline_s,
        ),
        model_calls=models,
    )
    parts.background.append(llm.warm)
    if embedder is not None:

        async def warm_embedder() -> None:
            # Load MiniLM now rather than in the first request's deadline (seconds to
            # tens of seconds: torch and transformers are imported on the way).
            try:
                await models.run(embedder.warm, deadline_s=3600, what="embedding model", setting="(startup warm-up)")
                log.info("embedding model loaded")
            except Exception as exc:  # noqa: BLE001 - a request will try again
                log.warning("embedding model warm-up failed", error=repr(exc))

        parts.background.append(warm_embedder)
    if reward_model is not None:
        rm = reward_model

        async def warm_reward_model() -> None:
            # The checkpoint (from S3 maybe) loads now, not inside a request's deadline.
            try:
                await models.run(rm.warm, deadline_s=3600, what="reward model", setting="(startup warm-up)")
                log.info("reward model loaded", source=rm.source)
            except Exception as exc:  # noqa: BLE001 - a request will try again and say why
                log.warning("reward model warm-up failed", error=repr(exc))

        parts.background.append(warm_reward_model)
    parts.servicers.append(
        (
            pb_grpc.add_RewardJudgeServiceServicer_to_server,
            RewardJudgeServicer(
                judge,
                store,
                stats,
                RequestLimits(
                    rubric_yaml_max_chars=settings.rubric_yaml_max_chars,
                    rubric_yaml_max_nodes=settings.rubric_yaml_max_nodes,
                    max_aggregate_candidates=settings.max_aggregate_candidates,
                    max_signals_per_candidate=settings.max_signals_per_candidate,
                    max_trace_spans=settings.max_trace_spans,
                    max_text_chars=settings.max_text_chars,
                ),
            ),
            pb.DESCRIPTOR.services_by_name["RewardJudgeService"].full_name,
        )
    )
    if isinstance(cache, PostgresCache):

        async def purge_expired() -> None:
            while True:
                await asyncio.sleep(PURGE_INTERVAL_S)
                try:
                    removed = await cache.purge()
                    log.info("judgement cache purged", removed=removed)
                except Exception as exc:  # noqa: BLE001 - the database may be down; try next time
                    log.warning("judgement cache purge failed", error=repr(exc))

        parts.background.append(purge_expired)

    async def sweep_labels() -> None:
        await retention.sweep_forever(
            database.engine,
            [retention.Rule("human_labels", "created_at", settings.human_label_retention_days)],
            interval_s=settings.retention_interval_s,
            service=NAME,
        )

    parts.background.append(sweep_labels)


def main() -> None:
    """Entry point of ``python -m flywheel.reward_judge``."""
    entrypoint.run(name=NAME, settings_cls=RewardJudgeSettings, build=build, migrations=MIGRATIONS)
