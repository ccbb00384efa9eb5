"""Exactly-once feedback throughput and latency: Flywheel's optimizer against raw nats-py and
FastStream, each batched like the optimizer and per message, then a kill -9 of every one.

    python bench/feedback/run.py [--quick]

Real NATS (JetStream), PostgreSQL and S3 start under a temporary folder, the optimizer's
schema is migrated, and the real optimizer process creates one endpoint per contestant and
phase and their decisions through its gRPC API (SelectBatch, 1000 per call; each decision
then gets several feedback events, each with its own event id).

Contestants (each its own process, its own NATS namespace, stream and durable consumer):
``flywheel`` (``python -m flywheel.optimizer``, one transaction per fetched batch of 1000),
``raw_natspy_batch`` and ``faststream_batch`` (peers.py: the same batched exactly-once SQL,
one transaction per batch of 1000, ack after commit), and ``raw_natspy`` and ``faststream``
(peers.py: one transaction per message, the second rows).

1. Throughput, in rounds (the order reversed every other round, so a machine whose load
   drifts favours no one): per contestant its events are published to its stream while
   nothing consumes, its consumer process starts on that backlog, and arm totals are polled
   in PostgreSQL every 20 ms; the rate is the posterior updates applied between the first and
   the last poll at which the count changed, over that time. Once the consumer has nothing
   pending and nothing unacked, the arms, arm_stats and the applied_feedback ledger are
   compared with everything published so far (lost / double counted).
2. Latency: with the consumer running and idle, events are published one at a time at a fixed
   rate every contestant sustains; each event's latency is from just before its publish to the
   first poll (every 5 ms, by event id) that sees its ledger row, i.e. its transaction committed.
3. Crash, every contestant at once: events for another endpoint, a tenth of them published a
   second time with a different Nats-Msg-Id (JetStream stores both copies, so only the
   consumer's dedup can drop one); the consumer is SIGKILLed once about a third is applied,
   restarted, and the bench waits until nothing is pending or unacked. What the killed process
   held unacked comes back after the consumer's ack_wait (30 s).

Every process started here (servers, optimizer, peers) is stopped by pid, also on failure,
and the temporary folder is removed (``--keep`` keeps it, with the logs). Results go to
bench/results/feedback.json through flywheel.stack.benchstamp (commit, date, machine, command).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import nats
import psutil
from google.protobuf.struct_pb2 import Struct

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.connection import ensure_stream
from flywheel.stack.benchstamp import write_results
from flywheel.stack.servers import _find_binary, cpu_seconds
from flywheel.stack.services import ServiceProcess, migrate
from flywheel.stack.stack import Servers

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "bench" / "results" / "feedback.json"

SCHEMA = "bench"
FLYWHEEL_BATCH = 1000  # the optimizer's feedback consumer: batch_size=1000 (optimizer app.py), fetch timeout 0.5 s


@dataclass(frozen=True)
class Contestant:
    name: str
    namespace: str  # its own NATS namespace: stream and durable consumer
    batched: bool  # one transaction per fetched batch (else one per message)
    env: dict[str, str] = field(default_factory=dict)  # BENCH_* settings for peers.py


# Order of the first round; the next round runs them in reverse, and so on.
CONTESTANTS = (
    Contestant("flywheel", "bfly", True),
    Contestant("raw_natspy_batch", "brawb", True, {"BENCH_BATCH": str(FLYWHEEL_BATCH), "BENCH_BATCH_TIMEOUT": "0.5"}),
    Contestant(
        "faststream_batch",
        "bfsb",
        True,
        # FastStream's batch subscriber awaits one batch's handler before fetching the next: one
        # connection is all it uses. Its timeout (the longest a partial batch waits) is the
        # optimizer's fetch timeout, not FastStream's default of 5 s.
        {"BENCH_BATCH": str(FLYWHEEL_BATCH), "BENCH_BATCH_TIMEOUT": "0.5", "BENCH_POOL": "2"},
    ),
    Contestant("raw_natspy", "braw", False, {"BENCH_BATCH": "256", "BENCH_BATCH_TIMEOUT": "0.5"}),
    Contestant("faststream", "bfs", False, {"BENCH_BATCH": "256", "BENCH_BATCH_TIMEOUT": "0.5", "BENCH_POOL": "10"}),
)
BY_NAME = {c.name: c for c in CONTESTANTS}
ARMS = ("small", "large", "creative")
REWARDS = (0.0, 0.25, 0.5, 0.75, 1.0)  # exact in binary: sums compare exactly
DURABLE = "optimizer-feedback"

# events: per batched contestant (split over the rounds); peer_events: per per-message peer.
FULL = {
    "events": 200_000,
    "peer_events": 20_000,
    "rounds": 2,
    "latency_events": 2_000,
    "latency_rate": 50,
    "crash_events": 30_000,
    "peer_crash_events": 10_000,
}
QUICK = {
    # 50,000 a round: at ~20,000 updates/s (an idle machine, after the consumer's look-ahead)
    # 10,000 a round was measured over 0.4-0.9 s, polled every 20 ms, and the rounds of one
    # contestant spread 1.5x; 50,000 gives a few seconds.
    "events": 100_000,
    "peer_events": 3_000,
    "rounds": 2,
    "latency_events": 500,
    "latency_rate": 50,
    "crash_events": 6_000,
    "peer_crash_events": 3_000,
}
EVENTS_PER_DECISION = 4
CRASH_DUPLICATE_FRACTION = 0.1
WARMUP_EVENTS = 20
# The goals set against the peers before (0.8 against raw nats-py, 3.0 against FastStream),
# now held against each peer's strongest configuration: the batched one.
GOALS = {"flywheel_vs_raw_natspy_batch": 0.8, "flywheel_vs_faststream_batch": 3.0}

SELECT_BATCH = 1000  # the most SelectBatch takes
PUBLISH_IN_FLIGHT = 2000
POLL_S = 0.02
LATENCY_POLL_S = 0.005
IDLE_S = 10.0
LATENCY_STALL_S = 95.0  # two redeliveries (2 x ack_wait) and some
STALL_S = 60.0  # longer than ack_wait (30 s): redeliveries after the crash take that long


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


# --- processes -------------------------------------------------------------------------------


class Optimizer(ServiceProcess):
    """The real optimizer process (`python -m flywheel.optimizer`)."""

    def __init__(self, *, env: dict[str, str], log_dir: Path) -> None:
        super().__init__("optimizer", env=env, log_dir=log_dir)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self._proc is not None and self._proc.poll() is not None:
            return self._proc.returncode  # already gone and reaped: its pid may belong to another process now
        return super().stop(timeout_s)

    def kill(self) -> None:
        if self.alive():
            super().kill()


class PeerProcess:
    """A peer consumer from peers.py, as its own process."""

    def __init__(self, kind: str, env: dict[str, str], log_dir: Path) -> None:
        self.kind = kind
        self.env = env
        self.log_file = log_dir / f"{kind}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "peers.py"), self.kind],
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()  # SIGKILL to this pid only
            self.proc.wait(5)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


# --- workload --------------------------------------------------------------------------------


@dataclass
class Workload:
    """What one contestant is sent: (payload, Nats-Msg-Id) in publish order, and the truth."""

    endpoint: str
    messages: list[tuple[bytes, str]] = field(default_factory=list)
    expected_ids: set[str] = field(default_factory=set)
    expected_arms: dict[str, list[float]] = field(default_factory=lambda: {a: [0, 0.0] for a in ARMS})
    duplicates: int = 0

    @property
    def distinct(self) -> int:
        return len(self.expected_ids)

    def add(self, other: Workload) -> None:
        """Fold in another workload for the same endpoint (the truth becomes cumulative)."""
        self.messages += other.messages
        self.expected_ids |= other.expected_ids
        for arm, (n, s) in other.expected_arms.items():
            self.expected_arms[arm][0] += n
            self.expected_arms[arm][1] += s
        self.duplicates += other.duplicates


def make_workload(
    endpoint: str,
    decisions: list[tuple[str, str]],
    n: int,
    tag: str,
    rng: random.Random,
    duplicate_fraction: float = 0.0,
) -> Workload:
    """``n`` feedback events spread over the decisions, in shuffled order; a fraction of them
    is published twice (same event id, different Nats-Msg-Id)."""
    w = Workload(endpoint)
    for i in range(n):
        decision_id, arm_id = decisions[i % len(decisions)]
        reward = rng.choice(REWARDS)
        event_id = f"{tag}-{i}"
        payload = FeedbackEvent(
            meta=EventMeta(event_id=event_id), decision_id=decision_id, reward=reward
        ).SerializeToString()
        copies = 2 if rng.random() < duplicate_fraction else 1
        w.messages += [(payload, f"{event_id}-copy{c}") for c in range(copies)]
        w.duplicates += copies - 1
        w.expected_ids.add(event_id)
        w.expected_arms[arm_id][0] += 1
        w.expected_arms[arm_id][1] += reward
    rng.shuffle(w.messages)
    return w


async def publish(js: Any, subject: str, messages: list[tuple[bytes, str]]) -> dict[str, Any]:
    """Publish with PUBLISH_IN_FLIGHT acks outstanding; counts what JetStream acknowledged."""
    started = time.perf_counter()
    acked = failed = dropped = 0
    headers = {"Content-Type": "application/protobuf"}  # what flywheel.core.bus.Publisher sends
    for start in range(0, len(messages), PUBLISH_IN_FLIGHT):
        results = await asyncio.gather(
            *(
                js.publish(subject, payload, headers={**headers, "Nats-Msg-Id": msg_id}, timeout=30)
                for payload, msg_id in messages[start : start + PUBLISH_IN_FLIGHT]
            ),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                failed += 1
            elif r.duplicate:
                dropped += 1
            else:
                acked += 1
    seconds = time.perf_counter() - started
    if failed or dropped:
        raise RuntimeError(f"{subject}: {failed} publishes failed, {dropped} dropped as duplicate Nats-Msg-Ids")
    return {"acked": acked, "seconds": round(seconds, 2), "per_s": round(len(messages) / seconds)}


# --- measurement -----------------------------------------------------------------------------


async def totals(pool: asyncpg.Pool, endpoint: str) -> int:
    return int(await pool.fetchval("SELECT coalesce(sum(pulls), 0)::bigint FROM arms WHERE endpoint = $1", endpoint))


def servers_cpu_seconds(pids: tuple[int, ...]) -> float:
    """CPU seconds of the servers every contestant shares: nats-server, and PostgreSQL's
    postmaster with its children (the backends running the SQL, the WAL writer). This is work
    no consumer can skip, since they all run the same statements on the same bus."""
    return sum(cpu_seconds(pid, children=True) for pid in pids)


@dataclass
class Watch:
    """The first and last poll at which the applied count changed, with the consumer's CPU
    and the shared servers' CPU (``shared_pids``) over the same span."""

    first_t: float | None = None
    first_n: int = 0
    last_t: float | None = None
    last_n: int = 0
    cpu: float = 0.0  # consumer CPU seconds between the first and the last change
    shared_pids: tuple[int, ...] = ()
    servers_cpu: float = 0.0  # the shared servers' CPU seconds over the same span
    _cpu_mark: float = math.nan
    _servers_mark: float = math.nan

    def rate(self) -> float:
        if self.first_t is None or self.last_t is None or self.last_t <= self.first_t:
            return math.nan
        return (self.last_n - self.first_n) / (self.last_t - self.first_t)

    def cpu_us_per_update(self) -> float:
        n = self.last_n - self.first_n
        return 1e6 * self.cpu / n if n > 0 else math.nan

    def servers_cpu_us_per_update(self) -> float:
        n = self.last_n - self.first_n
        return 1e6 * self.servers_cpu / n if n > 0 and self.shared_pids else math.nan


