"""Reward judge settings (env prefix ``FLYWHEEL_REWARD_JUDGE_``)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import DatabaseSettings, S3Settings, ServiceSettings


class RewardJudgeSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_REWARD_JUDGE_", extra="ignore")

    grpc_port: int = Field(50053, ge=0, le=65535)
    # Rubrics and the judgement cache live in PostgreSQL; reward-model checkpoints in S3.
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
