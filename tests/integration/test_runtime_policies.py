"""Runtime selection policies, end to end through a real optimizer: Gaussian, linear
(contextual) and per-segment Thompson sampling, information-directed allocation, sticky
sessions, exploration floor, canary promotion, the incumbent rule, discounting, and
off-policy evaluation."""

from __future__ import annotations

import random

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2_grpc as ope_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc

from .helpers import eventually

pytestmark = pytest.mark.integration


def endpoint(
    name: str,
    arms: list[str],
    *,
    policy: ep_pb.PolicySpec | None = None,
    bounded: bool = True,
    canary: dict[str, float] | None = None,
) -> admin_pb.CreateEndpointRequest:
    canary = canary or {}
    return admin_pb.CreateEndpointRequest(
        endpoint=ep_pb.Endpoint(
            name=name,
            arms=[
                ep_pb.Arm(
                    arm_id=a,
                    params=Struct(),
                    status=ep_pb.ARM_STATUS_CANARY if a in canary else 0,
                    traffic_cap=canary.get(a, 0.0),
                )
                for a in arms
            ],
            policy=policy or ep_pb.PolicySpec(),
            reward_spec=ep_pb.RewardSpec(bounded=bounded),
        )
    )


def context(**values: float | str) -> Struct:
    s = Struct()
    s.update(values)
    return s


@pytest.fixture(scope="module")
def optimizer_process(launch_module):
    return launch_module(
        "optimizer",
        env={"FLYWHEEL_OPTIMIZER_LIFECYCLE_INTERVAL_S": "0.3", "FLYWHEEL_OPTIMIZER_REFRESH_INTERVAL_S": "0.2"},
    )


@pytest.fixture
async def optimizer(optimizer_process):
    """One optimizer for the module: every test uses endpoints of its own."""
    async with grpc.aio.insecure_channel(optimizer_process.address) as channel:
        yield (
            admin_grpc.EndpointAdminServiceStub(channel),
            sel_grpc.SelectionServiceStub(channel),
            ope_grpc.OffPolicyServiceStub(channel),
        )


async def play(sel, name: str, rounds: int, reward_of, rng: random.Random, make_context=None) -> list:
    """Select, observe a simulated reward, report it with Update; returns the decisions."""
    decisions = []
    for i in range(rounds):
        ctx = make_context(i) if make_context else {}
        d = await sel.Select(sel_pb.SelectRequest(endpoint=name, context=context(**ctx), user_id=f"u{i}"))
        await sel.Update(
            sel_pb.UpdateRequest(
                decision_id=d.decision_id, reward=reward_of(d.arm_id, ctx, rng), feedback_id=f"fb-{d.decision_id}"
            )
        )
        decisions.append(d)
    return decisions


def covers(low: float, high: float, truth: float) -> bool:
    """True when `truth` lies within the 95% interval widened to about 4 standard errors.

    The server's arm choices are not seeded, so a bare 95% interval would miss the truth in
    about one run in twenty; doubling its half-width keeps the check meaningful (a biased
    estimate still fails) while a miss by chance becomes about one in ten thousand.
    """
    centre, half = (low + high) / 2, (high - low) / 2
    return abs(truth - centre) < 2 * half


async def stats_of(admin, name: str) -> dict[str, ep_pb.ArmStats]:
    got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=name))
    return {s.arm_id: s for s in got.endpoint.stats}


async def test_gaussian_thompson_learns_unbounded_rewards_and_names_an_incumbent(optimizer):
    admin, sel, _ = optimizer
    await admin.CreateEndpoint(
        endpoint(
            "revenue", ["low", "high"], bounded=False, policy=ep_pb.PolicySpec(kind=ep_pb.POLICY_KIND_THOMPSON_GAUSSIAN)
        )
    )
    truth = {"low": 20.0, "high": 30.0}
    await play(sel, "revenue", 120, lambda arm, _, rng: rng.gauss(truth[arm], 5.0), random.Random(1))
    stats = await stats_of(admin, "revenue")
    assert stats["high"].pulls > stats["low"].pulls
    assert covers(stats["high"].ci_low, stats["high"].ci_high, 30.0)
    assert stats["high"].probability_best > 0.95
    got = await eventually(
        lambda: admin.GetEndpoint(admin_pb.GetEndpointRequest(name="revenue")),
        lambda r: r.endpoint.incumbent_arm_id == "high",
    )
    assert got.endpoint.incumbent_arm_id == "high"


