"""Provisional folds: a replica learns a reward for one of its own decisions as it is published.

Committed feedback reaches the cached posteriors only after the durable consumer has fetched
it, the feedback transaction has run and committed (``fold.py``): under load that is tens of
milliseconds, which at ~1,700 decisions/s is ~80 decisions served from a posterior that has
not seen the reward yet (bench/service-regret/README.md). The consumer's exactly-once path
stays as it is; beside it, every replica also receives each feedback message on a plain NATS
subscription (no acks, no redelivery: a message it misses is simply folded at its commit).
When the event's decision is one this replica made (``RecentDecisions``, filled by the
decision log), its reward is folded into the cached snapshot at once (``PosteriorCache.
provisional``), keyed by the event id. The transaction that settles the event (this replica's
or another's, which names it in its NOTIFY) replaces the provisional fold by what it really
added, so an event counts once whatever happens: a duplicate, a refused reward or a
rolled-back transaction undoes its provisional fold when it is settled, or after
``cache.PROVISIONAL_TTL_S`` when nothing settles it.

Segmented endpoints: the reward is folded into the endpoint's snapshot and into its segment's
(``SegmentCache.provisional``) alike. Feedback for another replica's decisions is not folded
here from the feedback message (this replica does not know their arms yet): the replica that
made the decision tells the others of its fold (``peer_folds.py``), and the NOTIFY of the
commit settles it, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from prometheus_client import Counter, Histogram

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.codec import MalformedEvent, decode
from flywheel.core.errors import InvalidArgument
from flywheel.core.logging import get_logger
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.decisions import decision_age_s
from flywheel.optimizer.handlers import feedback_item
from flywheel.optimizer.peer_folds import PeerFolds
from flywheel.optimizer.segment_cache import SegmentCache
from flywheel.optimizer.service import check_item, reward_value
from flywheel.optimizer.stats import Increment

log = get_logger(__name__)

SEEN = Counter(
    "flywheel_optimizer_provisional_feedback_total",
    "Feedback messages seen on the provisional fold's subscription, by what became of them: folded, "
    "elsewhere (a decision this replica did not make or no longer remembers), invalid (left to the "
    "durable consumer, which dead-letters it), not_folded (see flywheel_optimizer_provisional_folds_total)",
    ["outcome"],
)
DELIVERY = Histogram(
    "flywheel_optimizer_provisional_delivery_seconds",
    "Feedback published (its meta.time, the publisher's clock) -> received on the provisional fold's "
    "subscription, for the events of this replica's decisions",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 5),
)
_SEEN = {o: SEEN.labels(o) for o in ("folded", "elsewhere", "invalid", "not_folded")}  # resolved once
# The subscription's buffer in the NATS client: past it, messages are dropped (and folded only
# at their commit), so a replica that falls behind never holds more than this.
PENDING_MESSAGES = 20_000
PENDING_BYTES = 32 * 1024 * 1024


class RecentDecisions:
    """This replica's latest decisions (endpoint, arm, features, segment) by id, at most ``capacity``,
    the oldest forgotten first. Written by the decision log (under its lock, from the gRPC
    worker threads), read on the event loop: dict operations are atomic under the GIL, and
    only writers iterate (to evict)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        # Evict a tenth at a time: one walk per many inserts rather than one per insert.
        self._slack = max(1, capacity // 10)
        self._by_id: dict[str, tuple[str, str, list[float] | None, str]] = {}

    def add_many(self, decisions: Iterable[Any]) -> None:
        """Remember decisions (``decisions.Decision``); the caller serializes writers."""
        by_id = self._by_id
        for d in decisions:
            by_id[d.decision_id] = (d.endpoint, d.arm_id, d.features, d.segment)
        if len(by_id) > self._capacity + self._slack:
            for decision_id in list(itertools.islice(by_id, len(by_id) - self._capacity)):
                del by_id[decision_id]

    def get(self, decision_id: str) -> tuple[str, str, list[float] | None, str] | None:
        """(endpoint, arm id, features, segment) of a remembered decision."""
        return self._by_id.get(decision_id)

    def __len__(self) -> int:
        return len(self._by_id)


class ProvisionalFolder:
    """Subscribes to every feedback subject and folds the rewards of this replica's decisions
    into the posterior cache before their transactions run."""

    def __init__(
        self,
        cache: PosteriorCache,
        recent: RecentDecisions,
        *,
        window: timedelta,
        segments: SegmentCache | None = None,
        peers: PeerFolds | None = None,
    ) -> None:
        self._cache = cache
        self._segments = segments
        self._peers = peers  # told of every fold made here (``peer_folds.py``)
        self._recent = recent
        self._window_s = window.total_seconds()

    async def run(self, nc: Nats, subject: str) -> None:
        """Fold until cancelled (a background task of the service); the NATS client
        resubscribes after a reconnect by itself."""
        self._cache.track_provisional(self._recent)
        sub = await nc.subscribe(
            subject, cb=self._received, pending_msgs_limit=PENDING_MESSAGES, pending_bytes_limit=PENDING_BYTES
        )
        try:
            await asyncio.Event().wait()
        finally:
            with contextlib.suppress(Exception):  # the connection may be closing already
                await sub.unsubscribe()

    async def _received(self, msg: Msg) -> None:
        _SEEN[self.fold(msg.data, msg.headers)].inc()

    def fold(self, payload: bytes, headers: dict[str, str] | None) -> str:
        """Fold one published feedback message if its decision is this replica's; what became of it."""
        try:
            event = decode(payload, headers, FeedbackEvent)
            item = feedback_item(event)
            check_item(item)
        except (MalformedEvent, InvalidArgument):
            return "invalid"
        decision = self._recent.get(item.decision_id)
        if decision is None:
            return "elsewhere"
        endpoint, arm_id, features, segment = decision
        if item.endpoint and item.endpoint != endpoint:
            return "invalid"
        age = decision_age_s(item.decision_id)
        if age is not None and age > self._window_s:
            return "invalid"  # the transaction refuses it: past the feedback window
        snap = self._cache.cached(endpoint)
        if snap is None:
            return "not_folded"
        spec = snap.reward_spec
        value = reward_value(
            item, weights=spec.get("signal_weights", {}), bounded=spec.get("bounded", True), kind=snap.policy.kind
        )
        if isinstance(value, Exception):
            return "invalid"
        inc = Increment()
        inc.add(value, features)
        sent = event.meta.time.seconds + event.meta.time.nanos / 1e9
        if sent > 0:
            DELIVERY.observe(max(0.0, time.time() - sent))
        if not self._cache.provisional(endpoint, item.event_id, arm_id, inc, since=sent):
            return "not_folded"
        if segment and self._segments is not None:
            self._segments.provisional(endpoint, segment, item.event_id, arm_id, inc, since=sent)
        if self._peers is not None:
            self._peers.add(
                event_id=item.event_id,
                endpoint=endpoint,
                arm_id=arm_id,
                segment=segment,
                reward=value,
                features=features,
                published=sent,
            )
        return "folded"
