"""Which errors say "a dependency is away, retry later" (``is_transient``) and which say "this
write can never be stored" (``rejects_the_data``), read through SQLAlchemy's wrapper and the
chain of causes: the consumer bisects a batch, and the gRPC guard answers INTERNAL, only for
errors that are not transient, so a missing file must not pass for one."""

from __future__ import annotations

import asyncpg
import nats.errors
import pytest
import sqlalchemy.exc

from flywheel.core.errors import Unavailable, is_transient, rejects_the_data


def _wrapped(cause: BaseException) -> sqlalchemy.exc.DBAPIError:
    """What SQLAlchemy raises around a driver's error: the driver's error as ``orig``."""
    return sqlalchemy.exc.DBAPIError("INSERT INTO decisions ...", {}, cause)


def _caused_by(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        Unavailable("optimizer draining"),
        nats.errors.ConnectionReconnectingError(),
        _wrapped(asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed")),
        _wrapped(asyncpg.exceptions.AdminShutdownError("terminating connection")),
        _caused_by(RuntimeError("the pool gave up"), TimeoutError()),
    ],
    ids=["refused", "timeout", "unavailable", "nats", "pg-lost", "pg-shutdown", "caused-by-timeout"],
)
def test_a_dependency_away_is_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(2, "No such file or directory", "/models/rm/adapter.safetensors"),
        PermissionError(13, "Permission denied", "/var/lib/flywheel"),
        IsADirectoryError(21, "Is a directory", "/models"),
        # A file error under a transient-looking wrapper: the cause decides, not the wrapper.
        _caused_by(ConnectionError("loading the reward model"), FileNotFoundError(2, "gone", "/m")),
        _caused_by(RuntimeError("upload failed"), _caused_by(OSError("io"), PermissionError(13, "no"))),
        RuntimeError("a plain bug"),
        KeyError("arm"),
    ],
    ids=["missing-file", "permission", "is-a-dir", "file-under-connection", "file-deep", "bug", "key"],
)
def test_a_file_error_or_a_bug_is_not_transient(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_a_cycle_of_causes_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_transient(a)
    assert not rejects_the_data(a)


def test_data_the_database_refuses_is_told_from_the_database_away() -> None:
    assert rejects_the_data(_wrapped(asyncpg.exceptions.StringDataRightTruncationError("value too long")))
    assert rejects_the_data(_wrapped(asyncpg.exceptions.UniqueViolationError("duplicate key")))
    assert rejects_the_data(_caused_by(RuntimeError("encoding"), UnicodeEncodeError("utf-8", "x", 0, 1, "bad")))
    assert not rejects_the_data(_wrapped(asyncpg.exceptions.ConnectionDoesNotExistError("closed")))
    assert not rejects_the_data(ConnectionRefusedError(111, "refused"))
