"""In-memory snapshots of every endpoint: read from PostgreSQL, kept fresh by folding feedback.

Select samples from the cached snapshot of its endpoint, which changes when

- this replica commits feedback: right after the commit its increments are added to the
  cached counts (``committed``, see ``fold.py``) and the snapshot's probabilities are rebuilt,
  one rebuild per endpoint at a time, starting at most one per ``rebuild_interval_s`` (or per
  twice the last rebuild's duration, if longer): folds that arrive meanwhile accumulate and
  share the next rebuild. A Beta snapshot's rebuild reweights the draws of the last one on
  the event loop (``reweight.py``: no new draw, no thread); when those draws no longer serve,
  it draws again in a worker thread;
- another replica commits feedback: its NOTIFY carries the increments (``notice``, see
  ``notify.py``), folded the same way;
- feedback for one of this replica's decisions is published: it is folded provisionally
  (``provisional``, see ``provisional.py``) on top of the committed counts, keyed by its event
  id, until the transaction that settles the event (this replica's, or another's, named in its
  NOTIFY) replaces it with what the transaction really added, or ``PROVISIONAL_TTL_S`` passes;
- this replica makes an administrative change (``load``), or the periodic full refresh reads
  everything (``refresh``, every ``refresh_interval_s``): the reconciliation. Every read
  records its PostgreSQL snapshot and every fold its transaction id, so a fold the read could
  see is not counted twice and one it could not see is added on top of the read again.

Admin reads (``read``, ``read_all``) build a view for their caller from a fresh read and
never replace what Select uses, so polling the API does not change how fresh selection is.
Segment posteriors are cached by ``segment_cache.SegmentCache``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import Counter, Histogram
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.core.errors import NotFound
from flywheel.core.logging import get_logger
from flywheel.optimizer import fold, snapshot, stats
from flywheel.optimizer.fold import Counts, EndpointFold, FoldBatch, Notice, PgSnapshot
from flywheel.optimizer.models import ArmRow, EndpointRow
from flywheel.optimizer.overlay import ArmSum, Overlay, indexed
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.snapshot import EndpointSnapshot
from flywheel.optimizer.spec import LINEAR, PolicyConfig
from flywheel.optimizer.stats import Increment

if TYPE_CHECKING:  # provisional.py imports this module
    from flywheel.optimizer.provisional import RecentDecisions

log = get_logger(__name__)

FOLDS = Counter(
    "flywheel_optimizer_posterior_folds_total",
    "Committed feedback transactions folded into a cached posterior without a reload, by source (own, peer)",
    ["source"],
)
REBUILDS = Counter(
    "flywheel_optimizer_posterior_rebuilds_total",
    "Snapshots rebuilt from folded feedback (one may cover many folds), by how: reweighted (the last "
    "rebuild's draws reweighted on the event loop) or drawn (new draws, in a worker thread)",
    ["how"],
)
_REWEIGHTED, _DRAWN = REBUILDS.labels("reweighted"), REBUILDS.labels("drawn")
FOLD_LAG = Histogram(
    "flywheel_optimizer_posterior_fold_lag_seconds",
    "Committed feedback to the snapshot Select samples from reflecting it, by source: own (from this "
    "replica's commit) and peer (from the other replica's NOTIFY being sent, just before its commit)",
    ["source"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 10, 60),
)
# An endpoint with this many folds no read has seen yet (refreshes failing) is reloaded instead.
MAX_PENDING_FOLDS = 10_000
# At most this many folds per endpoint wait to be timed (``FOLD_LAG``); more are not timed.
MAX_TIMED_FOLDS = 1_000
PROVISIONAL = Counter(
    "flywheel_optimizer_provisional_folds_total",
    "Feedback folded provisionally into a cached posterior before its transaction commits, and how each "
    "provisional fold ended: folded, settled (its transaction committed), expired (none did in time), "
    "late (its event was settled already), skipped (endpoint not cached, arm unknown, or the bound reached)",
    ["outcome"],
)
# Its children resolved once: labels() per event is a measurable share of a hot path.
_FOLDED, _SETTLED, _EXPIRED, _LATE, _SKIPPED = (
    PROVISIONAL.labels(o) for o in ("folded", "settled", "expired", "late", "skipped")
)
# A provisional fold that no transaction settles within this long is dropped (its event was
# dead-lettered, or its replica's consumer is stuck): at most this long, one reward counts twice
# or one that was refused counts once.
PROVISIONAL_TTL_S = 5.0
# At most this many provisional folds are held (over all endpoints); more are not folded.
MAX_PROVISIONAL = 50_000
# The ids of this many settled events are remembered, so that a provisional fold arriving after
# its event was settled (its NATS delivery late) is not added.
MAX_SETTLED_IDS = 100_000


@dataclass
class _Inputs:
    """One endpoint as read from PostgreSQL."""

    row: Any
    arms: list[Any]
    agg: Stats
    now: datetime


@dataclass
class _Entry:
    """Fold bookkeeping of one cached endpoint."""

    seen: PgSnapshot  # what the read behind the installed snapshot could see
    counts: Counts  # that read's counts plus every fold since: what the next rebuild uses
    folds: dict[int, EndpointFold]  # by transaction id: committed, but not visible to that read
    version: int = 0  # bumped by every change of ``counts``
    built: int = 0  # the version the installed snapshot reflects
    next_rebuild: float = 0.0  # monotonic time before which no rebuild starts
    rebuilding: asyncio.Task[None] | None = None
    redrawing: asyncio.Task[None] | None = None  # new draws ahead, while folds reweight the old
    waiters: list[tuple[int, asyncio.Future[bool]]] = field(default_factory=list)
    # Folds not in the installed snapshot yet: (version, since when (time.time()), source)
    timed: list[tuple[int, float, str]] = field(default_factory=list)
    # Provisional folds by event id: (arm id, increment), on top of ``counts`` until settled.
    provisional: Overlay = field(default_factory=Overlay)


class PosteriorCache:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        refresh_interval_s: float = 0.5,
        rebuild_interval_s: float = 0.002,
        fold_draws: int = snapshot.PROPENSITY_DRAWS,
        redraw_ahead_ess: float = 0.75,
        replica: str = "",
        announce: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._sessions = sessions
        self._interval = refresh_interval_s
        self._rebuild_interval = rebuild_interval_s
        # Joint posterior draws of a snapshot rebuilt from folds (a read draws PROPENSITY_DRAWS).
        self._fold_draws = fold_draws
        # A Beta snapshot whose reweighted draws keep less than this effective sample share draws
        # again ahead, in a worker thread, while folds go on reweighting the old draws: no fold
        # waits for that draw unless the old ones fall below ``reweight.MIN_ESS_SHARE`` meanwhile.
        self._redraw_ahead_ess = redraw_ahead_ess
        # Put into this replica's notifications, so that it skips its own.
        self.replica = replica
        # Tells the other replicas to reload an endpoint (after an administrative change here).
        self._announce = announce
        # Where a transaction's per-segment increments go (``SegmentCache.fold_many``), if any,
        # and who drops the segments' provisional folds of settled events (``SegmentCache.settle``).
        self._segment_folds: Callable[..., int] | None = None
        self._segment_settle: Callable[[Iterable[str]], None] | None = None
        self._snapshots: dict[str, EndpointSnapshot] = {}
        self._entries: dict[str, _Entry] = {}
        # When each snapshot's read began (monotonic), and the reload in flight per endpoint:
        # lets concurrent callers that need a post-commit view share one reload (``fresh``).
        self._read_at: dict[str, float] = {}
        self._inflight: dict[str, tuple[float, asyncio.Future[EndpointSnapshot]]] = {}
        self._reloading: dict[str, asyncio.Task[None]] = {}
        self._rng = np.random.default_rng()
        self._rebuild_rng = np.random.default_rng()  # used by the rebuild threads
        # The last snapshot built for each endpoint, with what it was built from: a read that
        # finds the same inputs again reuses that snapshot. (Not whatever ``_snapshots`` holds:
        # a refresh that read before a concurrent load may have put an older one back there.)
        self._built: dict[str, tuple[tuple[Any, ...], EndpointSnapshot]] = {}
        # This replica's recent decisions, set when it folds provisionally (``provisional.py``):
        # then its feedback transactions name the events they settle (``service.FoldSink``).
        self._recent: RecentDecisions | None = None
        self._sharing: Callable[[], bool] | None = None  # share_provisional
        # event id -> (endpoint, when folded (monotonic)), oldest first: for settling and expiry.
        self._provisional: dict[str, tuple[str, float]] = {}
        self._settled: dict[str, None] = {}  # recently settled event ids, oldest first

    def snapshots(self) -> list[EndpointSnapshot]:
        return list(self._snapshots.values())

    def cached(self, name: str) -> EndpointSnapshot | None:
        """The cached snapshot, or None (no await on the hot path)."""
        return self._snapshots.get(name)

    async def get(self, name: str) -> EndpointSnapshot:
        """The cached snapshot, loading it on a miss (NotFound if the endpoint does not exist)."""
        found = self._snapshots.get(name)
        return found if found is not None else await self.load(name)

    # --- reads ---------------------------------------------------------------------------

    async def load(self, name: str) -> EndpointSnapshot:
        """Reload one endpoint from the database now (after a write: Select sees it at once)."""
        started = time.monotonic()
        try:
            inputs, seen = await self._read(name)
        except NotFound:
            self._drop(name)
            raise
        self._install(inputs[0], seen, started)
        return self._snapshots[name]

    async def changed(self, name: str) -> EndpointSnapshot:
        """After an administrative change made here: reload it, and ask the other replicas to."""
        snap = await self.load(name)
        if self._announce is not None:
            try:
                await self._announce(name)
            except Exception as exc:  # noqa: BLE001 - they reload at their next refresh anyway
                log.warning("could not announce an endpoint change", endpoint=name, error=repr(exc))
        return snap

    async def read(self, name: str) -> EndpointSnapshot:
        """A view of one endpoint freshly read for an admin caller; what Select uses is left
        as it is (NotFound if the endpoint does not exist)."""
        inputs, _ = await self._read(name)
        return self._base_snapshot(inputs[0])

    async def read_all(self) -> list[EndpointSnapshot]:
        """``read`` for every endpoint, by name, in one pass."""
        inputs, _ = await self._read(None)
        return [self._base_snapshot(i) for i in sorted(inputs, key=lambda i: i.row.name)]

    async def fresh(self, name: str, *, since: float) -> EndpointSnapshot:
        """A snapshot whose read began at or after ``since`` (``time.monotonic()``), so it sees
        every commit made before then. Concurrent callers share one reload: under a burst of
        Update calls the endpoint is read once per round, not once per call."""
        if self._read_at.get(name, -1.0) >= since and name in self._snapshots:
            return self._snapshots[name]
        inflight = self._inflight.get(name)
        if inflight is not None and inflight[0] >= since:
            return await asyncio.shield(inflight[1])
        started = time.monotonic()
        task = asyncio.ensure_future(self.load(name))
        self._inflight[name] = (started, task)
        task.add_done_callback(lambda done: self._forget(name, done))
        return await asyncio.shield(task)

    def _forget(self, name: str, done: asyncio.Future[EndpointSnapshot]) -> None:
        if self._inflight.get(name, (0.0, None))[1] is done:
            del self._inflight[name]
        if not done.cancelled():
            done.exception()  # retrieved here so a failed shared reload is not reported as unhandled

    async def refresh(self) -> None:
        """Reload every endpoint in one pass (four queries): the reconciliation."""
        started = time.monotonic()
        inputs, seen = await self._read(None)
        names = {i.row.name for i in inputs}
        for name in [n for n in self._snapshots if n not in names]:
            entry = self._entries.get(name)
            if entry is None or not seen.precedes(entry.seen):  # not loaded after this read began
                self._drop(name)
        for i in inputs:
            self._install(i, seen, started)
        self._built = {name: last for name, last in self._built.items() if name in names}

    async def run(self) -> None:
        """Refresh forever (a background task of the service)."""
        while True:
            self.expire_provisional()
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep serving the last snapshot while PostgreSQL is away
                log.warning("posterior refresh failed", error=repr(exc))
            await asyncio.sleep(self._interval)

    async def _read(self, name: str | None) -> tuple[list[_Inputs], PgSnapshot]:
        """One endpoint (or all) as of one PostgreSQL snapshot, which is returned too."""
        async with self._sessions() as session:
            # One snapshot for every statement, so the read is exactly the transactions it sees.
            await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            seen = PgSnapshot.parse((await session.execute(text("SELECT pg_current_snapshot()::text"))).scalar_one())
            if name is None:
                rows = list((await session.scalars(select(EndpointRow))).all())
            else:
                row = await session.get(EndpointRow, name)
                if row is None:
                    raise NotFound(f"endpoint {name!r} does not exist")
                rows = [row]
            names = [r.name for r in rows]
            arms = (
                (
                    await session.scalars(
                        select(ArmRow).where(ArmRow.endpoint.in_(names)).order_by(ArmRow.endpoint, ArmRow.position)
                    )
                ).all()
                if names
                else []
            )
            stat_rows, now = await stats.load_rows(session, endpoint=names[0] if len(names) == 1 else None)
        by_endpoint: dict[str, list[ArmRow]] = {n: [] for n in names}
        for arm in arms:
            by_endpoint[arm.endpoint].append(arm)
        rows_by_endpoint: dict[str, list[object]] = {n: [] for n in names}
        for st in stat_rows:
            if st.endpoint in rows_by_endpoint:
                rows_by_endpoint[st.endpoint].append(st)
        out = []
        for row in rows:
            policy = _policy(row)
            d = len(policy.context_features) if policy.kind == LINEAR else 0
            ep_arms = by_endpoint[row.name]
            agg = stats.aggregate(policy, [a.arm_id for a in ep_arms], rows_by_endpoint[row.name], now, d)
            out.append(_Inputs(row, ep_arms, agg, now))
        return out, seen

    def _base_snapshot(self, inp: _Inputs) -> EndpointSnapshot:
        """The snapshot of exactly what was read (reused when the same inputs were built before)."""
        inputs = snapshot_inputs(inp.row, inp.arms, inp.agg)
        last = self._built.get(inp.row.name)
        if last is not None and last[0] == inputs:
            # Nothing changed since it was built (an idle endpoint): keep it rather than draw
            # its posteriors again, the bulk of a refresh's CPU when endpoints are many.
            return last[1]
        built = snapshot.build(row=inp.row, arms=inp.arms, stats=inp.agg, now=inp.now, rng=self._rng)
        self._built[inp.row.name] = (inputs, built)
        return built

    def _install(self, inp: _Inputs, seen: PgSnapshot, started: float) -> None:
        """Make a read what Select uses, with the folds it could not see added on top."""
        name = inp.row.name
        entry = self._entries.get(name)
        if entry is not None and seen.precedes(entry.seen) and name in self._snapshots:
            return  # a newer read is installed already (a load finished before this refresh)
        pending = [] if entry is None else [f for f in entry.folds.values() if not seen.visible(f.xid)]
        base = Counts(
            inp.agg,
            np.array([a.pulls for a in inp.arms], dtype=float),
            np.array([a.reward_sum for a in inp.arms], dtype=float),
            fold.epoch(inp.now),
            float(getattr(inp.row, "decisions_total", 0) or 0),  # the decision clock, read with the rows
        )
        counts, kept = base, []
        if pending:
            policy = _policy(inp.row)
            index = {a.arm_id: i for i, a in enumerate(inp.arms)}
            for f in sorted(pending, key=lambda f: f.at):
                if all(a in index for a in f.arms):  # else: an arm this read does not know yet
                    counts = fold.add(policy, counts, index, f.at, f.arms, f.clock)
                    kept.append(f)
        serving = counts
        if entry is not None and entry.provisional:
            serving = _with_provisional(counts, [a.arm_id for a in inp.arms], entry.provisional)
        if kept or serving is not counts:
            snap = snapshot.build(
                row=inp.row,
                arms=inp.arms,
                stats=serving.stats,
                now=fold.from_epoch(serving.as_of),
                rng=self._rng,
                pulls=serving.pulls,
                reward_sums=serving.reward_sums,
            )
        else:
            snap = self._base_snapshot(inp)
        snap = _carry_draws(self._snapshots.get(name), snap)
        if entry is None:
            entry = self._entries[name] = _Entry(seen=seen, counts=counts, folds={})
        entry.seen, entry.counts, entry.folds = seen, counts, {f.xid: f for f in kept}
        entry.version += 1
        entry.built = entry.version
        self._snapshots[name] = snap
        self._read_at[name] = max(started, self._read_at.get(name, 0.0))
        self._release(entry)

    def _drop(self, name: str) -> None:
        self._snapshots.pop(name, None)
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._release(entry, ok=False)

    # --- folds ---------------------------------------------------------------------------

    def fold_segments_into(
        self, fold_many: Callable[..., int], settle: Callable[[Iterable[str]], None] | None = None
    ) -> None:
        """Also hand each committed batch's per-segment increments to ``fold_many``
        (``SegmentCache.fold_many``), so cached segments learn this replica's feedback at once,
        and every settled or expired event id to ``settle`` (``SegmentCache.settle``)."""
        self._segment_folds = fold_many
        self._segment_settle = settle

    def committed(self, batch: FoldBatch) -> None:
        """This replica's feedback transaction committed: fold its increments in now, in place
        of the provisional folds of the events it settled."""
        now = time.time()
        if batch.settled:
            self.settle(batch.settled)
        for name, f in batch.folds().items():
            self._fold(name, f, "own", now)
        if self._segment_folds is not None and batch.segments:
            self._segment_folds(batch.segments, committed_at=time.monotonic())

    def notice(self, notice: Notice) -> None:
        """Another replica's notification: fold its increments, drop the provisional folds of
        the events it settled, or reload the endpoint."""
        if notice.settled:
            self.settle(notice.settled)
        elif notice.fold is None:
            self._reload_soon(notice.endpoint)
        else:
            self._fold(notice.endpoint, notice.fold, "peer", notice.sent)

    # --- provisional folds -----------------------------------------------------------------

    def track_provisional(self, recent: RecentDecisions) -> None:
        """Fold provisionally the feedback of the decisions in ``recent`` (this replica's)."""
        self._recent = recent

    @property
    def tracks_provisional(self) -> bool:
        return self._recent is not None

    def share_provisional(self, sharing: Callable[[], bool]) -> None:
        """``sharing()`` says whether this replica's provisional folds may be held by its peers
        (``peer_folds.py``): then its transactions name every event they settle."""
        self._sharing = sharing

    @property
    def shares_provisional(self) -> bool:
        return self._sharing is not None and self._sharing()

    def decided_here(self, decision_id: str) -> bool:
        """Whether this replica made the decision (and so folded its feedback provisionally
        itself: no other replica needs to hear that it was settled)."""
        return self._recent is not None and self._recent.get(decision_id) is not None

    def provisional(
        self,
        name: str,
        event_id: str,
        arm_id: str,
        inc: Increment,
        *,
        since: float = 0.0,
        source: str = "provisional",
    ) -> bool:
        """Fold one feedback event into the endpoint's snapshot before any transaction has
        applied it (its reward, on the arm its decision chose: here, or at the peer that told
        us, ``peer_folds.py``). It stays on top of the committed counts until ``settle`` names
        its event id or ``PROVISIONAL_TTL_S`` passes; the same event id is folded once.
        ``since`` (epoch seconds: the event's publish time) times it in ``FOLD_LAG{source}``.
        False when it was not folded."""
        if event_id in self._provisional:
            return False
        if event_id in self._settled:
            _LATE.inc()
            return False
        entry, snap = self._entries.get(name), self._snapshots.get(name)
        if entry is None or snap is None or arm_id not in snap.arm_ids or len(self._provisional) >= MAX_PROVISIONAL:
            _SKIPPED.inc()
            return False
        entry.provisional.add(event_id, arm_id, inc)
        self._provisional[event_id] = (name, time.monotonic())
        _FOLDED.inc()
        self._changed(name, entry, since, source)
        return True

    def settle(self, event_ids: Iterable[str]) -> None:
        """These events' transaction committed (their increments are folded, or they were
        duplicates or refused): drop their provisional folds."""
        event_ids = tuple(event_ids)
        if self._segment_settle is not None:
            self._segment_settle(event_ids)
        changed: dict[str, _Entry] = {}
        settled = self._settled
        n_settled = 0
        for event_id in event_ids:
            settled[event_id] = None
            home = self._provisional.pop(event_id, None)
            if home is None:
                continue
            entry = self._entries.get(home[0])
            if entry is not None and entry.provisional.pop(event_id) is not None:
                changed[home[0]] = entry
                n_settled += 1
        if n_settled:
            _SETTLED.inc(n_settled)
        over = len(settled) - MAX_SETTLED_IDS
        if over > 0:
            for event_id in list(itertools.islice(settled, over)):
                del settled[event_id]
        for name, entry in changed.items():
            self._changed(name, entry)

    def expire_provisional(self) -> int:
        """Drop the provisional folds older than ``PROVISIONAL_TTL_S`` (no transaction settled
        them); how many."""
        cutoff = time.monotonic() - PROVISIONAL_TTL_S
        expired: list[str] = []
        for event_id, (_, folded_at) in self._provisional.items():
            if folded_at > cutoff:
                break  # oldest first
            expired.append(event_id)
        changed: dict[str, _Entry] = {}
        for event_id in expired:
            name, _ = self._provisional.pop(event_id)
            entry = self._entries.get(name)
            if entry is not None and entry.provisional.pop(event_id) is not None:
                changed[name] = entry
        for name, entry in changed.items():
            self._changed(name, entry)
        if expired:
            _EXPIRED.inc(len(expired))
            if self._segment_settle is not None:
                self._segment_settle(expired)
        return len(expired)

    async def caught_up(self, name: str) -> EndpointSnapshot | None:
        """The cached snapshot once it reflects every fold received so far (None when the
        endpoint is not cached or its rebuild failed: read it instead)."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        if entry.built < entry.version:
            waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            entry.waiters.append((entry.version, waiter))
            if not await asyncio.shield(waiter):
                return None
        return self._snapshots.get(name)

    def _fold(self, name: str, f: EndpointFold, source: str, since: float = 0.0) -> None:
        entry, snap = self._entries.get(name), self._snapshots.get(name)
        if entry is None or snap is None:
            return  # not cached here: its first read will have it
        if f.xid in entry.folds or entry.seen.visible(f.xid):
            return  # folded already, or in the read
        index = {a: i for i, a in enumerate(snap.arm_ids)}
        if any(a not in index for a in f.arms) or len(entry.folds) >= MAX_PENDING_FOLDS:
            self._reload_soon(name)  # an arm added since the read, or reads failing for long
            return
        entry.folds[f.xid] = f
        entry.counts = fold.add(snap.policy, entry.counts, index, f.at, f.arms, f.clock)
        FOLDS.labels(source).inc()
        self._changed(name, entry, since, source)

    def _changed(self, name: str, entry: _Entry, since: float = 0.0, source: str = "") -> None:
        """What Select should sample from changed: rebuild (timing it from ``since``)."""
        entry.version += 1
        if since > 0 and len(entry.timed) < MAX_TIMED_FOLDS:
            entry.timed.append((entry.version, since, source))
        if entry.rebuilding is None:
            entry.rebuilding = asyncio.get_running_loop().create_task(self._rebuild(name, entry))

    async def _rebuild(self, name: str, entry: _Entry) -> None:
        """Rebuild the endpoint's snapshot until it reflects every fold, one rebuild at a time."""
        try:
            while self._entries.get(name) is entry and entry.built < entry.version:
                wait = entry.next_rebuild - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)  # later folds accumulate meanwhile
                    continue  # a refresh may have covered them
                version, counts, base = entry.version, entry.counts, self._snapshots[name]
                started = time.monotonic()
                snap = self._reweighted(base, counts, entry.provisional)
                if snap is None and entry.redrawing is not None:
                    await asyncio.shield(entry.redrawing)  # its draws will serve: reweight them
                    continue
                if snap is None:
                    provisional = entry.provisional.sums()  # taken here: the loop changes the overlay
                    snap = await asyncio.to_thread(self._rebuilt, base, counts, provisional)
                    _DRAWN.inc()
                else:
                    _REWEIGHTED.inc()
                    if snap.draw_ess < self._redraw_ahead_ess and entry.redrawing is None:
                        entry.redrawing = asyncio.get_running_loop().create_task(self._redraw(name, entry))
                took = time.monotonic() - started
                entry.next_rebuild = started + max(self._rebuild_interval, 2 * took)
                if self._entries.get(name) is entry and version > entry.built:
                    self._snapshots[name] = snap
                    entry.built = version
                    self._release(entry)
        except Exception as exc:  # noqa: BLE001 - the next refresh rebuilds it; waiters read instead
            log.warning("posterior rebuild failed", endpoint=name, error=repr(exc))
            self._release(entry, ok=False)
        finally:
            entry.rebuilding = None

    async def _redraw(self, name: str, entry: _Entry) -> None:
        """Draw the endpoint's posterior again in a worker thread, then put the new draws under
        the snapshot Select samples from, reweighted to every fold made meanwhile."""
        try:
            base, counts = self._snapshots[name], entry.counts
            provisional = entry.provisional.sums()  # taken here: the loop changes the overlay
            drawn = await asyncio.to_thread(self._rebuilt, base, counts, provisional)
            _DRAWN.inc()
            current = self._snapshots.get(name)
            if self._entries.get(name) is not entry or current is None or drawn.draw_set is None:
                return  # the endpoint was dropped, or these draws cannot be reweighted
            # Onto the current snapshot: a read may have changed its arms (then they do not serve).
            snap = self._reweighted(
                dataclasses.replace(current, draw_set=drawn.draw_set), entry.counts, entry.provisional
            )
            if snap is None:
                return
            self._snapshots[name] = snap  # every fold so far, on the new draws
            if entry.built < entry.version:
                entry.built = entry.version
                self._release(entry)
        except Exception as exc:  # noqa: BLE001 - the rebuild task draws again when it must
            log.warning("posterior redraw failed", endpoint=name, error=repr(exc))
        finally:
            entry.redrawing = None

    @staticmethod
    def _reweighted(base: EndpointSnapshot, counts: Counts, provisional: Overlay) -> EndpointSnapshot | None:
        """The rebuild by reweighting ``base``'s draws, on the event loop (None: draw again)."""
        if base.draw_set is None:
            return None
        snap = snapshot.reweighted(base, **_fields(_with_provisional(counts, base.arm_ids, provisional)))
        if snap is not None:
            _ = snap.cdf  # computed here, not by the first Select
        return snap

    def _rebuilt(self, base: EndpointSnapshot, counts: Counts, provisional: list[ArmSum]) -> EndpointSnapshot:
        counts = _with_provisional(counts, base.arm_ids, provisional)
        snap = snapshot.rebuild(base, **_fields(counts), rng=self._rebuild_rng, draws=self._fold_draws)
        _ = snap.cdf  # computed here, not by the first Select
        return snap

    def _release(self, entry: _Entry, *, ok: bool = True) -> None:
        if ok and entry.timed:
            now, timed = time.time(), []
            for version, since, source in entry.timed:
                if version <= entry.built:
                    FOLD_LAG.labels(source).observe(max(0.0, now - since))
                else:
                    timed.append((version, since, source))
            entry.timed = timed
        waiting = []
        for version, waiter in entry.waiters:
            if waiter.done():
                continue
            if not ok or version <= entry.built:
                waiter.set_result(ok)
            else:
                waiting.append((version, waiter))
        entry.waiters = waiting

    def _reload_soon(self, name: str) -> None:
        if name not in self._reloading:
            self._reloading[name] = asyncio.get_running_loop().create_task(self._reload(name))

    async def _reload(self, name: str) -> None:
        try:
            await self.load(name)
        except NotFound:
            pass
        except Exception as exc:  # noqa: BLE001 - the next refresh reads it
            log.warning("endpoint reload failed", endpoint=name, error=repr(exc))
        finally:
            self._reloading.pop(name, None)