async def watch(pool: asyncpg.Pool, endpoint: str, until: int, proc: Any, w: Watch | None = None) -> Watch:
    """Poll arm totals until ``until`` updates are applied. Fails if the consumer exits or
    nothing changes for STALL_S. A Watch passed in (the crash) continues across processes."""
    w = w or Watch()
    w._cpu_mark = w._servers_mark = math.nan  # a new process: its CPU counts from its first change
    seen = w.last_n
    last_change = time.monotonic()
    while True:
        n = await totals(pool, endpoint)
        now = time.monotonic()
        if n != seen:
            cpu, servers = cpu_seconds(proc.pid), servers_cpu_seconds(w.shared_pids)
            if w.first_t is None:
                w.first_t, w.first_n = now, n
            elif not math.isnan(w._cpu_mark):
                w.cpu += cpu - w._cpu_mark
                w.servers_cpu += servers - w._servers_mark
            w._cpu_mark, w._servers_mark = cpu, servers
            w.last_t, w.last_n = now, n
            seen, last_change = n, now
        if n >= until:
            return w
        if not proc.alive():
            raise RuntimeError(f"{endpoint}: the consumer exited at {n}/{until} applied:\n{proc.log_tail()}")
        if now - last_change > STALL_S:
            raise RuntimeError(f"{endpoint}: no progress for {STALL_S:.0f}s at {n}/{until}:\n{proc.log_tail()}")
        await asyncio.sleep(POLL_S)


