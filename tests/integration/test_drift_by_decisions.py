"""Forgetting by decisions through a real optimizer (PostgreSQL, NATS): a half-life measured in
the endpoint's decisions gives the same posterior whether the same decisions and feedback come
at 25, 100 or up to 400 decisions per second, and the same as the in-process policy (`ThompsonAgent`
with its clock counting decisions, as `bench/regret` runs it); a half-life in seconds does not.

Each run plays one sequence: rounds of ``BATCH`` decisions (one SelectBatch), then the feedback
of each (gRPC Update, concurrently), the rewards fixed in advance and drifting halfway (0.9 then
0.1). The endpoints have one arm, so the sequence of decisions and rewards is the same in every
run and only the pace differs. The decision clock at each round's feedback is then the number of
decisions made so far, ``BATCH * (round + 1)``: the in-process agent is updated at that clock.
"""

from __future__ import annotations

import asyncio
import random
import time

import asyncpg
import grpc
import numpy as np
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.optimizer.policies.simulate import ThompsonAgent

from .helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Decisions per second. The fast run asks for 400/s; what one test client reaches with a gRPC
# Update per decision depends on the machine (about 120-250/s on 2 shared cores, 122/s in one
# loaded CI run), so the test checks the pace it reached: at least 2.5x the slow run's. The slow
# pace is 25/s so that even 65/s is fast enough. A run at 100/s (decisions only) shows the issue's
# "the same at 100 and at 400 decisions/s".
SLOW, MID, FAST = 25, 100, 400
HALF_LIFE = 200  # decisions; in seconds: 8 s is 200 decisions at 25/s but 1,000+ at 125/s and more
# Rounds of 40 concurrent Updates: they share the service's feedback batches and reloads, which
# is what lets one test client keep 400 decisions/s with feedback on a small machine.
BATCH = 40
ROUNDS = 20  # 800 decisions: 32 s at 25/s (both slow runs at once), 2-7 s fast
_RNG = random.Random(19)
REWARDS = [1.0 if _RNG.random() < (0.9 if i < BATCH * ROUNDS // 2 else 0.1) else 0.0 for i in range(BATCH * ROUNDS)]


def one_arm(name: str, policy: ep_pb.PolicySpec) -> admin_pb.CreateEndpointRequest:
    return admin_pb.CreateEndpointRequest(
        endpoint=ep_pb.Endpoint(name=name, arms=[ep_pb.Arm(arm_id="only", params=Struct())], policy=policy)
    )


async def play(sel: sel_grpc.SelectionServiceStub, name: str, rate: float) -> float:
    """Play the sequence on ``name`` at ``rate`` decisions per second; returns the rate achieved."""
    started = time.monotonic()
    for r in range(ROUNDS):
        # Paced by the clock, not by sleeps after the work: a slow round is caught up by the next.
        delay = started + r * BATCH / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        batch = await sel.SelectBatch(
            sel_pb.SelectBatchRequest(requests=[sel_pb.SelectRequest(endpoint=name) for _ in range(BATCH)])
        )
        await asyncio.gather(
            *(
                sel.Update(sel_pb.UpdateRequest(decision_id=d.decision_id, reward=REWARDS[r * BATCH + i]))
                for i, d in enumerate(batch.decisions)
            )
        )
    return BATCH * ROUNDS / (time.monotonic() - started)


async def posterior(admin: admin_grpc.EndpointAdminServiceStub, name: str) -> ep_pb.ArmStats:
    """The arm's posterior once every reward of the sequence is in it."""

    async def read() -> ep_pb.ArmStats:
        return (await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=name))).endpoint.stats[0]

    return await eventually(read, lambda s: s.pulls == BATCH * ROUNDS, timeout_s=10)


def in_process() -> tuple[float, float]:
    """Beta parameters of the same sequence in `ThompsonAgent`, its clock counting decisions."""
    agent = ThompsonAgent(1, "beta", half_life_s=HALF_LIFE)
    for r in range(ROUNDS):
        clock = BATCH * (r + 1)
        agent.update_many(np.zeros(BATCH, dtype=np.intp), np.asarray(REWARDS[r * BATCH : clock]), now=clock)
    ev = agent.evidence(now=BATCH * ROUNDS)
    return 1.0 + float(ev[0][0]), 1.0 + float(ev[1][0])


@pytest.fixture(scope="module")
def optimizer_process(launch_module):
    # The lifecycle tick drops expired window buckets: often, for the window test.
    return launch_module("optimizer", env={"FLYWHEEL_OPTIMIZER_LIFECYCLE_INTERVAL_S": "0.3"})


