"""flywheel.core.logging: JSON lines off a TTY, secrets redacted, bound ids scoped to their block."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from flywheel.core.logging import bound, configure_logging, get_logger


@pytest.fixture(autouse=True)
def clean_structlog() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    err = capsys.readouterr().err
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def test_json_lines_with_service_component_level_and_time(capsys):
    configure_logging(service="optimizer", fmt="json")
    get_logger("flywheel.optimizer.test").info("endpoint created", endpoint="support-bot", arms=3)
    (line,) = _lines(capsys)
    assert line["event"] == "endpoint created"
    assert line["endpoint"] == "support-bot"
    assert line["arms"] == 3
    assert line["service"] == "optimizer"
    assert line["component"] == "flywheel.optimizer.test"
    assert line["level"] == "info"
    assert line["timestamp"].endswith("Z")  # ISO, UTC


def test_auto_format_is_json_when_stderr_is_not_a_tty(capsys):
    configure_logging(service="svc", fmt="auto")  # capsys' stderr is not a TTY
    get_logger().warning("hello")
    (line,) = _lines(capsys)
    assert line["event"] == "hello"
    assert line["level"] == "warning"


def test_console_format_is_not_json(capsys):
    configure_logging(service="svc", fmt="console")
    get_logger().info("hello console")
    err = capsys.readouterr().err
    assert "hello console" in err
    with pytest.raises(json.JSONDecodeError):
        json.loads(err.splitlines()[0])


def test_level_filters_lower_levels(capsys):
    configure_logging(service="svc", level="WARNING", fmt="json")
    log = get_logger()
    log.info("dropped")
    log.warning("kept")
    assert [line["event"] for line in _lines(capsys)] == ["kept"]


def test_secret_keys_are_redacted(capsys):
    configure_logging(service="svc", fmt="json")
    get_logger().info(
        "connecting",
        password="hunter2",
        db_password="hunter2",
        client_secret="hunter2",
        auth_token="hunter2",
        API_TOKEN="hunter2",
        authorization="Bearer hunter2",
        api_key="hunter2",
        access_key="hunter2",
        user="bob",
    )
    err = capsys.readouterr().err
    assert "hunter2" not in err
    (line,) = [json.loads(x) for x in err.splitlines()]
    for key in (
        "password",
        "db_password",
        "client_secret",
        "auth_token",
        "API_TOKEN",
        "authorization",
        "api_key",
        "access_key",
    ):
        assert line[key] == "***", key
    assert line["user"] == "bob"  # other keys untouched


def test_secrets_bound_through_context_are_redacted_too(capsys):
    configure_logging(service="svc", fmt="json")
    with bound(session_token="hunter2", request_id="r-1"):
        get_logger().info("inside")
    (line,) = _lines(capsys)
    assert line["session_token"] == "***"
    assert line["request_id"] == "r-1"


def test_bound_ids_appear_inside_the_block_only(capsys):
    configure_logging(service="svc", fmt="json")
    log = get_logger("c")
    log.info("before")
    with bound(decision_id="d-1", event_id="e-1"):
        log.info("inside one")
        log.info("inside two")
    log.info("after")
    before, one, two, after = _lines(capsys)
    for line in (one, two):
        assert line["decision_id"] == "d-1"
        assert line["event_id"] == "e-1"
    for line in (before, after):
        assert "decision_id" not in line
        assert "event_id" not in line
    # the service id bound at configure time survives the block
    assert after["service"] == "svc"


def test_nested_bound_restores_the_outer_value(capsys):
    configure_logging(service="svc", fmt="json")
    log = get_logger()
    with bound(rpc="Select"):
        with bound(rpc="Update", decision_id="d-2"):
            log.info("inner")
        log.info("outer")
    inner, outer = _lines(capsys)
    assert inner["rpc"] == "Update" and inner["decision_id"] == "d-2"
    assert outer["rpc"] == "Select" and "decision_id" not in outer


def test_bound_ids_are_removed_even_when_the_block_raises(capsys):
    configure_logging(service="svc", fmt="json")
    log = get_logger()
    with pytest.raises(RuntimeError), bound(event_id="e-9"):
        raise RuntimeError("handler failed")
    log.info("after failure")
    (line,) = _lines(capsys)
    assert "event_id" not in line


def test_exception_is_rendered_in_the_json_line(capsys):
    configure_logging(service="svc", fmt="json")
    try:
        raise ValueError("boom")
    except ValueError:
        get_logger().exception("failed")
    (line,) = _lines(capsys)
    assert "ValueError: boom" in line["exception"]
