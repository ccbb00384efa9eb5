"""The canary stage's verdict when the optimizer's lifecycle decides on its own tick, after the
stage's last look: the record takes the verdict it finds and waits for the registry to follow
it (CI once saw "undecided" recorded beside a RETIRED arm)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.stack.story import canary

ARM, POLICY = "support-assistant-v1", "pol-1"


def endpoint(status: int) -> ep_pb.Endpoint:
    return ep_pb.Endpoint(name="support-assistant", arms=[ep_pb.Arm(arm_id=ARM, status=status)])


class Trainer:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses

    async def GetPolicy(self, request):
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return SimpleNamespace(policy=jobs.Policy(policy_id=request.policy_id, status=status))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch):
    """The arm statuses successive GetEndpoint calls return."""
    seen: list[int] = []

    async def get_endpoint(ctx, channel):
        return endpoint(seen.pop(0) if len(seen) > 1 else seen[0])

    monkeypatch.setattr(canary, "get_endpoint", get_endpoint)
    return seen


async def test_a_tick_after_the_last_look_is_the_verdict(reads) -> None:
    # Read 1: still a canary, but the registry already rolled back (the tick fell in between).
    reads += [ep_pb.ARM_STATUS_CANARY, ep_pb.ARM_STATUS_RETIRED]
    trainer = Trainer([jobs.POLICY_STATUS_ROLLED_BACK])
    decision, found, policy = await canary.verdict_and_registry(None, None, trainer, ARM, POLICY, "undecided")
    assert decision == "rolled_back" and policy.status == jobs.POLICY_STATUS_ROLLED_BACK
    assert canary.arm_status(found, ARM) == ep_pb.ARM_STATUS_RETIRED  # the record's arm agrees


async def test_undecided_stays_undecided_while_arm_and_registry_say_canary(reads) -> None:
    reads.append(ep_pb.ARM_STATUS_CANARY)
    decision, found, policy = await canary.verdict_and_registry(
        None, None, Trainer([jobs.POLICY_STATUS_CANARY]), ARM, POLICY, "undecided", tick_s=0
    )
    assert (decision, policy.status) == ("undecided", jobs.POLICY_STATUS_CANARY)
    assert canary.arm_status(found, ARM) == ep_pb.ARM_STATUS_CANARY


async def test_undecided_waits_a_lifecycle_tick_for_the_last_feedback(reads, monkeypatch) -> None:
    # The demo once ended "undecided" while P(better) had just fallen under the retire rule:
    # the tick that would have retired the arm came after the stage's last look.
    reads += [ep_pb.ARM_STATUS_CANARY, ep_pb.ARM_STATUS_CANARY, ep_pb.ARM_STATUS_RETIRED]
    trainer = Trainer([jobs.POLICY_STATUS_CANARY, jobs.POLICY_STATUS_CANARY, jobs.POLICY_STATUS_ROLLED_BACK])
    naps: list[float] = []

    async def sleep(seconds: float) -> None:
        naps.append(seconds)

    monkeypatch.setattr(canary.asyncio, "sleep", sleep)
    decision, found, policy = await canary.verdict_and_registry(
        None, None, trainer, ARM, POLICY, "undecided", tick_s=3600
    )
    assert decision == "rolled_back" and policy.status == jobs.POLICY_STATUS_ROLLED_BACK
    assert canary.arm_status(found, ARM) == ep_pb.ARM_STATUS_RETIRED and len(naps) == 2


async def test_a_lagging_registry_is_waited_for_and_a_stuck_one_named(reads) -> None:
    reads.append(ep_pb.ARM_STATUS_ACTIVE)
    trainer = Trainer([jobs.POLICY_STATUS_CANARY, jobs.POLICY_STATUS_ACTIVE])
    decision, _, policy = await canary.verdict_and_registry(None, None, trainer, ARM, POLICY, "promoted")
    assert (decision, policy.status) == ("promoted", jobs.POLICY_STATUS_ACTIVE)
    with pytest.raises(TimeoutError, match="wants POLICY_STATUS_ACTIVE"):
        await canary.verdict_and_registry(
            None, None, Trainer([jobs.POLICY_STATUS_CANARY]), ARM, POLICY, "promoted", timeout_s=0
        )
