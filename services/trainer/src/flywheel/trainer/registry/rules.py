"""The policy registry's rules, pure: which status changes are allowed, and what Promote and
Rollback change. The service applies the plans these functions return inside one transaction.

Statuses (``flywheel.api.trainer.v1.PolicyStatus``)::

    registered -> canary -> active -> retired
         |          |         |
         |          |         +---> rolled_back   (Rollback: the previous active one returns)
         |          +--> retired / rolled_back   (a canary that lost)
         +--> failed                              (evaluation or loading failed)

A retired version becomes active again only through Rollback; failed, rolled-back and
retired versions are never promoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.errors import FailedPrecondition


class Status(IntEnum):
    """Mirrors ``PolicyStatus`` (the numbers are stored in the table)."""

    REGISTERED = jobs_pb2.POLICY_STATUS_REGISTERED
    CANARY = jobs_pb2.POLICY_STATUS_CANARY
    ACTIVE = jobs_pb2.POLICY_STATUS_ACTIVE
    RETIRED = jobs_pb2.POLICY_STATUS_RETIRED
    ROLLED_BACK = jobs_pb2.POLICY_STATUS_ROLLED_BACK
    FAILED = jobs_pb2.POLICY_STATUS_FAILED

    @property
    def label(self) -> str:
        return self.name.lower()


# Changes SetPolicyStatus may make directly. ACTIVE is reached through promote() (it retires
# the previous active version), and ROLLED_BACK of the active version through rollback().
ALLOWED: dict[Status, frozenset[Status]] = {
    Status.REGISTERED: frozenset({Status.CANARY, Status.ACTIVE, Status.RETIRED, Status.FAILED}),
    Status.CANARY: frozenset({Status.ACTIVE, Status.RETIRED, Status.ROLLED_BACK, Status.FAILED}),
    Status.ACTIVE: frozenset({Status.RETIRED, Status.ROLLED_BACK}),
    Status.RETIRED: frozenset(),
    Status.ROLLED_BACK: frozenset(),
    Status.FAILED: frozenset(),
}


class RuleViolation(FailedPrecondition):
    """A change the registry's rules forbid; ``rule`` is its short name (in the message too)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{message} (rule: {rule})")
        self.rule = rule


@dataclass(frozen=True)
class Version:
    policy_id: str
    version: int
    status: Status


@dataclass(frozen=True)
class Change:
    policy_id: str
    previous: Status
    status: Status


def check_transition(version: Version, target: Status) -> None:
    """Raise RuleViolation unless ``version`` may go from its status to ``target``."""
    if version.status == target:
        raise RuleViolation("no-op", f"version {version.version} is already {target.label}")
    if target == Status.ACTIVE and version.status in (Status.FAILED, Status.RETIRED, Status.ROLLED_BACK):
        raise RuleViolation(
            f"no-promote-{version.status.label.replace('_', '-')}",
            f"version {version.version} is {version.status.label} and cannot be promoted"
            + ("; use Rollback to return to the previous active version" if version.status == Status.RETIRED else ""),
        )
    if target not in ALLOWED[version.status]:
        raise RuleViolation(
            "transition",
            f"version {version.version} cannot go from {version.status.label} to {target.label}; "
            f"allowed: {sorted(s.label for s in ALLOWED[version.status]) or 'none (final status)'}",
        )


def promote(target: Version, active: Version | None) -> list[Change]:
    """Make ``target`` active; the version active until now (if any) is retired."""
    check_transition(target, Status.ACTIVE)
    changes = []
    if active is not None and active.policy_id != target.policy_id:
        changes.append(Change(active.policy_id, active.status, Status.RETIRED))
    changes.append(Change(target.policy_id, target.status, Status.ACTIVE))
    return changes


def rollback(active: Version | None, activations: Sequence[Version]) -> list[Change]:
    """Roll back the active version: it becomes rolled back, and the latest version that was
    active before it and is retired now (``activations``: every activation of the name, newest
    first, as the versions stand now) becomes active again."""
    if active is None:
        raise RuleViolation("rollback-needs-active", "no version is active, so there is nothing to roll back")
    previous = next(
        (v for v in activations if v.policy_id != active.policy_id and v.status == Status.RETIRED),
        None,
    )
    if previous is None:
        raise RuleViolation(
            "rollback-needs-previous",
            f"version {active.version} is the only version that was ever active (none retired to return to)",
        )
    return [
        Change(active.policy_id, active.status, Status.ROLLED_BACK),
        Change(previous.policy_id, previous.status, Status.ACTIVE),
    ]


def set_status(
    version: Version, target: Status, active: Version | None, activations: Sequence[Version]
) -> list[Change]:
    """SetPolicyStatus: ACTIVE promotes; ROLLED_BACK of the active version rolls back (the
    previous active one returns); anything else is one checked change."""
    if target == Status.ACTIVE:
        return promote(version, active)
    if target == Status.ROLLED_BACK and version.status == Status.ACTIVE:
        return rollback(version, activations)
    check_transition(version, target)
    return [Change(version.policy_id, version.status, target)]
