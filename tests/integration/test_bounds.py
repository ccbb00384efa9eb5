"""Nothing grows or waits without a bound: the reward judge against hostile YAML and judge
calls that cannot finish, and retention of the optimizer's append-only tables, each
against the real service and the real PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

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
            try:
                reply = await asyncio.wait_for(judge.Score(request, timeout=60), 60)
            except grpc.aio.AioRpcError as exc:
                waits.append(time.monotonic() - started)
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc.details()
                assert "FLYWHEEL_REWARD_JUDGE_EMBEDDING_DEADLINE_S" in exc.details()
                assert time.monotonic() < give_up, "MiniLM never loaded"
                await asyncio.sleep(1)
                continue
            waits.append(time.monotonic() - started)
            break
        assert max(waits) < 10, waits  # the 5 s deadline, plus a busy machine's margin
        j = reply.judgement
        assert j.judge == pb.JUDGE_KIND_EMBEDDING
        assert set(j.components) == {"similarity_to_prompt"}
        assert 0.0 < j.score <= 1.0
        assert health_status(judge_process.address) == "SERVING"
