"""Stage 4: product traffic goes on with policy v1 as a canary arm. Its answers come live from
the model server with v1's adapter (the arm's ``model``), judged by the same hidden truth as
every arm's. The bandit promotes the canary (arm ACTIVE) or retires it (RETIRED), or neither
within ``sizes.canary_max_decisions`` ("undecided"); the registry follows (v1 ACTIVE or
ROLLED_BACK; still CANARY when undecided)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import AsyncExitStack
from typing import Any

import grpc
import numpy as np

from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.stack.story.context import StoryContext
from flywheel.stack.story.traffic import Product, get_endpoint, retrying, settle

CHECK_EVERY = 5  # decisions between looks at the canary arm's status
TIMELINE_POINTS = 40
WINDOW = 20  # decisions the canary share is measured over
# The optimizer's lifecycle judges canaries every lifecycle_interval_s (2 s by default): an
# "undecided" verdict stands only once a tick has had the stage's last feedback to judge.
LIFECYCLE_TICK_S = 2.5
DECISIONS = {ep_pb.ARM_STATUS_ACTIVE: "promoted", ep_pb.ARM_STATUS_RETIRED: "rolled_back"}
REGISTRY = {
    "promoted": jobs.POLICY_STATUS_ACTIVE,
    "rolled_back": jobs.POLICY_STATUS_ROLLED_BACK,
    "undecided": jobs.POLICY_STATUS_CANARY,
}


def p_better(canary: tuple[float, float], incumbent: tuple[float, float], *, samples: int = 20000) -> float:
    """P(canary's mean > incumbent's mean) under their Beta posteriors (Monte Carlo, fixed seed)."""
    rng = np.random.default_rng(0)
    return float(np.mean(rng.beta(*canary, samples) > rng.beta(*incumbent, samples)))


def incumbent_of(endpoint: ep_pb.Endpoint, canary_arm: str) -> str:
    """The arm the canary challenges: the endpoint's incumbent, else the best other active arm."""
    if endpoint.incumbent_arm_id and endpoint.incumbent_arm_id != canary_arm:
        return endpoint.incumbent_arm_id
    active = {a.arm_id for a in endpoint.arms if a.status == ep_pb.ARM_STATUS_ACTIVE and a.arm_id != canary_arm}
    stats = [s for s in endpoint.stats if s.arm_id in active]
    return max(stats, key=lambda s: s.mean).arm_id if stats else ""


def beta(endpoint: ep_pb.Endpoint, arm: str) -> tuple[float, float]:
    found = next((s for s in endpoint.stats if s.arm_id == arm), None)
    return (found.alpha, found.beta) if found is not None else (1.0, 1.0)


def arm_status(endpoint: ep_pb.Endpoint, arm: str) -> int:
    found = next((a for a in endpoint.arms if a.arm_id == arm), None)
    if found is None:
        raise RuntimeError(f"arm {arm}: not on endpoint {endpoint.name} any more")
    return found.status


def point(endpoint: ep_pb.Endpoint, arm: str, decision: int, share: float) -> dict[str, Any]:
    incumbent = incumbent_of(endpoint, arm)
    c, i = beta(endpoint, arm), beta(endpoint, incumbent)
    return {
        "decision": decision,
        "p_better": p_better(c, i),
        "canary_share": share,
        "canary": {"alpha": c[0], "beta": c[1]},
        "incumbent": {"arm_id": incumbent, "alpha": i[0], "beta": i[1]},
    }


async def verdict_and_registry(
    ctx: StoryContext,
    opt: grpc.aio.Channel,
    trainer: pb_grpc.TrainerServiceStub,
    arm: str,
    policy_id: str,
    decision: str,
    *,
    timeout_s: float = 60.0,
    tick_s: float = LIFECYCLE_TICK_S,
) -> tuple[str, ep_pb.Endpoint, jobs.Policy]:
    """The verdict once the registry agrees with it: (decision, the endpoint read with it, the
    policy). The optimizer's lifecycle judges canaries on its own ticks, so an "undecided"
    stage can be decided by a tick after its last look (on the feedback applied while
    settling): each round reads the arm first, takes a verdict it finds, then waits for the
    registry to follow that verdict. "undecided" is returned only after ``tick_s``, so that a
    lifecycle tick has judged the feedback applied last."""
    began = time.monotonic()
    deadline = began + timeout_s
    while True:
        endpoint = await retrying(lambda: get_endpoint(ctx, opt))
        status = arm_status(endpoint, arm)
        if decision == "undecided" and status in DECISIONS:
            decision = DECISIONS[status]
        want = REGISTRY[decision]
        policy = (await retrying(lambda: trainer.GetPolicy(pb.GetPolicyRequest(policy_id=policy_id)))).policy
        if policy.status == want and (decision != "undecided" or time.monotonic() - began >= tick_s):
            return decision, endpoint, policy
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"policy {policy_id}: status {jobs.PolicyStatus.Name(policy.status)} after {timeout_s:.0f} s, "
                f"the bandit's verdict wants {jobs.PolicyStatus.Name(want)}"
            )
        await asyncio.sleep(0.5)


