"""Society settings (env prefix ``FLYWHEEL_SOCIETY_``)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import NatsSettings, ServiceSettings


class SocietySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_SOCIETY_", extra="ignore")

    grpc_port: int = Field(50055, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
