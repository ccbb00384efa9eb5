"""Domain errors that map to gRPC status codes in one place (the server interceptor),
so service code raises plain exceptions and never touches gRPC contexts."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """Base: a request-level failure with a message a person can act on."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(ServiceError):
    """Transient: the caller (or the bus) should retry shortly."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(ServiceError):
    """The service is at a bound (a full buffer, too many streams): back off and retry."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


def rejects_the_data(exc: BaseException) -> bool:
    """True when ``exc`` says the *data* of a write can never be stored (a value too long for
    its column, a NUL byte, invalid text or JSON, a number or date out of range, a constraint),
    as opposed to the database being unreachable or the call being cancelled. A batched write
    that fails this way is worth splitting to find the row at fault; one that fails any other
    way is retried whole later."""
    import asyncpg  # here: errors.py is imported by code that never talks to PostgreSQL

    for current in _causes(exc):
        if isinstance(current, asyncpg.DataError | asyncpg.IntegrityConstraintViolationError):
            return True
        if isinstance(current, asyncpg.PostgresError):  # connection, shutdown, timeout, ...
            return False
        if isinstance(current, UnicodeError | OverflowError | TypeError) or type(current) is ValueError:
            return True  # raised while encoding a parameter, before anything was sent
    return False


# OSErrors that name a file, not a dependency: a bug or a bad deployment, which a retry does not mend.
FILE_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` says a dependency is away or slow (connection refused or lost, a
    timeout, PostgreSQL shutting down, NATS reconnecting, :class:`Unavailable`): retrying the
    same work later can succeed, and splitting a batch to find a culprit would not help.

    The whole chain of causes is read, and an error that names a file (:data:`FILE_ERRORS`)
    anywhere in it makes the answer False, though it is an ``OSError``: a missing model file or a
    directory the service may not write stays missing however often the work is retried."""
    import asyncpg
    import nats.errors

    transient = (
        OSError,
        TimeoutError,
        Unavailable,
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, query cancelled
        asyncpg.exceptions.InsufficientResourcesError,
        nats.errors.Error,
    )
    found = False
    for current in _causes(exc):
        if isinstance(current, FILE_ERRORS):
            return False
        found = found or isinstance(current, transient) or bool(getattr(current, "connection_invalidated", False))
    return found


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, outermost first: the driver's error under SQLAlchemy's
    wrapper (``orig``), else ``__cause__``; each once, so a cycle ends."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = getattr(current, "orig", None) or current.__cause__
    return chain


def describe(exc: BaseException, limit: int = 500) -> str:
    """A short reason for a dead letter: the database driver's own message when there is one
    (SQLAlchemy's text adds the statement and its parameters), else the exception's."""
    current: BaseException = exc
    while getattr(current, "orig", None) is not None:
        current = current.orig  # type: ignore[attr-defined]
    text = f"{type(current).__name__}: {current}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
