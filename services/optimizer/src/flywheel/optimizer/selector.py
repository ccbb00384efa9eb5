"""Select: one request in, one decision out, from the cached snapshot (no database
round trip unless a segment or a session is seen for the first time). A segmented endpoint's
Select samples its segment's cached snapshot (segment_cache.py) the same way."""

from __future__ import annotations

import bisect
import random
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from google.protobuf.struct_pb2 import Struct
from sqlalchemy import select as sql_select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.core.errors import InvalidArgument
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.decisions import Decision, DecisionLog, new_decision_id
from flywheel.optimizer.models import DecisionRow
from flywheel.optimizer.policies import selection
from flywheel.optimizer.segment_cache import SegmentCache, SegmentSnapshot
from flywheel.optimizer.snapshot import EndpointSnapshot
from flywheel.optimizer.spec import LINEAR, RETIRED


class StickySessions:
    """Session -> arm, kept in memory (LRU) and recovered from the decision log on a miss,
    so a session keeps its arm across replicas."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], max_size: int = 100_000) -> None:
        self._sessions = sessions
        self._map: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._max = max_size

    async def get(self, endpoint: str, session_id: str, ttl_s: float) -> str | None:
        key = (endpoint, session_id)
        hit = self._map.get(key)
        if hit is not None:
            return hit[0] if time.time() - hit[1] < ttl_s else None
        async with self._sessions() as session:
            row = (
                await session.execute(
                    sql_select(DecisionRow.arm_id, DecisionRow.created_at)
                    .where(DecisionRow.endpoint == endpoint, DecisionRow.session_id == session_id)
                    .order_by(DecisionRow.created_at.asc())
                    .limit(1)
                )
            ).first()
        if row is None:
            return None
        self.remember(endpoint, session_id, row.arm_id, row.created_at.timestamp())
        return row.arm_id if time.time() - row.created_at.timestamp() < ttl_s else None

    def remember(self, endpoint: str, session_id: str, arm_id: str, since: float) -> None:
        self._map[(endpoint, session_id)] = (arm_id, since)
        if len(self._map) > self._max:
            self._map.popitem(last=False)


def features_of(snap: EndpointSnapshot, context: dict[str, Any]) -> np.ndarray:
    """The declared numeric features of a contextual endpoint, in order."""
    values = []
    for name in snap.policy.context_features:
        value = context.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
            raise InvalidArgument(f"context feature {name!r} of endpoint {snap.name!r} must be a finite number")
        values.append(float(value))
    return np.asarray(values)


def segment_of(snap: EndpointSnapshot, user_id: str, context: dict[str, Any]) -> str:
    key = snap.policy.segment_key
    if not key:
        return ""
    value = user_id if key == "user_id" else context.get(key)
    return "" if value in (None, "") else str(value)[:256]


class Selector:
    def __init__(
        self, cache: PosteriorCache, log: DecisionLog, sticky: StickySessions, segments: SegmentCache | None = None
    ) -> None:
        self._cache = cache
        self._log = log
        self._sticky = sticky
        # Segment snapshots (None: the endpoint's snapshot also serves segmented endpoints'
        # Selects, for tools that build a Selector without a database).
        self._segments = segments
        self._rng = np.random.default_rng()
        self._uniform = random.Random().random  # noqa: S311 - sampling an arm, not a secret

    async def select(
        self,
        *,
        endpoint: str,
        user_id: str = "",
        session_id: str = "",
        context: dict[str, Any] | None = None,
        context_struct: Struct | None = None,
        record: bool = True,
    ) -> Decision:
        """A decision for one request, buffered in the decision log unless ``record`` is False
        (SelectBatch records a whole batch at once with ``DecisionLog.record_many``)."""
        if not endpoint:
            raise InvalidArgument("endpoint name is empty")
        context = context or {}
        snap = self._cache.cached(endpoint) or await self._cache.get(endpoint)
        policy = snap.policy
        if policy.sticky_sessions and session_id:
            arm_id = await self._sticky.get(endpoint, session_id, policy.sticky_ttl_s)
            if arm_id is not None and arm_id in snap.arm_ids and snap.statuses[snap.arm_ids.index(arm_id)] != RETIRED:
                index = snap.arm_ids.index(arm_id)
                return self._decide(
                    snap, index, 1.0, user_id, session_id, context, context_struct, sticky=True, record=record
                )
        features = None
        segment = segment_of(snap, user_id, context)
        if policy.kind == LINEAR:
            x = features_of(snap, context)
            features = x.tolist()
            p = snap.probabilities_for(snap.stats, self._rng, x=x, m=500)
            index = selection.sample(p, self._rng)
            probability = float(p[index])
        elif segment and self._segments is not None:
            part = self._segments.peek(snap, segment) or await self._segments.get(snap, segment)
            index, probability = self._sample_snapshot(part)
        else:
            index, probability = self._sample_snapshot(snap)
        decision = self._decide(
            snap,
            index,
            probability,
            user_id,
            session_id,
            context,
            context_struct,
            segment=segment,
            features=features,
            record=record,
        )
        if policy.sticky_sessions and session_id:
            self._sticky.remember(endpoint, session_id, decision.arm_id, time.time())
        return decision

    def select_now(
        self,
        *,
        endpoint: str,
        user_id: str = "",
        session_id: str = "",
        context: dict[str, Any] | None = None,
        context_struct: Struct | None = None,
        record: bool = True,
    ) -> Decision | None:
        """The decision without awaiting, when a cached distribution is the one to sample: the
        endpoint's, or its segment's once the segment cache holds it (no sticky session, no
        context features); None means: use ``select``."""
        snap = self._cache.cached(endpoint) if endpoint else None
        if snap is None:
            return None
        policy = snap.policy
        if policy.kind == LINEAR or (policy.sticky_sessions and session_id):
            return None
        context = context or {}
        segment = segment_of(snap, user_id, context) if policy.segment_key else ""
        if segment:
            part = self._segments.peek(snap, segment) if self._segments is not None else None
            if part is None:
                return None  # first use of this segment (or its arms changed): load it on the loop
            index, probability = self._sample_snapshot(part)
        else:
            index, probability = self._sample_snapshot(snap)
        return self._decide(
            snap, index, probability, user_id, session_id, context, context_struct, segment=segment, record=record
        )

    def _sample_snapshot(self, snap: EndpointSnapshot | SegmentSnapshot) -> tuple[int, float]:
        """An arm from a cached distribution (one uniform draw, bisect on its cdf)."""
        cdf = snap.cdf
        index = min(bisect.bisect_right(cdf, self._uniform() * cdf[-1]), len(cdf) - 1)
        return index, float(snap.probabilities[index])

    def _decide(
        self,
        snap: EndpointSnapshot,
        index: int,
        probability: float,
        user_id: str,
        session_id: str,
        context: dict[str, Any],
        context_struct: Struct | None,
        *,
        segment: str = "",
        features: list[float] | None = None,
        sticky: bool = False,
        record: bool = True,
    ) -> Decision:
        decision = Decision(
            decision_id=new_decision_id(),
            endpoint=snap.name,
            arm_id=snap.arm_ids[index],
            params=snap.params[index],
            probability=probability,
            user_id=user_id,
            session_id=session_id,
            segment=segment,
            context=context,
            features=features,
            sticky=sticky,
            params_struct=snap.params_structs[index],
            context_struct=context_struct,
        )
        if record:
            self._log.record(decision)
        return decision
