"""Folding committed feedback into a cached posterior without reading PostgreSQL again.

A feedback transaction knows exactly what it added to each arm (``stats.Increment``). Right
after it commits, the replica that ran it adds the same increments to its cached counts, and
other replicas add them when PostgreSQL's NOTIFY tells them (``notify.py``). A full refresh
still reads everything now and then; to never count a fold twice nor lose one, every fold
carries its transaction id and every read its PostgreSQL snapshot: a fold the read could see
is already in the read, one it could not see is added on top again (``PgSnapshot.visible``).

Pure arithmetic and parsing here; the cache (``cache.py``) owns the state.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.spec import PolicyConfig
from flywheel.optimizer.stats import Increment, evidence_factor

# NOTIFY payloads must stay under 8000 bytes; an endpoint's increments that do not fit are
# announced as "reload this endpoint" instead.
MAX_PAYLOAD_BYTES = 7900


def decay(policy: PolicyConfig, elapsed_s: float, elapsed_decisions: float = 0.0) -> float:
    """The share of evidence kept after ``elapsed_s`` seconds and ``elapsed_decisions`` of the
    endpoint's decisions: the one place a fold decays (the SQL increment in ``stats.add`` and
    ``stats.aggregate`` apply the same `stats.evidence_factor`). The decision clock of a fold is
    the endpoint's ``decisions_total`` as its transaction read it; with several replicas it can
    lag the decisions still in their buffers (one flush, 20 ms), and is exact at the next read."""
    return evidence_factor(policy, elapsed_s=elapsed_s, elapsed_decisions=elapsed_decisions)


@dataclass(frozen=True)
class Counts:
    """What a snapshot is built from that feedback changes: the arms' statistics (as of
    ``as_of``, epoch seconds of the database's clock) and their raw pulls and reward sums."""

    stats: Stats
    pulls: np.ndarray
    reward_sums: np.ndarray
    as_of: float
    clock: float = 0.0  # the endpoint's decision clock the statistics are valid at


def add(
    policy: PolicyConfig,
    counts: Counts,
    arm_index: Mapping[str, int],
    at: float,
    incs: Mapping[str, Increment],
    clock: float = 0.0,
) -> Counts:
    """``counts`` brought to ``at`` (decayed) plus one transaction's increments, as new arrays
    (the old ones may be in use by Select). Like the SQL update, time never runs backwards: a
    transaction that started before ``as_of`` adds its increments undecayed. ``clock`` is the
    endpoint's decision clock in that transaction (for ``half_life_decisions``), likewise."""
    f = decay(policy, at - counts.as_of, clock - counts.clock)
    adds = ((arm_index[arm_id], inc, round(inc.w)) for arm_id, inc in incs.items())
    return _plus(counts, f, adds, max(counts.as_of, at), max(counts.clock, clock))


def overlay(counts: Counts, adds: Iterable[tuple[int, Increment, int]]) -> Counts:
    """``counts`` plus provisional increments (arm index, increment, pulls: one per arm, the
    sum of its folds, ``overlay.Overlay.sums``), undecayed and as new arrays: what Select samples
    from while their transactions have not committed yet (``provisional.py``). ``as_of`` and
    the clock stay the committed counts'."""
    return _plus(counts, 1.0, adds, counts.as_of, counts.clock)


def _plus(counts: Counts, f: float, adds: Iterable[tuple[int, Increment, int]], as_of: float, clock: float) -> Counts:
    """``counts``' statistics times ``f``, plus each (arm index, increment, pulls), as new arrays."""
    st = counts.stats
    w, s, ss = st.w * f, st.s * f, st.ss * f
    xtx = None if st.xtx is None else st.xtx * f
    xty = None if st.xty is None else st.xty * f
    pulls, reward_sums = counts.pulls.copy(), counts.reward_sums.copy()
    for i, inc, n in adds:
        w[i] += inc.w
        s[i] += inc.s
        ss[i] += inc.ss
        if xtx is not None and xty is not None and inc.xtx is not None and inc.xty is not None:
            xtx[i] += inc.xtx
            xty[i] += inc.xty
        pulls[i] += n
        reward_sums[i] += inc.s
    return Counts(Stats(w, s, ss, xtx, xty), pulls, reward_sums, as_of, clock)


@dataclass(frozen=True)
class PgSnapshot:
    """A PostgreSQL snapshot (``pg_current_snapshot()``): which transactions a read could see."""

    xmin: int
    xmax: int
    xip: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def parse(cls, text: str) -> PgSnapshot:
        """From its text form ``xmin:xmax:xip,xip,...``."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def visible(self, xid: int) -> bool:
        """Whether a transaction known to have committed was visible to this read."""
        return xid < self.xmin or (xid < self.xmax and xid not in self.xip)

    def precedes(self, other: PgSnapshot) -> bool:
        """True when this read was taken before ``other`` (it sees strictly less)."""
        return self.xmax < other.xmax or (self.xmax == other.xmax and self.xip > other.xip)


@dataclass(frozen=True)
class EndpointFold:
    """One committed transaction's endpoint-wide increments to one endpoint."""

    xid: int
    at: float  # the transaction's now(), epoch seconds
    arms: dict[str, Increment]
    clock: float = 0.0  # the endpoint's decision clock (decisions_total) in the transaction


