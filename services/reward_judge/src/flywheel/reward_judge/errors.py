"""Errors of the judge itself (not request errors: those are flywheel.core.errors)."""

import grpc

from flywheel.core.errors import ServiceError


class JudgeFailed(Exception):
    """The judge asked for could not produce a valid judgement (after its retries)."""


class JudgeTimedOut(ServiceError):
    """A judge (embedding model, reward model) did not answer within its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
