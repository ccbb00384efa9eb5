"""The kill drill: the story's hooks that kill -9 each service once, mid-work, and restart it.

At each of the story's ``POINTS`` a stage stops and awaits ``StoryHooks.reached``; the drill
then SIGKILLs the services its plan names for that point (no drain, no flush, no ack), keeps
them down ``restart_delay_s``, starts each again on the same ports and waits until it is
SERVING. A ``background`` service is started again ``background_down_s`` later while the stage
goes on, so its events pile up on the bus while it is dead. What the services hold at that
moment is what the drill exercises:

====================  ==================  =====================================================
point                 killed              what it holds when it dies
====================  ==================  =====================================================
optimize.sao_running  reward_judge        the SAO round's Rank calls (when its policy model's
                                          self-ranking gave pairs to judge)
                      optimizer           the batch run's search state and its evaluation
                                          requests in flight; results arriving while it is
                                          dead wait on the bus
optimize.running      evaluator           evaluation requests taken, not answered (redelivered
                                          after the consumer's ack wait, 8 s in the story)
                      society             an RLP step thinking on a run-progress event, the SAO
                                          round running (requeued by the sweep)
traffic.halfway       trace_store         (background, 3 s) decisions, feedback and spans
                                          published while it is dead, and those it had taken
                                          (redelivered after its ack wait, 8 s in the story)
training.running      trainer             the DPO job it claimed (its message unacked:
                                          redelivered after the trainer's ack wait)
====================  ==================  =====================================================

The optimizer is not killed during traffic: its decision log is written every 20 ms
(``decisions.py``: Select never waits for PostgreSQL), so a kill -9 within that window of a
Select loses a decision the product already holds, and that decision's feedback is then
dead-lettered as "never logged": a trade-off the optimizer documents, that the story's traffic
stage would report as feedback never applied. ``grace_s`` (seconds between the point and a
service's kill) lets a plan kill it there past that window (e.g. ``{"optimizer": 0.5}``).

Each service is killed exactly once (``KillDrill`` refuses a plan that names one twice or
misses one); ``kills`` records what happened (``Kill``), ``missed()`` the services whose
point the story never reached. Restarts run in threads, so a stage's background tasks (a
feedback queue, a tracer's flush) keep going through the outage.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import nats

from flywheel.api.subjects import ROLES, Catalogue
from flywheel.stack.services import SERVICES, ServiceProcess, health_status
from flywheel.stack.story.context import POINTS, StoryContext

DEFAULT_PLAN: dict[str, tuple[str, ...]] = {
    "optimize.sao_running": ("reward_judge", "optimizer"),
    "optimize.running": ("evaluator", "society"),
    "traffic.halfway": ("trace_store",),
    "training.running": ("trainer",),
}
# Services the stage does not call while it goes on (the product publishes spans, decisions
# and feedback to JetStream, not to the trace store): down for a while as traffic flows.
DEFAULT_BACKGROUND = frozenset({"trace_store"})
# Seconds between the point and a service's kill, by service (see the module docstring).
DEFAULT_GRACE_S: dict[str, float] = {}


@dataclass(frozen=True)
class Kill:
    """One kill -9 and its restart. Times are seconds since the drill's first kill."""

    point: str
    service: str
    pid_before: int
    pid_after: int
    exit_code: int | None  # -9 when the kill was what ended it
    killed_at_s: float
    serving_at_s: float  # SERVING again (health check) this long after the first kill
    down_s: float  # from SIGKILL to SERVING
    status_after: str  # the health status when the drill moved on ("SERVING")
    # The service's JetStream consumers just before the kill: {durable: {"ack_pending": taken
    # but not acked (dies with it), "pending": not delivered yet}}; {} for a bus-less service.
    in_flight: dict[str, dict[str, int]]
    # The same just before it was started again: what arrived for it while it was dead.
    queued_while_down: dict[str, dict[str, int]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_plan(plan: Mapping[str, tuple[str, ...]]) -> None:
    """Every service once, at points the story has; ``ValueError`` naming what is wrong."""
    named: list[str] = []
    for point, services in plan.items():
        if point not in POINTS:
            raise ValueError(f"plan: unknown point {point!r}; one of {POINTS}")
        for service in services:
            if service not in SERVICES:
                raise ValueError(f"plan[{point!r}]: unknown service {service!r}; one of {SERVICES}")
            named.append(service)
    twice = sorted({s for s in named if named.count(s) > 1})
    missing = [s for s in SERVICES if s not in named]
    if twice or missing:
        raise ValueError(f"plan: every service exactly once (twice: {twice}, never: {missing})")


class KillDrill:
    """``StoryHooks`` that kill -9 and restart services at the story's points (see module doc).

    ``restart_delay_s``: how long a killed service stays down before it is started again (the
    clients' retries and the bus's redelivery see an outage this long plus the start-up).
    ``serving_timeout_s``: how long a restarted service may take to report SERVING.
    ``grace_s``: seconds to wait after the point before killing a service (by name).
    ``background``: services whose outage the stage goes on through: ``reached`` returns once
    they are dead, and they are started again ``background_down_s`` later while the stage keeps
    producing their events (await ``settled()`` before reading ``kills``)."""

    def __init__(
        self,
        plan: Mapping[str, tuple[str, ...]] | None = None,
        *,
        restart_delay_s: float = 0.5,
        serving_timeout_s: float = 90.0,
        grace_s: Mapping[str, float] | None = None,
        background: frozenset[str] = DEFAULT_BACKGROUND,
        background_down_s: float = 3.0,
    ) -> None:
        self.plan = dict(DEFAULT_PLAN if plan is None else plan)
        check_plan(self.plan)
        self.grace_s = dict(DEFAULT_GRACE_S if grace_s is None else grace_s)
        self.restart_delay_s = restart_delay_s
        self.serving_timeout_s = serving_timeout_s
        self.background = background
        self.background_down_s = background_down_s
        self.kills: list[Kill] = []
        self.reached_points: list[str] = []
        self._t0: float | None = None
        self._pending: list[asyncio.Task[None]] = []
        self._down: list[str] = []

    async def reached(self, point: str, ctx: StoryContext) -> None:
        self.reached_points.append(point)
        await self.settled()  # one outage at a time
        names = [s for s in self.plan.get(point, ()) if s not in self.killed()]
        if not names:
            return
        ctx.progress.say(f"kill drill at {point}: kill -9 {', '.join(names)}")
        grace = max((self.grace_s.get(name, 0.0) for name in names), default=0.0)
        if grace:
            await asyncio.sleep(grace)
        now = [n for n in names if n not in self.background]
        later = [n for n in names if n in self.background]
        if now:
            await self._outage(point, ctx, now, self.restart_delay_s)
        if later:
            self._pending.append(asyncio.create_task(self._outage(point, ctx, later, self.background_down_s)))
            await asyncio.sleep(0)  # the task has killed them when ``reached`` returns

    async def settled(self) -> None:
        """Wait for the restarts still running in the background (raises what they raised)."""
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)

    async def _outage(self, point: str, ctx: StoryContext, names: list[str], down_s: float) -> None:
        """Kill ``names`` at once, keep them down ``down_s``, start them again, record it."""
        in_flight = {name: await bus_backlog(ctx, name) for name in names}
        killed = [self._kill(point, ctx.stack.services[name]) for name in names]
        await asyncio.sleep(down_s)
        queued = {name: await bus_backlog(ctx, name) for name in names}
        kills = await asyncio.gather(
            *(asyncio.to_thread(self._restart, *k, in_flight[k[1].name], queued[k[1].name]) for k in killed)
        )
        self.kills.extend(kills)
        for kill in kills:
            ctx.progress.say(
                f"kill drill: {kill.service} pid {kill.pid_before} -> {kill.pid_after}, down {kill.down_s:.1f}s"
            )

    def killed(self) -> list[str]:
        """Services killed so far (restarted or, in the background, being restarted)."""
        return [k.service for k in self.kills] + [n for n in self._dying]

    def missed(self) -> list[str]:
        """Services the plan names that were not killed (their point was never reached)."""
        done = set(self.killed())
        return [s for services in self.plan.values() for s in services if s not in done]

    def to_dict(self) -> dict[str, Any]:
        return {"plan": {p: list(s) for p, s in self.plan.items()}, "kills": [k.to_dict() for k in self.kills]}

    def _now(self) -> float:
        if self._t0 is None:
            self._t0 = time.monotonic()
        return time.monotonic() - self._t0

    @property
    def _dying(self) -> list[str]:
        restarted = {k.service for k in self.kills}
        return [n for n in self._down if n not in restarted]

    def _kill(self, point: str, proc: ServiceProcess) -> tuple[str, ServiceProcess, int, float, int | None]:
        pid = proc.pid
        if pid is None:
            raise RuntimeError(f"kill drill at {point}: {proc.name} has no pid (not started?)")
        killed_at = self._now()
        os.kill(pid, signal.SIGKILL)
        self._down.append(proc.name)
        code = proc._wait(pid, 10.0)  # reaps our child (its exit code); None if it outlived SIGKILL
        if code is None:
            raise RuntimeError(f"kill drill at {point}: {proc.name} (pid {pid}) survived SIGKILL for 10 s")
        return point, proc, pid, killed_at, code

    def _restart(
        self,
        point: str,
        proc: ServiceProcess,
        pid: int,
        killed_at: float,
        code: int | None,
        in_flight: dict[str, dict[str, int]],
        queued: dict[str, dict[str, int]],
    ) -> Kill:
        proc.start()
        proc.wait_serving(self.serving_timeout_s)
        serving_at = self._now()
        after = proc.pid
        assert after is not None and after != pid, (proc.name, pid, after)
        return Kill(
            point=point,
            service=proc.name,
            pid_before=pid,
            pid_after=after,
            exit_code=code,
            killed_at_s=round(killed_at, 3),
            serving_at_s=round(serving_at, 3),
            down_s=round(serving_at - killed_at, 3),
            status_after=health_status(proc.address),
            in_flight=in_flight,
            queued_while_down=queued,
        )


async def bus_backlog(ctx: StoryContext, service: str) -> dict[str, dict[str, int]]:
    """What ``service``'s durable consumers hold right now (as the NATS admin sees them)."""
    durables = ROLES[service].consumes if service in ROLES and ROLES[service].uses_bus else ()
    if not durables:
        return {}
    env = ctx.stack.servers.env()
    catalogue = Catalogue(env["FLYWHEEL_NATS_NAMESPACE"])
    nc = await nats.connect(
        env["FLYWHEEL_NATS_URL"], user=env["FLYWHEEL_NATS_USER"], password=env["FLYWHEEL_NATS_PASSWORD"]
    )
    try:
        js = nc.jetstream()
        found: dict[str, dict[str, int]] = {}
        for durable in durables:
            info = await js.consumer_info(catalogue.consumer(durable).stream, durable)
            found[durable] = {"ack_pending": int(info.num_ack_pending or 0), "pending": int(info.num_pending or 0)}
        return found
    finally:
        await nc.close()