@dataclass
class FoldBatch:
    """What one feedback transaction added, handed to the cache right after it commits."""

    xid: int
    at: float
    # endpoint -> arm_id -> increment, endpoint-wide ('' segment) only
    endpoints: dict[str, dict[str, Increment]]
    # (endpoint, arm_id, segment) -> increment for the other segments (for a segment cache)
    segments: dict[tuple[str, str, str], Increment] = field(default_factory=dict)
    # endpoint -> its decision clock as the transaction read it
    clocks: dict[str, float] = field(default_factory=dict)
    # the event ids the transaction settled, when replicas fold provisionally (``provisional.py``)
    settled: tuple[str, ...] = ()

    def folds(self) -> dict[str, EndpointFold]:
        return {e: EndpointFold(self.xid, self.at, arms, self.clocks.get(e, 0.0)) for e, arms in self.endpoints.items()}


# --- NOTIFY payloads ------------------------------------------------------------------------
# The body is written here without the transaction's id and times, which PostgreSQL prepends
# inside the transaction (``notify.py``): {"x": xid, "t": now, "k": sent, "r": replica, "e": endpoint,
# "a": {arm: [w, s, ss] or [w, s, ss, xtx..., xty...]}, "c": decision clock} or, too large,
# {..., "reload": 1}; and the event ids it settled, {..., "r": replica, "s": [event ids]}.


def _arm_values(inc: Increment) -> list[float]:
    values = [inc.w, inc.s, inc.ss]
    if inc.xtx is not None and inc.xty is not None:
        values += [*inc.xtx.ravel().tolist(), *inc.xty.tolist()]
    return values


def body(replica: str, endpoint: str, arms: Mapping[str, Increment], clock: float = 0.0) -> str:
    """The payload after ``{"x":..,"t":..,`` for one endpoint (a reload request when too large)."""
    out = json.dumps(
        {"r": replica, "e": endpoint, "a": {a: _arm_values(inc) for a, inc in arms.items()}, "c": clock},
        separators=(",", ":"),
    )[1:]
    if len(out.encode()) > MAX_PAYLOAD_BYTES - 64:
        out = reload_body(replica, endpoint)
    return out


def settled_bodies(replica: str, event_ids: Iterable[str]) -> list[str]:
    """The payloads after ``{"x":..,"t":..,"k":..,`` naming the event ids a transaction settled,
    as many as needed to keep each under the size limit."""
    head = json.dumps({"r": replica, "s": []}, separators=(",", ":"))[1:-3]  # '"r":"..","s":'
    out: list[str] = []
    chunk: list[str] = []
    size = len(head.encode()) + 64
    for event_id in event_ids:
        cost = len(json.dumps(event_id).encode()) + 1
        if chunk and size + cost > MAX_PAYLOAD_BYTES - 64:
            out.append(head + json.dumps(chunk, separators=(",", ":")) + "}")
            chunk, size = [], len(head.encode()) + 64
        chunk.append(event_id)
        size += cost
    if chunk:
        out.append(head + json.dumps(chunk, separators=(",", ":")) + "}")
    return out


def reload_body(replica: str, endpoint: str) -> str:
    return json.dumps({"r": replica, "e": endpoint, "reload": 1}, separators=(",", ":"))[1:]


@dataclass(frozen=True)
class Notice:
    """A decoded notification: a peer's fold, or a request to reload the endpoint."""

    replica: str
    endpoint: str
    fold: EndpointFold | None  # None: reload
    # When the notifying transaction sent it (epoch seconds of the database's clock, just before
    # its commit); 0.0 when the payload does not say (a replica of an older version).
    sent: float = 0.0
    # Event ids the transaction settled (applied, duplicate or refused): the receiver drops its
    # provisional folds of them (``provisional.py``). A settled-ids notice has no fold.
    settled: tuple[str, ...] = ()


def _increment(values: list[float]) -> Increment:
    inc = Increment(w=float(values[0]), s=float(values[1]), ss=float(values[2]))
    rest = values[3:]
    if rest:
        # d*d + d values: d is the positive root of d^2 + d - n = 0.
        d = round((-1 + (1 + 4 * len(rest)) ** 0.5) / 2)
        if d * d + d != len(rest):
            raise ValueError(f"an arm's linear increment has {len(rest)} values, not d*d + d")
        inc.xtx = np.asarray(rest[: d * d], dtype=float).reshape(d, d)
        inc.xty = np.asarray(rest[d * d :], dtype=float)
    return inc


def decode(payload: str) -> Notice:
    """A notification's payload (ValueError when it is not one of ours)."""
    data: dict[str, Any] = json.loads(payload)
    if "s" in data:
        ids = data["s"]
        if not isinstance(ids, list):
            raise ValueError("settled event ids are not a list")
        return Notice(str(data["r"]), "", None, float(data.get("k", 0.0)), tuple(str(i) for i in ids))
    replica, endpoint = str(data["r"]), str(data["e"])
    if data.get("reload") or "x" not in data:
        return Notice(replica, endpoint, None)
    arms = {str(a): _increment(v) for a, v in data["a"].items()}
    clock = float(data.get("c", 0.0))
    got = EndpointFold(int(data["x"]), float(data["t"]), arms, clock)
    return Notice(replica, endpoint, got, float(data.get("k", 0.0)))


def epoch(when: datetime) -> float:
    return when.timestamp()


def from_epoch(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)
