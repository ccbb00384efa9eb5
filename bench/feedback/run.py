"""Exactly-once feedback throughput: Flywheel's optimizer against a raw nats-py consumer and
FastStream, then a kill -9 of the optimizer mid-stream.

    python bench/feedback/run.py [--quick]

Real NATS (JetStream), PostgreSQL and S3 start under a temporary folder, the optimizer's
schema is migrated, and the real optimizer process creates one endpoint per contestant and
its decisions through its gRPC API (SelectBatch, 1000 per call; each decision then gets
several feedback events, each with its own event id). Then, for each contestant in turn:

1. its feedback events are published to its own JetStream stream (async publishes, 2000 in
   flight) while nothing consumes them, so it starts with a backlog;
2. its consumer process starts: the optimizer (`python -m flywheel.optimizer`, its durable
   consumer, one transaction per fetched batch) or a peer from peers.py (one transaction
   per message);
3. arm totals are polled in PostgreSQL every 20 ms; the rate is the posterior updates
   applied between the first and the last poll at which the count changed, over that time;
4. once the consumer has nothing pending and nothing unacked, the arms, arm_stats and the
   applied_feedback ledger are compared with what was published (lost / double counted).

Every contestant writes the optimizer's tables in one schema, each for its own endpoint and
from its own stream (namespaces bfly, braw, bfs), so counts never mix.

The crash check publishes events for another endpoint, a tenth of them twice with different
Nats-Msg-Ids (JetStream stores both copies, so only the optimizer's dedup can drop one),
starts the optimizer, SIGKILLs it once about a third is applied, restarts it and waits until
its consumer has nothing pending or unacked. What the killed process held unacked comes
back after the consumer's ack_wait (30 s), so this phase lasts at least that long.

Every process started here (servers, optimizer, peers) is stopped by pid, also on failure,
and the temporary folder is removed (``--keep`` keeps it, with the logs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
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
from flywheel.stack.servers import _find_binary
from flywheel.stack.services import ServiceProcess, migrate
from flywheel.stack.stack import Servers

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "bench" / "results" / "feedback.json"

SCHEMA = "bench"
FLYWHEEL_NS = "bfly"
PEERS = {"raw_natspy": "braw", "faststream": "bfs"}  # peer -> its NATS namespace
ARMS = ("small", "large", "creative")
REWARDS = (0.0, 0.25, 0.5, 0.75, 1.0)  # exact in binary: sums compare exactly
DURABLE = "optimizer-feedback"

FULL = {"events": 200_000, "peer_events": 20_000, "crash_events": 30_000}
QUICK = {"events": 20_000, "peer_events": 3_000, "crash_events": 6_000}
EVENTS_PER_DECISION = 4
CRASH_DUPLICATE_FRACTION = 0.1
GOALS = {"flywheel_vs_raw_natspy": 0.8, "flywheel_vs_faststream": 3.0}

SELECT_BATCH = 1000  # the most SelectBatch takes
PUBLISH_IN_FLIGHT = 2000
POLL_S = 0.02
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


def cpu_seconds(pid: int | None) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except (psutil.Error, TypeError, ValueError):
        return math.nan


@dataclass
class Watch:
    """The first and last poll at which the applied count changed, with the consumer's CPU."""

    first_t: float | None = None
    first_n: int = 0
    last_t: float | None = None
    last_n: int = 0
    cpu: float = 0.0  # consumer CPU seconds between the first and the last change
    _cpu_mark: float = math.nan

    def rate(self) -> float:
        if self.first_t is None or self.last_t is None or self.last_t <= self.first_t:
            return math.nan
        return (self.last_n - self.first_n) / (self.last_t - self.first_t)

    def cpu_us_per_update(self) -> float:
        n = self.last_n - self.first_n
        return 1e6 * self.cpu / n if n > 0 else math.nan


