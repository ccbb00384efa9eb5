"""Reweighting kept draws (reweight.py): a fold's rebuild gives the selection probabilities that
new draws would give, without drawing; it draws again when the kept draws cannot serve."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pytest

from flywheel.optimizer import cache as cache_module
from flywheel.optimizer import reweight, snapshot, stats
from flywheel.optimizer.cache import PosteriorCache, _Inputs
from flywheel.optimizer.fold import FoldBatch, PgSnapshot
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.spec import PolicyConfig

NOW = datetime.fromtimestamp(100.0, UTC)
# Ten arms with distinct means and 60 pulls each: every arm has some chance of being best.
W = np.full(10, 60.0)
S = np.arange(30.0, 40.0)


def _snap(policy=None, statuses=None, caps=None, w=W, s=S) -> snapshot.EndpointSnapshot:
    policy = policy or {"exploration_floor": 0.01}
    row = SimpleNamespace(
        name="bot",
        description="",
        policy_kind=policy.pop("kind", "thompson_beta"),
        policy=policy,
        reward_spec={},
        incumbent_arm_id="",
        created_at=NOW,
    )
    statuses = statuses or ["active"] * len(w)
    caps = caps or [1.0] * len(w)
    arms = [
        SimpleNamespace(arm_id=f"a{i}", status=st, traffic_cap=c, pulls=int(n), reward_sum=float(r), params={})
        for i, (st, c, n, r) in enumerate(zip(statuses, caps, w, s, strict=True))
    ]
    st = Stats(w.copy(), s.copy(), s.copy())
    return snapshot.build(row=row, arms=arms, stats=st, now=NOW, rng=np.random.default_rng(0))


def _rebuilt(snap, w, s, seed=1):
    return snapshot.rebuild(
        snap, stats=Stats(w, s, s.copy()), pulls=w, reward_sums=s, now=NOW, rng=np.random.default_rng(seed), draws=1000
    )


def _reweighted(snap, w, s):
    return snapshot.reweighted(snap, stats=Stats(w, s, s.copy()), pulls=w, reward_sums=s, now=NOW)


def _with(arm: int, successes: float, failures: float):
    w, s = W.copy(), S.copy()
    w[arm] += successes + failures
    s[arm] += successes
    return w, s


def test_reweighted_draws_give_the_probabilities_new_draws_would():
    base = _rebuilt(_snap(), W, S)
    assert base.draw_set is not None and base.draw_set.draws == 1000
    w, s = _with(3, 2, 0)
    w[9] += 1  # and one failure for the leading arm
    moved = _reweighted(base, w, s)
    assert moved is not None and moved.draw_set is base.draw_set  # no new draw
    reference = snapshot.selection_probabilities(
        base.policy, Stats(w, s, s.copy()), base.live, base.caps, np.random.default_rng(2), m=400_000
    )
    # Within what 1,000 fresh draws would miss by (their standard error is up to 0.016 here).
    assert np.abs(moved.probabilities - reference).max() < 0.05
    # The evidence moved the probabilities the way a user expects: arm 3 gained, arm 9 lost.
    assert moved.probabilities[3] > base.probabilities[3] and moved.probabilities[9] < base.probabilities[9]
    assert moved.pulls.tolist() == w.tolist() and moved.means[3] > base.means[3]
    assert moved.probabilities.sum() == pytest.approx(1.0) and moved.probabilities.min() >= 0.01 - 1e-12


def test_with_no_change_the_kept_draws_give_back_their_own_probabilities():
    base = _rebuilt(_snap(), W, S)
    again = _reweighted(base, W.copy(), S.copy())
    assert again is not None
    np.testing.assert_allclose(again.probabilities, base.probabilities, atol=1e-12)
    np.testing.assert_allclose(again.probability_best, base.probability_best, atol=1e-12)


def test_too_large_a_change_draws_again():
    base = _rebuilt(_snap(), W, S)
    assert _reweighted(base, *_with(0, 40, 0)) is None  # the worst arm became the best: ESS collapses


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy": {"kind": "thompson_gaussian"}},
        {"policy": {"allocation": "ids"}},
        # Two canaries over their caps: the second one's excess would go by the third-best arm.
        {"statuses": ["active"] * 8 + ["canary"] * 2, "caps": [1.0] * 8 + [0.05, 0.05]},
    ],
    ids=["gaussian", "ids", "two-capped-canaries"],
)
def test_rules_that_are_not_a_share_of_wins_draw_again(kwargs):
    base = _rebuilt(_snap(**kwargs), W, S)
    assert _reweighted(base, *_with(3, 1, 0)) is None


def test_a_canary_under_its_cap_is_reweighted():
    base = _rebuilt(_snap(statuses=["active"] * 9 + ["canary"], caps=[1.0] * 9 + [0.9]), W, S)
    assert _reweighted(base, *_with(3, 1, 0)) is not None


@pytest.mark.parametrize(
    "policy",
    [{"exploration_floor": 0.01}, {"exploration_floor": 0.01, "canary_min_pulls": 100}],
    ids=["capped", "on-trial"],
)
def test_a_canary_over_its_cap_or_on_trial_is_reweighted_as_new_draws_would_allocate(policy):
    # Arm 9, the likeliest best, is a canary capped at 5%: its excess goes to the arm that is
    # best among the others in each draw. On trial (60 of 100 pulls) it gets its fixed share.
    kwargs = {"statuses": ["active"] * 9 + ["canary"], "caps": [1.0] * 9 + [0.05]}
    base = _rebuilt(_snap(policy=dict(policy), **kwargs), W, S)
    w, s = _with(3, 2, 0)
    moved = _reweighted(base, w, s)
    assert moved is not None and moved.draw_set is base.draw_set  # no new draw
    fresh = _rebuilt(_snap(policy=dict(policy), **kwargs), w, s, seed=7)
    large = snapshot.rebuild(
        fresh, stats=Stats(w, s, s.copy()), pulls=w, reward_sums=s, now=NOW, rng=np.random.default_rng(3), draws=200_000
    )
    assert moved.probabilities[9] == pytest.approx(large.probabilities[9], abs=1e-3) == pytest.approx(0.05, abs=1e-3)
    assert np.abs(moved.probabilities - large.probabilities).max() < 0.05
    assert moved.probabilities[3] > base.probabilities[3]  # the evidence for arm 3 counts


def test_draws_with_ties_or_at_the_edge_are_not_kept():
    live = np.ones(2, dtype=bool)
    policy = PolicyConfig(kind="thompson_beta")
    st = Stats(np.ones(2), np.ones(2), np.ones(2))
    assert reweight.keep(policy, live, st, np.array([[0.5, 0.5], [0.2, 0.3]])) is None
    assert reweight.keep(policy, live, st, np.array([[1.0, 0.5], [0.2, 0.3]])) is None
    kept = reweight.keep(policy, live, st, np.array([[0.6, 0.5], [0.2, 0.3]]))
    assert kept is not None and [w.tolist() for w in kept.winner] == [[0, 1]]


def _inputs(arms_stats) -> _Inputs:
    row = SimpleNamespace(
        name="bot",
        description="",
        policy_kind="thompson_beta",
        policy={},
        reward_spec={},
        incumbent_arm_id="",
        created_at=NOW,
    )
    w, s = arms_stats
    arms = [
        SimpleNamespace(arm_id=f"a{i}", status="active", traffic_cap=1.0, pulls=int(n), reward_sum=r, params={})
        for i, (n, r) in enumerate(zip(w, s, strict=True))
    ]
    return _Inputs(row, arms, Stats(w.copy(), s.copy(), s.copy()), NOW)


def _fold(xid: int, arm: str, rewards: list[float]) -> FoldBatch:
    total = stats.Increment()
    for r in rewards:
        total.add(r, None)
    return FoldBatch(xid=xid, at=100.0, endpoints={"bot": {arm: total}})


def _count(how: str) -> float:
    return cache_module.REBUILDS.labels(how)._value.get()


async def test_the_cache_draws_once_then_reweights_each_fold_and_a_read_keeps_the_draws():
    cache = PosteriorCache(sessions=None, rebuild_interval_s=0.0)  # type: ignore[arg-type]
    cache._install(_inputs((W, S)), PgSnapshot.parse("10:10:"), 0.0)
    assert cache.cached("bot").draw_set is None  # a read keeps no draws
    drawn, reweighted = _count("drawn"), _count("reweighted")
    cache.committed(_fold(11, "a3", [1.0]))
    first = await cache.caught_up("bot")
    assert first is not None and first.draw_set is not None and first.pulls[3] == 61
    cache.committed(_fold(12, "a3", [1.0]))
    assert cache.provisional("bot", "e1", "a3", _fold(0, "a3", [1.0]).endpoints["bot"]["a3"])
    second = await cache.caught_up("bot")
    assert second is not None and second.draw_set is first.draw_set and second.pulls[3] == 63
    assert second.probabilities[3] > first.probabilities[3]
    assert (_count("drawn") - drawn, _count("reweighted") - reweighted) == (1, 1)
    # A read of the same arms keeps the draws: its next fold reweights them too.
    w, s = W.copy(), S.copy()
    w[3] += 2
    s[3] += 2
    cache._install(_inputs((w, s)), PgSnapshot.parse("13:13:"), 0.0)
    assert cache.cached("bot").draw_set is first.draw_set


async def test_a_segments_provisional_pass_reweights_its_kept_draws_without_a_thread(monkeypatch):
    import asyncio

    from flywheel.optimizer.segment_cache import SegmentCache

    cache = PosteriorCache(sessions=None, rebuild_interval_s=0.0)  # type: ignore[arg-type]
    cache._install(_inputs((W, S)), PgSnapshot.parse("10:10:"), 0.0)
    segments = SegmentCache(sessions=None, endpoints=cache)  # type: ignore[arg-type]
    snap = cache.cached("bot")
    own = Stats(W / 2, S / 2, S / 2)
    segments._put(segments._build(snap, "fr", own, Stats(np.zeros(10), np.zeros(10), np.zeros(10)), 0.0))
    assert len(segments._draw_sets) == 1  # the segment's first draws were kept
    before = segments.peek(snap, "fr").probabilities.copy()

    def no_thread(jobs):
        raise AssertionError("a pass whose draws serve must not draw again")

    monkeypatch.setattr(segments, "_draw", no_thread)
    one = stats.Increment()
    one.add(1.0, None)
    assert cache.provisional("bot", "e1", "a3", one)
    assert segments.provisional("bot", "fr", "e1", "a3", one)
    await asyncio.sleep(0.05)  # one pass
    after = segments.peek(snap, "fr").probabilities
    assert after[3] > before[3] and after.sum() == pytest.approx(1.0)


def test_the_draw_set_store_keeps_at_most_its_bytes_least_recently_used_dropped_first():
    policy = PolicyConfig(kind="thompson_beta")
    live = np.ones(10, dtype=bool)
    st = Stats(W, S, S)
    one = reweight.keep(policy, live, st, np.random.default_rng(0).beta(S + 1, W - S + 1, size=(1000, 10)))
    # logs, winners one-hot (float32), winners and runners-up (int32)
    assert one is not None and one.nbytes == 3 * 1000 * 10 * 4 + 2 * 1000 * 4
    store = reweight.DrawSetStore(max_bytes=2 * one.nbytes)
    store.put("a", "basis", one)
    store.put("b", "basis", one)
    assert store.get("a", "basis") is one  # "b" is now the least recently used
    assert store.get("a", "another policy") is None  # drawn under something else: not served
    store.put("c", "basis", one)
    assert store.get("b", "basis") is None and store.get("c", "basis") is one
    assert len(store) == 2 and store.nbytes == 2 * one.nbytes


def test_a_rebuild_by_reweighting_keeps_the_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reweighting runs on the event loop beside Select's worker threads, so it calls none
    of the numpy functions that let the GIL go at any size (each release can cost the loop a
    5 ms switch interval under load): np.zeros over 1 KiB, np.bincount, np.unique, np.searchsorted."""
    base = _rebuilt(_snap(), W, S)  # a fold's rebuild keeps its draws
    assert base.draw_set is not None
    w, s = W.copy(), S.copy()
    w[:3] += 1
    s[:3] += 1

    def released(name: str):
        real = getattr(np, name)

        def guard(*args, **kwargs):
            if name != "zeros" or np.prod(args[0] if args else kwargs["shape"]) * 8 > 1024:
                raise AssertionError(f"np.{name} lets the GIL go")
            return real(*args, **kwargs)

        return guard

    expected = snapshot.reweighted(base, stats=Stats(w, s, s), pulls=w, reward_sums=s, now=NOW)
    for name in ("zeros", "bincount", "unique", "searchsorted"):
        monkeypatch.setattr(np, name, released(name))
    moved = snapshot.reweighted(base, stats=Stats(w, s, s), pulls=w, reward_sums=s, now=NOW)
    monkeypatch.undo()
    assert moved is not None and expected is not None
    np.testing.assert_array_equal(moved.probabilities, expected.probabilities)
    assert moved.probabilities[:3].sum() > base.probabilities[:3].sum()  # the fold moved them
