"""The policy registry of the trainer, as a real process on real PostgreSQL and NATS: versions
are numbered per name, never reused (not after concurrent registrations, not after a delete);
Promote retires the previous active version, Rollback returns to it; the rules refuse what
they forbid with FAILED_PRECONDITION naming the rule; every change is a PolicyChangedEvent
on flywheel.trainer.policy.<name>, in order, each once."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import pytest

from flywheel.api.subjects import Catalogue
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.api.trainer.v1.events_pb2 import PolicyChangedEvent

from .helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REG, CANARY, ACTIVE, RETIRED, ROLLED_BACK = (
    jobs.POLICY_STATUS_REGISTERED,
    jobs.POLICY_STATUS_CANARY,
    jobs.POLICY_STATUS_ACTIVE,
    jobs.POLICY_STATUS_RETIRED,
    jobs.POLICY_STATUS_ROLLED_BACK,
)
NAME = "support-dpo"


def register(n: int, parent: str = "") -> pb.RegisterPolicyRequest:
    return pb.RegisterPolicyRequest(
        name=NAME,
        kind=jobs.TRAINING_KIND_DPO,
        base_model="s3://models/smollm2-135m-instruct",
        checkpoint_uri=f"s3://checkpoints/{NAME}/{n}/adapter",
        dataset_uri="s3://exports/ds1/manifest.json",
        job_id=f"job-{n}",
        parent_policy_id=parent,
        metrics={"win_rate": 0.5 + n / 100},
        actor="test",
        reason=f"import {n}",
    )


async def connect(env: dict[str, str]) -> asyncpg.Connection:
    return await asyncpg.connect(
        env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://"),
        server_settings={"search_path": env["FLYWHEEL_DB_SCHEMA"]},
    )


async def refused(call, code: grpc.StatusCode, *words: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert err.value.code() == code, f"{err.value.code().name}: {details}"
    for word in words:
        assert word in details, details
    return details


async def test_register_promote_rollback_with_events(launch, nats_client):
    trainer = launch("trainer")
    ns = launch.isolation["namespace"]
    js = nats_client.jetstream()
    changes = await js.pull_subscribe(
        Catalogue(namespace=ns).policy_changed(NAME), stream=f"{ns.upper()}_TRAINER_EVENTS"
    )
    async with grpc.aio.insecure_channel(trainer.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        v1 = (await stub.RegisterPolicy(register(1))).policy
        v2 = (await stub.RegisterPolicy(register(2, parent=v1.policy_id))).policy
        assert (v1.version, v1.status, v2.version, v2.parent_policy_id) == (1, REG, 2, v1.policy_id)
        assert v2.metrics["win_rate"] == pytest.approx(0.52) and v2.kind == jobs.TRAINING_KIND_DPO

        promoted = await stub.PromotePolicy(pb.PromotePolicyRequest(policy_id=v1.policy_id, actor="op"))
        assert promoted.policy.status == ACTIVE and not promoted.HasField("retired")
        promoted = await stub.PromotePolicy(pb.PromotePolicyRequest(policy_id=v2.policy_id, actor="op"))
        assert (promoted.policy.version, promoted.policy.status) == (2, ACTIVE)
        assert (promoted.retired.version, promoted.retired.status) == (1, RETIRED)

        back = await stub.RollbackPolicy(pb.RollbackPolicyRequest(name=NAME, reason="feedback fell", actor="op"))
        assert (back.rolled_back.version, back.rolled_back.status) == (2, ROLLED_BACK)
        assert (back.policy.version, back.policy.status) == (1, ACTIVE)
        got = (await stub.GetPolicy(pb.GetPolicyRequest(policy_id=v1.policy_id))).policy
        assert got.status == ACTIVE and got.updated_at.ToDatetime() >= got.created_at.ToDatetime()

        # The rules, with the rule named.
        await refused(
            stub.PromotePolicy(pb.PromotePolicyRequest(policy_id=v2.policy_id)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "rolled_back",
            "rule: no-promote-rolled-back",
        )
        await refused(
            stub.SetPolicyStatus(pb.SetPolicyStatusRequest(policy_id=v2.policy_id, status=ACTIVE)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "rule: no-promote-rolled-back",
        )
        await refused(
            stub.SetPolicyStatus(pb.SetPolicyStatusRequest(policy_id=v2.policy_id, status=CANARY)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "rule: transition",
        )
        # v2, the only other version ever active, is rolled back: there is nothing to return to.
        await refused(
            stub.RollbackPolicy(pb.RollbackPolicyRequest(name=NAME)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "rule: rollback-needs-previous",
        )
        await refused(stub.GetPolicy(pb.GetPolicyRequest(policy_id="0" * 32)), grpc.StatusCode.NOT_FOUND, "policy_id")
        await refused(stub.RollbackPolicy(pb.RollbackPolicyRequest(name="nobody")), grpc.StatusCode.NOT_FOUND, "name")
        await refused(
            stub.SetPolicyStatus(pb.SetPolicyStatusRequest(policy_id=v1.policy_id, status=99)),  # type: ignore[arg-type]
            grpc.StatusCode.INVALID_ARGUMENT,
            "status",
        )
        await refused(
            stub.RegisterPolicy(pb.RegisterPolicyRequest(name="a.b", kind=jobs.TRAINING_KIND_SFT)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "name",
        )

        # A canary path through SetPolicyStatus: v3 canary, then SetPolicyStatus(ACTIVE) promotes it.
        v3 = (await stub.RegisterPolicy(register(3, parent=v1.policy_id))).policy
        canary = await stub.SetPolicyStatus(pb.SetPolicyStatusRequest(policy_id=v3.policy_id, status=CANARY))
        assert canary.policy.status == CANARY
        active = await stub.SetPolicyStatus(pb.SetPolicyStatusRequest(policy_id=v3.policy_id, status=ACTIVE))
        assert active.policy.status == ACTIVE

        # Concurrent registrations get distinct, consecutive versions.
        many = await asyncio.gather(*(stub.RegisterPolicy(register(10 + i)) for i in range(8)))
        assert sorted(r.policy.version for r in many) == list(range(4, 12))

        # Deleting the newest version does not free its number.
        conn = await connect(trainer.env)
        try:
            await conn.execute("DELETE FROM policies WHERE name = $1 AND version = 11", NAME)
            # The database itself allows one active version per name.
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute("UPDATE policies SET status = $1 WHERE name = $2", ACTIVE, NAME)
        finally:
            await conn.close()
        v12 = (await stub.RegisterPolicy(register(12))).policy
        assert v12.version == 12
        listed = (await stub.ListPolicies(pb.ListPoliciesRequest(name=NAME))).policies
        assert [p.version for p in listed] == [12, *range(10, 0, -1)]
        assert [p.version for p in listed if p.status == ACTIVE] == [3]

    events = [PolicyChangedEvent.FromString(m.data) for m in await changes.fetch(30, timeout=10)]
    seen = [(e.policy.version, e.previous_status, e.policy.status) for e in events]
    assert seen[:9] == [
        (1, 0, REG),
        (2, 0, REG),
        (1, REG, ACTIVE),
        (1, ACTIVE, RETIRED),
        (2, REG, ACTIVE),
        (2, ACTIVE, ROLLED_BACK),
        (1, RETIRED, ACTIVE),
        (3, 0, REG),
        (3, REG, CANARY),
    ]
    assert seen[9:11] == [(1, ACTIVE, RETIRED), (3, CANARY, ACTIVE)]
    assert sorted(v for v, _, s in seen[11:] if s == REG) == list(range(4, 13))
    assert len(seen) == 20, seen  # nothing for the refused requests, one per change
    assert len({e.meta.event_id for e in events}) == len(events)
    assert all(e.meta.source == "trainer" and e.policy.name == NAME for e in events)


async def test_changes_left_unpublished_are_published_by_the_sweep_once(launch, nats_client):
    """A crash between the commit and the publish leaves history rows unpublished: the sweep
    publishes them, and a change published twice is stored once (its event id is the dedup id)."""
    trainer = launch(
        "trainer",
        env={"FLYWHEEL_TRAINER_POLICY_EVENT_SWEEP_S": "0.3", "FLYWHEEL_TRAINER_POLICY_EVENT_GRACE_S": "0"},
    )
    ns = launch.isolation["namespace"]
    changes = await nats_client.jetstream().pull_subscribe(
        Catalogue(namespace=ns).policy_changed(NAME), stream=f"{ns.upper()}_TRAINER_EVENTS"
    )
    async with grpc.aio.insecure_channel(trainer.address) as channel:
        v1 = (await pb_grpc.TrainerServiceStub(channel).RegisterPolicy(register(1))).policy
    conn = await connect(trainer.env)
    try:
        unpublished = "SELECT count(*) FROM policy_history WHERE published_at IS NULL"
        await eventually(lambda: conn.fetchval(unpublished), lambda n: n == 0)
        # As if the process died after committing: the registration again, and a change never sent.
        await conn.execute("UPDATE policy_history SET published_at = NULL")
        await conn.execute(
            "INSERT INTO policy_history (policy_id, name, previous_status, status, event_id, actor, reason)"
            " VALUES ($1, $2, $3, $4, 'lost-change-1', 'test', 'crash')",
            v1.policy_id,
            NAME,
            REG,
            CANARY,
        )
        await eventually(lambda: conn.fetchval(unpublished), lambda n: n == 0, timeout_s=15)
    finally:
        await conn.close()
    events = [PolicyChangedEvent.FromString(m.data) for m in await changes.fetch(10, timeout=3)]
    assert [(e.previous_status, e.policy.status) for e in events] == [(0, REG), (REG, CANARY)]
    assert events[1].meta.event_id == "lost-change-1"
