"""Batch runs end to end on real servers: the optimizer's RunService and run driver, evaluators
on the work queue, a society proposal injected mid-run, and crashes (kill -9 of an evaluator
and of the optimizer) that lose no evaluation and count none twice."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import run_service_pb2 as pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as pb_grpc
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.society.v1.events_pb2 import PROPOSAL_SOURCE_EXTERNAL, ProposalEvent
from flywheel.api.subjects import Catalogue

pytestmark = pytest.mark.integration

QUESTIONS = [f"question number {i}" for i in range(6)]


def run_config(*, generations: int = 3, delay: tuple[float, float] = (0.0, 0.02)) -> dict:
    """The echo target repeats the question after ``prefix``: only the empty prefix matches the
    expected answer, so the best config is known. ``delay_s`` is a continuous parameter that
    costs latency (a small weight), so the search has something to trade."""
    return {
        "api": {"name": "echo", "kind": "python", "callable": "flywheel.evaluator.examples:echo"},
        "search_space": {
            "parameters": {
                "prefix": {"choices": ["", "A: ", "Answer: ", "Well, "]},
                "delay_s": {"type": "float", "min": delay[0], "max": delay[1], "step": 0.01},
            }
        },
        "evaluation": {
            "test_cases": {"inline": [{"id": f"q{i}", "input": q, "expected": q} for i, q in enumerate(QUESTIONS)]},
            "metrics": {"correct": {"type": "exact_match", "weight": 0.9}, "latency_ms": {"weight": 0.1}},
        },
        "optimization": {
            "seed": 3,
            "evolution": {"population": 4, "generations": generations, "elite": 1},
            "racing": {"min_cases": 2},
            "execution": {"parallel_workers": 4, "timeout_s": 10},
        },
    }


def struct(value: dict) -> Struct:
    out = Struct()
    out.update(value)
    return out


async def finished(stub, run_id: str, timeout_s: float = 120) -> list[runs_pb2.RunProgress]:
    seen = []
    async with asyncio.timeout(timeout_s):
        async for r in stub.WatchRun(pb.WatchRunRequest(run_id=run_id)):
            seen.append(r.progress)
    return seen


async def evaluation_rows(env: dict[str, str], schema: str, run_id: str) -> list[asyncpg.Record]:
    url = env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        return await conn.fetch(
            "SELECT e.candidate_id, e.test_case_id, c.origin, c.config::text AS config"
            " FROM run_evaluations e JOIN run_candidates c USING (run_id, candidate_id) WHERE run_id = $1",
            run_id,
        )
    finally:
        await conn.close()


async def test_a_run_finds_the_best_config_reports_it_and_takes_a_proposal(launch, nats_client, isolation):
    optimizer = launch("optimizer")
    launch("evaluator", env={"FLYWHEEL_EVALUATOR_CONCURRENCY": "4"})
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        stub = pb_grpc.RunServiceStub(channel)
        started = (await stub.StartRun(pb.StartRunRequest(config=struct(run_config(delay=(0.05, 0.1)))))).run
        assert started.state == runs_pb2.RUN_STATE_RUNNING and started.run_id

        # An outside proposer (the society) sends a config for the running generation.
        proposal = ProposalEvent(
            meta=EventMeta(event_id="p-1"),
            run_id=started.run_id,
            config=struct({"prefix": "", "delay_s": 0.05}),
            source=PROPOSAL_SOURCE_EXTERNAL,
        )
        await nats_client.jetstream().publish(
            Catalogue(isolation["namespace"]).society_proposal(started.run_id), proposal.SerializeToString()
        )

        progress = await finished(stub, started.run_id)
        assert progress[-1].state == runs_pb2.RUN_STATE_SUCCEEDED
        done = [p.evaluations_done for p in progress]
        assert done == sorted(done) and done[-1] > 0
        run = (await stub.GetRun(pb.GetRunRequest(run_id=started.run_id))).run
        assert run.best_config["prefix"] == "" and run.best_score > 0.9
        assert set(run.artifacts) == {"best_config.json", "detailed_results.json", "report.md", "report.html"}
        best = json.loads(
            (await stub.GetRunArtifact(pb.GetRunArtifactRequest(run_id=run.run_id, name="best_config.json"))).content
        )
        assert best["config"]["prefix"] == ""
        page = (await stub.GetRunArtifact(pb.GetRunArtifactRequest(run_id=run.run_id, name="report.html"))).content
        # best so far, distribution, one panel per parameter (prefix, delay_s), the Pareto front
        assert page.count(b"data:image/png;base64,") == 5
        listed = (await stub.ListRuns(pb.ListRunsRequest(limit=10))).runs
        assert [r.run_id for r in listed] == [run.run_id]

        # The run's history, as the society reads it: every candidate with its scores so far.
        history = await stub.ListRunCandidates(pb.ListRunCandidatesRequest(run_id=run.run_id))
        later = await stub.ListRunCandidates(pb.ListRunCandidatesRequest(run_id=run.run_id, min_generation=1))
    found = list(history.candidates)
    assert history.generation == run.generation
    assert [(c.generation, c.candidate_id) for c in found] == sorted((c.generation, c.candidate_id) for c in found)
    assert sum(c.cases_evaluated for c in found) == run.evaluations_done
    assert sum(c.cases_failed for c in found) == run.evaluations_failed
    assert all(0.0 <= c.mean_score <= 1.0 and c.cases_evaluated <= len(QUESTIONS) for c in found)
    generations = {c.generation for c in found}
    assert {c.origin for c in found} >= {"initial", "external"} and generations == set(range(max(generations) + 1))
    assert [c.candidate_id for c in later.candidates] == [c.candidate_id for c in found if c.generation >= 1]
    # the best config is a candidate whose mean matches the best score the run reports
    best = [c for c in found if json_format.MessageToDict(c.config) == json_format.MessageToDict(run.best_config)]
    assert best and any(abs(c.mean_score - run.best_score) < 1e-6 for c in best)

    rows = await evaluation_rows(optimizer.env, isolation["schema"], run.run_id)
    assert any(r["origin"] == "external" for r in rows), "the proposal was never evaluated"
    pairs = [(r["candidate_id"], r["test_case_id"]) for r in rows]
    assert len(pairs) == len(set(pairs))


async def test_bad_run_configs_get_invalid_argument_naming_the_field(launch):
    optimizer = launch("optimizer")
    bad = run_config()
    bad["search_space"]["parameters"]["delay_s"] = {"type": "float", "min": 1.0, "max": 0.1}
    bad["evaluation"]["metrics"]["odd"] = {"type": "telepathy"}
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        stub = pb_grpc.RunServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.StartRun(pb.StartRunRequest(config=struct(bad)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "search_space.parameters.delay_s" in err.value.details()
        assert "evaluation.metrics.odd" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetRun(pb.GetRunRequest(run_id="run-nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        # Test-case augmentation: bad settings are named; good ones give the run its variants.
        augmented = run_config()
        augmented["evaluation"]["test_cases"]["augmentation"] = {"enabled": True, "mutation_rate": 2}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.StartRun(pb.StartRunRequest(config=struct(augmented)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "evaluation.test_cases.augmentation.mutation_rate" in err.value.details()
        augmented["evaluation"]["test_cases"]["augmentation"] = {"enabled": True, "augmentation_factor": 1}
        run = (await stub.StartRun(pb.StartRunRequest(config=struct(augmented)))).run
        await stub.CancelRun(pb.CancelRunRequest(run_id=run.run_id))
        progress = await finished(stub, run.run_id, timeout_s=30)
        # The budget: population 4 x 3 generations x (6 cases + 6 variants).
        assert progress[-1].evaluations_total == 4 * 3 * 12


async def test_kill_9_of_an_evaluator_and_of_the_optimizer_mid_run(launch, isolation):
    """Every (candidate, test case) the search asked for is evaluated once: none lost with the
    killed evaluator's unacked requests, none counted twice after the optimizer's restart."""
    fast_redelivery = {"FLYWHEEL_EVALUATOR_CONCURRENCY": "2", "FLYWHEEL_EVALUATOR_ACK_WAIT_S": "2"}
    optimizer = launch("optimizer")
    victim = launch("evaluator", env={**fast_redelivery, "FLYWHEEL_EVALUATOR_REPLICA_ID": "victim"})
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        stub = pb_grpc.RunServiceStub(channel)
        config = run_config(generations=3, delay=(0.1, 0.2))
        run_id = (await stub.StartRun(pb.StartRunRequest(config=struct(config)))).run.run_id
        deadline = time.monotonic() + 60
        while (await stub.GetRun(pb.GetRunRequest(run_id=run_id))).run.generation < 1:
            assert time.monotonic() < deadline, "the run did not reach its second generation"
            await asyncio.sleep(0.2)
    victim.kill()
    launch("evaluator", env={**fast_redelivery, "FLYWHEEL_EVALUATOR_REPLICA_ID": "survivor"})
    optimizer.kill()
    optimizer.start()
    optimizer.wait_serving()
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        stub = pb_grpc.RunServiceStub(channel)
        progress = await finished(stub, run_id, timeout_s=150)
        assert progress[-1].state == runs_pb2.RUN_STATE_SUCCEEDED
        run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id))).run
        detailed = json.loads(
            (await stub.GetRunArtifact(pb.GetRunArtifactRequest(run_id=run_id, name="detailed_results.json"))).content
        )
    rows = await evaluation_rows(optimizer.env, isolation["schema"], run_id)
    pairs = [(r["candidate_id"], r["test_case_id"]) for r in rows]
    assert len(pairs) == len(set(pairs))
    # The search counted exactly the stored evaluations: nothing lost, nothing twice.
    assert progress[-1].evaluations_done == len(rows) == len(detailed["evaluations"])
    assert run.best_config["prefix"] == ""
