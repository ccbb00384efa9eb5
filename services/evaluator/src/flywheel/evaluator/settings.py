"""Evaluator settings (env prefix ``FLYWHEEL_EVALUATOR_``)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import NatsSettings, ServiceSettings


class EvaluatorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_EVALUATOR_", extra="ignore")

    grpc_port: int = Field(50052, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
