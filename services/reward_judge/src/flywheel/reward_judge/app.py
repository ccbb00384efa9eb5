"""Wiring of the reward judge. It serves health and readiness on PostgreSQL (rubrics,
judgement cache) and S3 (reward-model checkpoints); RewardJudgeService arrives with
the reward-judge issue and answers UNIMPLEMENTED until then."""

from __future__ import annotations

from flywheel.core import entrypoint
from flywheel.core.infra import connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.reward_judge.settings import RewardJudgeSettings

NAME = "reward_judge"


async def build(settings: RewardJudgeSettings, parts: ServiceParts) -> None:
    connect_database(settings.db, parts=parts)
    connect_objects(settings.s3, parts=parts)


def main() -> None:
    """Entry point of ``python -m flywheel.reward_judge``."""
    entrypoint.run(name=NAME, settings_cls=RewardJudgeSettings, build=build)
