"""RLP on real servers: a batch run with ``society.learning.rlp_enabled`` (optimizer, evaluator,
society as processes). Before each generation the society's reasoning model writes two
thoughts with score predictions; the best-predicted configs go to the run as proposals, which
the optimizer races (candidates of origin ``rlp`` in ListRunCandidates); once the results are
in, each thought gets a numeric information-gain reward from the log-probabilities of the
real local model server (SmolLM2-135M-Instruct when installed), stored in the experience
buffer and shown by GetStats.

The reasoning *text* comes from a scripted OpenAI-compatible server: a 135M model does not
write the JSON thoughts reliably, and this test is about the loop. Only the text is scripted;
the rewards are the real model server's log-probabilities of the observed outcome."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time

import asyncpg
import grpc
import httpx
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.common.v1.common_pb2 import DeadLetter
from flywheel.api.optimizer.v1 import run_service_pb2 as pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as pb_grpc
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.society.v1 import society_service_pb2 as society_pb
from flywheel.api.society.v1 import society_service_pb2_grpc as society_grpc
from flywheel.api.subjects import Catalogue

from .sao_stubs import Stub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUESTIONS = [f"question number {i}" for i in range(4)]
DELAYS = [round(0.4 + 0.01 * i, 2) for i in range(11)]  # the delay_s grid


def run_config() -> dict:
    """The echo target (only the empty prefix answers right); evaluations take 0.4-0.5 s, two at
    a time, so a generation lasts seconds: long enough for the society's proposals to join it."""
    return {
        "api": {"name": "echo", "kind": "python", "callable": "flywheel.evaluator.examples:echo"},
        "search_space": {
            "parameters": {
                "prefix": {"choices": ["", "A: ", "Answer: ", "Well, "]},
                "delay_s": {"type": "float", "min": 0.4, "max": 0.5, "step": 0.01},
            }
        },
        "evaluation": {
            "test_cases": {"inline": [{"id": f"q{i}", "input": q, "expected": q} for i, q in enumerate(QUESTIONS)]},
            "metrics": {"correct": {"type": "exact_match", "weight": 0.9}, "latency_ms": {"weight": 0.1}},
        },
        "optimization": {
            "seed": 5,
            "evolution": {"population": 4, "generations": 3, "elite": 1},
            "racing": {"min_cases": 2},
            "execution": {"parallel_workers": 2, "timeout_s": 10},
        },
        "society": {
            "enabled": True,
            "proposals_per_generation": 2,
            "learning": {"rlp_enabled": True, "rlp": {"num_thoughts": 2, "thought_length": 256}},
        },
    }


def prop(prefix: str, delay: float, predicted: float, sigma: float) -> dict:
    return {"params": {"prefix": prefix, "delay_s": delay}, "predicted_score": predicted, "sigma": sigma}


def reasoning_answers():
    """Two thoughts per call, each proposing one config not tried before (the delay grid, in
    turn); both are among the best predicted, so both are sent and both thoughts are rewarded."""
    delays = itertools.cycle(DELAYS)

    def answer(prompt: str) -> str:
        a, b = next(delays), next(delays)
        return json.dumps(
            {
                "thoughts": [
                    {
                        "thought": "Only the empty prefix repeats the question; the shortest delay costs least.",
                        "proposals": [prop("", a, 0.95, 0.05)],
                    },
                    {
                        "thought": "A prefix such as 'A: ' might read better to the metric.",
                        "proposals": [
                            {"params": {"prefix": "A: ", "delay_s": b}, "predicted_score": 0.9, "sigma": 0.2}
                        ],
                    },
                ]
            }
        )

    return answer


def struct(value: dict) -> Struct:
    out = Struct()
    out.update(value)
    return out


async def society_rows(env: dict[str, str], schema: str, sql: str, *args: object) -> list[asyncpg.Record]:
    url = env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def dead_letters(nats_client, isolation: dict[str, str]) -> list[str]:
    """Reasons of the dead letters of the society's consumer and the optimizer's proposals."""
    catalogue, js, out = Catalogue(isolation["namespace"]), nats_client.jetstream(), []
    stream = f"{isolation['namespace'].upper()}_DEADLETTER"
    for durable in ("society-run-progress", "optimizer-proposals"):
        sub = await js.pull_subscribe(catalogue.dead_letter(durable), stream=stream)
        try:
            for msg in await sub.fetch(20, timeout=1.0):
                letter = DeadLetter()
                letter.ParseFromString(msg.data)
                out.append(f"{durable}: {letter.reason}")
        except TimeoutError:
            pass
    return out


