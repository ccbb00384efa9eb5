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
from typing import ClassVar, Literal, TypeVar

from pydantic import Field, FilePath, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flywheel.api.subjects import NAMESPACE
from flywheel.api.tls import ClientTls, is_loopback, target_host


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
    # CA bundle that signed the S3 server's certificate (a private CA); default: the system's.
    ca_file: FilePath | None = None

    @field_validator("endpoint")
    @classmethod
    def _no_scheme(cls, v: str) -> str:
        if "://" in v:
            raise ValueError("give host:port without a scheme; set FLYWHEEL_S3_SECURE for TLS")
        return v


class ServiceSettings(BaseSettings):
    """What every service has: its gRPC server, metrics, logging and shutdown.

    Listeners bind to loopback unless told otherwise. A gRPC server told to listen on any
    other address (``0.0.0.0``, ``::``, a LAN address, a host name) needs a bearer token or
    TLS, or refuses to start; ``allow_insecure`` overrides that, with a warning at start.
    """

    model_config = SettingsConfigDict(extra="ignore")

    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(50051, ge=0, le=65535)
    # "sync": grpcio's thread-pool server (unary and server-streaming methods only); async
    # servicer methods run on the event loop, a servicer's ``<Method>_sync`` twin in the worker.
    grpc_server: Literal["aio", "sync"] = "aio"
    grpc_workers: int = Field(8, ge=1, le=256)
    # CPython's GIL switch interval (``sys.setswitchinterval``), set at service start: how long
    # a thread holding the GIL runs before a waiting thread (the event loop, behind the sync
    # server's workers) may take it. None keeps Python's default (5 ms). 0.5 and 1 ms gave the
    # optimizer no gain in Select CPU or feedback lag on 2 shared cores (bench/select/README.md
    # "GIL hand-offs"); kept so that ``--variant GIL_SWITCH_INTERVAL_S=...`` can measure it elsewhere.
    gil_switch_interval_s: float | None = Field(None, gt=0, le=1)
    # Prometheus /metrics (9090, the usual scrape port); 0 disables. Counters and latencies
    # only, no credentials; a cluster sets 0.0.0.0 so Prometheus can scrape the pod.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9090, ge=0, le=65535)
    # Serve /metrics over HTTPS with the gRPC server's certificate (and require a client
    # certificate from tls_client_ca_file when that is set).
    metrics_tls: bool = False
    # Time in-flight RPCs and events get to finish after SIGTERM.
    shutdown_grace_s: float = Field(5.0, gt=0, le=60)
    # How often readiness (NATS, PostgreSQL, S3) is re-checked.
    readiness_interval_s: float = Field(1.0, gt=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"
    # gRPC server TLS; with a client CA the server requires client certificates (mTLS).
    tls_cert_file: FilePath | None = None
    tls_key_file: FilePath | None = None
    tls_client_ca_file: FilePath | None = None
    # When set, every RPC but health checks must send "authorization: Bearer <token>".
    auth_token: SecretStr | None = None
    # Serve a non-loopback grpc_host without token and TLS anyway (logged as a warning).
    allow_insecure: bool = False

    @model_validator(mode="after")
    def _safe_listener(self) -> ServiceSettings:
        var = type(self).env_var
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(f"set both {var('tls_cert_file')} and {var('tls_key_file')}, or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(
                f"{var('tls_client_ca_file')} (mTLS) needs server TLS: set {var('tls_cert_file')} and "
                f"{var('tls_key_file')}"
            )
        if self.metrics_tls and self.tls_cert_file is None:
            raise ValueError(
                f"{var('metrics_tls')} serves /metrics with the gRPC server's certificate: set "
                f"{var('tls_cert_file')} and {var('tls_key_file')}"
            )
        if not (is_loopback(self.grpc_host) or self.auth_token or self.tls_cert_file or self.allow_insecure):
            raise ValueError(
                f"{var('grpc_host')}={self.grpc_host!r} is reachable from other machines, and this service "
                f"has no credentials: set {var('auth_token')} and/or {var('tls_cert_file')} with "
                f"{var('tls_key_file')} (and {var('tls_client_ca_file')} for mTLS), or listen on 127.0.0.1; "
                f"{var('allow_insecure')}=true serves it open anyway"
            )
        return self

    @classmethod
    def env_var(cls, field: str) -> str:
        """The environment variable that sets ``field`` (e.g. FLYWHEEL_OPTIMIZER_AUTH_TOKEN)."""
        return _env_var(cls, field)

    def exposure_warnings(self) -> list[str]:
        """What :func:`flywheel.core.lifecycle.serve` logs as warnings at start: listeners
        others can reach with weak or no protection."""
        if is_loopback(self.grpc_host):
            return []
        if not (self.auth_token or self.tls_cert_file):
            return [
                f"gRPC on {self.grpc_host} with no token and no TLS: anyone who reaches it may call every "
                f"method ({self.env_var('allow_insecure')}=true)"
            ]
        if not self.tls_cert_file:
            return [f"gRPC on {self.grpc_host} without TLS: the bearer token crosses the network in plaintext"]
        return []


def client_link_problem(
    *, name: str, address: str, token: bool, tls: bool, allow_insecure: bool, env: dict[str, str]
) -> str | None:
    """Why a client link may not be used as configured, or None: a bearer token is sent only
    over TLS, or to a loopback address, unless the link is explicitly allowed to be insecure.
    ``env`` names the variables for the message (keys "address", "tls", "allow_insecure")."""
    if not address or not token or tls or allow_insecure or is_loopback(target_host(address)):
        return None
    return (
        f"{env['address']}={address!r} is not a loopback address and the {name} link has a bearer token but "
        f"no TLS (the token would cross the network in plaintext): set {env['tls']}, or "
        f"{env['allow_insecure']}=true to send it anyway"
    )


class ClientLinks(BaseSettings):
    """Mixin for settings that call other services over gRPC. For each name in ``LINKS`` the
    class inherits that link's fields from :func:`flywheel.core.link_settings.link_settings`
    (``<link>_address``, ``<link>_auth_token``, ``<link>_tls``… with its service's env names);
    this gives their TLS and token and checks them at start (a token never crosses the network
    in plaintext, cert and key come together)."""

    LINKS: ClassVar[tuple[str, ...]] = ()
    LINK_NAMES: ClassVar[dict[str, str]] = {"judge": "reward judge"}

    def link_tls(self, link: str) -> ClientTls | None:
        """TLS for one link, or None for plaintext."""
        files = {k: getattr(self, f"{link}_tls_{k}") for k in ("ca_file", "cert_file", "key_file", "server_name")}
        if not (getattr(self, f"{link}_tls") or any(files.values())):
            return None
        return ClientTls.from_files(**files)

    def link_token(self, link: str) -> str | None:
        token = getattr(self, f"{link}_auth_token")
        return token.get_secret_value() if token is not None else None

    @model_validator(mode="after")
    def _check_links(self):  # type: ignore[no-untyped-def]
        var = type(self).env_var  # type: ignore[attr-defined]
        for link in self.LINKS:
            if (getattr(self, f"{link}_tls_cert_file") is None) != (getattr(self, f"{link}_tls_key_file") is None):
                cert, key = var(f"{link}_tls_cert_file"), var(f"{link}_tls_key_file")
                raise ValueError(f"set both {cert} and {key}, or neither")
            problem = client_link_problem(
                name=self.LINK_NAMES.get(link, link),
                address=getattr(self, f"{link}_address"),
                token=getattr(self, f"{link}_auth_token") is not None,
                tls=self.link_tls(link) is not None,
                allow_insecure=getattr(self, f"{link}_allow_insecure"),
                env={
                    "address": var(f"{link}_address"),
                    "tls": var(f"{link}_tls"),
                    "allow_insecure": var(f"{link}_allow_insecure"),
                },
            )
            if problem:
                raise ValueError(problem)
        return self


S = TypeVar("S", bound=BaseSettings)


def _env_var(model: type[BaseSettings], field: str) -> str:
    info = model.model_fields.get(field)
    if info is not None and info.alias:
        return info.alias
    return (str(model.model_config.get("env_prefix", "")) + field).upper()


def _describe(model: type[BaseSettings], exc: ValidationError) -> list[str]:
    # A model validator's error has no field: its message names the variables itself.
    return [f"  {_env_var(model, str(e['loc'][0]))}: {e['msg']}" if e["loc"] else f"  {e['msg']}" for e in exc.errors()]


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
