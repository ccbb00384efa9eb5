"""In-memory snapshots of every endpoint, refreshed from PostgreSQL on an interval.

Replicas share nothing but the database: each refreshes every ``refresh_interval_s``,
so two replicas agree on an endpoint's posterior within about that lag. Admin changes
made through this replica are visible to it at once (the snapshot is reloaded).
Segment posteriors are loaded on first use and kept for one refresh interval.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.core.errors import NotFound
from flywheel.core.logging import get_logger
from flywheel.optimizer import snapshot, stats
from flywheel.optimizer.models import ArmRow, EndpointRow
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.snapshot import EndpointSnapshot
from flywheel.optimizer.spec import LINEAR

log = get_logger(__name__)


class PosteriorCache:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], *, refresh_interval_s: float = 0.5, max_segments: int = 10_000
    ) -> None:
        self._sessions = sessions
        self._interval = refresh_interval_s
        self._snapshots: dict[str, EndpointSnapshot] = {}
        # When each snapshot's read began (monotonic), and the reload in flight per endpoint:
        # lets concurrent callers that need a post-commit view share one reload (``fresh``).
        self._read_at: dict[str, float] = {}
        self._inflight: dict[str, tuple[float, asyncio.Future[EndpointSnapshot]]] = {}
        self._segments: OrderedDict[tuple[str, str], tuple[float, Stats]] = OrderedDict()
        self._max_segments = max_segments
        self._rng = np.random.default_rng()
        # The last snapshot built for each endpoint, with what it was built from: a read that
        # finds the same inputs again reuses that snapshot. (Not whatever ``_snapshots`` holds:
        # a refresh that read before a concurrent load may have put an older one back there.)
        self._built: dict[str, tuple[tuple[Any, ...], EndpointSnapshot]] = {}

    def snapshots(self) -> list[EndpointSnapshot]:
        return list(self._snapshots.values())

    def cached(self, name: str) -> EndpointSnapshot | None:
        """The cached snapshot, or None (no await on the hot path)."""
        return self._snapshots.get(name)

    async def get(self, name: str) -> EndpointSnapshot:
        """The cached snapshot, loading it on a miss (NotFound if the endpoint does not exist)."""
        found = self._snapshots.get(name)
        return found if found is not None else await self.load(name)

    async def load(self, name: str) -> EndpointSnapshot:
        """Reload one endpoint from the database now."""
        started = time.monotonic()
        async with self._sessions() as session:
            row = await session.get(EndpointRow, name)
            if row is None:
                self._snapshots.pop(name, None)
                raise NotFound(f"endpoint {name!r} does not exist")
            built = await self._build(session, [row])
        self._snapshots[name] = built[name]
        self._read_at[name] = max(started, self._read_at.get(name, 0.0))
        return built[name]

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
        """Reload every endpoint in one pass (three queries)."""
        started = time.monotonic()
        async with self._sessions() as session:
            rows = list((await session.scalars(select(EndpointRow))).all())
            built = await self._build(session, rows)
        self._snapshots = built
        self._read_at = dict.fromkeys(built, started)
        self._built = {name: last for name, last in self._built.items() if name in built}

    async def run(self) -> None:
        """Refresh forever (a background task of the service)."""
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep serving the last snapshot while PostgreSQL is away
                log.warning("posterior refresh failed", error=repr(exc))
            await asyncio.sleep(self._interval)

    async def segment_stats(self, snap: EndpointSnapshot, segment: str) -> Stats:
        """A segment's statistics with the endpoint's borrowed as its prior."""
        key = (snap.name, segment)
        hit = self._segments.get(key)
        if hit is not None and time.monotonic() - hit[0] < self._interval:
            self._segments.move_to_end(key)
            own = hit[1]
        else:
            async with self._sessions() as session:
                rows, now = await stats.load_rows(session, endpoint=snap.name, segment=segment)
            own = stats.aggregate(snap.policy, snap.arm_ids, rows, now)
            self._segments[key] = (time.monotonic(), own)
            if len(self._segments) > self._max_segments:
                self._segments.popitem(last=False)
        return own.with_borrowed(snap.stats, snap.policy.segment_prior_strength)

    async def _build(self, session: AsyncSession, rows: list[EndpointRow]) -> dict[str, EndpointSnapshot]:
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
        out = {}
        for row in rows:
            ep_arms = by_endpoint[row.name]
            snap_policy = snapshot.PolicyConfig.from_json({"kind": row.policy_kind, **row.policy})
            d = len(snap_policy.context_features) if snap_policy.kind == LINEAR else 0
            agg = stats.aggregate(snap_policy, [a.arm_id for a in ep_arms], rows_by_endpoint[row.name], now, d)
            inputs = snapshot_inputs(row, ep_arms, agg)
            last = self._built.get(row.name)
            if last is not None and last[0] == inputs:
                # Nothing changed since it was built (an idle endpoint): keep it rather than draw
                # its posteriors again, the bulk of a refresh's CPU when endpoints are many.
                out[row.name] = last[1]
            else:
                out[row.name] = snapshot.build(row=row, arms=ep_arms, stats=agg, now=now, rng=self._rng)
                self._built[row.name] = (inputs, out[row.name])
        return out


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