async def test_rlp_thoughts_proposals_raced_and_information_gain_rewards(
    launch, model_server, isolation, nats_client
) -> None:
    headers = {"Authorization": f"Bearer {model_server.api_key}"}
    async with httpx.AsyncClient(headers=headers, timeout=10) as client:
        served = (await client.get(f"{model_server.url}/models")).json()["data"][0]["id"]
    reasoning = await Stub(reasoning_answers()).start()
    try:
        optimizer = launch("optimizer")
        launch("evaluator", env={"FLYWHEEL_EVALUATOR_CONCURRENCY": "2"})
        society = launch(
            "society",
            env={
                "FLYWHEEL_LLM_MODEL": f"openai/{served}",
                "FLYWHEEL_LLM_API_BASE": reasoning.url,
                "FLYWHEEL_LLM_API_KEY": "sk-scripted",
                "FLYWHEEL_LLM_TIMEOUT_S": "10",
                "FLYWHEEL_SOCIETY_OPTIMIZER_ADDRESS": optimizer.address,
                "FLYWHEEL_SOCIETY_MODELSERVER_URL": model_server.url,
                "FLYWHEEL_SOCIETY_MODELSERVER_API_KEY": model_server.api_key,
            },
        )
        # LiteLLM takes seconds to import; the run starts once the society can think.
        deadline = time.monotonic() + 60
        while "reasoning model client ready" not in society.log_file.read_text():
            assert time.monotonic() < deadline, society.log_file.read_text()[-2000:]
            await asyncio.sleep(0.2)
        started_at = time.monotonic()
        async with grpc.aio.insecure_channel(optimizer.address) as channel:
            runs = pb_grpc.RunServiceStub(channel)
            run = (await runs.StartRun(pb.StartRunRequest(config=struct(run_config())))).run
            async with asyncio.timeout(120):
                async for r in runs.WatchRun(pb.WatchRunRequest(run_id=run.run_id)):
                    last = r.progress
            assert last.state == runs_pb2.RUN_STATE_SUCCEEDED
            history = await runs.ListRunCandidates(pb.ListRunCandidatesRequest(run_id=run.run_id))
        raced = [c for c in history.candidates if c.origin == "rlp"]
        env, schema = optimizer.env, isolation["schema"]
        if not raced:
            steps = await society_rows(env, schema, "SELECT generation, state, reason, detail FROM rlp_steps")
            letters = await dead_letters(nats_client, isolation)
            pytest.fail(f"no rlp candidate; steps {[tuple(s) for s in steps]}; dead letters {letters}")
        assert any(c.cases_evaluated > 0 for c in raced)
        assert reasoning.calls >= 1

        # The run moved on (or finished): the society resolves its steps, rewarding each thought
        # with log-probabilities from the model server (tens of seconds a step on a busy CPU).
        # The first rewarded step is enough here; later ones follow the same path.
        deadline = time.monotonic() + 150
        while True:
            steps = await society_rows(
                env, schema, "SELECT * FROM rlp_steps WHERE run_id = $1 ORDER BY generation", run.run_id
            )
            resolved = await society_rows(
                env, schema, "SELECT step_id FROM rlp_proposals WHERE run_id = $1 AND hit IS NOT NULL", run.run_id
            )
            done = {r["step_id"] for r in resolved}
            if any(s["state"] == "rewarded" and s["step_id"] in done for s in steps):
                break
            assert time.monotonic() < deadline, [(s["generation"], s["state"], s["reason"]) for s in steps]
            assert not any(s["state"] == "failed" for s in steps), [(s["reason"], s["detail"]) for s in steps]
            await asyncio.sleep(0.5)
        print(f"\nsteps: {[(s['generation'], s['state'], s['reason'], s['detail'][:80]) for s in steps]}")
        step = next(s for s in steps if s["state"] == "rewarded" and s["step_id"] in done)
        thoughts = json.loads(step["thoughts"])
        assert len(thoughts) == 2 and all(
            math.isfinite(p["predicted_score"]) for t in thoughts for p in t["proposals"]
        )  # a parsed prediction per proposal
        exps = await society_rows(env, schema, "SELECT * FROM rlp_experiences WHERE step_id = $1", step["step_id"])
        assert exps, "a rewarded step has an experience per thought whose configs were evaluated"
        for e in exps:
            assert e["definition"] == "logprob_information_gain", e["baseline"]
            assert math.isfinite(e["reward"]) and e["reward"] != 0.0
            assert served in e["baseline"]  # the no-think baseline: the base model without the thought
        if len(exps) == 2:  # G = 2: A = +-(r1 - r2)
            assert exps[0]["advantage"] == pytest.approx(-exps[1]["advantage"])
        # Proposals already in the run are not sent again (a random candidate may hold one).
        sent = await society_rows(env, schema, "SELECT * FROM rlp_proposals WHERE step_id = $1", step["step_id"])
        assert sent and any(p["generation_median"] is not None and p["hit"] is not None for p in sent)
        print(f"rewards: {[round(e['reward'], 2) for e in exps]}; {time.monotonic() - started_at:.1f} s")

        async with grpc.aio.insecure_channel(society.address) as channel:
            stats = (
                await society_grpc.SocietyServiceStub(channel).GetStats(society_pb.GetStatsRequest(run_id=run.run_id))
            ).rlp
        assert stats.steps == len(steps) and stats.steps_failed == 0 and stats.thoughts_rewarded >= 2
        # Resolution goes on while we read: count at least what was resolved when the loop ended
        # (a proposal the run never reached stays unresolved, so not every one of them need be).
        assert stats.proposals >= max(2, len(sent)) and stats.proposals_resolved >= max(1, len(resolved))
        assert 0.0 <= stats.hit_rate <= 1.0
        assert set(stats.reward_definitions) == {"logprob_information_gain"}
    finally:
        await reasoning.stop()
