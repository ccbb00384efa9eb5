"""Peer folds: each replica tells the others of its provisional folds as it makes them.

A reward reaches the replica that made its decision within a few decisions (``provisional.py``);
the other replicas learned it only from the NOTIFY of the transaction that applied it, tens of
milliseconds later under load (bench/service-regret/README.md). They cannot fold the published
feedback themselves: only the deciding replica knows the decision's arm and segment before its
decision batch goes out (the next flush). So it tells them. Every provisional fold it makes goes
into an outbox that one task sends, all the folds of an event-loop turn together, as one
``ProvisionalFoldBatch`` on plain NATS (``<ns>.optimizer.fold.<replica>``, in no stream). Each
replica subscribes to every replica's subject, skips its own, and folds the others' folds
provisionally (``PosteriorCache.provisional``, ``FOLD_LAG{source="provisional_peer"}``).

They end like its own provisional folds: the transaction that applies the event names it in its
NOTIFY (while a replica shares, ``PosteriorCache.shares_provisional``, its transactions name
every event they settle, not only other replicas' decisions'), a fold arriving after its event
was settled is refused, and one nobody settles expires after ``cache.PROVISIONAL_TTL_S``. So a
message lost or late costs freshness, never a double count that lasts.

Only the optimizer's NATS user may publish on these subjects (``flywheel.api.subjects.ROLES``).
A replica sends only while it has heard from another replica lately (a peer fold, or a NOTIFY):
one replica alone sends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from google.protobuf.message import DecodeError
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from prometheus_client import Counter

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1.events_pb2 import ProvisionalFoldBatch
from flywheel.core.logging import get_logger
from flywheel.optimizer.cache import PROVISIONAL_TTL_S, PosteriorCache
from flywheel.optimizer.segment_cache import SegmentCache
from flywheel.optimizer.spec import LINEAR
from flywheel.optimizer.stats import Increment

log = get_logger(__name__)

PEER_FOLDS = Counter(
    "flywheel_optimizer_peer_folds_total",
    "Provisional folds shared between replicas: sent (to the others), dropped (the outbox was full), "
    "folded (another replica's, into this one's cache), not_folded (endpoint or segment not cached "
    "here, arm unknown, or settled already), invalid (an unreadable message or fold)",
    ["outcome"],
)
_OUTCOMES = {o: PEER_FOLDS.labels(o) for o in ("sent", "dropped", "folded", "not_folded", "invalid")}
# A replica sends while it heard from a peer within this long.
PEER_SILENCE_S = 30.0
# At most this many folds wait to be sent; more are dropped (the NOTIFY still carries them).
MAX_OUTBOX = 5_000
# At most this many folds per message (about 100 bytes each, far under NATS's 1 MiB).
MAX_BATCH = 1_000
# The subscription's buffer in the NATS client: past it, messages are dropped.
PENDING_MESSAGES = 10_000
PENDING_BYTES = 16 * 1024 * 1024


class PeerFolds:
    """Sends this replica's provisional folds to the other replicas and folds theirs."""

    def __init__(
        self,
        cache: PosteriorCache,
        *,
        replica: str,
        subject: str,
        peers_subject: str,
        segments: SegmentCache | None = None,
    ) -> None:
        self._cache = cache
        self._segments = segments
        self._replica = replica
        self._subject = subject  # this replica's: <ns>.optimizer.fold.<replica>
        self._peers_subject = peers_subject  # everyone's: <ns>.optimizer.fold.*
        self._outbox = ProvisionalFoldBatch()
        self._ready = asyncio.Event()
        self._sequence = 0
        self._heard_at = -math.inf  # monotonic: a peer fold or a NOTIFY from another replica
        self._shared_until = -math.inf  # monotonic: peers may hold this replica's folds until then
        cache.share_provisional(self.shares)

    def heard_peer(self) -> None:
        """Another replica exists (its NOTIFY or its folds arrived): send ours."""
        self._heard_at = time.monotonic()

    def shares(self) -> bool:
        """Whether another replica may hold one of this replica's provisional folds: a fold
        sent less than ``PROVISIONAL_TTL_S`` (and a second) ago."""
        return time.monotonic() < self._shared_until

    def add(
        self,
        *,
        event_id: str,
        endpoint: str,
        arm_id: str,
        segment: str,
        reward: float,
        features: list[float] | None,
        published: float,
    ) -> None:
        """Queue one of this replica's provisional folds for the others (sent with the others
        of this event-loop turn); nothing while no peer was heard lately."""
        now = time.monotonic()
        if now - self._heard_at > PEER_SILENCE_S:
            return
        if len(self._outbox.folds) >= MAX_OUTBOX:
            _OUTCOMES["dropped"].inc()
            return
        fold = self._outbox.folds.add(event_id=event_id, endpoint=endpoint, arm_id=arm_id, segment=segment)
        fold.reward = reward
        if features:
            fold.features.extend(features)
        if published > 0:
            micros = round(published * 1_000_000)
            fold.published.seconds, fold.published.nanos = micros // 1_000_000, (micros % 1_000_000) * 1000
        # Set before the send: a transaction committing from now on names its events for peers.
        self._shared_until = now + PROVISIONAL_TTL_S + 1.0
        self._ready.set()

    async def run(self, nc: Nats) -> None:
        """Send and receive until cancelled (a background task of the service)."""
        sub = await nc.subscribe(
            self._peers_subject,
            cb=self._received,
            pending_msgs_limit=PENDING_MESSAGES,
            pending_bytes_limit=PENDING_BYTES,
        )
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                await self._send(nc)
        finally:
            with contextlib.suppress(Exception):  # the connection may be closing already
                await sub.unsubscribe()

    async def _send(self, nc: Nats) -> None:
        outbox, self._outbox = self._outbox, ProvisionalFoldBatch()
        messages = [outbox]
        if len(outbox.folds) > MAX_BATCH:
            messages = [ProvisionalFoldBatch() for _ in range(0, len(outbox.folds), MAX_BATCH)]
            for i, message in enumerate(messages):
                message.folds.extend(outbox.folds[i * MAX_BATCH : (i + 1) * MAX_BATCH])
        for message in messages:
            self._sequence += 1
            message.meta.CopyFrom(EventMeta(event_id=f"{self._replica}-{self._sequence}", source="optimizer"))
            message.meta.time.GetCurrentTime()
            try:
                await nc.publish(self._subject, message.SerializeToString())
            except Exception as exc:  # noqa: BLE001 - NATS away: the NOTIFY carries these rewards
                log.debug("peer folds not sent", error=repr(exc), folds=len(message.folds))
                continue
            _OUTCOMES["sent"].inc(len(message.folds))

    async def _received(self, msg: Msg) -> None:
        if msg.subject == self._subject:
            return  # our own
        self.heard_peer()
        self.fold(msg.data)

    def fold(self, payload: bytes) -> dict[str, int]:
        """Fold another replica's ``ProvisionalFoldBatch`` into this replica's caches; the
        count of each outcome."""
        counts = dict.fromkeys(_OUTCOMES, 0)
        try:
            batch = ProvisionalFoldBatch.FromString(payload)
        except DecodeError:
            counts["invalid"] += 1
        else:
            for fold in batch.folds:
                counts[self._fold_one(fold)] += 1
        for outcome, n in counts.items():
            if n:
                _OUTCOMES[outcome].inc(n)
        return counts

    def _fold_one(self, fold: Any) -> str:
        if not fold.event_id or not math.isfinite(fold.reward):
            return "invalid"
        snap = self._cache.cached(fold.endpoint)
        if snap is None:
            return "not_folded"
        features: list[float] | None = None
        if snap.policy.kind == LINEAR:
            features = list(fold.features)
            if len(features) != len(snap.policy.context_features) or not all(map(math.isfinite, features)):
                return "invalid"
        inc = Increment()
        inc.add(fold.reward, features)
        since = fold.published.seconds + fold.published.nanos / 1e9
        if not self._cache.provisional(
            fold.endpoint, fold.event_id, fold.arm_id, inc, since=since, source="provisional_peer"
        ):
            return "not_folded"
        if fold.segment and self._segments is not None:
            self._segments.provisional(
                fold.endpoint,
                fold.segment,
                fold.event_id,
                fold.arm_id,
                inc,
                since=since,
                source="provisional_peer_segment",
            )
        return "folded"