async def consumer_state(js: Any, namespace: str, durable: str) -> Any:
    cat = Catalogue(namespace)
    return await js.consumer_info(cat.consumer(DURABLE).stream, durable)


async def wait_drained(js: Any, namespace: str, durable: str, timeout_s: float = STALL_S) -> Any:
    """Wait until the consumer has nothing pending and nothing unacked; returns its info."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = await consumer_state(js, namespace, durable)
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return info
        if time.monotonic() > deadline:
            raise RuntimeError(f"{namespace}/{durable}: {info.num_pending} pending, {info.num_ack_pending} unacked")
        await asyncio.sleep(0.1)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between order statistics."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def paced_latency(
    pool: asyncpg.Pool, js: Any, subject: str, messages: list[tuple[bytes, str]], rate: float
) -> list[float]:
    """Publish ``messages`` one at a time at ``rate`` per second and return each event's
    seconds from just before its publish to the first poll whose snapshot holds its ledger
    row (polls every LATENCY_POLL_S, by event id, only for events not seen yet)."""
    headers = {"Content-Type": "application/protobuf"}
    sent: dict[str, float] = {}
    unseen: set[str] = set()
    latencies: list[float] = []
    done_publishing = asyncio.Event()

    async def publisher() -> None:
        t0 = time.monotonic()
        for k, (payload, msg_id) in enumerate(messages):
            delay = t0 + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            event_id = msg_id.rsplit("-copy", 1)[0]
            sent[event_id] = time.monotonic()
            unseen.add(event_id)
            ack = await js.publish(subject, payload, headers={**headers, "Nats-Msg-Id": msg_id}, timeout=30)
            if ack.duplicate:
                raise RuntimeError(f"{subject}: {msg_id} dropped as a duplicate")
        done_publishing.set()

    async def poller() -> None:
        last_progress = time.monotonic()
        while not (done_publishing.is_set() and not unseen):
            await asyncio.sleep(LATENCY_POLL_S)
            if not unseen:
                continue
            t = time.monotonic()  # the snapshot is taken after this: an upper bound on the commit
            rows = await pool.fetch(
                "SELECT event_id FROM applied_feedback WHERE event_id = ANY($1::text[])", list(unseen)
            )
            for r in rows:
                unseen.discard(r["event_id"])
                latencies.append(t - sent[r["event_id"]])
            if rows:
                last_progress = t
            elif t - last_progress > LATENCY_STALL_S:
                raise RuntimeError(f"{subject}: {len(unseen)} events not applied after {LATENCY_STALL_S:.0f} s")

    await asyncio.gather(publisher(), poller())
    return latencies


async def verify(pool: asyncpg.Pool, w: Workload) -> dict[str, Any]:
    """Compare the database with what was published (and acknowledged by JetStream)."""
    arms = {
        r["arm_id"]: (int(r["pulls"]), float(r["reward_sum"]))
        for r in await pool.fetch("SELECT arm_id, pulls, reward_sum FROM arms WHERE endpoint = $1", w.endpoint)
    }
    stats = {
        r["arm_id"]: (float(r["w"]), float(r["s"]))
        for r in await pool.fetch(
            "SELECT arm_id, sum(w) AS w, sum(s) AS s FROM arm_stats WHERE endpoint = $1 AND segment = '' "
            "GROUP BY arm_id",
            w.endpoint,
        )
    }
    ledger = [
        r["event_id"]
        for r in await pool.fetch(
            "SELECT a.event_id FROM applied_feedback a JOIN decisions d ON d.decision_id = a.decision_id "
            "WHERE d.endpoint = $1",
            w.endpoint,
        )
    ]
    ledger_ids = set(ledger)
    # Per arm, so a loss on one arm cannot hide a double count on another.
    over = under = 0
    sums_match = stats_match = True
    for arm, (n, s) in w.expected_arms.items():
        got_n, got_s = arms.get(arm, (0, 0.0))
        st_w, st_s = stats.get(arm, (0.0, 0.0))
        over += max(0, got_n - n)
        under += max(0, n - got_n)
        sums_match &= abs(got_s - s) < 1e-6
        stats_match &= abs(st_w - n) < 1e-6 and abs(st_s - s) < 1e-6
    lost = max(len(w.expected_ids - ledger_ids), under)
    double = max(len(ledger) - len(ledger_ids) + len(ledger_ids - w.expected_ids), over)
    return {
        "messages": len(w.messages),
        "distinct_events": w.distinct,
        "duplicate_messages": w.duplicates,
        "applied_updates": sum(n for n, _ in arms.values()),
        "expected_reward_sum": sum(s for _, s in w.expected_arms.values()),
        "applied_reward_sum": sum(s for _, s in arms.values()),
        "ledger_rows": len(ledger),
        "lost": lost,
        "double_counted": double,
        "reward_sums_match": sums_match,
        "arm_stats_match": stats_match,
        "exactly_once": lost == 0 and double == 0 and sums_match and stats_match,
    }


# --- the run ---------------------------------------------------------------------------------


def endpoint_request(name: str) -> admin_pb.CreateEndpointRequest:
    arms = []
    for arm_id, model, temperature in zip(ARMS, ("gpt-4o-mini", "gpt-4o", "gpt-4o"), (0.2, 0.2, 0.9), strict=True):
        params = Struct()
        params.update({"model": model, "temperature": temperature})
        arms.append(ep_pb.Arm(arm_id=arm_id, params=params))
    return admin_pb.CreateEndpointRequest(endpoint=ep_pb.Endpoint(name=name, arms=arms))


async def make_decisions(address: str, pool: asyncpg.Pool, wanted: dict[str, int]) -> dict[str, list[tuple[str, str]]]:
    """Create the endpoints and their decisions through the optimizer's gRPC API.

    One SelectBatch at a time, and the next only once the decision log has written all but
    one batch: the log flushes its whole buffer in one INSERT, which fails for good once it
    holds more than ~2,978 decisions (asyncpg's 32,767 bind parameters; see README.md)."""
    out: dict[str, list[tuple[str, str]]] = {}
    made = 0
    async with grpc.aio.insecure_channel(address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        sel = sel_grpc.SelectionServiceStub(channel)
        for endpoint, n in wanted.items():
            await admin.CreateEndpoint(endpoint_request(endpoint))
            got: list[tuple[str, str]] = []
            for start in range(0, n, SELECT_BATCH):
                while made - await pool.fetchval("SELECT count(*) FROM decisions") > SELECT_BATCH:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)  # polling another process's writes: no event to wait on
                k = min(SELECT_BATCH, n - start)
                reply = await sel.SelectBatch(
                    sel_pb.SelectBatchRequest(requests=[sel_pb.SelectRequest(endpoint=endpoint)] * k)
                )
                got += [(d.decision_id, d.arm_id) for d in reply.decisions]
                made += k
            out[endpoint] = got
    # Everything written before SIGTERM: a stop that lands during a flush loses that batch.
    deadline = time.monotonic() + 30
    while (stored := await pool.fetchval("SELECT count(*) FROM decisions")) < made:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{made} decisions made but only {stored} stored after 30 s")
        await asyncio.sleep(0.02)
    return out


def decisions_for(events: int) -> int:
    return max(1, math.ceil(events / EVENTS_PER_DECISION))


def durable_of(c: Contestant) -> str:
    return DURABLE if c.name == "flywheel" else f"bench-{c.name.replace('_', '-')}"


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "mean": round(1e3 * statistics.fmean(values), 1) if values else math.nan,
        "p50": round(1e3 * percentile(values, 0.5), 1),
        "p90": round(1e3 * percentile(values, 0.9), 1),
        "p99": round(1e3 * percentile(values, 0.99), 1),
        "max": round(1e3 * max(values), 1) if values else math.nan,
    }


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


