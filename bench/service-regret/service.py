"""The service side: real NATS, PostgreSQL and S3, optimizer replicas as real processes, and a
product that plays a world through the SDK (``select()``, then ``feedback_nowait()``).

One endpoint per run, created through the admin API with the world's policy. Decision t is
sent to replica ``t % replicas`` (the SDK takes one target, so there is one client per
replica; every client publishes its feedback on the same JetStream stream, which the
replicas' shared durable consumer splits between them). Paced runs start decision t at
``t / rate`` seconds; unpaced runs start decisions as fast as the client goes. Both keep at
most ``in_flight`` Selects outstanding. A reward is queued as soon as its Select returns
(``delay`` 0) or once ``delay[t]`` more decisions have returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import re
import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from worlds import World

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.sdk import FlywheelClient
from flywheel.stack.services import ServiceProcess, migrate
from flywheel.stack.stack import Servers

NAMESPACE = "bsreg"
SCHEMA = "bench_service_regret"
SEGMENT_KEY = "seg"
BOUNCES = "flywheel_optimizer_feedback_bounces_total"
# Drift settings the service may offer: decisions (issue 19) or seconds (older trees).
HALF_LIFE_DECISIONS = "half_life_decisions" in ep_pb.PolicySpec.DESCRIPTOR.fields_by_name


def log(*args: object) -> None:
    import sys

    print(*args, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Mode:
    """How the product drives the service: replicas, and a rate in decisions/s (None: unpaced)."""

    replicas: int
    rate: float | None
    in_flight: int

    @property
    def name(self) -> str:
        return f"{self.replicas}rep-{'paced' if self.rate else 'unpaced'}"


@dataclass
class RunResult:
    arms: np.ndarray
    seconds: float
    select_ms: np.ndarray
    bounces: float
    retries: float
    applied: int
    feedback_failed: int
    half_life: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.arms.shape[0] / self.seconds if self.seconds > 0 else float("nan")


def scrape(metrics_port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` whose labels include ``labels``."""
    total = 0.0
    for got_labels, value in re.findall(rf"^{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', got_labels or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


class Stack:
    """NATS, PostgreSQL and S3 under a temporary folder, and up to two optimizer replicas."""

    def __init__(self, keep: bool = False) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="flywheel-bench-service-regret-"))
        self.work.chmod(0o755)  # PostgreSQL's unprivileged system user must reach its data folder
        self.keep = keep
        self.servers = Servers.create(self.work / "stack")
        self.replicas: list[ServiceProcess] = []
        self.env: dict[str, str] = {}

    def start(self) -> None:
        self.servers.start()
        iso = {"namespace": NAMESPACE, "schema": SCHEMA, "bucket_prefix": NAMESPACE}
        self.env = {**self.servers.service_env("optimizer", **iso), "FLYWHEEL_OPTIMIZER_LOG_LEVEL": "WARNING"}
        migrate("optimizer", self.env)
        self.product = self.servers.env(**iso, nats_role="product")

    def scale(self, n: int) -> None:
        """Run exactly ``n`` replicas (starting or stopping the newest ones)."""
        while len(self.replicas) > n:
            self.replicas.pop().stop()
        while len(self.replicas) < n:
            proc = ServiceProcess("optimizer", env=self.env, log_dir=self.work / f"replica{len(self.replicas)}")
            proc.start()
            proc.wait_serving(90)
            self.replicas.append(proc)

    def counters(self) -> tuple[float, float]:
        """Feedback bounces and feedback retries counted by the running replicas so far."""
        bounces = retries = 0.0
        for proc in self.replicas:
            text = scrape(proc.metrics_port)
            bounces += metric_sum(text, BOUNCES)
            retries += metric_sum(text, "flywheel_events_total", consumer="optimizer-feedback", outcome="retry")
        return bounces, retries

    def clients(self) -> list[FlywheelClient]:
        return [
            FlywheelClient(
                target=proc.address,
                nats_url=self.product["FLYWHEEL_NATS_URL"],
                nats_user=self.product["FLYWHEEL_NATS_USER"],
                nats_password=self.product["FLYWHEEL_NATS_PASSWORD"],
                namespace=NAMESPACE,
                feedback_max_pending=100_000,
            )
            for proc in self.replicas
        ]

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.log_file}\n{p.log_tail(20)}" for p in self.replicas)

    def stop(self) -> None:
        for proc in reversed(self.replicas):
            with contextlib.suppress(Exception):
                proc.stop()
        self.replicas = []
        with contextlib.suppress(Exception):
            self.servers.stop()
        if self.keep:
            log(f"kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)


def endpoint_request(name: str, world: World, half_life: dict[str, float]) -> admin_pb.CreateEndpointRequest:
    arms = []
    for i in range(world.k):
        arm = ep_pb.Arm(arm_id=f"a{i}")
        arm.params.update({"i": i})
        arms.append(arm)
    bernoulli = world.reward == "bernoulli"
    policy = ep_pb.PolicySpec(
        kind=ep_pb.POLICY_KIND_THOMPSON_BETA if bernoulli else ep_pb.POLICY_KIND_THOMPSON_GAUSSIAN,
        segment_key=SEGMENT_KEY if world.segmented else "",
        **half_life,
    )
    return admin_pb.CreateEndpointRequest(
        endpoint=ep_pb.Endpoint(name=name, arms=arms, policy=policy, reward_spec=ep_pb.RewardSpec(bounded=bernoulli))
    )


def service_half_life(half_life_decisions: float, rate: float) -> dict[str, float]:
    """The endpoint's drift setting for a half-life of ``half_life_decisions``: in decisions when
    the service offers it, else in seconds at the expected ``rate`` (decisions/s)."""
    if half_life_decisions <= 0:
        return {}
    if HALF_LIFE_DECISIONS:
        return {"half_life_decisions": float(half_life_decisions)}
    return {"half_life_s": round(half_life_decisions / rate, 4)}


async def create_endpoint(stack: Stack, request: admin_pb.CreateEndpointRequest) -> None:
    async with grpc.aio.insecure_channel(stack.replicas[0].address) as channel:
        await admin_grpc.EndpointAdminServiceStub(channel).CreateEndpoint(request, timeout=30)
    # Every replica loads the new endpoint before the first decision (a Select on an unknown
    # endpoint loads it anyway; this keeps that first load out of the measured latencies).
    await asyncio.sleep(0.1)


async def wait_applied(stack: Stack, name: str, want: int, stall_s: float = 10.0) -> int:
    """Pulls applied to the endpoint, once they reach ``want`` or stop moving for ``stall_s``."""
    last, moved = -1, time.monotonic()
    async with grpc.aio.insecure_channel(stack.replicas[0].address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        while True:
            got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=name), timeout=10)
            n = int(sum(s.pulls for s in got.endpoint.stats))
            if n != last:
                last, moved = n, time.monotonic()
            if n >= want or time.monotonic() - moved > stall_s:
                return n
            await asyncio.sleep(0.2)


