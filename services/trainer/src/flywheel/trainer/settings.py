"""Trainer settings (env prefix ``FLYWHEEL_TRAINER_``)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings, ServiceSettings


class TrainerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_TRAINER_", extra="ignore")

    grpc_port: int = Field(50056, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    # Policy events left unpublished (bus down after a change committed) are published again
    # by a sweep every policy_event_sweep_s, once older than policy_event_grace_s.
    policy_event_sweep_s: float = Field(10.0, gt=0)
    policy_event_grace_s: float = Field(5.0, ge=0)
