"""The trace store's settings as an operator sets them: FLYWHEEL_TRACE_STORE_ACK_WAIT_S overrides
the catalogue's ack wait of its three consumers; a value that is not a positive number of seconds
stops the service at start, naming the variable."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from flywheel.api.subjects import Catalogue
from flywheel.core.bus.connection import with_ack_wait
from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings, load_settings
from flywheel.trace_store.app import DURABLES
from flywheel.trace_store.settings import TraceStoreSettings

VAR = "FLYWHEEL_TRACE_STORE_ACK_WAIT_S"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [n for n in os.environ if n.upper().startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def settings() -> TraceStoreSettings:
    """The trace store's own fields from the environment (the connections stubbed)."""
    stubs = (NatsSettings, DatabaseSettings, S3Settings)
    return TraceStoreSettings(**dict(zip(("nats", "db", "s3"), (s.model_construct() for s in stubs), strict=True)))


def test_ack_wait_is_the_catalogues_unless_set(env):
    assert settings().ack_wait_s is None
    catalogue = Catalogue()
    for durable in DURABLES:
        spec = catalogue.consumer(durable)
        assert with_ack_wait(spec, settings().ack_wait_s) is spec


def test_ack_wait_overrides_every_consumer(env):
    env.setenv(VAR, "2.5")
    assert settings().ack_wait_s == 2.5
    catalogue = Catalogue()
    for durable in DURABLES:
        spec = with_ack_wait(catalogue.consumer(durable), settings().ack_wait_s)
        assert spec.ack_wait == timedelta(seconds=2.5), durable
        assert spec.durable == durable and spec.max_deliver == catalogue.consumer(durable).max_deliver


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "greater than 0"),
        ("-1", "greater than 0"),
        ("abc", "a valid number"),
        ("", "a valid number"),
    ],
)
def test_a_bad_ack_wait_stops_the_service_naming_the_variable(env, capsys, value, problem):
    env.setenv(VAR, value)
    with pytest.raises(SystemExit) as exc:
        load_settings(TraceStoreSettings)
    assert exc.value.code == 2
    reported = [line for line in capsys.readouterr().err.splitlines() if VAR in line]
    assert len(reported) == 1 and problem in reported[0], reported
