"""plan_apply: what `flywheel endpoint apply` would change, computed against a live endpoint."""

from __future__ import annotations

import pytest

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.sdk.admin import AdminClient, ApplyConflict, apply_plan, plan_apply
from flywheel.sdk.endpoint_file import parse_endpoint

FILE = {
    "name": "bot",
    "description": "d",
    "arms": [{"arm_id": "a", "params": {"model": "m", "max_tokens": 512}}, {"arm_id": "b", "params": {}}],
    "policy": {"exploration_floor": 0.1},
    "reward": {"signal_weights": {"q": 1.0}},
}


def live_from(data: dict, *, zeros_for_defaults: bool = False) -> pb.Endpoint:
    """What GetEndpoint would return after creating ``data`` (arms active, stats empty)."""
    msg = parse_endpoint(data).to_proto()
    if zeros_for_defaults:  # an older server, or one that leaves defaults unset
        msg.policy.ClearField("incumbent")
        msg.policy.ClearField("canary")
        msg.policy.sticky_ttl_s = 0
    for arm in msg.arms:
        arm.status = arm.status or pb.ARM_STATUS_ACTIVE
    return msg


def test_missing_endpoint_is_created():
    plan = plan_apply(parse_endpoint(FILE), None)
    assert plan.create and not plan.empty
    assert plan.describe() == ["+ create endpoint 'bot' (thompson_beta) with arms a, b"]


@pytest.mark.parametrize("zeros", [False, True])
def test_same_file_is_no_change(zeros):
    plan = plan_apply(parse_endpoint(FILE), live_from(FILE, zeros_for_defaults=zeros))
    assert plan.empty and not plan.conflicts and not plan.notes
    assert plan.describe() == []


def test_edits_become_adds_updates_and_retirements():
    edited = {
        **FILE,
        "arms": [FILE["arms"][0], {"arm_id": "c", "params": {"t": 0.5}, "status": "canary", "traffic_cap": 0.2}],
        "policy": {"exploration_floor": 0.05, "half_life_s": 3600},
    }
    plan = plan_apply(parse_endpoint(edited), live_from(FILE))
    assert [a.arm_id for a in plan.add] == ["c"]
    assert plan.retire == ["b"]
    assert plan.settings == [("policy.exploration_floor", 0.1, 0.05), ("policy.half_life_s", 0.0, 3600.0)]
    assert plan.describe() == [
        "~ policy.exploration_floor: 0.1 -> 0.05",
        "~ policy.half_life_s: 0.0 -> 3600.0",
        "+ add arm 'c' as canary (traffic_cap 0.2) params {\"t\": 0.5}",
        "- retire arm 'b'",
    ]


def test_reward_and_description_changes():
    live = live_from(FILE)
    plan = plan_apply(parse_endpoint({**FILE, "description": "new", "reward": {"signal_weights": {"q": 2}}}), live)
    assert plan.settings == [("description", "d", "new"), ("reward.signal_weights", {"q": 1.0}, {"q": 2.0})]


def test_changed_params_conflict_and_nothing_is_applied():
    changed = {**FILE, "arms": [{"arm_id": "a", "params": {"model": "other"}}, FILE["arms"][1]]}
    plan = plan_apply(parse_endpoint(changed), live_from(FILE))
    assert len(plan.conflicts) == 1 and "arm 'a'" in plan.conflicts[0] and "new arm_id" in plan.conflicts[0]

    class Untouchable(AdminClient):
        def __init__(self):
            pass

        def __getattribute__(self, name):
            raise AssertionError(f"apply_plan called {name} despite a conflict")

    with pytest.raises(ApplyConflict):
        apply_plan(Untouchable(), plan)


def test_retired_arms_in_the_file_are_a_note_not_a_change():
    live = live_from(FILE)
    live.arms[1].status = pb.ARM_STATUS_RETIRED  # e.g. a canary retired by its posterior
    plan = plan_apply(parse_endpoint(FILE), live)
    assert plan.empty and plan.notes and "'b' is retired" in plan.notes[0]
    # ... and a retired arm missing from the file is not retired again.
    plan = plan_apply(parse_endpoint({**FILE, "arms": FILE["arms"][:1]}), live)
    assert plan.empty


def test_promoted_canary_still_matches_its_file():
    data = {**FILE, "arms": [*FILE["arms"], {"arm_id": "c", "status": "canary", "traffic_cap": 0.1}]}
    live = live_from(data)
    live.arms[2].status = pb.ARM_STATUS_ACTIVE
    assert plan_apply(parse_endpoint(data), live).empty