async def watch(pool: asyncpg.Pool, endpoint: str, until: int, proc: Any, w: Watch | None = None) -> Watch:
    """Poll arm totals until ``until`` updates are applied. Fails if the consumer exits or
    nothing changes for STALL_S. A Watch passed in (the crash) continues across processes."""
    w = w or Watch()
    w._cpu_mark = math.nan  # a new process: its CPU counts from its first change
    seen = w.last_n
    last_change = time.monotonic()
    while True:
        n = await totals(pool, endpoint)
        now = time.monotonic()
        if n != seen:
            cpu = cpu_seconds(proc.pid)
            if w.first_t is None:
                w.first_t, w.first_n = now, n
            elif not math.isnan(w._cpu_mark):
                w.cpu += cpu - w._cpu_mark
            w._cpu_mark = cpu
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
        proc = Optimizer(env=self.env(FLYWHEEL_NS), log_dir=self.root / "services" / FLYWHEEL_NS)
        self.procs.append(proc)
        return proc

    def peer(self, kind: str) -> PeerProcess:
        env = {**self.env(PEERS[kind]), "BENCH_DURABLE": durable_of(kind)}
        proc = PeerProcess(kind, env, self.root / "services")
        self.procs.append(proc)
        return proc

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
        migrate("optimizer", self.env(FLYWHEEL_NS))
        dsn = self.servers.database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, server_settings={"search_path": SCHEMA})
        nats_server = self.servers.nats
        nc = await nats.connect(nats_server.url, user=nats_server.user, password=nats_server.password)
        try:
            self.postgres_version = await pool.fetchval("SHOW server_version")
            await self._run(pool, nc.jetstream())
        finally:
            await nc.close()
            await pool.close()
        self.figures["seconds"] = round(time.perf_counter() - started, 1)

    async def _run(self, pool: asyncpg.Pool, js: Any) -> None:
        p = self.params
        wanted = {
            "bench-flywheel": decisions_for(p["events"]),
            **{f"bench-{kind}": decisions_for(p["peer_events"]) for kind in PEERS},
            "bench-crash": decisions_for(p["crash_events"]),
        }
        started = time.perf_counter()
        optimizer = self.optimizer()
        optimizer.start()
        optimizer.wait_serving(60)
        decisions = await make_decisions(optimizer.address, pool, wanted)
        optimizer.stop()
        made = sum(len(v) for v in decisions.values())
        self.figures["decisions"] = {"made_by_select_batch": made, "seconds": round(time.perf_counter() - started, 1)}
        log(f"{made:,} decisions through SelectBatch in {self.figures['decisions']['seconds']} s")

        for ns in (FLYWHEEL_NS, *PEERS.values()):
            cat = Catalogue(ns)
            await ensure_stream(js, cat.streams[cat.consumer(DURABLE).stream])

        throughput: dict[str, Any] = {}
        work = make_workload("bench-flywheel", decisions["bench-flywheel"], p["events"], "fly", self.rng)
        throughput["flywheel"] = await self._drain(pool, js, work, FLYWHEEL_NS, DURABLE, self.optimizer())
        for kind, ns in PEERS.items():
            endpoint = f"bench-{kind}"
            work = make_workload(endpoint, decisions[endpoint], p["peer_events"], kind, self.rng)
            throughput[kind] = await self._drain(pool, js, work, ns, durable_of(kind), self.peer(kind))
        self.figures["throughput"] = throughput

        self.figures["crash"] = await self._crash(pool, js, decisions["bench-crash"])

    async def _drain(
        self, pool: asyncpg.Pool, js: Any, work: Workload, ns: str, durable: str, proc: Any
    ) -> dict[str, Any]:
        name = work.endpoint
        pub = await publish(js, Catalogue(ns).feedback(work.endpoint), work.messages)
        proc.start()
        w = await watch(pool, work.endpoint, work.distinct, proc)
        await wait_drained(js, ns, durable)
        checks = await verify(pool, work)
        proc.stop()
        result = {
            "updates_per_s": round(w.rate(), 1),
            "seconds_first_to_last_update": round((w.last_t or 0) - (w.first_t or 0), 2),
            "consumer_cpu_us_per_update": round(w.cpu_us_per_update(), 1),
            "publish": pub,
            **checks,
        }
        log(f"{name}: {result['updates_per_s']:,.0f} updates/s, exactly once: {checks['exactly_once']}")
        return result

    async def _crash(self, pool: asyncpg.Pool, js: Any, decisions: list[tuple[str, str]]) -> dict[str, Any]:
        n = self.params["crash_events"]
        work = make_workload("bench-crash", decisions, n, "crash", self.rng, CRASH_DUPLICATE_FRACTION)
        before = (await consumer_state(js, FLYWHEEL_NS, DURABLE)).delivered
        pub = await publish(js, Catalogue(FLYWHEEL_NS).feedback(work.endpoint), work.messages)
        first = self.optimizer()
        first.start()
        w = await watch(pool, work.endpoint, work.distinct // 3, first)
        first.kill()
        killed_at = time.monotonic()
        at_kill = await totals(pool, work.endpoint)
        unacked = (await consumer_state(js, FLYWHEEL_NS, DURABLE)).num_ack_pending
        log(f"crash: SIGKILLed the optimizer at {at_kill:,}/{work.distinct:,} applied, {unacked} messages unacked")
        second = self.optimizer()
        second.start()
        w = await watch(pool, work.endpoint, work.distinct, second, w)
        after = (await wait_drained(js, FLYWHEEL_NS, DURABLE)).delivered
        # Deliveries beyond one per stored message: what the killed process held came back.
        redelivered = (after.consumer_seq - before.consumer_seq) - (after.stream_seq - before.stream_seq)
        checks = await verify(pool, work)
        second.stop()
        log(f"crash: lost {checks['lost']}, double counted {checks['double_counted']}")
        ack_wait_s = Catalogue(FLYWHEEL_NS).consumer(DURABLE).ack_wait.total_seconds()
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


def durable_of(kind: str) -> str:
    return f"bench-{kind.replace('_', '-')}"


# --- report ----------------------------------------------------------------------------------


def machine(postgres_version: str) -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nats_version = subprocess.run(
            [_find_binary("nats-server"), "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, FileNotFoundError):
        nats_version = "unknown"
    packages = {}
    for pkg in ("nats-py", "asyncpg", "sqlalchemy", "faststream", "grpcio", "protobuf"):
        try:
            packages[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            packages[pkg] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "nats_server": nats_version,
        "postgresql": postgres_version,
        "packages": packages,
    }


def render(result: dict[str, Any]) -> str:
    f, p = result["figures"], result["params"]
    lines = [
        f"feedback: {p['events']:,} events to Flywheel, {p['peer_events']:,} to each peer, "
        f"{p['events_per_decision']} events per decision ({f['decisions']['made_by_select_batch']:,} decisions "
        f"via SelectBatch in {f['decisions']['seconds']} s)",
        "",
        f"{'consumer':<22}{'events':>8}{'dup msgs':>9}{'applied':>9}{'seconds':>9}{'updates/s':>11}"
        f"{'CPU us/upd':>11}{'lost':>6}{'double':>7}  exactly once",
    ]
    rows = [(k, v) for k, v in f["throughput"].items()] + [("flywheel kill -9", f["crash"])]
    for name, r in rows:
        rate = f"{r['updates_per_s']:,.0f}" if "updates_per_s" in r else "-"
        cpu = f"{r['consumer_cpu_us_per_update']:,.0f}" if "consumer_cpu_us_per_update" in r else "-"
        secs = r.get("seconds_first_to_last_update", r.get("seconds_kill_to_last_update"))
        lines.append(
            f"{name:<22}{r['distinct_events']:>8,}{r['duplicate_messages']:>9,}{r['applied_updates']:>9,}"
            f"{secs:>9}{rate:>11}{cpu:>11}{r['lost']:>6}{r['double_counted']:>7}"
            f"  {'yes' if r['exactly_once'] else 'NO'}"
        )
    c = f["crash"]
    lines += [
        "",
        f"kill -9 at {c['applied_when_killed']:,}/{c['distinct_events']:,} applied with {c['unacked_when_killed']} "
        f"messages unacked; {c['redelivered_messages']} redelivered"
        + (
            f" (all {c['redeliveries_dropped_by_dedup']} dropped by the dedup: every event was applied before"
            " ack_wait let them come back)"
            if c["redeliveries_dropped_by_dedup"]
            else ""
        )
        + f"; last update {c['seconds_kill_to_last_update']} s "
        f"after the kill (ack_wait {c['ack_wait_s']:.0f} s); expected reward sum {c['expected_reward_sum']}, "
        f"in PostgreSQL {c['applied_reward_sum']}",
        "",
        f"{'ratio':<28}{'value':>8}{'goal':>8}  met",
    ]
    for name, value in result["ratios"].items():
        goal = result["goals"][name]
        lines.append(f"{name:<28}{value:>8.2f}{goal:>8.2f}  {'yes' if value >= goal else 'NO'}")
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
    fly = f["throughput"]["flywheel"]["updates_per_s"]
    ratios = {f"flywheel_vs_{k}": round(fly / f["throughput"][k]["updates_per_s"], 3) for k in PEERS}
    f["lost"] = f["crash"]["lost"]
    f["double_counted"] = f["crash"]["double_counted"]
    f["goals_met"] = {
        **{k: bool(ratios[k] >= v) for k, v in GOALS.items()},
        "crash_exactly_once": bool(f["crash"]["exactly_once"]),
        "all_exactly_once": all(r["exactly_once"] for r in f["throughput"].values()),
    }
    result = {
        "name": "feedback",
        "machine": machine(run.postgres_version),
        "params": {
            "quick": args.quick,
            "seed": args.seed,
            **params,
            "events_per_decision": EVENTS_PER_DECISION,
            "crash_duplicate_fraction": CRASH_DUPLICATE_FRACTION,
            "flywheel": "python -m flywheel.optimizer",
            "publish_in_flight": PUBLISH_IN_FLIGHT,
            "poll_interval_s": POLL_S,
            "peer_fetch_batch": 256,
            "faststream_pool": 10,
            "rate": "updates applied between the first and the last poll at which the count changed, over that time",
        },
        "figures": f,
        "ratios": ratios,
        "goals": GOALS,
    }
    print(render(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
