"""Per-segment snapshots for Select on endpoints with a ``segment_key``, cached like the
endpoints' own: statistics, borrowed prior and selection probabilities are built once per
refresh (or fold), never per Select, so a segmented Select is one weighted draw as well.

- **Hot path** (`peek`): a dict lookup, no await, no lock; safe from the sync gRPC server's
  worker threads. An entry is served while its endpoint's arms and statuses are the ones it
  was built for, however old: a stale entry is served and refreshed in the background.
- **First use** (`get`): one load from PostgreSQL; concurrent first Selects of a segment
  share that load (single flight).
- **Refresh** (`run`/`refresh`): every ``refresh_interval_s`` one pass reloads the segments
  Selected since the last pass, one session per pass, and re-estimates each endpoint's
  borrowing table (`policies.segments.segment_priors`) from all its cached segments plus the
  endpoint's remainder. A segment not used for a while keeps its entry (until evicted) and is
  refreshed by the pass after its next use: a Select never waits on SQL for a segment it has
  seen before.
- **Feedback** (`fold`): the feedback path adds what it committed to a cached segment at
  once, and the segment's probabilities are rebuilt with its current prior.
- **Provisional folds** (`provisional`, see ``provisional.py``): a reward for one of this
  replica's decisions, published but not committed yet, is added on top of the segment's
  statistics, keyed by its event id, until ``settle`` names that event (the endpoint cache owns
  each event's lifecycle: its commit, a peer's NOTIFY, or its expiry). Such segments are
  rebuilt in coalesced passes (``PROVISIONAL_PASS_S``).
- **Draws**: a segment's last Beta draws are kept (``reweight.py``, at most ``draw_set_bytes``
  of them, least recently used dropped first), so that a fold, a provisional pass or a refresh
  reweights them on the event loop instead of drawing again; when they no longer serve (too
  little effective sample size left, a rule that is not a share of wins) it draws again, in a
  worker thread for a provisional pass. With ``redraw_ahead_ess`` (the endpoint cache's
  ``posterior_redraw_ahead_ess``) a pass never waits for a worker thread: a segment whose
  reweighted draws fall below that effective sample share gets new ones drawn in the
  background (``_redraws``) while passes go on reweighting the old ones, and only a segment
  whose draws no longer serve at all waits for its new ones; the other segments of the pass
  are served at once. With 0, a pass draws the segments that need it and waits for them.
- **Bound**: at most ``max_segments`` entries, least recently used evicted first.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.core.logging import get_logger
from flywheel.optimizer import reweight, stats
from flywheel.optimizer.cache import FOLD_LAG, PosteriorCache
from flywheel.optimizer.overlay import Overlay, indexed
from flywheel.optimizer.policies import segments
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.snapshot import EndpointSnapshot
from flywheel.optimizer.spec import BETA
from flywheel.optimizer.stats import Increment

log = get_logger(__name__)

# Joint posterior draws behind a segment's selection probabilities (built once per refresh
# or fold; a Select only samples from them). The endpoint's own use snapshot.PROPENSITY_DRAWS.
SEGMENT_DRAWS = 2000
# Segments changed by provisional folds are rebuilt in passes, at most one pass per this long or
# per twice the last pass's own duration if longer; folds that arrive meanwhile share the next
# pass. A pass reweights kept draws on the event loop; a segment whose draws cannot serve draws
# PROVISIONAL_DRAWS again in a worker thread (the event loop keeps serving).
PROVISIONAL_PASS_S = 0.002
PROVISIONAL_DRAWS = 1000
# Kept draws of all segments together (reweight.DrawSetStore): ~170 KB per segment of 10 arms.
DRAW_SET_BYTES = 64 * 1024 * 1024
# At most this many provisional folds per segment wait to be timed (``cache.FOLD_LAG``).
MAX_TIMED = 1_000


@dataclass(frozen=True)
class SegmentSnapshot:
    """One segment of one endpoint as Select uses it: ``own`` statistics (the segment's rows),
    the ``prior`` borrowed from the other segments, and the selection probabilities of their
    sum over the endpoint's arms (retired arms 0)."""

    endpoint: str
    segment: str
    arm_ids: list[str]  # lists, as the endpoint snapshot's: compared on every Select
    statuses: list[str]
    own: Stats
    prior: Stats
    probabilities: np.ndarray
    cdf: list[float]
    read_at: float  # monotonic time its rows' read began
    basis: tuple[object, ...]  # the endpoint's policy and caps it was built with

    def same(self, other: SegmentSnapshot) -> bool:
        """Built from the same inputs (a rebuild would only redraw the same distribution)."""
        return (
            self.fits_arms(other.arm_ids, other.statuses)
            and self.basis == other.basis
            and all(
                np.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(_arrays(self), _arrays(other), strict=True)
            )
        )

    def fits_arms(self, arm_ids: list[str], statuses: list[str]) -> bool:
        return self.arm_ids == arm_ids and self.statuses == statuses

    @property
    def stats(self) -> Stats:
        return Stats(self.own.w + self.prior.w, self.own.s + self.prior.s, self.own.ss + self.prior.ss)

    def fits(self, snap: EndpointSnapshot) -> bool:
        """Built for this endpoint's arms as they are now (else its indexes would be wrong)."""
        return self.fits_arms(snap.arm_ids, snap.statuses)


def _draw_basis(basis: tuple[object, ...], snap: EndpointSnapshot) -> tuple[object, ...]:
    """What a segment's kept draws must have been drawn under to be reweighted: the endpoint's
    policy and caps and the same arms in the same states."""
    return (basis, tuple(snap.arm_ids), tuple(snap.statuses))


def _arrays(entry: SegmentSnapshot) -> tuple[np.ndarray, ...]:
    return (entry.own.w, entry.own.s, entry.own.ss, entry.prior.w, entry.prior.s, entry.prior.ss)


class SegmentCache:
    """Segment snapshots of every segmented endpoint, LRU-bounded (see the module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        endpoints: PosteriorCache,
        *,
        refresh_interval_s: float = 0.5,
        max_segments: int = 10_000,
        draws: int = SEGMENT_DRAWS,
        draw_set_bytes: int = DRAW_SET_BYTES,
        redraw_ahead_ess: float = 0.0,
    ) -> None:
        if max_segments < 1:
            raise ValueError("max_segments must be at least 1")
        if not 0.0 <= redraw_ahead_ess <= 1.0:
            raise ValueError("redraw_ahead_ess must be within [0, 1]")
        self._redraw_ahead_ess = redraw_ahead_ess
        self._sessions = sessions
        self._endpoints = endpoints
        self._interval = refresh_interval_s
        self._max = max_segments
        self._draws = draws
        self._entries: OrderedDict[tuple[str, str], SegmentSnapshot] = OrderedDict()
        # Keys Selected since the last pass. Worker threads add to it (set.add is atomic);
        # the pass swaps in a new set and copies the old one before reading it.
        self._used: set[tuple[str, str]] = set()
        self._loading: dict[tuple[str, str], asyncio.Future[SegmentSnapshot]] = {}
        self._rng = np.random.default_rng()  # only the event loop builds
        self.loads = 0  # first-use loads from PostgreSQL (tests and benchmarks read it)
        # Provisional folds: segment -> event id -> (arm id, increment); event id -> segment.
        self._overlay: dict[tuple[str, str], Overlay] = {}
        self._overlay_of: dict[str, tuple[str, str]] = {}
        # Segments whose overlay changed, with the publish times of the folds they wait for.
        self._dirty: dict[tuple[str, str], list[tuple[float, str]]] = {}  # key -> (since, FOLD_LAG source)
        self._passes: asyncio.Task[None] | None = None
        self._next_pass = 0.0  # monotonic time before which no pass starts
        self._pass_rng = np.random.default_rng()  # only one worker thread at a time draws with it
        self._draw_sets = reweight.DrawSetStore(draw_set_bytes)  # by (endpoint, segment)
        # Draws renewed in the background (``_redraws``): the segments to draw, the one task
        # drawing them, and the folds of segments that wait for their new draws (FOLD_LAG timing).
        self._to_draw: set[tuple[str, str]] = set()
        self._in_draw: set[tuple[str, str]] = set()  # the batch being drawn now
        self._drawing: asyncio.Task[None] | None = None
        self._waiting: dict[tuple[str, str], list[tuple[float, str]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    # --- hot path ------------------------------------------------------------------------

    def peek(self, snap: EndpointSnapshot, segment: str) -> SegmentSnapshot | None:
        """The cached segment if it fits the endpoint's current arms, else None (no await)."""
        key = (snap.name, segment)
        entry = self._entries.get(key)
        if entry is None or not entry.fits(snap):
            return None
        self._used.add(key)
        return entry

    async def get(self, snap: EndpointSnapshot, segment: str) -> SegmentSnapshot:
        """The cached segment, or one load of it shared by every concurrent caller."""
        found = self.peek(snap, segment)
        if found is not None:
            return found
        key = (snap.name, segment)
        pending = self._loading.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._load(snap, segment))
            self._loading[key] = pending
            pending.add_done_callback(lambda done: self._loaded(key, done))
        return await asyncio.shield(pending)

    def _loaded(self, key: tuple[str, str], done: asyncio.Future[SegmentSnapshot]) -> None:
        if self._loading.get(key) is done:
            del self._loading[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failed shared load is raised to its callers, not logged as unhandled

    async def _load(self, snap: EndpointSnapshot, segment: str) -> SegmentSnapshot:
        started = time.monotonic()
        async with self._sessions() as session:
            own = await self._read(session, snap, segment)
        self.loads += 1
        # A newcomer is not in the endpoint's table yet: it borrows the table's consensus
        # (the next pass puts it in, leaving its own data out of its prior).
        table = self._table(snap, extra=own)
        entry = self._build(snap, segment, own, self._prior_of(table, len(table[1]) - 1), started)
        self._put(entry)
        self._used.add((snap.name, segment))
        return entry

    # --- refresh ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Refresh the used segments every interval, forever (a background task)."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep serving the entries we have while PostgreSQL is away
                log.warning("segment refresh failed", error=repr(exc))

    async def refresh(self) -> int:
        """Reload the segments Selected since the last pass and rebuild them with their
        endpoint's current borrowing table; returns how many were reloaded."""
        used, self._used = self._used, set()
        keys = [k for k in list(used) if k in self._entries]
        by_endpoint: dict[str, list[str]] = {}
        for name, segment in keys:
            by_endpoint.setdefault(name, []).append(segment)
        for name in {n for n, _ in self._entries} - set(self._endpoints_names()):
            self._drop_endpoint(name)
        if not by_endpoint:
            return 0
        started = time.monotonic()
        read: dict[tuple[str, str], tuple[EndpointSnapshot, Stats]] = {}
        async with self._sessions() as session:
            for name, segs in by_endpoint.items():
                snap = self._endpoints.cached(name)
                if snap is None or not snap.policy.segment_key:
                    self._drop_endpoint(name)
                    continue
                for segment in segs:
                    read[(name, segment)] = (snap, await self._read(session, snap, segment))
        for name in {n for n, _ in read}:
            snap = self._endpoints.cached(name) or read[next(k for k in read if k[0] == name)][0]
            own = {seg: st for (n, seg), (s, st) in read.items() if n == name and s.arm_ids == snap.arm_ids}
            for (n, seg), entry in list(self._entries.items()):
                if n == name and seg not in own and entry.fits(snap):
                    own[seg] = entry.own
            names = sorted(own)  # one order every pass: the same inputs give the same table
            table = self._table(snap, rows=[own[seg] for seg in names])
            for i, seg in enumerate(names):
                if (name, seg) in read:
                    self._put(self._build(snap, seg, own[seg], self._prior_of(table, i), started, reuse=True))
        return len(read)

    async def _read(self, session: AsyncSession, snap: EndpointSnapshot, segment: str) -> Stats:
        rows, now = await stats.load_rows(session, endpoint=snap.name, segment=segment)
        return stats.aggregate(snap.policy, snap.arm_ids, rows, now)

    def _endpoints_names(self) -> list[str]:
        return [s.name for s in self._endpoints.snapshots()]

    def _drop_endpoint(self, name: str) -> None:
        for key in [k for k in self._entries if k[0] == name]:
            self._entries.pop(key, None)
            self._draw_sets.pop(key)

    # --- feedback --------------------------------------------------------------------------

    def fold(
        self, endpoint: str, segment: str, increments: Mapping[str, Increment], *, committed_at: float | None = None
    ) -> bool:
        """Add committed feedback to a cached segment now and rebuild its probabilities.

        ``increments``: arm id -> what the transaction added to that arm in this segment (the
        same `stats.Increment` it wrote). ``committed_at``: ``time.monotonic()`` taken after
        the commit returned, if known; an entry whose read began later already has it and is
        left alone. Call on the event loop. Returns whether an entry changed (segments not
        cached, the endpoint-wide segment '' and unknown arms are ignored: the next read has
        them). Not decayed by a half-life between refreshes; each pass re-reads the truth.
        """
        entry = self._entries.get((endpoint, segment))
        if entry is None or not segment or (committed_at is not None and entry.read_at >= committed_at):
            return False
        snap = self._endpoints.cached(endpoint)
        if snap is None or not entry.fits(snap):
            return False
        index = {a: i for i, a in enumerate(entry.arm_ids)}
        w, s, ss = entry.own.w.copy(), entry.own.s.copy(), entry.own.ss.copy()
        changed = False
        for arm_id, inc in increments.items():
            i = index.get(arm_id)
            if i is not None:
                w[i] += inc.w
                s[i] += inc.s
                ss[i] += inc.ss
                changed = True
        if changed:
            self._put(self._build(snap, segment, Stats(w, s, ss), entry.prior, entry.read_at))
        return changed

    def provisional(
        self,
        endpoint: str,
        segment: str,
        event_id: str,
        arm_id: str,
        inc: Increment,
        *,
        since: float = 0.0,
        source: str = "provisional_segment",
    ) -> bool:
        """Add a published, uncommitted reward to a cached segment until ``settle`` names its
        event (call on the event loop, after the endpoint cache took the same event: it owns
        the event's lifecycle). False when the segment is not cached or the arm is unknown."""
        key = (endpoint, segment)
        entry = self._entries.get(key)
        if not segment or entry is None or arm_id not in entry.arm_ids or event_id in self._overlay_of:
            return False
        self._overlay.setdefault(key, Overlay()).add(event_id, arm_id, inc)
        self._overlay_of[event_id] = key
        self._changed(key, since, source)
        return True

    def settle(self, event_ids: Iterable[str]) -> None:
        """These events were settled (or expired): drop their provisional folds."""
        if not self._overlay_of:
            return
        for event_id in event_ids:
            key = self._overlay_of.pop(event_id, None)
            if key is None:
                continue
            folds = self._overlay.get(key)
            if folds is not None:
                folds.pop(event_id)
                if not folds:
                    del self._overlay[key]
            self._changed(key)

    def _changed(self, key: tuple[str, str], since: float = 0.0, source: str = "") -> None:
        timed = self._dirty.setdefault(key, [])
        if since > 0 and len(timed) < MAX_TIMED:
            timed.append((since, source))
        if self._passes is None:
            self._passes = asyncio.get_running_loop().create_task(self._rebuild_passes())

    async def _rebuild_passes(self) -> None:
        """Rebuild the segments whose provisional folds changed until none is left, one pass at a
        time: kept draws reweighted on the loop, entries replaced on the loop. A segment whose
        draws no longer serve is drawn again in a worker thread: in the background, while the
        others are served (``redraw_ahead_ess`` > 0), or by the pass itself, which waits for it
        (0; entries replaced unless a commit's fold or a refresh replaced them meanwhile)."""
        try:
            while self._dirty:
                wait = self._next_pass - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)  # later folds join this pass
                dirty, self._dirty = self._dirty, {}
                jobs = []
                for key, timed in dirty.items():
                    entry, snap = self._entries.get(key), self._endpoints.cached(key[0])
                    if entry is not None and snap is not None and entry.fits(snap):
                        jobs.append((key, timed, entry, snap, self._total(snap, key[1], entry.own, entry.prior)))
                started = time.monotonic()
                results: list[tuple[np.ndarray, reweight.DrawSet | None] | None] = []
                for key, timed, entry, snap, total in jobs:
                    reused = self._reweighted(key, entry.basis, snap, total)
                    if reused is not None and reused[1] < self._redraw_ahead_ess:
                        self._request_draw(key)  # renewed ahead: these still serve meanwhile
                    if reused is None and self._redraw_ahead_ess > 0:
                        # Served once the new draws are in ((0, "") marks a change with no timing).
                        waiting = self._waiting.setdefault(key, [])
                        waiting.extend((timed or [(0.0, "")])[: max(1, MAX_TIMED - len(waiting))])
                        self._request_draw(key)
                    results.append(None if reused is None else (reused[0], None))
                redraw = [i for i, r in enumerate(results) if r is None] if self._redraw_ahead_ess == 0 else []
                if redraw:
                    drawn = await asyncio.to_thread(self._draw, [(jobs[i][3], jobs[i][4]) for i in redraw])
                    for i, out in zip(redraw, drawn, strict=True):
                        results[i] = out
                self._next_pass = started + max(PROVISIONAL_PASS_S, 2 * (time.monotonic() - started))
                for (key, timed, entry, snap, _), result in zip(jobs, results, strict=True):
                    if self._entries.get(key) is not entry or result is None:
                        continue
                    self._install(key, entry, snap, result, timed)
        except Exception as exc:  # noqa: BLE001 - the next fold or refresh rebuilds them
            log.warning("segment rebuild failed", error=repr(exc))
        finally:
            self._passes = None

    def _install(
        self,
        key: tuple[str, str],
        entry: SegmentSnapshot,
        snap: EndpointSnapshot,
        result: tuple[np.ndarray, reweight.DrawSet | None],
        timed: list[tuple[float, str]],
    ) -> None:
        """``entry`` with new probabilities (and their draws kept), its folds timed."""
        p, drawn_set = result
        if drawn_set is not None:
            self._draw_sets.put(key, _draw_basis(entry.basis, snap), drawn_set)
        self._put(replace(entry, probabilities=p, cdf=[float(x) for x in np.cumsum(p)]))
        now = time.time()
        for since, source in timed:
            if since > 0:
                FOLD_LAG.labels(source).observe(max(0.0, now - since))

    def _request_draw(self, key: tuple[str, str]) -> None:
        if key in self._in_draw:
            return  # its new draws are on their way: the pass after them reweights them
        self._to_draw.add(key)
        if self._drawing is None:
            self._drawing = asyncio.get_running_loop().create_task(self._redraws())

    async def _redraws(self) -> None:
        """Draw the requested segments again in a worker thread, a batch at a time. New Beta
        draws are kept and the segment goes to the next pass, which reweights them to every fold
        made meanwhile; probabilities whose draws cannot be kept (a rule that is not a share of
        wins) are served as drawn, unless the segment was replaced meanwhile (its next pass then
        asks again)."""
        try:
            while self._to_draw:
                self._in_draw, self._to_draw = self._to_draw, set()
                jobs = []
                for key in self._in_draw:
                    entry, snap = self._entries.get(key), self._endpoints.cached(key[0])
                    if entry is not None and snap is not None and entry.fits(snap):
                        total = self._total(snap, key[1], entry.own, entry.prior)
                        jobs.append((key, entry, snap, total, len(self._waiting.get(key, ()))))
                    else:
                        self._waiting.pop(key, None)  # dropped, or rebuilt for other arms by a refresh
                drawn = await asyncio.to_thread(self._draw, [(snap, total) for _, _, snap, total, _ in jobs])
                self._in_draw = set()
                for (key, entry, snap, _, covered), (p, draw_set) in zip(jobs, drawn, strict=True):
                    waiting = self._waiting.pop(key, [])
                    if draw_set is None and self._entries.get(key) is entry:
                        # As drawn: it covers the folds that waited when it began; the later ones go on.
                        self._install(key, entry, snap, (p, None), waiting[:covered])
                        waiting = waiting[covered:]
                    elif draw_set is not None:
                        self._draw_sets.put(key, _draw_basis(entry.basis, snap), draw_set)
                    if waiting:
                        self._dirty.setdefault(key, []).extend(t for t in waiting if t[0] > 0)
                if self._dirty and self._passes is None:
                    self._passes = asyncio.get_running_loop().create_task(self._rebuild_passes())
        except Exception as exc:  # noqa: BLE001 - the next fold or refresh rebuilds them
            log.warning("segment redraw failed", error=repr(exc))
            self._waiting.clear()  # not drawn again in a loop: their next fold or refresh rebuilds them
        finally:
            self._in_draw = set()
            self._drawing = None

    def _reweighted(
        self, key: tuple[str, str], basis: tuple[object, ...], snap: EndpointSnapshot, total: Stats
    ) -> tuple[np.ndarray, float] | None:
        """A segment's probabilities from its kept draws reweighted to ``total``, and the
        weights' effective sample share (None: draw again)."""
        kept = self._draw_sets.get(key, _draw_basis(basis, snap))
        return None if kept is None else snap.reweighted_for(kept, total)

    def _draw(self, jobs: list[tuple[EndpointSnapshot, Stats]]) -> list[tuple[np.ndarray, reweight.DrawSet | None]]:
        m = min(self._draws, PROVISIONAL_DRAWS)
        return [snap.drawn_for(total, self._pass_rng, m=m) for snap, total in jobs]

    def _total(self, snap: EndpointSnapshot, segment: str, own: Stats, prior: Stats) -> Stats:
        """What a segment's probabilities are drawn from: its own statistics, its borrowed prior,
        and its provisional folds on top."""
        total = Stats(own.w + prior.w, own.s + prior.s, own.ss + prior.ss)
        overlay = self._overlay.get((snap.name, segment))
        if overlay:
            for i, arm in indexed(overlay.sums(), snap.arm_ids):  # one per arm, however many folds wait
                total.w[i] += arm.inc.w
                total.s[i] += arm.inc.s
                total.ss[i] += arm.inc.ss
        return total

    def fold_many(
        self, increments: Mapping[tuple[str, str, str], Increment], *, committed_at: float | None = None
    ) -> int:
        """`fold` for a whole transaction in ``FoldBatch.segments`` form ((endpoint, arm id,
        segment) -> increment); returns how many cached segments changed."""
        grouped: dict[tuple[str, str], dict[str, Increment]] = {}
        for (endpoint, arm_id, segment), inc in increments.items():
            grouped.setdefault((endpoint, segment), {})[arm_id] = inc
        return sum(self.fold(e, s, incs, committed_at=committed_at) for (e, s), incs in grouped.items())

    # --- building --------------------------------------------------------------------------

    def _table(
        self, snap: EndpointSnapshot, *, rows: list[Stats] | None = None, extra: Stats | None = None
    ) -> tuple[segments.SegmentPriors, list[Stats]]:
        """The endpoint's borrowing table: its cached segments (``rows``, or every fitting
        entry), ``extra`` (a newcomer), then the remainder (the endpoint's statistics minus
        theirs: unsegmented and uncached traffic) as the last group."""
        if rows is None:
            rows = [e.own for (n, _), e in list(self._entries.items()) if n == snap.name and e.fits(snap)]
        groups = [*rows, *([extra] if extra is not None else [])]
        k = len(snap.arm_ids)
        w = np.array([g.w for g in groups]).reshape(-1, k)
        s = np.array([g.s for g in groups]).reshape(-1, k)
        ss = np.array([g.ss for g in groups]).reshape(-1, k)
        rest_w = np.maximum(snap.stats.w - w.sum(axis=0), 0.0)
        keep = np.where(snap.stats.w > 0, rest_w / np.maximum(snap.stats.w, 1e-12), 0.0)
        # The remainder keeps the endpoint's mean (and spread) with the remaining weight.
        rest = Stats(rest_w, keep * snap.stats.s, keep * snap.stats.ss)
        kind = "beta" if snap.policy.kind == BETA else "gaussian"
        priors = segments.segment_priors(
            np.vstack([w, rest.w]), np.vstack([s, rest.s]), np.vstack([ss, rest.ss]),
            snap.policy.segment_prior_strength, kind,
        )  # fmt: skip
        return priors, groups

    @staticmethod
    def _prior_of(table: tuple[segments.SegmentPriors, list[Stats]], i: int) -> Stats:
        priors = table[0]
        return Stats(priors.w[i].copy(), priors.s[i].copy(), priors.ss[i].copy())

    def _build(
        self, snap: EndpointSnapshot, segment: str, own: Stats, prior: Stats, read_at: float, *, reuse: bool = False
    ) -> SegmentSnapshot:
        """The segment's snapshot; with ``reuse``, the cached one when its inputs are the same
        (an idle segment keeps its distribution instead of drawing it again every pass)."""
        basis = (tuple(snap.caps.tolist()), snap.policy)
        overlay = self._overlay.get((snap.name, segment))
        old = self._entries.get((snap.name, segment)) if reuse and not overlay else None
        if old is not None:
            new = replace(old, own=own, prior=prior, basis=basis, arm_ids=snap.arm_ids, statuses=snap.statuses)
            if old.same(new):
                return replace(old, read_at=read_at)
        total = self._total(snap, segment, own, prior)  # provisional folds in the draws, never in ``own``
        key = (snap.name, segment)
        reused = self._reweighted(key, basis, snap, total)
        if reused is not None:
            p = reused[0]
        else:
            p, drawn = snap.drawn_for(total, self._rng, m=self._draws)
            self._draw_sets.put(key, _draw_basis(basis, snap), drawn)
        return SegmentSnapshot(
            endpoint=snap.name,
            segment=segment,
            arm_ids=list(snap.arm_ids),
            statuses=list(snap.statuses),
            own=own,
            prior=prior,
            probabilities=p,
            cdf=[float(x) for x in np.cumsum(p)],
            read_at=read_at,
            basis=basis,
        )

    def _put(self, entry: SegmentSnapshot) -> None:
        key = (entry.endpoint, entry.segment)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            evicted, _ = self._entries.popitem(last=False)
            self._draw_sets.pop(evicted)