async def play_service(
    stack: Stack,
    world: World,
    mode: Mode,
    name: str,
    half_life: dict[str, float],
    published: dict[str, float] | None = None,
) -> RunResult:
    """Play ``world`` through the service on a new endpoint ``name``; every reward applied.
    ``published``, when given, gets each decision id's feedback publish time (``time.time()``)."""
    await create_endpoint(stack, endpoint_request(name, world, half_life))
    clients = stack.clients()
    horizon = world.horizon
    arms = np.full(horizon, -1, dtype=np.intp)
    select_ms = np.zeros(horizon)
    index = {f"a{i}": i for i in range(world.k)}
    pending: list[tuple[int, int, Any, FlywheelClient]] = []  # (publish once this many returned, t, ...)
    returned = 0
    slots = asyncio.Semaphore(mode.in_flight)
    failures: list[BaseException] = []

    async def one(t: int) -> None:
        nonlocal returned
        client = clients[t % len(clients)]
        context = {SEGMENT_KEY: f"s{world.segments[t]}"} if world.segmented else None
        try:
            t0 = time.perf_counter()
            decision = await client.select(name, user_id=f"u{t}", context=context, timeout_s=30)
            select_ms[t] = (time.perf_counter() - t0) * 1e3
            arm = index[decision.arm_id]
            arms[t] = arm
            returned += 1
            if world.delays[t] == 0:
                if published is not None:
                    published[decision.decision_id] = time.time()
                client.feedback_nowait(decision, reward=float(world.rewards[t, arm]))
            else:
                heapq.heappush(pending, (t + int(world.delays[t]) + 1, t, decision, client))
            while pending and pending[0][0] <= returned:
                _, s, d, c = heapq.heappop(pending)
                c.feedback_nowait(d, reward=float(world.rewards[s, arms[s]]))
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            failures.append(exc)
        finally:
            slots.release()

    before = stack.counters()
    tasks = []
    start = time.perf_counter()
    for t in range(horizon):
        if mode.rate:
            wait = start + t / mode.rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        await slots.acquire()
        if failures:
            break
        tasks.append(asyncio.create_task(one(t)))
    await asyncio.gather(*tasks)
    seconds = time.perf_counter() - start
    if failures:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()
        raise RuntimeError(f"{name}: a Select failed: {failures[0]!r}\n{stack.log_tail()}")
    while pending:  # the last rewards: their "more decisions" never come, publish them now
        _, s, d, c = heapq.heappop(pending)
        c.feedback_nowait(d, reward=float(world.rewards[s, arms[s]]))
    failed = 0
    for c in clients:
        failed += (await c.flush_feedback()).failed
        await c.close()
    applied = await wait_applied(stack, name, horizon)
    await asyncio.sleep(0.3)  # the last acks' counters
    after = stack.counters()
    return RunResult(
        arms=arms,
        seconds=seconds,
        select_ms=select_ms,
        bounces=after[0] - before[0],
        retries=after[1] - before[1],
        applied=applied,
        feedback_failed=failed,
        half_life=half_life,
    )
