"""Nothing grows or waits without a bound: the reward judge against hostile YAML and judge
calls that cannot finish, and retention of the optimizer's append-only tables, each
against the real service and the real PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import grpc
import pytest
from sqlalchemy import text

from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as pb_grpc
from flywheel.stack.services import health_status

pytestmark = pytest.mark.integration

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """A rubric whose description is a list that expands to width**levels strings through
    aliases (~400 bytes); only known keys, so nothing refuses it before it is read."""
    parts = ["&a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        parts.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "description: [" + ", ".join(parts) + f"]\nname: *a{levels - 1}\n"


GOOD_RUBRIC = "name: bounded\ndescription: After a bomb\ncriteria:\n  - {name: ok, description: Is fine, weight: 1}\n"


@pytest.fixture
def judge_process(launch):
    return launch(
        "reward_judge",
        env={
            # No LLM is reachable: every call here is refused before, or judged without, one.
            "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": "http://127.0.0.1:9/v1",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDING_DEADLINE_S": "5",
        },
    )


async def test_yaml_alias_bomb_is_refused_and_the_judge_keeps_serving(judge_process):
    text = billion_laughs()
    assert len(text) < 1000
    async with grpc.aio.insecure_channel(judge_process.address) as channel:
        judge = pb_grpc.RewardJudgeServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await judge.PutRubric(pb.PutRubricRequest(yaml=text), timeout=20)
        assert info.value.code() == INVALID, info.value.details()
        assert "PutRubricRequest.yaml" in info.value.details()
        assert "expands to more than" in info.value.details()
        assert time.monotonic() - started < 5
        assert health_status(judge_process.address) == "SERVING"
        # A plain anchor a person might use is still fine, and so is the next good request.
        stored = (await judge.PutRubric(pb.PutRubricRequest(yaml=GOOD_RUBRIC), timeout=20)).rubric
        assert (stored.name, stored.version) == ("bounded", 1)
        deep = "name: " + "[" * 2000 + "]" * 2000 + "\n"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await judge.PutRubric(pb.PutRubricRequest(yaml=deep), timeout=20)
        assert info.value.code() == INVALID and "nests deeper than" in info.value.details()
        big = "description: '" + "x" * 300_000 + "'\n"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await judge.PutRubric(pb.PutRubricRequest(yaml=big), timeout=20)
        assert (
            info.value.code() == INVALID
            and "PutRubricRequest.yaml is 300,016 characters; at most 100,000" in info.value.details()
        )
        assert health_status(judge_process.address) == "SERVING"
        # Other request sizes: a huge or NUL-laden rubric name, an oversized group.
        for name in ("r" * 1_000_000, "bad\x00name"):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await judge.Score(pb.ScoreRequest(prompt="Q?", response="A", rubric=name), timeout=20)
            assert info.value.code() == INVALID and "rubric name must match" in info.value.details()
            assert len(info.value.details()) < 300
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await judge.Rank(pb.RankRequest(prompt="Q?", responses=["a"] * 17), timeout=20)
        assert info.value.code() == INVALID and "MAX_GROUP_SIZE" in info.value.details()
        signals = [pb.Signal(name=f"s{i}", value=0.5) for i in range(65)]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await judge.Aggregate(pb.AggregateRequest(candidates=[pb.Candidate(id="c", signals=signals)]))
        assert info.value.code() == INVALID and "candidates[0].signals has 65" in info.value.details()
        assert health_status(judge_process.address) == "SERVING"


async def test_embedding_score_without_a_reference_answers_within_its_deadline(judge_process):
    """No reference: the embedding judge scores similarity to the prompt (its documented
    behaviour). Loading MiniLM takes tens of seconds on a busy machine and used to be
    paid, unbounded, by the first request; now it is warmed at startup and every call
    answers within FLYWHEEL_REWARD_JUDGE_EMBEDDING_DEADLINE_S (5 s here), with a score
    or a DEADLINE_EXCEEDED that names the setting."""
    async with grpc.aio.insecure_channel(judge_process.address) as channel:
        judge = pb_grpc.RewardJudgeServiceStub(channel)
        request = pb.ScoreRequest(
            prompt="Capital of France?", response="Paris is the capital of France.", judge=pb.JUDGE_KIND_EMBEDDING
        )
        give_up = time.monotonic() + 240
        waits = []
        while True:
            started = time.monotonic()
            failed: grpc.aio.AioRpcError | None = None
            try:
                reply = await asyncio.wait_for(judge.Score(request, timeout=60), 60)
            except grpc.aio.AioRpcError as exc:
                failed = exc
            waits.append(time.monotonic() - started)
            if failed is None:
                break
            assert failed.code() == grpc.StatusCode.DEADLINE_EXCEEDED, failed.details()
            assert "FLYWHEEL_REWARD_JUDGE_EMBEDDING_DEADLINE_S" in failed.details()
            assert time.monotonic() < give_up, "MiniLM never loaded"
            await asyncio.sleep(1)
        assert max(waits) < 10, waits  # the 5 s deadline, plus a busy machine's margin
        j = reply.judgement
        assert j.judge == pb.JUDGE_KIND_EMBEDDING
        assert set(j.components) == {"similarity_to_prompt"}
        assert 0.0 < j.score <= 1.0
        assert health_status(judge_process.address) == "SERVING"


# -- retention ---------------------------------------------------------------------------


async def _rows(conn, sql: str) -> list[str]:
    return [r[0] for r in await conn.fetch(sql)]


async def test_optimizer_retention_deletes_old_rows_and_keeps_recent_ones(launch, servers, isolation):
    """Rows written straight into PostgreSQL with old timestamps are swept by the running
    optimizer in chunks; recent rows, and old runs that are still running, stay."""
    launch("optimizer", env={"FLYWHEEL_OPTIMIZER_RETENTION_INTERVAL_S": "0.5"})
    conn = await asyncpg.connect(servers.postgres.url, server_settings={"search_path": isolation["schema"]})
    try:
        decision = (
            "INSERT INTO decisions (decision_id, endpoint, arm_id, probability, context, created_at) "
            "SELECT $1 || g, 'ep', 'a', 0.5, '{}', now() - make_interval(days => $2) FROM generate_series(1, $3) g"
        )
        await conn.execute(decision, "old-", 91, 12_000)  # more than two chunks of 5,000
        await conn.execute(decision, "new-", 89, 3)
        feedback = (
            "INSERT INTO applied_feedback (event_id, decision_id, reward, applied_at) "
            "SELECT $1 || g, 'd' || g, 1.0, now() - make_interval(days => $2) FROM generate_series(1, $3) g"
        )
        await conn.execute(feedback, "old-", 91, 10)
        await conn.execute(feedback, "new-", 1, 4)
        run = (
            "INSERT INTO runs (run_id, state, config, updated_at) "
            "VALUES ($1, $2, '{}', now() - make_interval(days => $3))"
        )
        await conn.execute(run, "done-old", "succeeded", 181)
        await conn.execute(run, "running-old", "running", 181)
        await conn.execute(run, "done-new", "failed", 10)
        await conn.execute(
            "INSERT INTO run_candidates (run_id, candidate_id, generation, config) VALUES ('done-old', 'c1', 0, '{}')"
        )

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = await conn.fetchval("SELECT count(*) FROM decisions WHERE decision_id LIKE 'old-%'")
            fb = await conn.fetchval("SELECT count(*) FROM applied_feedback WHERE event_id LIKE 'old-%'")
            runs = await _rows(conn, "SELECT run_id FROM runs ORDER BY run_id")
            if left == 0 and fb == 0 and "done-old" not in runs:
                break
            await asyncio.sleep(0.5)
        assert await _rows(conn, "SELECT decision_id FROM decisions ORDER BY 1") == ["new-1", "new-2", "new-3"]
        assert await _rows(conn, "SELECT event_id FROM applied_feedback ORDER BY 1") == [
            "new-1",
            "new-2",
            "new-3",
            "new-4",
        ]
        assert await _rows(conn, "SELECT run_id FROM runs ORDER BY 1") == ["done-new", "running-old"]
        assert await conn.fetchval("SELECT count(*) FROM run_candidates") == 0  # cascaded with its run
    finally:
        await conn.close()


def test_applied_feedback_retention_may_not_undercut_the_feedback_stream(monkeypatch, stack_env):
    from pydantic import ValidationError

    from flywheel.optimizer.settings import OptimizerSettings

    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FLYWHEEL_OPTIMIZER_APPLIED_FEEDBACK_RETENTION_DAYS", "7")
    with pytest.raises(ValidationError, match="FEEDBACK stream's max age"):
        OptimizerSettings()  # type: ignore[call-arg]


async def test_trace_store_and_judge_logs_are_swept_by_age(launch, servers, isolation):
    """The trace store's decision/feedback logs and the judge's human labels: old rows go,
    recent ones stay (FLYWHEEL_TRACE_STORE_LOG_RETENTION_DAYS, ..._HUMAN_LABEL_RETENTION_DAYS)."""
    launch("trace_store", env={"FLYWHEEL_TRACE_STORE_RETENTION_INTERVAL_S": "0.5"})
    launch(
        "reward_judge",
        env={
            "FLYWHEEL_REWARD_JUDGE_RETENTION_INTERVAL_S": "0.5",
            "FLYWHEEL_REWARD_JUDGE_HUMAN_LABEL_RETENTION_DAYS": "30",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
        },
    )
    conn = await asyncpg.connect(servers.postgres.url, server_settings={"search_path": isolation["schema"]})
    try:
        for tag, days in (("old", 366), ("new", 300)):
            await conn.execute(
                "INSERT INTO decision_log (decision_id, endpoint, arm_id, probability, user_id, context, decided_at, "
                "recorded_at) VALUES ($1, 'ep', 'a', 0.5, 'u', '{}', now(), now() - make_interval(days => $2))",
                f"{tag}-d",
                days,
            )
            await conn.execute(
                "INSERT INTO feedback_log (event_id, decision_id, reward, signals, sent_at, recorded_at) "
                "VALUES ($1, $2, 1.0, '{}', now(), now() - make_interval(days => $3))",
                f"{tag}-f",
                f"{tag}-d",
                days,
            )
        for tag, days in (("old", 31), ("new", 29)):
            await conn.execute(
                "INSERT INTO human_labels (judge_id, judge_score, human_score, created_at) "
                "VALUES ($1, 0.5, 0.5, now() - make_interval(days => $2))",
                f"{tag}-judge",
                days,
            )
        queries = {
            "SELECT decision_id FROM decision_log ORDER BY 1": ["new-d"],
            "SELECT event_id FROM feedback_log ORDER BY 1": ["new-f"],
            "SELECT judge_id FROM human_labels ORDER BY 1": ["new-judge"],
        }
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all([await _rows(conn, q) == want for q, want in queries.items()]):
                break
            await asyncio.sleep(0.5)
        for q, want in queries.items():
            assert await _rows(conn, q) == want, q
    finally:
        await conn.close()


async def test_judgement_cache_purge_goes_in_chunks_and_keeps_live_entries(stack_env, monkeypatch):
    from flywheel.core.db import create_engine, session_factory
    from flywheel.core.settings import DatabaseSettings
    from flywheel.reward_judge.cache import PostgresCache
    from flywheel.stack.testing import migrate_in_process as migrate

    migrate("reward_judge", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    try:
        cache = PostgresCache(session_factory(engine), ttl_s=3600)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO judgement_cache (key, value, expires_at) "
                    "SELECT 'old' || g, '{}', now() - interval '1 second' FROM generate_series(1, 12001) g"
                )
            )
        await cache.put("live", {"score": 1.0})
        assert await cache.purge() == 12_001  # three chunks of at most 5,000
        assert await cache.get("live") == {"score": 1.0}
        assert await cache.purge() == 0
    finally:
        await engine.dispose()