async def canary(ctx: StoryContext) -> None:
    """Stage 4: serve on until the bandit decides about the canary arm; fills
    ``ctx.record.canary`` and the lineage's "decision" entry."""
    began = time.monotonic()
    training = ctx.record.training or {}
    arm, policy_id = training.get("arm_id"), training.get("policy_id")
    if not arm or not policy_id:
        raise RuntimeError("training: no canary arm to decide about (stage 3 did not enrol one)")
    earlier = (ctx.record.traffic or {}).get("decisions", 0)
    most = ctx.sizes.canary_max_decisions
    every = max(1, most // TIMELINE_POINTS)
    async with AsyncExitStack() as exits:
        opt = await exits.enter_async_context(grpc.aio.insecure_channel(ctx.address("optimizer")))
        store = await exits.enter_async_context(grpc.aio.insecure_channel(ctx.address("trace_store")))
        trainer = pb_grpc.TrainerServiceStub(
            await exits.enter_async_context(grpc.aio.insecure_channel(ctx.address("trainer")))
        )
        # One answer per (question, arm): the canary's are written live by its adapter, one
        # generation each on the CPU; the pairs it needed were made in stage 2.
        product = await Product.open(ctx, exits, stream=1, variants=1)
        recent: deque[bool] = deque(maxlen=WINDOW)
        timeline: list[dict[str, Any]] = []
        decision, reached, canary_pulls = "undecided", False, 0
        with ctx.progress.bar(f"canary {arm} (the bandit decides)", most) as bar:
            for i in range(1, most + 1):
                chosen, _ = await product.serve()
                recent.append(chosen.arm_id == arm)
                canary_pulls += chosen.arm_id == arm
                if canary_pulls and not reached:
                    reached = True
                    await ctx.hooks.reached("canary.running", ctx)
                if i % CHECK_EVERY and i % every and i != most:
                    continue
                endpoint = await retrying(lambda: get_endpoint(ctx, opt))
                share = sum(recent) / len(recent)
                if i % every == 0 or i == most:
                    timeline.append(point(endpoint, arm, i, share))
                    bar.update(
                        completed=i,
                        note=f"P(better) {timeline[-1]['p_better']:.2f}, canary share {share:.0%}",
                    )
                status = arm_status(endpoint, arm)
                if status in DECISIONS:
                    decision = DECISIONS[status]
                    timeline.append(point(endpoint, arm, i, share))
                    bar.update(completed=most, note=decision)
                    break
        feedback_applied, traces = await settle(ctx, product, opt, store, already=earlier)
        looked = decision
        decision, endpoint, policy = await verdict_and_registry(ctx, opt, trainer, arm, policy_id, decision)
        if decision != looked:  # decided after the stage's last look: the timeline ends with it
            timeline.append(point(endpoint, arm, product.served, sum(recent) / max(1, len(recent))))
    ctx.record.canary = {
        "seconds": round(time.monotonic() - began, 2),
        "arm_id": arm,
        "decisions": product.served,
        "canary_decisions": canary_pulls,
        "feedback_applied": feedback_applied,  # every stage's
        "traces": traces,  # every stage's
        "decision": decision,
        "arm_status": ep_pb.ArmStatus.Name(arm_status(endpoint, arm)),
        "policy_status": jobs.PolicyStatus.Name(policy.status),
        "true_rate": product.arm_true_rate(arm),
        "incumbent": incumbent_of(endpoint, arm),
        "incumbent_true_rate": product.arm_true_rate(incumbent_of(endpoint, arm)),
        "timeline": timeline,
    }
    ctx.record.lineage.append({"kind": "decision", "id": f"{arm}:{decision}", "from": [arm, policy_id]})
    ctx.progress.say(
        f"canary: {decision} after {product.served} decisions ({canary_pulls} to the canary); "
        f"registry says {jobs.PolicyStatus.Name(policy.status)}"
    )
