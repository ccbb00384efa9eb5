"""Trace store settings (env prefix ``FLYWHEEL_TRACE_STORE_``)."""

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from flywheel.core.retention import stream_max_age_days
from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings, ServiceSettings


class TraceStoreSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_TRACE_STORE_", extra="ignore")

    grpc_port: int = Field(50054, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    # Span batches fetched from JetStream per write (each becomes part of one transaction).
    ingest_batch_size: int = Field(256, ge=1, le=10_000)
    # Overrides the catalogue's ack wait (30 s) of the trace store's three consumers (decisions,
    # feedback, span batches): how soon what a killed replica held is redelivered. Its handlers
    # send no in-progress acks, so keep it well above a batch write's time.
    ack_wait_s: float | None = Field(None, gt=0)
    max_spans_per_batch: int = Field(10_000, ge=1)
    max_attributes_bytes: int = Field(64 * 1024, ge=1)
    max_text_bytes: int = Field(1024 * 1024, ge=1)
    # TTL per agent in days as JSON, e.g. {"support-bot": 30}; 0 keeps forever.
    retention_days: dict[str, float] = Field(default_factory=dict)
    # TTL of agents not listed in retention_days; 0 keeps forever.
    default_retention_days: float = Field(0.0, ge=0)
    retention_interval_s: float = Field(3600.0, gt=0)
    # decision_log and feedback_log rows (they deduplicate bus events by id) older than this
    # are deleted by the same sweep; 0 keeps forever. At least the DECISIONS and FEEDBACK
    # streams' max age, so a redelivery is never stored twice. Traces kept longer lose their
    # decision and feedback in GetTrace and in dataset exports.
    log_retention_days: float = Field(365.0, ge=0)

    @model_validator(mode="after")
    def _log_retention_outlasts_the_streams(self) -> "TraceStoreSettings":
        need = stream_max_age_days("optimizer.decision", "product.feedback")
        if 0 < self.log_retention_days < need:
            raise ValueError(
                f"log_retention_days ({self.log_retention_days:g}) must be 0 (forever) or >= {need:g}, the max age "
                "of the DECISIONS and FEEDBACK streams: a redelivered event would be stored twice"
            )
        return self
