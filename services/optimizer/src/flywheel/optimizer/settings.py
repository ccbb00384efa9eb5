"""Optimizer settings (env prefix ``FLYWHEEL_OPTIMIZER_``)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings, ServiceSettings


class OptimizerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_OPTIMIZER_", extra="ignore")

    grpc_port: int = Field(50051, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    # Feedback older than this after its decision is dead-lettered as expired.
    feedback_window_s: float = Field(7 * 24 * 3600, gt=0)