async def test_a_half_life_in_decisions_is_the_same_at_25_100_and_up_to_400_decisions_per_second(optimizer_process):
    async with grpc.aio.insecure_channel(optimizer_process.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        sel = sel_grpc.SelectionServiceStub(channel)
        rates, by_decisions, by_seconds = {}, {}, {}
        for rate in (SLOW, FAST):
            await admin.CreateEndpoint(one_arm(f"dec-{rate}", ep_pb.PolicySpec(half_life_decisions=HALF_LIFE)))
            await admin.CreateEndpoint(one_arm(f"sec-{rate}", ep_pb.PolicySpec(half_life_s=HALF_LIFE / SLOW)))
        # The slow runs side by side (their pace is the clock's, not the machine's); each fast run
        # alone, so it reaches what the machine can.
        rates["sec-slow"], rates["dec-slow"] = await asyncio.gather(
            play(sel, f"sec-{SLOW}", SLOW), play(sel, f"dec-{SLOW}", SLOW)
        )
        # Read at once: evidence in seconds keeps fading while the test goes on.
        by_seconds[SLOW] = await posterior(admin, f"sec-{SLOW}")
        by_decisions[SLOW] = await posterior(admin, f"dec-{SLOW}")
        rates["sec-fast"] = await play(sel, f"sec-{FAST}", FAST)
        by_seconds[FAST] = await posterior(admin, f"sec-{FAST}")
        rates["dec-fast"] = await play(sel, f"dec-{FAST}", FAST)
        by_decisions[FAST] = await posterior(admin, f"dec-{FAST}")
        await admin.CreateEndpoint(one_arm(f"dec-{MID}", ep_pb.PolicySpec(half_life_decisions=HALF_LIFE)))
        rates["dec-mid"] = await play(sel, f"dec-{MID}", MID)
        by_decisions[MID] = await posterior(admin, f"dec-{MID}")

    print(f"paces reached (decisions/s): {rates}")
    alpha, beta = in_process()
    for rate, st in by_decisions.items():
        assert st.alpha == pytest.approx(alpha, rel=0.03), (rate, st, alpha, beta)
        assert st.beta == pytest.approx(beta, rel=0.03), (rate, st, alpha, beta)
    slow = by_decisions[SLOW]
    for rate in (MID, FAST):
        assert by_decisions[rate].effective_pulls == pytest.approx(slow.effective_pulls, rel=0.03), rate
        assert by_decisions[rate].mean == pytest.approx(slow.mean, abs=0.01), rate
    # The paces differed as intended (on a machine too busy to pace them apart this fails here).
    for unit in ("sec", "dec"):
        assert rates[f"{unit}-slow"] > 0.8 * SLOW and rates[f"{unit}-fast"] > 2.5 * rates[f"{unit}-slow"], rates
    assert rates["dec-mid"] > 2 * rates["dec-slow"], rates
    # In seconds, the fast run remembers several times as many decisions (more evidence, and
    # more of the first half's 0.9s).
    assert by_seconds[FAST].effective_pulls > 1.5 * by_seconds[SLOW].effective_pulls, by_seconds
    assert by_seconds[FAST].mean > by_seconds[SLOW].mean + 0.05, by_seconds


async def test_a_window_in_decisions_counts_the_feedback_of_the_last_window_decisions(
    optimizer_process, servers, launch_module
):
    """window_decisions=100 (buckets of 5): after 300 decisions in rounds of 20, each round's
    feedback applied at clock 20, 40, ..., 300, the window holds the rounds applied at clock
    200 and later: 6 rounds, 120 rewards, whatever the pace."""
    async with grpc.aio.insecure_channel(optimizer_process.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        sel = sel_grpc.SelectionServiceStub(channel)
        await admin.CreateEndpoint(one_arm("windowed", ep_pb.PolicySpec(window_decisions=100)))
        for r in range(15):
            batch = await sel.SelectBatch(
                sel_pb.SelectBatchRequest(requests=[sel_pb.SelectRequest(endpoint="windowed") for _ in range(20)])
            )
            # Written by then (the log flushes every 20 ms), so the clock is 20 (r + 1) at the feedback
            # even if a flush split the batch.
            await asyncio.sleep(0.1)
            # Rewards 1 in rounds 0-11, then 0: the window sees 3 rounds of each.
            reward = float(r < 12)
            await asyncio.gather(
                *(sel.Update(sel_pb.UpdateRequest(decision_id=d.decision_id, reward=reward)) for d in batch.decisions)
            )
        st = await eventually(
            lambda: admin.GetEndpoint(admin_pb.GetEndpointRequest(name="windowed")),
            lambda got: got.endpoint.stats[0].pulls == 300,
            timeout_s=10,
        )
    arm = st.endpoint.stats[0]
    assert arm.effective_pulls == pytest.approx(120)
    assert (arm.alpha, arm.beta) == (pytest.approx(1 + 60), pytest.approx(1 + 60))
    # The clock counted every decision once; the lifecycle deleted the buckets out of the window.
    conn = await asyncpg.connect(
        servers.postgres.url, server_settings={"search_path": launch_module.isolation["schema"]}
    )
    try:
        assert await conn.fetchval("SELECT decisions_total FROM endpoints WHERE name = 'windowed'") == 300

        async def oldest() -> int:
            return await conn.fetchval("SELECT min(bucket) FROM arm_stats WHERE endpoint = 'windowed'")

        await eventually(oldest, lambda bucket: bucket >= 200, timeout_s=10)
    finally:
        await conn.close()