def snapshot_inputs(row: Any, arms: list[Any], agg: Stats) -> tuple[Any, ...]:
    """Everything ``snapshot.build`` reads, in a form that compares by value. A discounted
    endpoint's statistics decay with time, so its inputs differ on every refresh."""
    arrays = (agg.w, agg.s, agg.ss, agg.xtx, agg.xty)
    return (
        row.description,
        row.policy_kind,
        row.policy,
        row.reward_spec,
        row.incumbent_arm_id,
        row.created_at,
        tuple((a.arm_id, a.status, a.traffic_cap, a.pulls, a.reward_sum, a.params) for a in arms),
        tuple(None if x is None else (x.shape, x.tobytes()) for x in arrays),
    )


def _carry_draws(old: EndpointSnapshot | None, new: EndpointSnapshot) -> EndpointSnapshot:
    """``new`` (a read) with ``old``'s kept draws, when they are draws of the same live arms
    under the same policy: its next fold reweights them rather than drawing again."""
    if old is None or old.draw_set is None or new.draw_set is not None:
        return new
    if old.policy != new.policy or old.arm_ids != new.arm_ids or old.statuses != new.statuses:
        return new
    if not np.array_equal(old.caps, new.caps):
        return new
    out = dataclasses.replace(new, draw_set=old.draw_set)
    for cached in ("cdf", "params_structs"):  # computed once per snapshot: keep them
        if cached in new.__dict__:
            out.__dict__[cached] = new.__dict__[cached]
    return out


def _fields(counts: Counts) -> dict[str, Any]:
    """``snapshot.rebuild``'s and ``reweighted``'s arguments for ``counts``."""
    return {
        "stats": counts.stats,
        "pulls": counts.pulls,
        "reward_sums": counts.reward_sums,
        "now": fold.from_epoch(counts.as_of),
    }


def _with_provisional(counts: Counts, arm_ids: list[str], provisional: Overlay | list[ArmSum]) -> Counts:
    """``counts`` with the provisional folds on top (those of arms still known): an overlay, or
    its sums taken earlier (for a worker thread: the loop changes the overlay)."""
    sums = provisional.sums() if isinstance(provisional, Overlay) else provisional
    if not sums:
        return counts
    return fold.overlay(counts, [(i, t.inc, t.pulls) for i, t in indexed(sums, arm_ids)])


def _policy(row: Any) -> PolicyConfig:
    return PolicyConfig.from_json({"kind": row.policy_kind, **row.policy})
