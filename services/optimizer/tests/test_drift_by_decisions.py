"""Forgetting by decisions: validation of half_life_decisions / window_decisions, the one decay
function (`stats.evidence_factor`), the read path (`stats.aggregate` with each row's decision
clock) against the in-process `ThompsonAgent` on the same sequence, and the proto round trip.

The SQL write path (`stats.add`) runs against PostgreSQL in
tests/integration/test_drift_by_decisions.py, which compares it with the same agent."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pytest

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.core.errors import InvalidArgument
from flywheel.optimizer import convert, fold, stats
from flywheel.optimizer.policies.simulate import ThompsonAgent
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.spec import FORGETTING, LINEAR, PolicyConfig, check_policy

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def _rejected(policy: PolicyConfig) -> str:
    with pytest.raises(InvalidArgument) as exc:
        check_policy(policy, n_arms=2, bounded=True)
    return str(exc.value)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["half_life_decisions", "window_decisions"])
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_a_negative_or_non_finite_value_is_refused_naming_the_field(name, value):
    assert name in _rejected(PolicyConfig(**{name: value}))


@pytest.mark.parametrize(
    ("first", "second"),
    [(a, b) for i, a in enumerate(FORGETTING) for b in FORGETTING[i + 1 :]],
)
def test_two_ways_of_forgetting_are_refused_naming_both(first, second):
    message = _rejected(PolicyConfig(**{first: 100.0, second: 100.0}))
    assert f"at most one of {first} and {second}" in message


def test_one_way_of_forgetting_by_decisions_passes():
    check_policy(PolicyConfig(half_life_decisions=500), n_arms=2, bounded=True)
    check_policy(PolicyConfig(window_decisions=1000, segment_key="country"), n_arms=2, bounded=True)


def test_linear_thompson_takes_a_half_life_in_decisions_but_no_window():
    linear = {"kind": LINEAR, "context_features": ("x",)}
    check_policy(PolicyConfig(**linear, half_life_decisions=500), n_arms=2, bounded=True)
    assert "not segments or windows" in _rejected(PolicyConfig(**linear, window_decisions=500))


def test_bucket_decisions_is_a_twentieth_of_the_window_and_at_least_one():
    assert PolicyConfig(window_decisions=1000).bucket_decisions == 50
    assert PolicyConfig(window_decisions=10).bucket_decisions == 1
    assert PolicyConfig().bucket_decisions == 0


def test_the_fields_travel_through_the_admin_proto_and_the_stored_json():
    policy = convert.policy_config(pb.PolicySpec(half_life_decisions=250, window_decisions=0))
    assert policy.half_life_decisions == 250
    assert convert.policy_message(PolicyConfig(window_decisions=800)).window_decisions == 800
    assert PolicyConfig.from_json(PolicyConfig(half_life_decisions=250).to_json()).half_life_decisions == 250
    # Policies stored before these fields existed read as 0: no forgetting by decisions.
    assert PolicyConfig.from_json({"kind": "thompson_beta", "half_life_s": 60}).half_life_decisions == 0


# --- the decay function --------------------------------------------------------------------


def test_evidence_factor_halves_every_half_life_in_the_unit_the_policy_sets():
    by_decisions = PolicyConfig(half_life_decisions=100)
    assert stats.evidence_factor(by_decisions, elapsed_s=1e6, elapsed_decisions=100) == pytest.approx(0.5)
    assert stats.evidence_factor(by_decisions, elapsed_s=0, elapsed_decisions=300) == pytest.approx(0.125)
    by_seconds = PolicyConfig(half_life_s=10)
    assert stats.evidence_factor(by_seconds, elapsed_s=20, elapsed_decisions=1e6) == pytest.approx(0.25)
    assert stats.evidence_factor(PolicyConfig(), elapsed_s=1e6, elapsed_decisions=1e6) == 1.0
    assert stats.evidence_factor(PolicyConfig(window_decisions=10), elapsed_s=1e6, elapsed_decisions=1e6) == 1.0
    # A clock read behind the row's (another replica wrote it) never grows the evidence.
    assert stats.evidence_factor(by_decisions, elapsed_s=0, elapsed_decisions=-50) == 1.0


def test_folding_in_steps_equals_one_step():
    """Decaying a snapshot through intermediate clocks gives what one decay to the end gives,
    so an in-memory fold may apply the factor at every batch."""
    policy = PolicyConfig(half_life_decisions=70)
    steps = [3, 11, 40, 1, 25]
    stepped = math.prod(stats.evidence_factor(policy, elapsed_s=0, elapsed_decisions=n) for n in steps)
    assert stepped == pytest.approx(stats.evidence_factor(policy, elapsed_s=0, elapsed_decisions=sum(steps)))


# --- the read path against the in-process policy -------------------------------------------


def _row(arm_id: str, *, w: float, s: float, as_of_decisions: int, clock: int, bucket: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        arm_id=arm_id, bucket=bucket, w=w, s=s, ss=s, xtx=None, xty=None, as_of=NOW,
        as_of_decisions=as_of_decisions, clock=clock,
    )  # fmt: skip


def _stored_rows(policy: PolicyConfig, events: list[tuple[int, int, float]], k: int) -> list[list[float]]:
    """What `stats.add` stores, written with the contract of policies/drift.py: each increment
    first brings the row (w, s, as_of_decisions) to the clock it is applied at."""
    rows = [[0.0, 0.0, 0] for _ in range(k)]
    for clock, arm, reward in events:
        w, s, as_of = rows[arm]
        f = stats.evidence_factor(policy, elapsed_s=0.0, elapsed_decisions=clock - as_of)
        rows[arm] = [w * f + 1.0, s * f + reward, max(as_of, clock)]
    return rows


def test_aggregate_matches_the_in_process_agent_counting_decisions():
    """The same sequence of decisions and feedback: the service's rows read by `aggregate` at
    the endpoint's clock give the Beta posterior `ThompsonAgent(half_life_s=H)` has when its
    ``now`` is the number of decisions made, as bench/regret runs it."""
    rng = np.random.default_rng(19)
    k, half_life = 3, 150.0
    policy = PolicyConfig(half_life_decisions=half_life)
    agent = ThompsonAgent(k, "beta", half_life_s=half_life)
    events, clock = [], 0
    for _ in range(120):  # rounds: a few decisions, then the feedback of some earlier ones
        clock += int(rng.integers(1, 9))
        for _ in range(int(rng.integers(0, 6))):
            arm, reward = int(rng.integers(k)), float(rng.random() < 0.3 + 0.2 * rng.integers(k))
            events.append((clock, arm, reward))
            agent.update(arm, reward, now=clock)
    end = clock + 37  # decisions made after the last feedback still age the evidence
    rows = [
        _row(str(a), w=w, s=s, as_of_decisions=as_of, clock=end)
        for a, (w, s, as_of) in enumerate(_stored_rows(policy, events, k))
    ]
    got = stats.aggregate(policy, [str(a) for a in range(k)], rows, NOW)
    alpha_ev, beta_ev = agent.evidence(now=end)
    # The service stores (w, s); Beta evidence is (s, w - s), as snapshot.build reads it.
    np.testing.assert_allclose(got.s, alpha_ev, rtol=1e-12)
    np.testing.assert_allclose(got.w - got.s, beta_ev, rtol=1e-12)


def test_aggregate_ignores_wall_time_for_a_half_life_in_decisions():
    policy = PolicyConfig(half_life_decisions=100)
    row = _row("a", w=8.0, s=4.0, as_of_decisions=100, clock=300)
    for now in (NOW, NOW + timedelta(days=30)):
        got = stats.aggregate(policy, ["a"], [row], now)
        assert got.w[0] == pytest.approx(2.0) and got.s[0] == pytest.approx(1.0)


def test_a_decision_window_keeps_the_buckets_within_the_last_window_decisions():
    policy = PolicyConfig(window_decisions=100)  # buckets of 5 decisions
    clock = 1000
    rows = [
        _row("a", w=1.0, s=1.0, as_of_decisions=0, clock=clock, bucket=895),  # ends at 900: out
        _row("a", w=2.0, s=2.0, as_of_decisions=0, clock=clock, bucket=900),  # 900-904: partly in
        _row("a", w=4.0, s=0.0, as_of_decisions=0, clock=clock, bucket=1000),  # the current bucket
        _row("a", w=64.0, s=0.0, as_of_decisions=0, clock=clock, bucket=1_700_000_000),  # a time bucket
    ]
    got = stats.aggregate(policy, ["a"], rows, NOW)
    assert got.w[0] == 6.0 and got.s[0] == 2.0


# --- the in-memory fold ------------------------------------------------------------------


def test_a_fold_decays_by_the_decision_clock_its_transaction_read():
    """`fold.add` with each transaction's clock gives what the stored rows read at that clock
    give (`stats.aggregate`): the cache's folds agree with the next refresh."""
    policy = PolicyConfig(half_life_decisions=50)
    events = [(10, 0, 1.0), (10, 1, 0.0), (60, 0, 1.0), (75, 1, 1.0), (160, 0, 0.0)]
    index = {"a": 0, "b": 1}
    counts = fold.Counts(Stats.zeros(2), np.zeros(2), np.zeros(2), as_of=0.0, clock=0.0)
    for clock, arm, reward in events:
        inc = stats.Increment()
        inc.add(reward, None)
        # Seconds do not matter to a half-life in decisions: the transactions' times are jumbled.
        counts = fold.add(policy, counts, index, 1000.0 - clock, {"ab"[arm]: inc}, clock)
    assert counts.clock == 160
    rows = [
        _row("ab"[a], w=w, s=s, as_of_decisions=as_of, clock=160)
        for a, (w, s, as_of) in enumerate(_stored_rows(policy, events, 2))
    ]
    read = stats.aggregate(policy, ["a", "b"], rows, NOW)
    np.testing.assert_allclose(counts.stats.w, read.w, rtol=1e-12)
    np.testing.assert_allclose(counts.stats.s, read.s, rtol=1e-12)


def test_a_peer_fold_carries_its_decision_clock():
    inc = stats.Increment()
    inc.add(1.0, None)
    notice = fold.decode('{"x":7,"t":5.0,' + fold.body("r1", "bot", {"a": inc}, 1234.0))
    assert notice.fold is not None and notice.fold.clock == 1234.0
    # A notification from a replica that does not send the clock yet folds without decay by it.
    old = fold.decode('{"x":7,"t":5.0,"r":"r1","e":"bot","a":{"a":[1,1,1]}}')
    assert old.fold is not None and old.fold.clock == 0.0
    batch = fold.FoldBatch(xid=7, at=5.0, endpoints={"bot": {"a": inc}}, clocks={"bot": 99.0})
    assert batch.folds()["bot"].clock == 99.0
