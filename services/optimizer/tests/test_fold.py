"""Folding committed increments into cached counts (fold.py), and the cache's bookkeeping of
folds against reads (which fold a read already counts), without a database."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import REGISTRY

from flywheel.optimizer import fold, snapshot, stats
from flywheel.optimizer.cache import PosteriorCache, _Inputs
from flywheel.optimizer.fold import Counts, FoldBatch, Notice, PgSnapshot
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.spec import PolicyConfig

BETA = PolicyConfig(kind="thompson_beta")


def counts(w, s, ss=None, *, as_of=100.0, d=0) -> Counts:
    w, s = np.asarray(w, dtype=float), np.asarray(s, dtype=float)
    ss = s.copy() if ss is None else np.asarray(ss, dtype=float)
    k = len(w)
    st = Stats(w, s, ss, np.zeros((k, d, d)) if d else None, np.zeros((k, d)) if d else None)
    return Counts(st, w.copy(), s.copy(), as_of)


def inc(*rewards: float, features=None) -> stats.Increment:
    out = stats.Increment()
    for r in rewards:
        out.add(r, features)
    return out


def test_a_fold_adds_increments_to_stats_pulls_and_reward_sums_without_touching_the_old_arrays():
    before = counts([2, 0], [1, 0])
    after = fold.add(BETA, before, {"a": 0, "b": 1}, 100.0, {"b": inc(1.0, 0.0, 1.0)})
    assert after.stats.w.tolist() == [2, 3] and after.stats.s.tolist() == [1, 2] and after.stats.ss.tolist() == [1, 2]
    assert after.pulls.tolist() == [2, 3] and after.reward_sums.tolist() == [1, 2]
    assert before.stats.w.tolist() == [2, 0] and before.pulls.tolist() == [2, 0]  # Select may hold these


def test_a_fold_decays_the_old_evidence_by_the_time_since_the_counts_as_the_sql_does():
    policy = PolicyConfig(kind="thompson_beta", half_life_s=10.0)
    before = counts([8, 4], [4, 2], as_of=100.0)
    after = fold.add(policy, before, {"a": 0, "b": 1}, 120.0, {"a": inc(1.0)})
    # Two half-lives: a quarter of the evidence is left, then the new reward adds in full.
    assert after.stats.w.tolist() == pytest.approx([8 / 4 + 1, 4 / 4])
    assert after.stats.s.tolist() == pytest.approx([4 / 4 + 1, 2 / 4])
    assert after.as_of == 120.0
    # Pulls and reward sums are raw totals: never decayed.
    assert after.pulls.tolist() == [9, 4]
    # A transaction that started before the counts' time adds undecayed, and time stays put.
    late = fold.add(policy, after, {"a": 0, "b": 1}, 110.0, {"b": inc(0.0)})
    assert late.stats.w.tolist() == pytest.approx([3, 2]) and late.as_of == 120.0
    # Folding twice equals reading once: decay is multiplicative.
    two = fold.add(policy, fold.add(policy, before, {"a": 0, "b": 1}, 110.0, {}), {"a": 0, "b": 1}, 120.0, {})
    one = fold.add(policy, before, {"a": 0, "b": 1}, 120.0, {})
    assert two.stats.w.tolist() == pytest.approx(one.stats.w.tolist())


def test_linear_increments_fold_xtx_and_xty():
    policy = PolicyConfig(kind="linear_thompson", context_features=["x", "y"])
    before = counts([0, 0], [0, 0], d=2)
    after = fold.add(policy, before, {"a": 0, "b": 1}, 100.0, {"a": inc(1.0, 0.5, features=[1.0, 2.0])})
    assert after.stats.xtx[0].tolist() == [[2, 4], [4, 8]] and after.stats.xty[0].tolist() == [1.5, 3.0]
    assert after.stats.xtx[1].tolist() == [[0, 0], [0, 0]]


def test_a_snapshot_tells_which_committed_transactions_a_read_saw():
    seen = PgSnapshot.parse("100:105:101,103")
    assert [x for x in range(98, 108) if seen.visible(x)] == [98, 99, 100, 102, 104]
    assert PgSnapshot.parse("100:105:").precedes(PgSnapshot.parse("101:106:"))
    assert PgSnapshot.parse("100:105:101,103").precedes(PgSnapshot.parse("100:105:103"))
    assert not PgSnapshot.parse("100:105:103").precedes(PgSnapshot.parse("100:105:101,103"))


def test_notification_payloads_round_trip_and_fall_back_to_a_reload_when_too_large():
    arms = {"a": inc(1.0, 0.25), "b": inc(0.0, features=None)}
    body = fold.body("r1", "bot", arms)
    notice = fold.decode('{"x":42,"t":1700000000.5,' + body)
    assert notice.replica == "r1" and notice.endpoint == "bot" and notice.fold is not None
    assert notice.fold.xid == 42 and notice.fold.at == 1700000000.5
    assert notice.fold.arms["a"].w == 2 and notice.fold.arms["a"].s == 1.25 and notice.fold.arms["a"].ss == 1.0625
    linear = fold.decode('{"x":1,"t":1,' + fold.body("r1", "lin", {"a": inc(1.0, features=[1.0, 2.0, 3.0])}))
    assert linear.fold is not None and linear.fold.arms["a"].xtx.shape == (3, 3)
    assert linear.fold.arms["a"].xty.tolist() == [1.0, 2.0, 3.0]
    many = {f"arm-{i}": inc(1.0, features=[0.1] * 8) for i in range(40)}
    big = fold.body("r1", "big", many)
    assert len(big) < fold.MAX_PAYLOAD_BYTES and fold.decode('{"x":1,"t":1,' + big).fold is None  # reload
    # The moment the notification was sent, when the payload has it (older replicas' do not).
    assert fold.decode('{"x":42,"t":1700000000.5,"k":1700000000.75,' + body).sent == 1700000000.75
    assert notice.sent == 0.0


# --- the cache's bookkeeping, over reads made up in memory ---------------------------------


def row(name="bot", policy=None):
    return SimpleNamespace(
        name=name,
        description="",
        policy_kind="thompson_beta",
        policy=policy or {},
        reward_spec={},
        incumbent_arm_id="",
        created_at=datetime.now(UTC),
    )


def arms(pulls=(0, 0)):
    return [
        SimpleNamespace(arm_id=a, status="active", traffic_cap=1.0, pulls=p, reward_sum=0.0, params={})
        for a, p in zip(("a", "b"), pulls, strict=True)
    ]


def inputs(w=(0.0, 0.0), s=(0.0, 0.0)) -> _Inputs:
    st = Stats(np.array(w), np.array(s), np.array(s))
    return _Inputs(row(), arms(tuple(int(x) for x in w)), st, datetime.fromtimestamp(100.0, UTC))


def batch(xid: int, arm: str, *rewards: float) -> FoldBatch:
    return FoldBatch(xid=xid, at=100.0, endpoints={"bot": {arm: inc(*rewards)}})


async def test_the_cache_folds_rebuilds_once_for_a_burst_and_reconciles_with_reads():
    cache = PosteriorCache(sessions=None, rebuild_interval_s=0.05)  # type: ignore[arg-type]
    cache._install(inputs(), PgSnapshot.parse("10:10:"), 0.0)
    first = cache.cached("bot")
    # A burst of 20 commits: each folded at once, one or two rebuilds for all of them.
    for xid in range(10, 30):
        cache.committed(batch(xid, "a", 1.0))
    snap = await cache.caught_up("bot")
    assert snap is not None and snap is not first
    assert snap.stats.w.tolist() == [20, 0] and snap.pulls.tolist() == [20, 0]
    assert snap.probabilities[0] > 0.9  # Beta(21, 1) against Beta(1, 1): about 0.955
    # The same transaction again (say, its notification) is not counted twice.
    cache.committed(batch(29, "a", 1.0))
    assert (await cache.caught_up("bot")).stats.w.tolist() == [20, 0]

    # A read that could see 10..19 but not 20..29 (say, it began meanwhile): those are kept.
    cache._install(inputs(w=(10, 0), s=(10, 0)), PgSnapshot.parse("20:20:"), 1.0)
    assert cache.cached("bot").stats.w.tolist() == [20, 0]
    assert sorted(cache._entries["bot"].folds) == list(range(20, 30))
    # An older read finishing late is not installed over it.
    cache._install(inputs(w=(5, 0), s=(5, 0)), PgSnapshot.parse("15:15:"), 0.5)
    assert cache.cached("bot").stats.w.tolist() == [20, 0]
    # A read that saw everything: the folds are in it, and forgotten.
    cache._install(inputs(w=(20, 0), s=(20, 0)), PgSnapshot.parse("30:30:"), 2.0)
    assert cache.cached("bot").stats.w.tolist() == [20, 0] and not cache._entries["bot"].folds
    # A transaction the read saw arriving late (a slow notification) is not added again.
    cache.committed(batch(25, "a", 1.0))
    assert cache._entries["bot"].version == cache._entries["bot"].built


async def test_a_fold_for_an_arm_the_cache_does_not_know_asks_for_a_reload():
    cache = PosteriorCache(sessions=None)  # type: ignore[arg-type]
    cache._install(inputs(), PgSnapshot.parse("10:10:"), 0.0)
    reloads = []

    async def load(name):
        reloads.append(name)

    cache.load = load  # type: ignore[method-assign]
    cache.committed(batch(11, "new-arm", 1.0))
    await asyncio.sleep(0.01)
    assert reloads == ["bot"] and cache.cached("bot").stats.w.tolist() == [0, 0]


def test_rebuild_matches_build_for_the_same_counts():
    rng = np.random.default_rng(0)
    st = Stats(np.array([30.0, 2.0]), np.array([29.0, 0.0]), np.array([29.0, 0.0]))
    base = snapshot.build(row=row(), arms=arms(), stats=Stats.zeros(2), now=datetime.now(UTC), rng=rng)
    _ = base.params_structs
    again = snapshot.rebuild(
        base, stats=st, pulls=np.array([30.0, 2.0]), reward_sums=np.array([29.0, 0.0]), now=base.as_of, rng=rng
    )
    fresh = snapshot.build(
        row=row(), arms=arms((30, 2)), stats=st, now=base.as_of, rng=rng, reward_sums=np.array([29.0, 0.0])
    )
    assert again.arm_ids == fresh.arm_ids and again.pulls.tolist() == fresh.pulls.tolist()
    assert again.means.tolist() == pytest.approx(fresh.means.tolist())
    assert again.probabilities.tolist() == pytest.approx(fresh.probabilities.tolist(), abs=0.02)
    assert again.params_structs is base.params_structs  # carried over, not rebuilt
    assert again.probabilities[0] > 0.95 and again.probability_best[0] > 0.95


def lag_count(source: str) -> tuple[float, float]:
    """The fold lag histogram's sum and count for ``source`` so far."""
    get = REGISTRY.get_sample_value
    name = "flywheel_optimizer_posterior_fold_lag_seconds"
    return get(f"{name}_sum", {"source": source}) or 0.0, get(f"{name}_count", {"source": source}) or 0.0


