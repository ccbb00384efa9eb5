"""The policy registry's rules: allowed transitions, Promote, Rollback, SetPolicyStatus."""

from __future__ import annotations

import pytest

from flywheel.trainer.registry.rules import (
    ALLOWED,
    Change,
    RuleViolation,
    Status,
    Version,
    promote,
    rollback,
    set_status,
)


def v(n: int, status: Status) -> Version:
    return Version(f"p{n}", n, status)


def test_promote_retires_the_previous_active_version_first() -> None:
    assert promote(v(2, Status.CANARY), v(1, Status.ACTIVE)) == [
        Change("p1", Status.ACTIVE, Status.RETIRED),
        Change("p2", Status.CANARY, Status.ACTIVE),
    ]


def test_first_promotion_changes_only_the_version() -> None:
    assert promote(v(1, Status.REGISTERED), None) == [Change("p1", Status.REGISTERED, Status.ACTIVE)]


@pytest.mark.parametrize(
    ("status", "rule"),
    [
        (Status.FAILED, "no-promote-failed"),
        (Status.RETIRED, "no-promote-retired"),
        (Status.ROLLED_BACK, "no-promote-rolled-back"),
        (Status.ACTIVE, "no-op"),
    ],
)
def test_promotion_refused(status: Status, rule: str) -> None:
    with pytest.raises(RuleViolation) as err:
        promote(v(2, status), v(1, Status.ACTIVE) if status != Status.ACTIVE else v(2, status))
    assert err.value.rule == rule
    assert f"rule: {rule}" in str(err.value)
    assert err.value.code.name == "FAILED_PRECONDITION"


def test_rollback_returns_to_the_latest_retired_activation() -> None:
    # Activated in order v1, v2, v3 (newest first below); v2 was rolled back once already.
    active = v(3, Status.ACTIVE)
    activations = [active, v(2, Status.ROLLED_BACK), v(1, Status.RETIRED)]
    assert rollback(active, activations) == [
        Change("p3", Status.ACTIVE, Status.ROLLED_BACK),
        Change("p1", Status.RETIRED, Status.ACTIVE),
    ]


def test_rollback_needs_an_active_and_a_previous_version() -> None:
    with pytest.raises(RuleViolation) as err:
        rollback(None, [])
    assert err.value.rule == "rollback-needs-active"
    only = v(1, Status.ACTIVE)
    with pytest.raises(RuleViolation) as err:
        rollback(only, [only])
    assert err.value.rule == "rollback-needs-previous"


def test_set_status_delegates_active_and_rolled_back_of_the_active_version() -> None:
    active = v(1, Status.ACTIVE)
    assert set_status(v(2, Status.CANARY), Status.ACTIVE, active, [active]) == promote(v(2, Status.CANARY), active)
    two = v(2, Status.ACTIVE)
    history = [two, v(1, Status.RETIRED)]
    assert set_status(two, Status.ROLLED_BACK, two, history) == rollback(two, history)
    # A canary that lost is rolled back on its own; the active version stays.
    assert set_status(v(3, Status.CANARY), Status.ROLLED_BACK, two, history) == [
        Change("p3", Status.CANARY, Status.ROLLED_BACK)
    ]


@pytest.mark.parametrize("current", list(Status))
@pytest.mark.parametrize("target", list(Status))
def test_set_status_follows_the_table(current: Status, target: Status) -> None:
    version = v(5, current)
    active = version if current == Status.ACTIVE else v(1, Status.ACTIVE)
    activations = [active, v(0, Status.RETIRED)]
    allowed = target in ALLOWED[current] and current != target
    if allowed:
        changes = set_status(version, target, active, activations)
        assert changes[-1].policy_id in ("p5", "p0") and any(c.policy_id == "p5" for c in changes)
    else:
        with pytest.raises(RuleViolation):
            set_status(version, target, active, activations)


def test_final_statuses_allow_nothing() -> None:
    for status in (Status.RETIRED, Status.ROLLED_BACK, Status.FAILED):
        assert ALLOWED[status] == frozenset()
    assert Status.REGISTERED not in {t for targets in ALLOWED.values() for t in targets}
