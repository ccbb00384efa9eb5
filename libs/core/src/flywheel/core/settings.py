"""Typed settings shared by every service.

Infrastructure settings have one env prefix each (``FLYWHEEL_NATS_``, ``FLYWHEEL_DB_``,
``FLYWHEEL_S3_``) because every service talks to the same servers; a service's own
settings class adds its prefix (``FLYWHEEL_OPTIMIZER_`` …) for ports and knobs.
Required values have no default, so a service started without them fails at once
with a message naming the missing variables (see :func:`load_settings`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flywheel.api.subjects import NAMESPACE


class NatsSettings(BaseSettings):
    """Connection to NATS with JetStream."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_NATS_", extra="ignore")

    url: str = Field(description="e.g. nats://127.0.0.1:4222 or tls://nats:4222")
    user: str | None = None
    password: SecretStr | None = None
    # A NATS credentials file (JWT + NKey), the usual choice in a managed cluster.
    creds_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Prefix of every subject and stream; tests use a fresh one per test.
    namespace: str = "flywheel"
    connect_timeout_s: float = 2.0

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, v: str) -> str:
        if "@" in v.split("://", 1)[-1]:
            raise ValueError("put credentials in FLYWHEEL_NATS_USER/PASSWORD or a creds file, not in the URL")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_subject_token(cls, v: str) -> str:
        if not NAMESPACE.fullmatch(v):
            raise ValueError(f"must match {NAMESPACE.pattern} (it prefixes NATS subjects and stream names)")
        return v


class DatabaseSettings(BaseSettings):
    """Connection to PostgreSQL."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_DB_", extra="ignore")

    url: SecretStr = Field(description="postgresql+asyncpg://user:password@host:5432/db")
    # Schema holding this deployment's tables; tests use a fresh one per test.
    schema_name: str = Field("public", alias="FLYWHEEL_DB_SCHEMA")
    pool_size: int = 10
    statement_timeout_ms: int = 10_000

    @field_validator("url")
    @classmethod
    def _async_driver(cls, v: SecretStr) -> SecretStr:
        raw = v.get_secret_value()
        for plain in ("postgresql://", "postgres://"):
            if raw.startswith(plain):
                raw = "postgresql+asyncpg://" + raw[len(plain) :]
        if not raw.startswith("postgresql+asyncpg://"):
            raise ValueError("must be a postgresql:// or postgresql+asyncpg:// URL")
        return SecretStr(raw)

    @field_validator("schema_name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", v):
            raise ValueError("must be a lowercase SQL identifier")
        return v


class S3Settings(BaseSettings):
    """Connection to S3 (MinIO, SeaweedFS, AWS)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_S3_", extra="ignore")

    endpoint: str = Field(description="host:port, without scheme")
    access_key: str
    secret_key: SecretStr
    secure: bool = False
    region: str = "us-east-1"
    # Buckets are named "<bucket_prefix>-<purpose>"; tests use a fresh prefix.
    bucket_prefix: str = "flywheel"
    cert_check: bool = True

    @field_validator("endpoint")
    @classmethod
    def _no_scheme(cls, v: str) -> str:
        if "://" in v:
            raise ValueError("give host:port without a scheme; set FLYWHEEL_S3_SECURE for TLS")
        return v


class ServiceSettings(BaseSettings):
    """What every service has: its gRPC server, metrics, logging and shutdown."""

    model_config = SettingsConfigDict(extra="ignore")

    grpc_host: str = "0.0.0.0"
    grpc_port: int = Field(50051, ge=0, le=65535)
    # "sync": grpcio's thread-pool server (unary and server-streaming methods only); async
    # servicer methods run on the event loop, a servicer's ``<Method>_sync`` twin in the worker.
    grpc_server: Literal["aio", "sync"] = "aio"
    grpc_workers: int = Field(8, ge=1, le=256)
    # Prometheus /metrics (9090, the usual scrape port); 0 disables.
    metrics_port: int = Field(9090, ge=0, le=65535)
    # Time in-flight RPCs and events get to finish after SIGTERM.
    shutdown_grace_s: float = Field(5.0, gt=0, le=60)
    # How often readiness (NATS, PostgreSQL, S3) is re-checked.
    readiness_interval_s: float = Field(1.0, gt=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"
    # gRPC server TLS; with a client CA the server requires client certificates (mTLS).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # When set, every RPC but health checks must send "authorization: Bearer <token>".
    auth_token: SecretStr | None = None


S = TypeVar("S", bound=BaseSettings)


def _env_var(model: type[BaseSettings], field: str) -> str:
    info = model.model_fields.get(field)
    if info is not None and info.alias:
        return info.alias
    return (str(model.model_config.get("env_prefix", "")) + field).upper()


def _describe(model: type[BaseSettings], exc: ValidationError) -> list[str]:
    return [f"  {_env_var(model, str(e['loc'][0]) if e['loc'] else '')}: {e['msg']}" for e in exc.errors()]


def load_settings(cls: type[S]) -> S:
    """Build settings from the environment, or exit(2) naming every bad or missing variable."""
    problems: list[str] = []
    # Nested settings are built by default factories, which stop at the first failure;
    # build each on its own, then the service's own fields with the nested ones stubbed,
    # so one run reports everything that is wrong.
    nested = {
        n: f.annotation
        for n, f in cls.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseSettings)
    }
    for model in nested.values():
        try:
            model()
        except ValidationError as exc:
            problems += _describe(model, exc)
    try:
        cls(**{n: model.model_construct() for n, model in nested.items()})
    except ValidationError as exc:
        problems += _describe(cls, exc)
    if not problems:
        return cls()
    sys.stderr.write(f"invalid configuration ({cls.__name__}):\n" + "\n".join(problems) + "\n")
    raise SystemExit(2)
