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
