"""Provisional folds (provisional.py): a reward for one of this replica's decisions is in the
snapshot Select samples from before any transaction applies it, and counts once whatever the
transaction decides; the other replicas get it from this one (peer_folds.py, at the end) and
settle it the same way. Over reads made up in memory and a recording NATS double;
tests/integration/test_provisional_folds.py runs the same over real NATS and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent, ProvisionalFoldBatch
from flywheel.optimizer import cache as cache_module
from flywheel.optimizer import fold, peer_folds, stats
from flywheel.optimizer.cache import PosteriorCache, _Inputs
from flywheel.optimizer.decisions import new_decision_id
from flywheel.optimizer.fold import FoldBatch, Notice, PgSnapshot
from flywheel.optimizer.peer_folds import PeerFolds
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.provisional import ProvisionalFolder, RecentDecisions
from flywheel.optimizer.segment_cache import _draw_basis


def _inputs(reward_spec=None) -> _Inputs:
    row = SimpleNamespace(
        name="bot",
        description="",
        policy_kind="thompson_beta",
        policy={},
        reward_spec=reward_spec or {},
        incumbent_arm_id="",
        created_at=datetime.now(UTC),
    )
    arms = [
        SimpleNamespace(arm_id=a, status="active", traffic_cap=1.0, pulls=0, reward_sum=0.0, params={})
        for a in ("a", "b")
    ]
    zero = np.zeros(2)
    return _Inputs(row, arms, Stats(zero.copy(), zero.copy(), zero.copy()), datetime.fromtimestamp(100.0, UTC))


def _cache(reward_spec=None) -> PosteriorCache:
    cache = PosteriorCache(sessions=None, rebuild_interval_s=0.0)  # type: ignore[arg-type]
    cache._install(_inputs(reward_spec), PgSnapshot.parse("10:10:"), 0.0)
    return cache


def _inc(reward: float) -> stats.Increment:
    out = stats.Increment()
    out.add(reward, None)
    return out


def _committed(xid: int, arm: str, rewards: list[float], settled: tuple[str, ...]) -> FoldBatch:
    total = stats.Increment()
    for r in rewards:
        total.add(r, None)
    endpoints = {"bot": {arm: total}} if rewards else {}
    return FoldBatch(xid=xid, at=100.0, endpoints=endpoints, settled=settled)


async def _pulls(cache: PosteriorCache) -> list[float]:
    snap = await cache.caught_up("bot")
    assert snap is not None
    return snap.pulls.tolist()


async def test_a_provisional_fold_is_served_at_once_and_replaced_by_its_commit():
    cache = _cache()
    assert cache.provisional("bot", "e1", "a", _inc(1.0))
    assert await _pulls(cache) == [1, 0]  # before any transaction
    # Its transaction commits: the real increment replaces it, counted once.
    cache.committed(_committed(11, "a", [1.0], settled=("e1",)))
    assert await _pulls(cache) == [1, 0]
    assert not cache._entries["bot"].provisional and not cache._provisional


async def test_an_event_is_folded_once_and_a_late_delivery_of_a_settled_one_not_at_all():
    cache = _cache()
    assert cache.provisional("bot", "e1", "a", _inc(1.0))
    assert not cache.provisional("bot", "e1", "a", _inc(1.0))  # published twice (an SDK retry)
    assert await _pulls(cache) == [1, 0]
    cache.committed(_committed(11, "a", [1.0], settled=("e1",)))
    # Its subscription delivers it after the commit (a slow replica): not added again.
    assert not cache.provisional("bot", "e1", "a", _inc(1.0))
    assert await _pulls(cache) == [1, 0]


async def test_a_duplicate_or_refused_event_undoes_its_provisional_fold_when_settled():
    cache = _cache()
    cache.provisional("bot", "dup", "a", _inc(1.0))
    cache.provisional("bot", "bad", "b", _inc(0.0))
    assert await _pulls(cache) == [1, 1]
    # The transaction found "dup" applied long ago and refused "bad": no increments, both settled.
    cache.committed(_committed(11, "a", [], settled=("dup", "bad")))
    assert await _pulls(cache) == [0, 0]


async def test_another_replica_settles_the_events_it_applied_by_its_notification():
    cache = _cache()
    cache.provisional("bot", "e1", "a", _inc(1.0))
    cache.provisional("bot", "e2", "a", _inc(1.0))
    # The other replica applied e1 and e2: the settled ids come first, then the increments.
    xid, at = 11, 100.0
    prefix = f'{{"x":{xid},"t":{at},"k":{time.time()},'
    bodies = [*fold.settled_bodies("r2", ["e1", "e2"]), fold.body("r2", "bot", {"a": _inc(1.0)})]
    for body in bodies:
        cache.notice(fold.decode(prefix + body))
    # The peer's increment says one reward (its batch held e1 only, e2 was a duplicate).
    assert await _pulls(cache) == [1, 0]


async def test_a_provisional_fold_nobody_settles_expires(monkeypatch):
    cache = _cache()
    cache.provisional("bot", "lost", "a", _inc(1.0))
    assert cache.expire_provisional() == 0 and await _pulls(cache) == [1, 0]
    monkeypatch.setattr(cache_module, "PROVISIONAL_TTL_S", 0.0)
    assert cache.expire_provisional() == 1
    assert await _pulls(cache) == [0, 0]


async def test_a_read_keeps_the_provisional_folds_on_top(monkeypatch):
    cache = _cache()
    cache.provisional("bot", "e1", "b", _inc(1.0))
    await _pulls(cache)
    # The periodic refresh installs a read that does not have e1 (not committed yet).
    cache._install(_inputs(), PgSnapshot.parse("12:12:"), 1.0)
    assert cache.cached("bot").pulls.tolist() == [0, 1]


async def test_the_provisional_folds_are_bounded(monkeypatch):
    cache = _cache()
    monkeypatch.setattr(cache_module, "MAX_PROVISIONAL", 2)
    assert cache.provisional("bot", "e1", "a", _inc(1.0)) and cache.provisional("bot", "e2", "a", _inc(1.0))
    assert not cache.provisional("bot", "e3", "a", _inc(1.0))
    assert not cache.provisional("gone", "e4", "a", _inc(1.0))  # an endpoint not cached
    assert not cache.provisional("bot", "e5", "no-such-arm", _inc(1.0))
    assert await _pulls(cache) == [2, 0]


def test_settled_ids_fill_notifications_under_the_size_limit_and_round_trip():
    ids = [f"{i:032x}" for i in range(1000)]
    bodies = fold.settled_bodies("r1", ids)
    assert len(bodies) > 1
    got: list[str] = []
    for body in bodies:
        payload = '{"x":123456789,"t":1764000000.123456,"k":1764000000.123456,' + body
        assert len(payload.encode()) < 8000  # PostgreSQL's NOTIFY limit
        notice = fold.decode(payload)
        assert notice.replica == "r1" and notice.fold is None
        got += notice.settled
    assert got == ids
    assert fold.settled_bodies("r1", []) == []


def test_recent_decisions_forget_the_oldest_past_their_capacity():
    recent = RecentDecisions(10)
    made = [
        SimpleNamespace(decision_id=f"d{i}", endpoint="bot", arm_id="a", features=None, segment="") for i in range(12)
    ]
    recent.add_many(made)  # past the capacity and its slack (a tenth): back to 10, the oldest gone
    assert len(recent) == 10 and recent.get("d1") is None and recent.get("d2") == ("bot", "a", None, "")
    recent.add_many([SimpleNamespace(decision_id="d12", endpoint="bot", arm_id="b", features=[1.0], segment="")])
    assert len(recent) == 11  # within the slack: evicted in bulk later, not one by one
    recent.add_many([SimpleNamespace(decision_id="d13", endpoint="bot", arm_id="b", features=None, segment="")])
    assert len(recent) == 10 and recent.get("d3") is None
    assert recent.get("d4") == ("bot", "a", None, "") and recent.get("d12") == ("bot", "b", [1.0], "")
    with pytest.raises(ValueError, match="capacity"):
        RecentDecisions(0)


def _event(decision_id: str, event_id: str, *, reward=None, signals=None, endpoint="", sent=None) -> bytes:
    e = FeedbackEvent(decision_id=decision_id, endpoint=endpoint)
    e.meta.event_id = event_id
    ts = Timestamp()
    ts.FromDatetime(sent or datetime.now(UTC))
    e.meta.time.CopyFrom(ts)
    if reward is not None:
        e.reward = reward
    for k, v in (signals or {}).items():
        e.signals[k] = v
    return e.SerializeToString()


async def test_the_folder_folds_only_this_replicas_decisions_with_the_endpoints_reward_settings():
    cache = _cache(reward_spec={"signal_weights": {"thumbs": 3.0, "stars": 1.0}, "bounded": True})
    recent = RecentDecisions(100)
    mine = new_decision_id()
    recent.add_many([SimpleNamespace(decision_id=mine, endpoint="bot", arm_id="b", features=None, segment="")])
    folder = ProvisionalFolder(cache, recent, window=timedelta(hours=1))
    # Weighted signals, as the transaction would weigh them: (3 * 1 + 1 * 0.2) / 4 = 0.8.
    assert folder.fold(_event(mine, "e1", signals={"thumbs": 1.0, "stars": 0.2}), None) == "folded"
    snap = await cache.caught_up("bot")
    assert snap.pulls.tolist() == [0, 1] and snap.reward_sums.tolist() == pytest.approx([0.0, 0.8])
    # Another replica's decision: that replica folds it.
    assert folder.fold(_event(new_decision_id(), "e2", reward=1.0), None) == "elsewhere"
    # What the durable consumer dead-letters is never folded.
    assert folder.fold(b"\xff\xfe not protobuf", None) == "invalid"
    assert folder.fold(_event(mine, "", reward=1.0), None) == "invalid"  # no event id
    assert folder.fold(_event(mine, "e3", reward=float("nan")), None) == "invalid"
    assert folder.fold(_event(mine, "e4", reward=1.0, endpoint="other"), None) == "invalid"
    assert folder.fold(_event(mine, "e5", signals={"unknown": 1.0}), None) == "invalid"
    assert (await cache.caught_up("bot")).pulls.tolist() == [0, 1]


async def test_the_folder_leaves_decisions_past_the_feedback_window_to_the_transaction():
    cache = _cache()
    recent = RecentDecisions(100)
    old = f"{int((time.time() - 120) * 1000):012x}" + "0" * 20  # made two minutes ago
    recent.add_many([SimpleNamespace(decision_id=old, endpoint="bot", arm_id="a", features=None, segment="")])
    folder = ProvisionalFolder(cache, recent, window=timedelta(seconds=60))
    assert folder.fold(_event(old, "e1", reward=1.0), None) == "invalid"
    assert (await cache.caught_up("bot")).pulls.tolist() == [0, 0]


async def test_the_provisional_fold_is_timed_from_the_publish():
    from prometheus_client import REGISTRY

    def count() -> float:
        return (
            REGISTRY.get_sample_value("flywheel_optimizer_posterior_fold_lag_seconds_count", {"source": "provisional"})
            or 0.0
        )

    cache = _cache()
    before = count()
    cache.provisional("bot", "e1", "a", _inc(1.0), since=time.time() - 0.1)
    await cache.caught_up("bot")
    assert count() == before + 1


def test_a_settled_notice_is_not_a_reload():
    notice = Notice("r2", "", None, settled=("e1",))
    cache = PosteriorCache(sessions=None)  # type: ignore[arg-type]
    cache.notice(notice)  # no endpoint to reload, no loop needed: only the ids are remembered
    assert "e1" in cache._settled


async def test_a_segment_serves_its_provisional_folds_until_they_are_settled_or_expire(monkeypatch):

    from flywheel.optimizer.segment_cache import SegmentCache

    cache = _cache()
    segments = SegmentCache(sessions=None, endpoints=cache)  # type: ignore[arg-type]
    cache.fold_segments_into(segments.fold_many, segments.settle)
    snap = cache.cached("bot")
    zero = Stats(np.zeros(2), np.zeros(2), np.zeros(2))
    segments._put(segments._build(snap, "fr", zero, Stats(np.ones(2), np.full(2, 0.5), np.full(2, 0.5)), 0.0))
    before = segments.peek(snap, "fr").probabilities.tolist()
    assert before[1] == pytest.approx(0.5, abs=0.1)
    for i in range(20):
        assert cache.provisional("bot", f"e{i}", "b", _inc(1.0))
        assert segments.provisional("bot", "fr", f"e{i}", "b", _inc(1.0))
    assert not segments.provisional("bot", "", "x", "b", _inc(1.0))  # the endpoint-wide part is not a segment
    assert not segments.provisional("bot", "de", "x", "b", _inc(1.0))  # not cached
    await _rebuilt(segments)  # one coalesced rebuild
    folded = segments.peek(snap, "fr")
    # 0.967 exactly (200,000 draws); from 1,000 draws its SD is 0.006, so 0.93 is 6 SD below.
    # Without the folds it is 0.5.
    assert folded.probabilities[1] > 0.93 and folded.own.w.tolist() == [0, 0]  # on top, never in own
    # Ten are committed (their increments folded into own) and settled: still 20 rewards in all.
    committed = stats.Increment()
    for _ in range(10):
        committed.add(1.0, None)
    cache.committed(
        FoldBatch(
            xid=11,
            at=100.0,
            endpoints={"bot": {"b": committed}},
            segments={("bot", "b", "fr"): committed},
            settled=tuple(f"e{i}" for i in range(10)),
        )
    )
    await _rebuilt(segments)
    assert segments.peek(snap, "fr").own.w.tolist() == [0, 10] and len(segments._overlay[("bot", "fr")]) == 10
    # The other ten expire (nothing settled them): the segment forgets them too.
    monkeypatch.setattr(cache_module, "PROVISIONAL_TTL_S", 0.0)
    assert cache.expire_provisional() == 10
    await _rebuilt(segments)
    assert not segments._overlay and not segments._overlay_of


async def _announced(cache: PosteriorCache, monkeypatch) -> tuple[dict[str, object], FoldBatch]:
    """What a transaction settling one event of decision "mine" and one of "theirs" tells the
    other replicas (``notify.announce``'s arguments), and its FoldBatch."""
    from flywheel.optimizer import notify, service
    from flywheel.optimizer.service import FeedbackItem

    sent: dict[str, object] = {}

    async def announce(session, **kwargs):
        sent.update(kwargs)
        return 11, 100.0

    monkeypatch.setattr(notify, "announce", announce)
    items = [FeedbackItem("e-mine", "mine", 1.0, {}), FeedbackItem("e-theirs", "theirs", 1.0, {})]
    batch = await service._announce(None, cache, {("bot", "a", ""): _inc(1.0)}, {"bot": 0.0}, items)  # type: ignore[arg-type]
    return sent, batch


async def test_a_transaction_tells_other_replicas_only_of_events_whose_decisions_they_made(monkeypatch):

    cache = _cache()
    recent = RecentDecisions(100)
    recent.add_many([SimpleNamespace(decision_id="mine", endpoint="bot", arm_id="a", features=None, segment="")])
    cache.track_provisional(recent)
    sent, batch = await _announced(cache, monkeypatch)
    assert sent["settled"] == ["e-theirs"]  # the other replica folded that one provisionally
    assert batch.settled == ("e-mine", "e-theirs")  # this replica settles both


# --- peer folds (peer_folds.py) -------------------------------------------------------------


class RecordingNats:
    """What PeerFolds.run needs of a NATS client: subscribe, and publish into a list."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.subscribed: list[str] = []

    async def subscribe(self, subject, cb, **_kwargs):
        self.subscribed.append(subject)
        return SimpleNamespace(unsubscribe=_nothing)

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, payload))


async def _nothing() -> None:
    return None


def _peers(cache, replica="r1") -> PeerFolds:
    return PeerFolds(cache, replica=replica, subject=f"t.optimizer.fold.{replica}", peers_subject="t.optimizer.fold.*")


def _batch(*folds: dict) -> bytes:
    message = ProvisionalFoldBatch()
    for f in folds:
        fold = message.folds.add(**{k: v for k, v in f.items() if k not in ("features", "published")})
        fold.features.extend(f.get("features", []))
        if "published" in f:
            fold.published.FromNanoseconds(int(f["published"] * 1e9))
    return message.SerializeToString()


async def test_a_peers_fold_is_served_at_once_and_replaced_by_the_commit_that_applies_it():
    cache = _cache()
    peers = _peers(cache)
    got = peers.fold(_batch({"event_id": "e1", "endpoint": "bot", "arm_id": "b", "reward": 1.0}))
    assert got["folded"] == 1
    assert await _pulls(cache) == [0, 1]  # before any transaction, on the arm the peer's decision chose
    # The deciding replica's commit names the event in its NOTIFY: the real increment replaces it.
    cache.notice(Notice("r2", "", None, settled=("e1",)))
    cache.committed(_committed(11, "b", [1.0], settled=()))
    assert await _pulls(cache) == [0, 1]
    assert not cache._provisional
    # The same fold told again after its settlement (NATS later than PostgreSQL) is not added.
    assert peers.fold(_batch({"event_id": "e1", "endpoint": "bot", "arm_id": "b", "reward": 1.0}))["not_folded"] == 1
    assert await _pulls(cache) == [0, 1]


async def test_a_peers_fold_nobody_settles_expires(monkeypatch):
    cache = _cache()
    _peers(cache).fold(_batch({"event_id": "e1", "endpoint": "bot", "arm_id": "a", "reward": 1.0}))
    assert await _pulls(cache) == [1, 0]
    monkeypatch.setattr(cache_module, "PROVISIONAL_TTL_S", 0.0)
    assert cache.expire_provisional() == 1
    assert await _pulls(cache) == [0, 0]


async def test_what_cannot_be_folded_is_refused_and_counted_and_the_rest_of_the_batch_folds():
    cache = _cache()
    peers = _peers(cache)
    got = peers.fold(
        _batch(
            {"event_id": "", "endpoint": "bot", "arm_id": "a", "reward": 1.0},  # no event id
            {"event_id": "e2", "endpoint": "bot", "arm_id": "a", "reward": float("nan")},
            {"event_id": "e3", "endpoint": "other", "arm_id": "a", "reward": 1.0},  # not cached here
            {"event_id": "e4", "endpoint": "bot", "arm_id": "zz", "reward": 1.0},  # no such arm
            {"event_id": "e5", "endpoint": "bot", "arm_id": "a", "reward": 0.5},
        )
    )
    assert (got["invalid"], got["not_folded"], got["folded"]) == (2, 2, 1)
    assert peers.fold(b"\xff\xfe not protobuf")["invalid"] == 1
    snap = await cache.caught_up("bot")
    assert snap.pulls.tolist() == [1, 0] and snap.reward_sums.tolist() == pytest.approx([0.5, 0.0])


async def test_a_peers_fold_is_timed_under_its_own_source():
    from prometheus_client import REGISTRY

    def count() -> float:
        labels = {"source": "provisional_peer"}
        return REGISTRY.get_sample_value("flywheel_optimizer_posterior_fold_lag_seconds_count", labels) or 0.0

    cache = _cache()
    before = count()
    peers = _peers(cache)
    peers.fold(_batch({"event_id": "e1", "endpoint": "bot", "arm_id": "a", "reward": 1.0, "published": time.time()}))
    await cache.caught_up("bot")
    assert count() == before + 1


async def test_a_replica_sends_its_folds_only_once_it_has_heard_of_a_peer_and_then_names_every_settled_event(
    monkeypatch,
):

    cache = _cache()
    recent = RecentDecisions(100)
    recent.add_many([SimpleNamespace(decision_id="mine", endpoint="bot", arm_id="a", features=None, segment="")])
    cache.track_provisional(recent)
    peers = _peers(cache)
    nats = RecordingNats()
    task = asyncio.create_task(peers.run(nats))  # type: ignore[arg-type]
    fold = {"endpoint": "bot", "arm_id": "a", "segment": "", "reward": 1.0, "features": None, "published": 0.0}
    try:
        peers.add(event_id="e0", **fold)  # alone so far: nothing sent
        await asyncio.sleep(0.01)
        assert nats.published == [] and not peers.shares() and not cache.shares_provisional
        peers.heard_peer()  # another replica's NOTIFY arrived
        for i in range(1, 4):  # one event-loop turn: one message
            peers.add(event_id=f"e{i}", **fold)
        assert cache.shares_provisional  # before the send: a commit from now on names its events
        await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert nats.subscribed == ["t.optimizer.fold.*"]
    assert len(nats.published) == 1 and nats.published[0][0] == "t.optimizer.fold.r1"
    sent = ProvisionalFoldBatch.FromString(nats.published[0][1])
    assert [f.event_id for f in sent.folds] == ["e1", "e2", "e3"] and sent.folds[0].arm_id == "a"

    # While it shares, its transactions name the events of its own decisions too.
    said, _ = await _announced(cache, monkeypatch)
    assert said["settled"] == ["e-mine", "e-theirs"]


def _peers_with_five_folds() -> PeerFolds:
    """A replica that has heard of a peer and queued folds e0..e4."""
    peers = _peers(_cache())
    peers.heard_peer()
    fold = {"endpoint": "bot", "arm_id": "a", "segment": "", "reward": 1.0, "features": None, "published": 0.0}
    for i in range(5):
        peers.add(event_id=f"e{i}", **fold)
    return peers


async def test_the_outbox_is_bounded(monkeypatch):
    monkeypatch.setattr(peer_folds, "MAX_OUTBOX", 3)
    assert len(_peers_with_five_folds()._outbox.folds) == 3


async def test_a_large_outbox_goes_in_several_messages(monkeypatch):
    monkeypatch.setattr(peer_folds, "MAX_BATCH", 2)
    peers = _peers_with_five_folds()
    nats = RecordingNats()
    await peers._send(nats)  # type: ignore[arg-type]
    sent = [ProvisionalFoldBatch.FromString(p) for _, p in nats.published]
    assert [len(m.folds) for m in sent] == [2, 2, 1]
    assert [f.event_id for m in sent for f in m.folds] == [f"e{i}" for i in range(5)]
    assert len({m.meta.event_id for m in sent}) == 3


async def _fold_until(cache: PosteriorCache, below: float, *, limit: int = 400) -> int:
    """Fold rewards on arm a one at a time until the served draws' effective sample share is
    below ``below``; how many were folded."""
    for n in range(1, limit + 1):
        assert cache.provisional("bot", f"e{n}", "a", _inc(1.0))
        await cache.caught_up("bot")
        if cache.cached("bot").draw_ess < below:
            return n
    raise AssertionError(f"the draws kept an effective sample share of {below} or more over {limit} folds")


def _seasoned_cache(**kwargs) -> PosteriorCache:
    """Both arms at 50 pulls, half of them rewarded: one fold moves the posterior a little."""
    inp = _inputs()
    for arm in inp.arms:
        arm.pulls, arm.reward_sum = 50, 25.0
    inp.agg = Stats(np.array([50.0, 50.0]), np.array([25.0, 25.0]), np.array([25.0, 25.0]))
    cache = PosteriorCache(sessions=None, rebuild_interval_s=0.0, **kwargs)  # type: ignore[arg-type]
    cache._install(inp, PgSnapshot.parse("10:10:"), 0.0)
    return cache


async def test_draws_are_renewed_ahead_in_the_background_with_every_fold_made_meanwhile(monkeypatch):
    cache = _seasoned_cache()
    assert cache.provisional("bot", "first", "b", _inc(0.0))
    await cache.caught_up("bot")
    first = cache.cached("bot").draw_set
    assert first is not None and cache.cached("bot").draw_ess == 1.0
    # The next draws wait until the test lets them go: folds meanwhile must not wait for them.
    go, drawing = threading.Event(), cache._rebuilt

    def held(*args):
        assert go.wait(10)
        return drawing(*args)

    monkeypatch.setattr(cache, "_rebuilt", held)
    n = await _fold_until(cache, 0.75)
    entry = cache._entries["bot"]
    redraw = entry.redrawing
    assert redraw is not None and cache.cached("bot").draw_set is first
    # A fold while the new draws are made is served at once, from the old ones.
    assert cache.provisional("bot", "during", "a", _inc(1.0))
    await asyncio.wait_for(cache.caught_up("bot"), 5)
    assert cache.cached("bot").pulls.tolist() == [51 + n, 51] and cache.cached("bot").draw_set is first
    go.set()
    await redraw
    renewed = cache.cached("bot")
    assert renewed.draw_set is not first and entry.redrawing is None
    assert renewed.pulls.tolist() == [51 + n, 51] and renewed.draw_ess > 0.9  # nothing lost, fresh weights
    # a: 26 + n rewards of 51 + n, b: 25 of 51.
    assert renewed.probabilities[0] > renewed.probabilities[1]


async def test_without_the_redraw_ahead_the_draws_are_kept_until_they_no_longer_serve():
    cache = _seasoned_cache(redraw_ahead_ess=0.0)
    assert cache.provisional("bot", "first", "b", _inc(0.0))
    await cache.caught_up("bot")
    first = cache.cached("bot").draw_set
    await _fold_until(cache, 0.75)
    assert cache._entries["bot"].redrawing is None and cache.cached("bot").draw_set is first


def _segments_held(monkeypatch, cache: PosteriorCache, **kwargs):
    """A segment cache over ``cache`` whose worker-thread draws wait for the returned Event."""
    from flywheel.optimizer.segment_cache import SegmentCache

    segments = SegmentCache(sessions=None, endpoints=cache, **kwargs)  # type: ignore[arg-type]
    go, drawing = threading.Event(), segments._draw

    def held(jobs):
        assert go.wait(10)
        return drawing(jobs)

    monkeypatch.setattr(segments, "_draw", held)
    return segments, go


def _seasoned(n: float) -> Stats:
    return Stats(np.array([n, n]), np.array([n / 2, n / 2]), np.array([n / 2, n / 2]))


async def _rebuilt(segments) -> None:
    """Once the segment cache's scheduled passes and draws are done (not a fixed sleep: the
    drawing thread is late on a loaded machine)."""
    await asyncio.sleep(0.01)  # a pass the change scheduled has begun
    await _settled_in(lambda: segments._passes is None and segments._drawing is None and not segments._dirty)


async def _settled_in(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.005)


async def test_a_segment_waiting_for_new_draws_holds_up_no_other_segment_and_gets_every_fold(monkeypatch):
    cache = _seasoned_cache()
    segments, go = _segments_held(monkeypatch, cache, redraw_ahead_ess=0.75)
    snap = cache.cached("bot")
    for name, own in (("fr", _seasoned(50)), ("de", _seasoned(1))):
        segments._put(segments._build(snap, name, own, _seasoned(0), 0.0))
    fr, de = (segments.peek(snap, s).probabilities.copy() for s in ("fr", "de"))
    # "de" moves so far that its draws no longer serve; "fr" by one reward, in the same pass.
    for i in range(20):
        assert segments.provisional("bot", "de", f"d{i}", "b", _inc(1.0))
    assert segments.provisional("bot", "fr", "f0", "b", _inc(1.0))
    await _settled_in(lambda: segments.peek(snap, "fr").probabilities[1] > fr[1])
    assert segments.peek(snap, "de").probabilities.tolist() == de.tolist()  # waits for its draws
    assert ("bot", "de") in segments._waiting and segments._drawing is not None
    # Rewards on a while the draws are made: the new draws must carry them too.
    for i in range(30):
        assert segments.provisional("bot", "de", f"late{i}", "a", _inc(1.0))
    await asyncio.sleep(0.02)
    assert segments.peek(snap, "de").probabilities.tolist() == de.tolist()
    go.set()
    await _rebuilt(segments)
    # a: 30.5 wins of 31 against b's 20.5 of 21 on both draws: a ahead, not b at ~1 as without them.
    served = segments.peek(snap, "de").probabilities
    assert 0.5 < served[0] < 0.95 and not segments._waiting


async def test_a_segments_draws_are_renewed_ahead_while_the_old_ones_still_serve(monkeypatch):
    cache = _seasoned_cache()
    segments, go = _segments_held(monkeypatch, cache, redraw_ahead_ess=0.75)
    snap = cache.cached("bot")
    segments._put(segments._build(snap, "fr", _seasoned(50), _seasoned(0), 0.0))
    key = ("bot", "fr")
    first = segments._draw_sets.get(key, _draw_basis(segments.peek(snap, "fr").basis, snap))
    assert first is not None
    for n in range(1, 400):
        assert segments.provisional("bot", "fr", f"e{n}", "a", _inc(1.0))
        await _settled_in(lambda: segments._passes is None)
        if segments._drawing is not None:
            break
    assert segments._drawing is not None, "never renewed ahead"
    # A fold while the new draws are made is served at once, from the old draws.
    before = segments.peek(snap, "fr").probabilities[0]
    assert segments.provisional("bot", "fr", "during", "a", _inc(1.0))
    await _settled_in(lambda: segments.peek(snap, "fr").probabilities[0] > before)
    assert segments._draw_sets.get(key, _draw_basis(segments.peek(snap, "fr").basis, snap)) is first
    go.set()
    await _settled_in(lambda: segments._drawing is None)
    entry = segments.peek(snap, "fr")
    renewed = segments._draw_sets.get(key, _draw_basis(entry.basis, snap))
    assert renewed is not None and renewed is not first
    _, ess = segments._reweighted(key, entry.basis, snap, segments._total(snap, "fr", entry.own, entry.prior))
    assert ess > 0.9  # drawn from (nearly) the posterior it now serves
