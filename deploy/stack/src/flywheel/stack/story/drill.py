"""The kill drill: the story's hooks that kill -9 each service once, mid-work, and restart it.

At each of the story's ``POINTS`` a stage stops and awaits ``StoryHooks.reached``; the drill
then SIGKILLs the services its plan names for that point (no drain, no flush, no ack), waits
``restart_delay_s``, starts each again on the same ports and waits until it is SERVING. What
the services had in flight at that moment is what the drill exercises:

========================  ==================  ===============================================
point                     killed              in flight when it dies
========================  ==================  ===============================================
optimize.running          evaluator, society  evaluation requests taken but not answered;
                                              an RLP step thinking on a run-progress event
optimize.sao_running      reward_judge        the SAO round's Rank calls (both orders)
traffic.halfway           trace_store,        spans and decision/feedback events not yet
                          optimizer           acked; decisions in the optimizer's log buffer;
                                              the run's search state (the run has ended)
training.running          trainer             the DPO job stepping (its message unacked)
========================  ==================  ===============================================

One exception to "mid-work": the optimizer is killed ``grace_s["optimizer"]`` (0.5 s) after the
point, not at once. Its decision log is written every 20 ms (``decisions.py``: Select never
waits for PostgreSQL), so a kill -9 within that window of a Select loses the decision the
product already holds, and its feedback is then dead-lettered as "never logged": a trade-off
the optimizer documents, which the drill leaves alone (a drill that killed inside it would
fail on the documented loss, not on a bug). Feedback and trace events are still in flight.

Each service is killed exactly once (``KillDrill`` refuses a plan that names one twice or
misses one); ``kills`` records what happened (``Kill``), ``missed()`` the services whose
point the story never reached. The stage is paused while the drill works, but the event loop
is not: restarts run in threads, so a stage's background tasks (a feedback queue, a progress
watcher) keep going through the outage.
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
    "optimize.running": ("evaluator", "society"),
    "optimize.sao_running": ("reward_judge",),
    "traffic.halfway": ("trace_store", "optimizer"),
    "training.running": ("trainer",),
}
# Seconds between the point and a service's kill (see the module docstring): past the
# optimizer's decision-log flush interval (20 ms), with room for a slow flush on 2 cores.
DEFAULT_GRACE_S: dict[str, float] = {"optimizer": 0.5}


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
    ``grace_s``: seconds to wait after the point before killing a service (by name)."""

    def __init__(
        self,
        plan: Mapping[str, tuple[str, ...]] | None = None,
        *,
        restart_delay_s: float = 0.5,
        serving_timeout_s: float = 90.0,
        grace_s: Mapping[str, float] | None = None,
    ) -> None:
        self.plan = dict(DEFAULT_PLAN if plan is None else plan)
        check_plan(self.plan)
        self.grace_s = dict(DEFAULT_GRACE_S if grace_s is None else grace_s)
        self.restart_delay_s = restart_delay_s
        self.serving_timeout_s = serving_timeout_s
        self.kills: list[Kill] = []
        self.reached_points: list[str] = []
        self._t0: float | None = None

    async def reached(self, point: str, ctx: StoryContext) -> None:
        self.reached_points.append(point)
        names = [s for s in self.plan.get(point, ()) if s not in self.killed()]
        if not names:
            return
        ctx.progress.say(f"kill drill at {point}: kill -9 {', '.join(names)}")
        procs = [ctx.stack.services[name] for name in names]
        grace = max((self.grace_s.get(name, 0.0) for name in names), default=0.0)
        if grace:
            await asyncio.sleep(grace)
        backlog = {name: await bus_backlog(ctx, name) for name in names}
        started = [self._kill(point, proc) for proc in procs]
        await asyncio.sleep(self.restart_delay_s)
        kills = await asyncio.gather(*(asyncio.to_thread(self._restart, *s, backlog[s[1].name]) for s in started))
        self.kills.extend(kills)
        for kill in kills:
            ctx.progress.say(
                f"kill drill: {kill.service} pid {kill.pid_before} -> {kill.pid_after}, down {kill.down_s:.1f}s"
            )

    def killed(self) -> list[str]:
        return [k.service for k in self.kills]

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

    def _kill(self, point: str, proc: ServiceProcess) -> tuple[str, ServiceProcess, int, float, int | None]:
        pid = proc.pid
        if pid is None:
            raise RuntimeError(f"kill drill at {point}: {proc.name} has no pid (not started?)")
        killed_at = self._now()
        os.kill(pid, signal.SIGKILL)
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
