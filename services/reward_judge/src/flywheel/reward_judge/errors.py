"""Errors of the judge itself (not request errors: those are flywheel.core.errors)."""


class JudgeFailed(Exception):
    """The judge asked for could not produce a valid judgement (after its retries)."""
