"""Provisional folds (issue 19) on real optimizer processes, NATS and PostgreSQL: a replica's
Select samples from the rewards of its own decisions as soon as they are published, and the
other replica's Select from them once the first tells it (peer_folds.py), before any feedback
transaction commits; every provisional fold is then settled by the transaction that applied its
event (its own, or the other replica's, named in its NOTIFY), so none counts twice.
The full refresh is pushed out to 60 s, so only folds can explain what Select does."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from sqlalchemy import text

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.core.db import create_engine
from flywheel.core.settings import DatabaseSettings
from flywheel.sdk import FlywheelClient

from .helpers import eventually, metrics, sample, sdk_nats, three_arm_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SLOW_REFRESH = {"FLYWHEEL_OPTIMIZER_REFRESH_INTERVAL_S": "60"}
FOLDS = "flywheel_optimizer_provisional_folds_total"
SEEN = "flywheel_optimizer_provisional_feedback_total"


def reward(arm_id: str) -> float:
    return 1.0 if arm_id == "small" else 0.0


async def p_small(
    sel: sel_grpc.SelectionServiceStub, endpoint: str, n: int = 10, context: dict[str, str] | None = None
) -> float:
    """The probability Select gave "small" (from responses that chose it; 0 if none did)."""
    seen = []
    for _ in range(n):
        request = sel_pb.SelectRequest(endpoint=endpoint)
        request.context.update(context or {})
        r = await sel.Select(request)
        if r.arm_id == "small":
            seen.append(r.probability)
    return max(seen, default=0.0)


async def committed_pulls(admin: admin_grpc.EndpointAdminServiceStub, name: str) -> int:
    """What PostgreSQL holds (GetEndpoint reads it, never the snapshot Select uses)."""
    got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=name))
    return sum(s.pulls for s in got.endpoint.stats)


REBUILDS = "flywheel_optimizer_posterior_rebuilds_total"


async def counts(port: int) -> dict[str, float]:
    body = await asyncio.to_thread(metrics, port)
    out = {o: sample(body, FOLDS, outcome=o) for o in ("folded", "settled", "expired", "late", "skipped")}
    out.update({f"seen_{o}": sample(body, SEEN, outcome=o) for o in ("folded", "elsewhere", "invalid")})
    return out


async def test_select_uses_published_feedback_before_its_transaction_commits(launch, stack_env, isolation, monkeypatch):
    optimizer = launch("optimizer", env={**SLOW_REFRESH, "FLYWHEEL_OPTIMIZER_POSTERIOR_NOTIFY": "false"})
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    try:
        async with (
            grpc.aio.insecure_channel(optimizer.address) as channel,
            FlywheelClient(target=optimizer.address, **sdk_nats(stack_env, isolation["namespace"])) as fw,
        ):
            admin = admin_grpc.EndpointAdminServiceStub(channel)
            sel = sel_grpc.SelectionServiceStub(channel)
            await admin.CreateEndpoint(three_arm_endpoint("early"))
            made = [await fw.select("early") for _ in range(60)]
            async with engine.connect() as lock:
                # Hold the arms' rows: the feedback transaction blocks on them, uncommitted.
                await lock.execute(text("SELECT 1 FROM arms WHERE endpoint = 'early' FOR UPDATE"))
                for d in made:
                    await fw.feedback(d, reward=reward(d.arm_id))
                # Select has the rewards already ...
                p = await eventually(lambda: p_small(sel, "early"), lambda p: p > 0.95, timeout_s=5.0)
                assert p > 0.95
                # ... while nothing is committed.
                assert await committed_pulls(admin, "early") == 0
                await lock.rollback()
            await eventually(lambda: committed_pulls(admin, "early"), lambda n: n == 60, timeout_s=20)
            # Every provisional fold was replaced by its commit: none left over, none expired.
            got = await eventually(lambda: counts(optimizer.metrics_port), lambda c: c["settled"] >= 60, timeout_s=5)
            assert got["folded"] == 60 and got["settled"] == 60 and got["expired"] == 0, got
            assert got["seen_folded"] == 60 and got["seen_elsewhere"] == 0, got
            assert await p_small(sel, "early") > 0.95

            # A segmented endpoint: the segment's posterior has them before the commit too.
            segmented = three_arm_endpoint("by-country")
            segmented.endpoint.policy.CopyFrom(ep_pb.PolicySpec(segment_key="country"))
            await admin.CreateEndpoint(segmented)
            fr = {"country": "fr"}
            made = [await fw.select("by-country", context=fr) for _ in range(60)]
            async with engine.connect() as lock:
                await lock.execute(text("SELECT 1 FROM arms WHERE endpoint = 'by-country' FOR UPDATE"))
                for d in made:
                    await fw.feedback(d, reward=reward(d.arm_id))
                p = await eventually(lambda: p_small(sel, "by-country", context=fr), lambda p: p > 0.95, timeout_s=5.0)
                assert p > 0.95 and await committed_pulls(admin, "by-country") == 0
                await lock.rollback()
            await eventually(lambda: committed_pulls(admin, "by-country"), lambda n: n == 60, timeout_s=20)
            got = await eventually(lambda: counts(optimizer.metrics_port), lambda c: c["settled"] >= 120, timeout_s=5)
            assert got["folded"] == 120 and got["expired"] == 0, got
            assert await p_small(sel, "by-country", context=fr) > 0.95
            # The real service took both ways of rebuilding (reweight.py): the first rebuild after
            # the read drew (a read keeps no draws), later ones reweighted those draws on the
            # event loop, and a large jump in the evidence (60 commits at once) drew again.
            body = await asyncio.to_thread(metrics, optimizer.metrics_port)
            drawn, reweighted = (sample(body, REBUILDS, how=h) for h in ("drawn", "reweighted"))
            assert drawn >= 1 and reweighted >= 1, (drawn, reweighted)
    finally:
        await engine.dispose()


PEER_FOLDS = "flywheel_optimizer_peer_folds_total"


async def heard(port: int) -> float:
    """Notifications a replica received from the other replica (each commit there sends some)."""
    body = await asyncio.to_thread(metrics, port)
    return sample(body, "flywheel_optimizer_increment_listener_events_total", event="notification")


async def test_each_replica_has_the_others_rewards_before_their_commit_and_every_fold_is_settled(
    launch, stack_env, isolation, monkeypatch
):
    a = launch("optimizer", env=SLOW_REFRESH)
    b = launch("optimizer", env=SLOW_REFRESH)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    try:
        async with (
            grpc.aio.insecure_channel(a.address) as channel,
            grpc.aio.insecure_channel(b.address) as channel_b,
            FlywheelClient(target=a.address, **sdk_nats(stack_env, isolation["namespace"])) as fw,
        ):
            admin = admin_grpc.EndpointAdminServiceStub(channel)
            sel_b = sel_grpc.SelectionServiceStub(channel_b)
            await admin.CreateEndpoint(three_arm_endpoint("shared"))
            n = 0
            # Both replicas fetch from the one durable consumer: some of A's events are applied by
            # B, whose NOTIFY must name them so that A drops its provisional folds of them. Until
            # A has heard from B (a NOTIFY), it keeps its folds to itself.
            for _ in range(20):
                made = [await fw.select("shared") for _ in range(40)]
                await asyncio.gather(*(fw.feedback(d, reward=reward(d.arm_id)) for d in made))
                n += len(made)
                if n >= 240 and await heard(a.metrics_port) > 0:
                    break
            assert await heard(a.metrics_port) > 0, "B applied none of the feedback"
            await eventually(lambda: committed_pulls(admin, "shared"), lambda got: got == n, timeout_s=30)

            # Now A tells B of its folds: B's Select has the rewards of A's decisions while no
            # transaction can commit them.
            await admin.CreateEndpoint(three_arm_endpoint("peered"))
            await eventually(lambda: p_small(sel_b, "peered", n=3), lambda _p: True, timeout_s=10)  # B has it cached
            made = [await fw.select("peered") for _ in range(60)]
            async with engine.connect() as lock:
                await lock.execute(text("SELECT 1 FROM arms WHERE endpoint = 'peered' FOR UPDATE"))
                for d in made:
                    await fw.feedback(d, reward=reward(d.arm_id))
                p = await eventually(lambda: p_small(sel_b, "peered"), lambda p: p > 0.95, timeout_s=5.0)
                assert p > 0.95 and await committed_pulls(admin, "peered") == 0
                await lock.rollback()
            await eventually(lambda: committed_pulls(admin, "peered"), lambda got: got == 60, timeout_s=20)
            n += 60
            # Every provisional fold, A's own and those B took from A, was settled by the commit
            # that applied its event, whichever replica ran it: none expired, none left over.
            on_a = await eventually(lambda: counts(a.metrics_port), lambda c: c["settled"] >= n, timeout_s=5)
            on_b = await eventually(
                lambda: counts(b.metrics_port), lambda c: c["folded"] >= 60 and c["settled"] == c["folded"], timeout_s=5
            )
            body_b = await asyncio.to_thread(metrics, b.metrics_port)
            applied_by_b = sample(body_b, "flywheel_events_total", consumer="optimizer-feedback", outcome="ack")
            assert await p_small(sel_b, "peered") > 0.95
    finally:
        await engine.dispose()
    print(
        f"A folded {on_a['folded']:.0f}, settled {on_a['settled']:.0f}; B applied {applied_by_b:.0f} of {n}, "
        f"folded {on_b['folded']:.0f} of A's, settled {on_b['settled']:.0f}"
    )
    assert on_a["folded"] == n and on_a["settled"] == n and on_a["expired"] == 0, on_a
    assert on_b["expired"] == 0 and on_b["settled"] == on_b["folded"], on_b
    # B folded A's rewards only as A told them (B decided nothing): never from the feedback itself.
    assert on_b["seen_folded"] == 0 and on_b["seen_elsewhere"] == n, on_b
    assert sample(body_b, PEER_FOLDS, outcome="folded") == on_b["folded"]
