"""flywheel.core.settings: what an operator sees when a service starts with bad or missing env."""

from __future__ import annotations

import os

import pytest
from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings, ServiceSettings, load_settings


class OptimizerSettings(ServiceSettings):
    """Shaped like services/optimizer's settings (libs/core tests do not import services)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_OPTIMIZER_", extra="ignore")

    grpc_port: int = Field(50051, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    feedback_window_s: float = Field(7 * 24 * 3600, gt=0)


VALID_ENV = {
    "FLYWHEEL_NATS_URL": "nats://127.0.0.1:4222",
    "FLYWHEEL_DB_URL": "postgresql+asyncpg://flywheel:pg-hunter2@127.0.0.1:5432/flywheel",
    "FLYWHEEL_S3_ENDPOINT": "127.0.0.1:9000",
    "FLYWHEEL_S3_ACCESS_KEY": "minio",
    "FLYWHEEL_S3_SECRET_KEY": "s3-hunter2",
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment with no FLYWHEEL_* variables at all (and no .env file in reach)."""
    for name in list(os.environ):
        if name.upper().startswith("FLYWHEEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _set(env: pytest.MonkeyPatch, **overrides: str) -> None:
    for name, value in {**VALID_ENV, **overrides}.items():
        env.setenv(name, value)


def _fail(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        load_settings(OptimizerSettings)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_missing_variables_exit_2_and_are_all_named(env, capsys):
    err = _fail(capsys)
    assert "OptimizerSettings" in err
    for name in VALID_ENV:
        assert name in err, f"{name} not reported:\n{err}"


def test_only_the_missing_variable_is_reported(env, capsys):
    _set(env)
    env.delenv("FLYWHEEL_S3_SECRET_KEY")
    err = _fail(capsys)
    assert "FLYWHEEL_S3_SECRET_KEY" in err
    assert "FLYWHEEL_NATS_URL" not in err
    assert "FLYWHEEL_DB_URL" not in err


def test_complete_environment_loads(env):
    _set(env, FLYWHEEL_OPTIMIZER_GRPC_PORT="6000", FLYWHEEL_NATS_NAMESPACE="team-a1")
    settings = load_settings(OptimizerSettings)
    assert settings.grpc_port == 6000
    assert settings.nats.url == VALID_ENV["FLYWHEEL_NATS_URL"]
    assert settings.nats.namespace == "team-a1"
    assert settings.s3.endpoint == "127.0.0.1:9000"
    assert settings.s3.secret_key.get_secret_value() == "s3-hunter2"


def test_service_field_error_is_named_with_service_prefix(env, capsys):
    _set(env, FLYWHEEL_OPTIMIZER_GRPC_PORT="not-a-port")
    err = _fail(capsys)
    assert "FLYWHEEL_OPTIMIZER_GRPC_PORT" in err


def test_bad_service_variable_reported_together_with_missing_infra(env, capsys):
    env.setenv("FLYWHEEL_OPTIMIZER_GRPC_PORT", "not-a-port")
    err = _fail(capsys)
    assert "FLYWHEEL_NATS_URL" in err
    assert "FLYWHEEL_OPTIMIZER_GRPC_PORT" in err


@pytest.mark.parametrize("url", ["postgresql://u:p@db:5432/x", "postgres://u:p@db:5432/x"])
def test_plain_postgres_url_gets_the_async_driver(env, url):
    _set(env, FLYWHEEL_DB_URL=url)
    settings = load_settings(OptimizerSettings)
    assert settings.db.url.get_secret_value() == "postgresql+asyncpg://u:p@db:5432/x"


def test_async_url_is_kept_as_is(env):
    _set(env)
    assert load_settings(OptimizerSettings).db.url.get_secret_value() == VALID_ENV["FLYWHEEL_DB_URL"]


def test_non_postgres_url_is_rejected(env, capsys):
    _set(env, FLYWHEEL_DB_URL="mysql://u:p@db/x")
    err = _fail(capsys)
    assert "FLYWHEEL_DB_URL" in err
    assert "postgresql://" in err
    assert "u:p@db" not in err  # the rejected URL itself carries a password


@pytest.mark.parametrize(
    "namespace", ["Bad.NS", "bad.ns", "has space", "x*", "1starts-with-digit", "a" * 33, "", "under_score"]
)
def test_bad_namespace_is_rejected_with_a_message(env, capsys, namespace):
    _set(env, FLYWHEEL_NATS_NAMESPACE=namespace)
    err = _fail(capsys)
    assert "FLYWHEEL_NATS_NAMESPACE" in err
    assert "[a-z][a-z0-9-]{0,31}" in err


def test_namespace_with_trailing_newline_is_rejected():
    with pytest.raises(ValidationError):
        NatsSettings(url="nats://x:4222", namespace="flywheel\n")


@pytest.mark.parametrize("endpoint", ["http://minio:9000", "https://s3.amazonaws.com"])
def test_s3_endpoint_with_scheme_is_rejected(env, capsys, endpoint):
    _set(env, FLYWHEEL_S3_ENDPOINT=endpoint)
    err = _fail(capsys)
    assert "FLYWHEEL_S3_ENDPOINT" in err
    assert "without a scheme" in err
    assert "FLYWHEEL_S3_SECURE" in err


def test_bad_schema_name_is_rejected(env, capsys):
    _set(env, FLYWHEEL_DB_SCHEMA="Drop Table")
    err = _fail(capsys)
    assert "FLYWHEEL_DB_SCHEMA" in err


def test_secrets_never_appear_in_repr_or_str(env):
    _set(
        env,
        FLYWHEEL_NATS_PASSWORD="nats-hunter2",
        FLYWHEEL_OPTIMIZER_AUTH_TOKEN="token-hunter2",
        FLYWHEEL_DB_URL="postgresql://flywheel:pg-hunter2@db:5432/flywheel",
    )
    settings = load_settings(OptimizerSettings)
    # The values are there for whoever asks for them explicitly...
    assert settings.nats.password is not None and settings.nats.password.get_secret_value() == "nats-hunter2"
    assert settings.auth_token is not None and settings.auth_token.get_secret_value() == "token-hunter2"
    # ...but not in anything that might be logged.
    for text in (
        repr(settings),
        str(settings),
        repr(settings.db),
        repr(settings.s3),
        repr(settings.nats),
        repr(settings.model_dump()),
    ):
        for secret in ("hunter2", "pg-hunter2", "s3-hunter2", "nats-hunter2", "token-hunter2"):
            assert secret not in text


def test_nested_settings_classes_read_their_own_prefix(env):
    _set(env)
    assert NatsSettings().url == VALID_ENV["FLYWHEEL_NATS_URL"]
    assert DatabaseSettings().schema_name == "public"
    assert S3Settings().access_key == "minio"


def test_credentials_in_the_nats_url_are_refused(env, capsys):
    _set(env, FLYWHEEL_NATS_URL="nats://user:hunter2@nats:4222")
    err = _fail(capsys)
    assert "FLYWHEEL_NATS_URL" in err
    assert "FLYWHEEL_NATS_USER/PASSWORD" in err
    assert "hunter2" not in err
