"""Trace store settings (env prefix ``FLYWHEEL_TRACE_STORE_``)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings, ServiceSettings


class TraceStoreSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_TRACE_STORE_", extra="ignore")

    grpc_port: int = Field(50054, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    # Span batches fetched from JetStream per write (each becomes part of one transaction).
    ingest_batch_size: int = Field(256, ge=1, le=10_000)
    max_spans_per_batch: int = Field(10_000, ge=1)
    max_attributes_bytes: int = Field(64 * 1024, ge=1)
    max_text_bytes: int = Field(1024 * 1024, ge=1)
    # TTL per agent in days as JSON, e.g. {"support-bot": 30}; 0 keeps forever.
    retention_days: dict[str, float] = Field(default_factory=dict)
    # TTL of agents not listed in retention_days; 0 keeps forever.
    default_retention_days: float = Field(0.0, ge=0)
    retention_interval_s: float = Field(3600.0, gt=0)