async def test_linear_thompson_learns_which_arm_suits_which_context(optimizer):
    admin, sel, _ = optimizer
    await admin.CreateEndpoint(
        endpoint(
            "router",
            ["short", "long"],
            policy=ep_pb.PolicySpec(kind=ep_pb.POLICY_KIND_LINEAR_THOMPSON, context_features=["bias", "length"]),
        )
    )

    def reward(arm, ctx, rng):  # long questions want the long-form arm
        good = (arm == "long") == (ctx["length"] > 0)
        return 1.0 if rng.random() < (0.9 if good else 0.1) else 0.0

    await play(
        sel,
        "router",
        200,
        reward,
        random.Random(2),
        make_context=lambda i: {"bias": 1.0, "length": 1.0 if i % 2 else -1.0},
    )
    picks = {"long": 0, "short": 0}
    for _ in range(40):
        d = await sel.Select(sel_pb.SelectRequest(endpoint="router", context=context(bias=1.0, length=1.0)))
        picks[d.arm_id] += 1
    assert picks["long"] >= 32, picks
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await sel.Select(sel_pb.SelectRequest(endpoint="router", context=context(bias=1.0)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'length'" in info.value.details()


async def test_segments_learn_their_own_best_arm(optimizer):
    admin, sel, _ = optimizer
    await admin.CreateEndpoint(
        endpoint(
            "greeting", ["formal", "casual"], policy=ep_pb.PolicySpec(segment_key="country", segment_prior_strength=2)
        )
    )
    best = {"fr": "formal", "us": "casual"}

    def reward(arm, ctx, rng):
        return 1.0 if rng.random() < (0.85 if best[ctx["country"]] == arm else 0.15) else 0.0

    await play(
        sel, "greeting", 240, reward, random.Random(3), make_context=lambda i: {"country": "fr" if i % 2 else "us"}
    )
    for country, arm in best.items():
        picks = [
            (await sel.Select(sel_pb.SelectRequest(endpoint="greeting", context=context(country=country)))).arm_id
            for _ in range(30)
        ]
        assert picks.count(arm) >= 22, (country, picks)


async def test_sticky_sessions_keep_their_arm_and_floor_keeps_exploring(optimizer):
    admin, sel, _ = optimizer
    await admin.CreateEndpoint(
        endpoint("chat", ["a", "b", "c"], policy=ep_pb.PolicySpec(sticky_sessions=True, exploration_floor=0.1))
    )
    first = await sel.Select(sel_pb.SelectRequest(endpoint="chat", session_id="s-1"))
    for _ in range(10):
        again = await sel.Select(sel_pb.SelectRequest(endpoint="chat", session_id="s-1"))
        assert (again.arm_id, again.probability) == (first.arm_id, 1.0)
    await play(sel, "chat", 60, lambda arm, _, rng: 1.0 if arm == "a" else 0.0, random.Random(4))
    stats = await stats_of(admin, "chat")
    assert all(s.selection_probability >= 0.1 - 1e-9 for s in stats.values())
    assert stats["a"].selection_probability >= 0.75


async def test_a_better_canary_is_capped_then_promoted(optimizer):
    admin, sel, _ = optimizer
    await admin.CreateEndpoint(
        endpoint(
            "writer",
            ["current", "candidate"],
            canary={"candidate": 0.2},
            policy=ep_pb.PolicySpec(canary=ep_pb.CanaryRule(min_pulls=15, promote_probability=0.95)),
        )
    )
    rates = {"current": 0.2, "candidate": 0.9}
    # 20 rounds at a 0.2 cap reach the 15 pulls a promotion needs about once in 5 million
    # runs (40 rounds did in one run of 130, and the canary was then rightly promoted).
    decisions = await play(
        sel, "writer", 20, lambda arm, _, rng: 1.0 if rng.random() < rates[arm] else 0.0, random.Random(5)
    )
    assert all(d.probability <= 0.2 + 1e-9 for d in decisions if d.arm_id == "candidate")
    got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="writer"))
    assert {a.arm_id: a.status for a in got.endpoint.arms}["candidate"] == ep_pb.ARM_STATUS_CANARY
    stats = await stats_of(admin, "writer")
    assert stats["candidate"].selection_probability <= 0.2 + 1e-9
    rng = random.Random(6)
    for i in range(8):  # keep feeding the canary until it has its pulls
        got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="writer"))
        if {a.arm_id: a.status for a in got.endpoint.arms}["candidate"] == ep_pb.ARM_STATUS_ACTIVE:
            break
        await play(sel, "writer", 40, lambda arm, _, r: 1.0 if r.random() < rates[arm] else 0.0, rng)
        del i
    got = await eventually(
        lambda: admin.GetEndpoint(admin_pb.GetEndpointRequest(name="writer")),
        lambda r: {a.arm_id: a.status for a in r.endpoint.arms}["candidate"] == ep_pb.ARM_STATUS_ACTIVE,
    )
    assert {a.arm_id: a.status for a in got.endpoint.arms}["current"] == ep_pb.ARM_STATUS_ACTIVE


