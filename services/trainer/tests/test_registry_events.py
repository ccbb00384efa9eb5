"""A status change as the PolicyChangedEvent consumers read."""

from __future__ import annotations

from datetime import UTC, datetime

from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.trainer.registry.events import changed_event, policy_message
from flywheel.trainer.registry.models import PolicyHistoryRow, PolicyRow
from flywheel.trainer.registry.rules import Status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)


def row(status: Status) -> PolicyRow:
    return PolicyRow(
        policy_id="p2",
        name="support",
        version=2,
        kind=jobs_pb2.TRAINING_KIND_DPO,
        base_model="base",
        checkpoint_uri="s3://c/2",
        dataset_uri="s3://d/m.json",
        job_id="j2",
        parent_policy_id="p1",
        metrics={"win_rate": 0.61},
        status=int(status),
        created_at=T0,
        updated_at=T1,
    )


def test_policy_message_carries_lineage_and_metrics() -> None:
    policy = policy_message(row(Status.CANARY))
    assert (policy.name, policy.version, policy.parent_policy_id, policy.job_id) == ("support", 2, "p1", "j2")
    assert policy.status == jobs_pb2.POLICY_STATUS_CANARY and policy.metrics["win_rate"] == 0.61
    assert policy.created_at.ToDatetime(tzinfo=UTC) == T0 and policy.updated_at.ToDatetime(tzinfo=UTC) == T1


def test_event_shows_the_change_it_records_not_the_current_status() -> None:
    # Republished later (the version has moved on to retired): the event still says canary -> active.
    history = PolicyHistoryRow(
        id=7,
        policy_id="p2",
        name="support",
        previous_status=int(Status.CANARY),
        status=int(Status.ACTIVE),
        event_id="e7",
        actor="op",
        reason="won",
        at=T1,
    )
    event = changed_event(history, row(Status.RETIRED))
    assert event.meta.event_id == "e7" and event.meta.source == "trainer"
    assert (event.previous_status, event.policy.status) == (
        jobs_pb2.POLICY_STATUS_CANARY,
        jobs_pb2.POLICY_STATUS_ACTIVE,
    )
    assert event.meta.time.ToDatetime(tzinfo=UTC) == T1
