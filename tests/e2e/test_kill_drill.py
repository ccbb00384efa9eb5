"""The kill drill: the whole story (``StorySizes.e2e()``) on a fresh stack while each of the six
services is killed with SIGKILL once, mid-work, and restarted (``flywheel.stack.story.drill``).

The story still completes, and what it counts is what an undisturbed telling counts, none
twice: every decision the product got is logged once, every feedback event is applied once
(the posterior's pulls are the applied events, one per decision), the batch run evaluates each
(candidate, test case) once and its counters agree with its rows, the trace store holds each
decision and feedback event once, and training ends with one DPO job SUCCEEDED and one policy
version. Figures that depend on timing even without kills (how many evaluations racing makes,
how many decisions the canary needs) are checked by the invariant that holds, not by a number.

Run alone: ``.venv/bin/python -m pytest tests/e2e/test_kill_drill.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import asyncpg
import grpc
import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.subjects import Catalogue
from flywheel.stack.services import SERVICES, health_status
from flywheel.stack.stack import Stack
from flywheel.stack.story.context import QuietProgress, StorySizes
from flywheel.stack.story.drill import DEFAULT_PLAN, KillDrill, check_plan
from flywheel.stack.story.run import TRACE_STORE_ENV
from flywheel.trace_store.app import DURABLES as TRACE_STORE_DURABLES

SIZES = StorySizes.e2e()


def test_a_plan_kills_every_service_exactly_once() -> None:
    check_plan(DEFAULT_PLAN)
    with pytest.raises(ValueError, match=r"twice: \['optimizer'\]"):
        check_plan({**DEFAULT_PLAN, "canary.running": ("optimizer",)})
    with pytest.raises(ValueError, match=r"never: \['trainer'\]"):
        check_plan({p: s for p, s in DEFAULT_PLAN.items() if p != "training.running"})
    with pytest.raises(ValueError, match="unknown point 'nowhere'"):
        KillDrill({"nowhere": SERVICES})
    with pytest.raises(ValueError, match="unknown service 'database'"):
        check_plan({**DEFAULT_PLAN, "canary.running": ("database",)})


async def _rows(stack: Stack, sql: str, *args: object) -> list[asyncpg.Record]:
    url = stack.servers.database_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def _pulls(stack: Stack, endpoint: str) -> int:
    async with grpc.aio.insecure_channel(stack.services["optimizer"].address) as channel:
        got = await admin_grpc.EndpointAdminServiceStub(channel).GetEndpoint(
            admin_pb.GetEndpointRequest(name=endpoint), timeout=10
        )
    return sum(int(s.pulls) for s in got.endpoint.stats)


async def _ack_waits(stack: Stack, durables: tuple[str, ...]) -> dict[str, float]:
    """The ack wait (s) each durable consumer has on the NATS server now."""
    env = stack.servers.env()
    catalogue = Catalogue(env["FLYWHEEL_NATS_NAMESPACE"])
    nc = await nats.connect(
        env["FLYWHEEL_NATS_URL"], user=env["FLYWHEEL_NATS_USER"], password=env["FLYWHEEL_NATS_PASSWORD"]
    )
    try:
        js = nc.jetstream()
        return {
            d: float((await js.consumer_info(catalogue.consumer(d).stream, d)).config.ack_wait or 0) for d in durables
        }
    finally:
        await nc.close()


def _slowest_handling_s(stack: Stack, service: str) -> dict[str, float]:
    """Per consumer of ``service``, the upper bound of the bucket holding its slowest sampled
    batch handling (``flywheel_event_lag_seconds{stage="handle"}`` on its /metrics)."""
    text = httpx.get(f"http://127.0.0.1:{stack.services[service].metrics_port}/metrics", timeout=10).text
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "flywheel_event_lag_seconds_bucket" and sample.labels.get("stage") == "handle":
                buckets.setdefault(sample.labels["consumer"], []).append((float(sample.labels["le"]), sample.value))
    slowest = {}
    for consumer, counts in buckets.items():
        counts.sort()
        total = counts[-1][1]
        if total:
            slowest[consumer] = next(le for le, n in counts if n == total)
    return slowest


async def _until(read, ok, *, timeout_s: float = 90.0, interval_s: float = 0.5):
    """``read()`` once ``ok`` holds for it, or the last read after ``timeout_s`` (events a
    killed consumer held come back after its ack wait: 8 s for the story's trace store)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await read()
        if ok(got) or time.monotonic() > deadline:
            return got
        await asyncio.sleep(interval_s)


@pytest.mark.integration
@pytest.mark.timeout(1200)  # about 10 min on 2 shared cores: restarts under load, 8-10 s redeliveries
async def test_the_story_survives_a_kill_9_of_every_service() -> None:
    from flywheel.stack.story.run import start_story_stack, stop_story_stack, tell_story

    root = Path(tempfile.mkdtemp(prefix="flywheel-drill-"))  # outside pytest's tmp tree (PostgreSQL)
    progress = QuietProgress()
    drill = KillDrill()
    began = time.monotonic()
    stack, model = await asyncio.to_thread(start_story_stack, root, SIZES)
    try:
        try:
            record = await tell_story(stack, model, SIZES, progress=progress, hooks=drill)
            await drill.settled()
        except BaseException:
            print("\n".join(["story so far:", *progress.lines, f"drill: {drill.to_dict()}"]))
            raise
        seconds = time.monotonic() - began
        ep = "support-assistant"

        # Every service was killed once, by SIGKILL, at its point, and is SERVING again.
        assert sorted(drill.killed()) == sorted(SERVICES), (drill.to_dict(), progress.lines)
        assert not drill.missed()
        for kill in drill.kills:
            assert kill.exit_code == -9 and kill.pid_after != kill.pid_before, kill
            assert kill.status_after == "SERVING", kill
            assert kill.service in DEFAULT_PLAN[kill.point]
        killed = {k.service: k for k in drill.kills}
        assert killed["trainer"].in_flight["trainer-jobs"]["ack_pending"] == 1, killed["trainer"]  # held the job
        # The product went on while the trace store was dead: its events waited on the bus.
        assert sum(c["pending"] for c in killed["trace_store"].queued_while_down.values()) > 0, killed["trace_store"]
        for name, proc in stack.services.items():
            assert health_status(proc.address) == "SERVING", (name, proc.log_tail())
        # The trace store's short ack wait is still in force after every other service started
        # again (each declares the topology, the trace store's interest consumer included).
        ack_waits = await _ack_waits(stack, TRACE_STORE_DURABLES)
        assert set(ack_waits.values()) == {float(TRACE_STORE_ENV["FLYWHEEL_TRACE_STORE_ACK_WAIT_S"])}, ack_waits

        # Stage 1: the batch run ended; each (candidate, case) evaluated once, counted once.
        opt = record.optimize
        assert opt is not None and opt["state"] == "succeeded", opt
        evaluations = await _rows(
            stack,
            "SELECT candidate_id, test_case_id FROM run_evaluations WHERE run_id = $1",
            opt["run_id"],
        )
        pairs = [(r["candidate_id"], r["test_case_id"]) for r in evaluations]
        assert len(pairs) == len(set(pairs)) == opt["evaluations"], (len(pairs), opt["evaluations"])
        unanswered = await _rows(
            stack,
            "SELECT r.request_id FROM run_requests r LEFT JOIN run_evaluations e"
            " USING (run_id, candidate_id, test_case_id) WHERE r.run_id = $1 AND e.run_id IS NULL",
            opt["run_id"],
        )
        assert not unanswered, f"{len(unanswered)} evaluation requests of the run never answered"
        # Racing skips what a candidate no longer needs (scores include latency: how many it
        # skips depends on timing, killed or not); never more than the budget.
        assert 0 < opt["evaluations"] <= opt["evaluations_total"], opt

        # Stage 2 (and 4): every decision logged once; every feedback event applied once.
        traffic, canary = record.traffic, record.canary
        assert traffic is not None and canary is not None
        assert traffic["decisions"] == SIZES.traffic_decisions
        made = traffic["decisions"] + canary["decisions"]

        async def counts() -> tuple[int, int, int, int, int]:
            logged = await _rows(stack, "SELECT count(*) AS n FROM decisions WHERE endpoint = $1", ep)
            applied = await _rows(
                stack,
                "SELECT count(*) AS n, count(DISTINCT f.decision_id) AS d FROM applied_feedback f"
                " JOIN decisions d USING (decision_id) WHERE d.endpoint = $1",
                ep,
            )
            traced = await _rows(stack, "SELECT count(*) AS n FROM decision_log WHERE endpoint = $1", ep)
            fed = await _rows(stack, "SELECT count(*) AS n FROM feedback_log")
            return (
                logged[0]["n"],
                applied[0]["n"],
                applied[0]["d"],
                traced[0]["n"],
                fed[0]["n"],
            )

        logged, applied, applied_decisions, traced, fed = await _until(
            counts, lambda c: c[0] == c[1] == c[3] == c[4] == made
        )
        pulls = await _pulls(stack, ep)
        figures = {
            "made": made,
            "logged": logged,
            "applied": applied,
            "applied_decisions": applied_decisions,
            "pulls": pulls,
            "trace_store_decisions": traced,
            "trace_store_feedback": fed,
            "traffic": {k: traffic.get(k) for k in ("decisions", "feedback_sent", "feedback_applied", "traces")},
            "canary_decisions": canary["decisions"],
        }
        assert logged == made, figures  # no decision lost with the optimizer's buffer
        assert applied == applied_decisions == made, figures  # one event per decision, applied once
        assert pulls == applied, figures  # the posterior counted each applied event once
        assert traffic["feedback_applied"] == traffic["feedback_sent"] == SIZES.traffic_decisions, figures
        assert traced == made, figures  # the trace store's decision log: each once
        assert fed == applied, figures  # and its feedback log

        # Stage 3: one job, one version, even though the trainer died while running it.
        training = record.training
        assert training is not None and training["job_state"] == "JOB_STATE_SUCCEEDED", training
        jobs = await _rows(stack, "SELECT job_id, state, attempts FROM training_jobs")
        assert [(j["job_id"], j["state"]) for j in jobs] == [(training["job_id"], "succeeded")], jobs
        assert jobs[0]["attempts"] >= 2, "the trainer was killed while running the job: a second pick-up"
        versions = await _rows(stack, "SELECT name, version, job_id FROM policies")
        assert [(v["name"], v["version"], v["job_id"]) for v in versions] == [
            (training["policy_name"], 1, training["job_id"])
        ], versions
        assert training["version"] == 1, training
        assert canary["decision"] in ("promoted", "rolled_back", "undecided")

        kills = [
            f"{k.service}@{k.point} down {k.down_s:.1f}s held {k.in_flight} queued {k.queued_while_down}"
            for k in drill.kills
        ]
        print(
            f"\nkill drill: {seconds:.0f}s; "
            + "\n".join(kills)
            + f"\nfigures: {figures}; evaluations {len(pairs)}; job attempts {jobs[0]['attempts']}"
            + f"\nstages {record.meta['stage_seconds']}"
            + f"\ntrace store ack waits {ack_waits}; slowest batch handled within "
            + f"{_slowest_handling_s(stack, 'trace_store')} s\n"
            + "\n".join(progress.lines)
        )
    finally:
        await asyncio.to_thread(stop_story_stack, stack, model)
        shutil.rmtree(root, ignore_errors=True)