async def test_a_worse_canary_is_retired(optimizer):
    admin, sel, _ = optimizer
    await admin.CreateEndpoint(
        endpoint(
            "ranker",
            ["current", "candidate"],
            canary={"candidate": 0.5},
            policy=ep_pb.PolicySpec(canary=ep_pb.CanaryRule(min_pulls=10, retire_probability=0.05)),
        )
    )
    rates = {"current": 0.9, "candidate": 0.05}
    rng = random.Random(7)
    for _ in range(10):
        got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="ranker"))
        if {a.arm_id: a.status for a in got.endpoint.arms}["candidate"] == ep_pb.ARM_STATUS_RETIRED:
            break
        await play(sel, "ranker", 30, lambda arm, _, r: 1.0 if r.random() < rates[arm] else 0.0, rng)
    await eventually(
        lambda: admin.GetEndpoint(admin_pb.GetEndpointRequest(name="ranker")),
        lambda r: {a.arm_id: a.status for a in r.endpoint.arms}["candidate"] == ep_pb.ARM_STATUS_RETIRED,
    )
    for _ in range(20):
        assert (await sel.Select(sel_pb.SelectRequest(endpoint="ranker"))).arm_id == "current"


async def test_information_directed_allocation_concentrates_exploration(optimizer):
    admin, sel, _ = optimizer
    arms = ["a", "b", "c", "d", "e"]
    policy = ep_pb.PolicySpec(allocation=ep_pb.ALLOCATION_IDS)
    await admin.CreateEndpoint(endpoint("ids-bot", arms, policy=policy))
    truth = {"a": 0.9, "b": 0.4, "c": 0.4, "d": 0.3, "e": 0.3}
    await play(sel, "ids-bot", 150, lambda arm, _, rng: float(rng.random() < truth[arm]), random.Random(7))
    got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="ids-bot"))
    assert got.endpoint.policy.allocation == ep_pb.ALLOCATION_IDS
    p = {s.arm_id: s.selection_probability for s in got.endpoint.stats}
    assert sum(p.values()) == pytest.approx(1.0)
    assert p["a"] >= 0.8
    # IDS plays at most two arms; the rest only get the 10% Thompson share.
    assert sum(v > 0.1 for v in p.values()) <= 2
    # Select draws from these probabilities (a later snapshot redraws them) and logs them.
    d = await sel.Select(sel_pb.SelectRequest(endpoint="ids-bot"))
    assert d.probability == pytest.approx(p[d.arm_id], abs=0.1)
    linear = ep_pb.PolicySpec(
        kind=ep_pb.POLICY_KIND_LINEAR_THOMPSON, context_features=["x"], allocation=ep_pb.ALLOCATION_IDS
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.CreateEndpoint(endpoint("ids-linear", ["a", "b"], policy=linear, bounded=False))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not linear_thompson" in err.value.details()


async def test_discounting_forgets_old_evidence(optimizer):
    admin, sel, _ = optimizer
    await admin.CreateEndpoint(endpoint("drifty", ["x", "y"], policy=ep_pb.PolicySpec(half_life_s=0.5)))
    await play(sel, "drifty", 30, lambda *_: 1.0, random.Random(8))
    fresh = await stats_of(admin, "drifty")
    total = sum(s.pulls for s in fresh.values())
    faded = await eventually(
        lambda: stats_of(admin, "drifty"),
        lambda st: sum(s.effective_pulls for s in st.values()) < 0.25 * total,
        timeout_s=5,
    )
    assert sum(s.pulls for s in faded.values()) == total == 30  # all-time counts are kept


async def test_off_policy_evaluation_recovers_an_arm_value_from_uniform_logs(optimizer):
    admin, sel, ope = optimizer
    # A floor of 1/k makes the logging policy uniform: the textbook OPE setting.
    await admin.CreateEndpoint(endpoint("uniform", ["a", "b"], policy=ep_pb.PolicySpec(exploration_floor=0.5)))
    rates = {"a": 0.8, "b": 0.2}
    decisions = await play(
        sel, "uniform", 300, lambda arm, _, rng: 1.0 if rng.random() < rates[arm] else 0.0, random.Random(9)
    )
    assert all(d.probability == pytest.approx(0.5) for d in decisions)
    got = await ope.EstimatePolicyValue(
        ope_pb.EstimatePolicyValueRequest(endpoint="uniform", candidate=ope_pb.CandidatePolicy(arm_id="a"))
    )
    assert got.samples == 300
    assert 0.35 < got.logged_value < 0.65
    by_name = {ope_pb.Estimator.Name(e.estimator): e for e in got.estimates}
    assert set(by_name) == {"ESTIMATOR_IPS", "ESTIMATOR_SNIPS", "ESTIMATOR_DOUBLY_ROBUST"}
    for e in by_name.values():
        assert covers(e.ci_low, e.ci_high, 0.8), e
        assert e.ci_high - e.ci_low < 0.4
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ope.EstimatePolicyValue(
            ope_pb.EstimatePolicyValueRequest(endpoint="uniform", candidate=ope_pb.CandidatePolicy(arm_id="zzz"))
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