async def test_the_fold_lag_is_timed_from_the_commit_or_the_notice_to_the_snapshot_that_has_it():
    cache = PosteriorCache(sessions=None, rebuild_interval_s=0.05)  # type: ignore[arg-type]
    cache._install(inputs(), PgSnapshot.parse("10:10:"), 0.0)
    (own_sum, own_n), (peer_sum, peer_n) = lag_count("own"), lag_count("peer")
    cache.committed(batch(10, "a", 1.0))
    # A peer's transaction whose notification was sent 0.2 s ago.
    peer = batch(11, "b", 0.0).folds()["bot"]
    cache.notice(Notice("r2", "bot", peer, sent=time.time() - 0.2))
    # Not observed before the snapshot Select samples from has them.
    assert lag_count("own")[1] == own_n and lag_count("peer")[1] == peer_n
    assert (await cache.caught_up("bot")).stats.w.tolist() == [1, 1]
    (own_sum2, own_n2), (peer_sum2, peer_n2) = lag_count("own"), lag_count("peer")
    assert own_n2 == own_n + 1 and peer_n2 == peer_n + 1
    assert 0 <= own_sum2 - own_sum < 1.0  # one rebuild (generous: a loaded machine)
    assert 0.2 <= peer_sum2 - peer_sum < 1.2  # timed from when the peer sent it
    # A notification without the moment it was sent (an older replica) is folded, not timed.
    cache.notice(Notice("r2", "bot", batch(12, "b", 0.0).folds()["bot"]))
    assert (await cache.caught_up("bot")).stats.w.tolist() == [1, 2]
    assert lag_count("peer")[1] == peer_n2
    # A fold a read covers is timed when that read is installed.
    cache.committed(batch(13, "a", 1.0))
    cache._install(inputs(w=(2, 2), s=(2, 0)), PgSnapshot.parse("14:14:"), 1.0)
    assert lag_count("own")[1] == own_n2 + 1 and not cache._entries["bot"].timed