async def idle_cpu(proc: Any, endpoints: int, settle_s: float = 2.0, seconds: float = IDLE_S) -> dict[str, Any]:
    """The optimizer's CPU with no request and no feedback: its background loops (posterior
    cache refresh, batch-run driver, arm lifecycle), which the peers do not run."""
    await asyncio.sleep(settle_s)
    before = cpu_seconds(proc.pid)
    await asyncio.sleep(seconds)
    share = (cpu_seconds(proc.pid) - before) / seconds
    log(f"flywheel idle: {100 * share:.1f}% of a core with {endpoints} endpoints")
    return {"cpu_percent_of_a_core": round(100 * share, 1), "endpoints": endpoints, "seconds": seconds}


class Run:
    def __init__(self, root: Path, params: dict[str, Any], seed: int) -> None:
        self.root = root
        self.params = params
        self.rng = random.Random(seed)
        self.servers = Servers.create(root / "servers")
        self.procs: list[Any] = []
        self.figures: dict[str, Any] = {}
        self.postgres_version = ""

    def env(self, namespace: str) -> dict[str, str]:
        return self.servers.env(namespace=namespace, schema=SCHEMA, bucket_prefix="bench")

    def optimizer(self) -> Optimizer:
        proc = Optimizer(env=self.env("bfly"), log_dir=self.root / "services" / "bfly")
        self.procs.append(proc)
        return proc

    def consumer(self, c: Contestant) -> Any:
        """A fresh consumer process for ``c`` (not started)."""
        if c.name == "flywheel":
            return self.optimizer()
        env = {**self.env(c.namespace), "BENCH_DURABLE": durable_of(c), **c.env}
        proc = PeerProcess(c.name, env, self.root / "services")
        self.procs.append(proc)
        return proc

    def shared_pids(self) -> tuple[int, ...]:
        """nats-server's and PostgreSQL's postmaster's pids (see ``servers_cpu_seconds``)."""
        return tuple(pid for pid in (self.servers.nats.pid, self.servers.postgres.pid) if pid is not None)

    def cleanup(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log(f"stopping {proc!r} failed: {exc!r}")
        self.servers.stop()

    async def main(self) -> None:
        started = time.perf_counter()
        log(f"starting NATS, PostgreSQL and S3 under {self.root}")
        self.servers.start()
        migrate("optimizer", self.env("bfly"))
        dsn = self.servers.database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8, server_settings={"search_path": SCHEMA})
        nats_server = self.servers.nats
        nc = await nats.connect(nats_server.url, user=nats_server.user, password=nats_server.password)
        try:
            self.postgres_version = await pool.fetchval("SHOW server_version")
            await self._run(pool, nc.jetstream())
        finally:
            await nc.close()
            await pool.close()
        self.figures["seconds"] = round(time.perf_counter() - started, 1)

    def events(self, c: Contestant, what: str) -> int:
        p = self.params
        if what == "throughput":
            return p["events"] if c.batched else p["peer_events"]
        if what == "latency":
            return p["latency_events"] + WARMUP_EVENTS
        return p["crash_events"] if c.batched else p["peer_crash_events"]

    async def _run(self, pool: asyncpg.Pool, js: Any) -> None:
        wanted = {
            f"bench-{what}-{c.name}": decisions_for(self.events(c, what))
            for what in ("throughput", "latency", "crash")
            for c in CONTESTANTS
        }
        started = time.perf_counter()
        optimizer = self.optimizer()
        optimizer.start()
        optimizer.wait_serving(60)
        decisions = await make_decisions(optimizer.address, pool, wanted)
        self.figures["flywheel_idle"] = await idle_cpu(optimizer, len(wanted))
        optimizer.stop()
        made = sum(len(v) for v in decisions.values())
        self.figures["decisions"] = {"made_by_select_batch": made, "seconds": round(time.perf_counter() - started, 1)}
        log(f"{made:,} decisions through SelectBatch in {self.figures['decisions']['seconds']} s")

        for c in CONTESTANTS:
            cat = Catalogue(c.namespace)
            await ensure_stream(js, cat.streams[cat.consumer(DURABLE).stream])

        self.figures["throughput"] = await self._throughput(pool, js, decisions)
        latency: dict[str, Any] = {}
        for c in CONTESTANTS:
            latency[c.name] = await self._latency(pool, js, c, decisions[f"bench-latency-{c.name}"])
        self.figures["latency"] = latency
        results = await asyncio.gather(
            *(self._crash(pool, js, c, decisions[f"bench-crash-{c.name}"]) for c in CONTESTANTS)
        )
        self.figures["crash"] = {c.name: r for c, r in zip(CONTESTANTS, results, strict=True)}

    async def _throughput(self, pool: asyncpg.Pool, js: Any, decisions: dict[str, list[Any]]) -> dict[str, Any]:
        rounds = self.params["rounds"]
        truth = {c.name: Workload(f"bench-throughput-{c.name}") for c in CONTESTANTS}
        per_round: dict[str, list[dict[str, Any]]] = {c.name: [] for c in CONTESTANTS}
        for r in range(rounds):
            order = CONTESTANTS if r % 2 == 0 else tuple(reversed(CONTESTANTS))
            for c in order:
                endpoint = truth[c.name].endpoint
                n = self.events(c, "throughput") // rounds
                work = make_workload(endpoint, decisions[endpoint], n, f"{c.name}-r{r}", self.rng)
                truth[c.name].add(work)
                row = await self._drain(pool, js, c, work, truth[c.name])
                row["round"] = r
                per_round[c.name].append(row)
        out: dict[str, Any] = {}
        for c in CONTESTANTS:
            rows = per_round[c.name]
            last = rows[-1]  # its checks cover every round so far (cumulative truth)
            rates = [x["updates_per_s"] for x in rows]
            out[c.name] = {
                "mode": "one transaction per batch" if c.batched else "one transaction per message",
                "updates_per_s": round(statistics.median(rates), 1),
                "updates_per_s_rounds": rates,
                "consumer_cpu_us_per_update": round(
                    statistics.median(x["consumer_cpu_us_per_update"] for x in rows), 1
                ),
                "servers_cpu_us_per_update": round(statistics.median(x["servers_cpu_us_per_update"] for x in rows), 1),
                "rounds": rows,
                "events_per_round": last["events"],
                **{k: last[k] for k in last if k not in ("updates_per_s", "round", "publish", "events")},
            }
        return out

    async def _drain(
        self, pool: asyncpg.Pool, js: Any, c: Contestant, work: Workload, truth: Workload
    ) -> dict[str, Any]:
        before = await totals(pool, work.endpoint)
        pub = await publish(js, Catalogue(c.namespace).feedback(work.endpoint), work.messages)
        proc = self.consumer(c)
        proc.start()
        w = await watch(pool, work.endpoint, truth.distinct, proc, Watch(last_n=before, shared_pids=self.shared_pids()))
        await wait_drained(js, c.namespace, durable_of(c))
        checks = await verify(pool, truth)
        proc.stop()
        result = {
            "events": work.distinct,
            "updates_per_s": round(w.rate(), 1),
            "seconds_first_to_last_update": round((w.last_t or 0) - (w.first_t or 0), 2),
            "consumer_cpu_us_per_update": round(w.cpu_us_per_update(), 1),
            "servers_cpu_us_per_update": round(w.servers_cpu_us_per_update(), 1),
            "publish": pub,
            **checks,
        }
        log(f"{c.name}: {result['updates_per_s']:,.0f} updates/s, exactly once so far: {checks['exactly_once']}")
        return result

    async def _latency(self, pool: asyncpg.Pool, js: Any, c: Contestant, decisions: list[Any]) -> dict[str, Any]:
        p = self.params
        endpoint = f"bench-latency-{c.name}"
        subject = Catalogue(c.namespace).feedback(endpoint)
        truth = make_workload(endpoint, decisions, WARMUP_EVENTS, f"{c.name}-warm", self.rng)
        work = make_workload(endpoint, decisions, p["latency_events"], f"{c.name}-lat", self.rng)
        proc = self.consumer(c)
        proc.start()
        try:
            await publish(js, subject, truth.messages)
            await watch(pool, endpoint, truth.distinct, proc)  # up, consuming, and now idle
            latencies = await paced_latency(pool, js, subject, work.messages, p["latency_rate"])
            truth.add(work)
            await wait_drained(js, c.namespace, durable_of(c))
            checks = await verify(pool, truth)
        except RuntimeError as exc:  # a stalled consumer: recorded, and the run goes on
            log(f"{c.name}: latency phase failed: {exc}")
            nothing = {"n": 0, **dict.fromkeys(("mean", "p50", "p90", "p99", "max"), None)}
            return {"offered_per_s": p["latency_rate"], "error": str(exc), "ms": nothing, "exactly_once": None}
        finally:
            proc.stop()
        result = {"offered_per_s": p["latency_rate"], "ms": summary(latencies), **checks}
        log(f"{c.name}: latency p50 {result['ms']['p50']} ms, p99 {result['ms']['p99']} ms at {p['latency_rate']}/s")
        return result

    async def _crash(
        self, pool: asyncpg.Pool, js: Any, c: Contestant, decisions: list[tuple[str, str]]
    ) -> dict[str, Any]:
        endpoint = f"bench-crash-{c.name}"
        work = make_workload(
            endpoint, decisions, self.events(c, "crash"), f"{c.name}-crash", self.rng, CRASH_DUPLICATE_FRACTION
        )
        durable = durable_of(c)
        before = (await consumer_state(js, c.namespace, durable)).delivered
        pub = await publish(js, Catalogue(c.namespace).feedback(endpoint), work.messages)
        first = self.consumer(c)
        first.start()
        w = await watch(pool, endpoint, work.distinct // 3, first)
        first.kill()
        killed_at = time.monotonic()
        at_kill = await totals(pool, endpoint)
        unacked = (await consumer_state(js, c.namespace, durable)).num_ack_pending
        log(f"crash {c.name}: SIGKILLed at {at_kill:,}/{work.distinct:,} applied, {unacked} messages unacked")
        second = self.consumer(c)
        second.start()
        w = await watch(pool, endpoint, work.distinct, second, w)
        after = (await wait_drained(js, c.namespace, durable)).delivered
        # Deliveries beyond one per stored message: what the killed process held came back.
        redelivered = (after.consumer_seq - before.consumer_seq) - (after.stream_seq - before.stream_seq)
        checks = await verify(pool, work)
        second.stop()
        log(f"crash {c.name}: lost {checks['lost']}, double counted {checks['double_counted']}")
        ack_wait_s = Catalogue(c.namespace).consumer(DURABLE).ack_wait.total_seconds()
        since_kill = (w.last_t or killed_at) - killed_at
        return {
            "applied_when_killed": at_kill,
            "unacked_when_killed": unacked,
            "redelivered_messages": redelivered,
            "ack_wait_s": ack_wait_s,
            "seconds_kill_to_last_update": round(since_kill, 1),
            # Redeliveries come ack_wait after the kill at the earliest; if every event was
            # applied before that, each redelivered message was a duplicate the dedup dropped.
            "redeliveries_dropped_by_dedup": redelivered if since_kill < ack_wait_s else None,
            "publish": pub,
            **checks,
        }


class ThroughputOnly(Run):
    """The throughput phase alone (profile.py, ab.py): the decisions, then the rounds."""

    async def _run(self, pool: asyncpg.Pool, js: Any) -> None:
        wanted = {f"bench-throughput-{c.name}": decisions_for(self.events(c, "throughput")) for c in CONTESTANTS}
        optimizer = self.optimizer()
        optimizer.start()
        optimizer.wait_serving(60)
        decisions = await make_decisions(optimizer.address, pool, wanted)
        optimizer.stop()
        for c in CONTESTANTS:
            cat = Catalogue(c.namespace)
            await ensure_stream(js, cat.streams[cat.consumer(DURABLE).stream])
        self.figures["throughput"] = await self._throughput(pool, js, decisions)


# --- report ----------------------------------------------------------------------------------


def versions(postgres_version: str) -> dict[str, Any]:
    """The servers' versions (benchstamp adds the machine and the Python packages)."""
    try:
        nats_version = subprocess.run(
            [_find_binary("nats-server"), "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, FileNotFoundError):
        nats_version = "unknown"
    return {"nats_server": nats_version, "postgresql": postgres_version}


def code_under_test() -> dict[str, Any]:
    """Where the optimizer's code came from: its package folder, and BENCH_CODE_COMMIT when the
    run took libs and services from an export of that commit (first on PYTHONPATH)."""
    import flywheel.optimizer

    return {
        "optimizer_package": str(Path(flywheel.optimizer.__file__).parent),
        "commit": os.environ.get("BENCH_CODE_COMMIT"),
    }


def ratios_of(f: dict[str, Any]) -> dict[str, Any]:
    """Flywheel's rate over each peer's: per round (measured side by side in that round), and
    their geometric mean; the headline is against the best batched peer."""
    fly = f["throughput"]["flywheel"]["updates_per_s_rounds"]
    per_round: dict[str, list[float]] = {}
    out: dict[str, Any] = {}
    for c in CONTESTANTS[1:]:
        peer = f["throughput"][c.name]["updates_per_s_rounds"]
        per_round[c.name] = [round(a / b, 3) for a, b in zip(fly, peer, strict=True)]
        out[f"flywheel_vs_{c.name}"] = round(geomean(per_round[c.name]), 3)
    best = min((c for c in CONTESTANTS[1:] if c.batched), key=lambda c: out[f"flywheel_vs_{c.name}"])
    out["flywheel_vs_best_batched_peer"] = out[f"flywheel_vs_{best.name}"]
    out["best_batched_peer"] = best.name
    out["per_round"] = per_round
    # The most any consumer could reach here: one costing no CPU, with every core left to the
    # servers' share of each update (Flywheel's own, measured above). A goal above this
    # ceiling against a peer cannot be met by the consumer's code on this machine.
    servers_us = f["throughput"]["flywheel"].get("servers_cpu_us_per_update")
    if isinstance(servers_us, int | float) and servers_us > 0:
        ceiling = (psutil.cpu_count() or 1) * 1e6 / servers_us
        out["ceiling_updates_per_s"] = round(ceiling)
        for c in CONTESTANTS[1:]:
            if c.batched:
                out[f"ceiling_vs_{c.name}"] = round(ceiling / f["throughput"][c.name]["updates_per_s"], 3)
    lat = f["latency"]
    for c in CONTESTANTS[1:]:
        for q in ("p50", "p99"):
            a, b = lat["flywheel"]["ms"][q], lat[c.name]["ms"][q]
            out[f"latency_{q}_flywheel_over_{c.name}"] = round(a / b, 3) if a and b else None
    return out


def render(result: dict[str, Any]) -> str:
    f, p, ratios = result["figures"], result["params"], result["ratios"]
    lines = [
        f"feedback: {p['events']:,} events to each batched contestant, {p['peer_events']:,} to each per-message "
        f"peer, in {p['rounds']} rounds; {p['events_per_decision']} events per decision "
        f"({f['decisions']['made_by_select_batch']:,} decisions via SelectBatch in {f['decisions']['seconds']} s)",
        "",
        f"{'consumer':<18}{'tx per':>8}{'updates/s (rounds)':>24}{'median':>9}{'CPU us/upd':>11}{'servers':>9}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'lost':>6}{'double':>7}  exactly once",
    ]
    for c in CONTESTANTS:
        t, lat, crash = f["throughput"][c.name], f["latency"][c.name], f["crash"][c.name]
        checked = [r for r in (t, lat, crash) if r.get("exactly_once") is not None]
        ok = all(r["exactly_once"] for r in checked)
        lost = sum(r["lost"] for r in checked)
        double = sum(r["double_counted"] for r in checked)
        rounds = " / ".join(f"{x:,.0f}" for x in t["updates_per_s_rounds"])
        lines.append(
            f"{c.name:<18}{'batch' if c.batched else 'message':>8}{rounds:>24}{t['updates_per_s']:>9,.0f}"
            f"{t['consumer_cpu_us_per_update']:>11,.0f}{t.get('servers_cpu_us_per_update', math.nan):>9,.0f}"
            f"{lat['ms']['p50']!s:>8}{lat['ms']['p99']!s:>8}"
            f"{lost:>6}{double:>7}"
            f"  {'yes' if ok else 'NO'}"
        )
    idle = f["flywheel_idle"]
    lines += [
        "",
        f"flywheel idle (no feedback, no requests): {idle['cpu_percent_of_a_core']}% of a core with "
        f"{idle['endpoints']} endpoints",
    ]
    lines += [
        "",
        f"latency at {p['latency_rate']}/s offered, {p['latency_events']:,} events, polled every "
        f"{LATENCY_POLL_S * 1e3:.0f} ms",
        "",
        *(f"  {name}: latency phase failed: {r['error']}" for name, r in f["latency"].items() if "error" in r),
        "",
        "kill -9:",
    ]
    for c in CONTESTANTS:
        k = f["crash"][c.name]
        lines.append(
            f"  {c.name:<18} at {k['applied_when_killed']:,}/{k['distinct_events']:,} applied, "
            f"{k['unacked_when_killed']} unacked, {k['redelivered_messages']} redelivered, "
            f"{k['duplicate_messages']} duplicate messages: lost {k['lost']}, double counted {k['double_counted']}"
        )
    lines += ["", f"{'ratio (geometric mean of rounds)':<40}{'value':>8}{'goal':>8}  met   rounds"]
    for c in CONTESTANTS[1:]:
        key = f"flywheel_vs_{c.name}"
        goal = result["goals"].get(key)
        met = "" if goal is None else ("yes" if ratios[key] >= goal else "NO")
        lines.append(
            f"{key:<40}{ratios[key]:>8.2f}{'' if goal is None else f'{goal:.2f}':>8}  {met:<5} "
            + " / ".join(f"{x:.2f}" for x in ratios["per_round"][c.name])
        )
    lines.append(
        f"{'flywheel_vs_best_batched_peer':<40}{ratios['flywheel_vs_best_batched_peer']:>8.2f}"
        f"  ({ratios['best_batched_peer']})"
    )
    if "ceiling_updates_per_s" in ratios:
        servers_us = f["throughput"]["flywheel"]["servers_cpu_us_per_update"]
        ceilings = {k.removeprefix("ceiling_vs_"): v for k, v in ratios.items() if k.startswith("ceiling_vs_")}
        vs = ", ".join(f"{name} {v:.2f}x" for name, v in ceilings.items())
        lines.append(
            f"ceiling: nats-server + PostgreSQL take {servers_us:.0f} us of CPU per Flywheel update; a consumer "
            f"costing nothing, on all {psutil.cpu_count()} cores, would reach {ratios['ceiling_updates_per_s']:,} "
            f"updates/s ({vs})"
        )
    lines.append(f"({f['seconds']} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK['events']:,} events instead of {FULL['events']:,}"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    args = parser.parse_args(argv)
    params = dict(QUICK if args.quick else FULL)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through the cleanup below

    signal.signal(signal.SIGTERM, on_term)
    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-feedback-"))
    run = Run(root, params, args.seed)
    try:
        asyncio.run(run.main())
    finally:
        run.cleanup()
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    f = run.figures
    ratios = ratios_of(f)
    everything = [
        r for r in (*f["throughput"].values(), *f["latency"].values(), *f["crash"].values()) if "error" not in r
    ]
    f["lost"] = sum(r["lost"] for r in everything)
    f["double_counted"] = sum(r["double_counted"] for r in everything)
    f["goals_met"] = {
        **{k: bool(ratios[k] >= v) for k, v in GOALS.items()},
        "crash_exactly_once": all(r["exactly_once"] for r in f["crash"].values()),
        "all_exactly_once": all(r["exactly_once"] for r in everything),
    }
    result = {
        "machine": versions(run.postgres_version),
        "code_under_test": code_under_test(),
        "params": {
            "quick": args.quick,
            "seed": args.seed,
            **params,
            "events_per_decision": EVENTS_PER_DECISION,
            "crash_duplicate_fraction": CRASH_DUPLICATE_FRACTION,
            "contestants": {
                c.name: {
                    "process": "python -m flywheel.optimizer"
                    if c.name == "flywheel"
                    else f"bench/feedback/peers.py {c.name}",
                    "namespace": c.namespace,
                    "transaction": "per batch" if c.batched else "per message",
                    **(
                        {"BENCH_BATCH": str(FLYWHEEL_BATCH), "fetch_timeout_s": "0.5"}
                        if c.name == "flywheel"
                        else c.env
                    ),
                }
                for c in CONTESTANTS
            },
            "publish_in_flight": PUBLISH_IN_FLIGHT,
            "poll_interval_s": POLL_S,
            "latency_poll_interval_s": LATENCY_POLL_S,
            "rate": "updates applied between the first and the last poll at which the count changed, over that time",
            "latency": "from just before the publish to the first poll (by event id) that sees the ledger row",
        },
        "figures": f,
        "ratios": ratios,
        "goals": GOALS,
    }
    print(render({**result, "figures": f}))
    write_results(
        "feedback",
        result,
        out=args.out,
        packages=("nats-py", "asyncpg", "sqlalchemy", "faststream", "grpcio", "protobuf"),
        argv=argv if argv is None else [sys.argv[0], *argv],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
