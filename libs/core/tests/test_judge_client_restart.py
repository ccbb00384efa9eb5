"""JudgeClient while the judge is down: by default it gives up within its retries (about
1.2 s); with ``wait_for_ready`` (the society's SAO rounds) a call waits for a judge that comes
back within the call's timeout, as after a kill -9 and restart."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as pb_grpc
from flywheel.core.judge_client import JudgeClient, JudgeUnavailable

DOWN_FOR_S = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FirstWins(pb_grpc.RewardJudgeServiceServicer):
    async def Rank(self, request, context):
        scores = [1.0 - i / len(request.responses) for i in range(len(request.responses))]
        return pb.RankResponse(judgements=[pb.Judgement(score=s, judge_id="first-wins") for s in scores])


async def judge_up_after(port: int, delay_s: float) -> grpc.aio.Server:
    await asyncio.sleep(delay_s)
    server = grpc.aio.server()
    pb_grpc.add_RewardJudgeServiceServicer_to_server(FirstWins(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def test_a_call_waits_for_a_judge_that_comes_back_only_when_asked_to():
    port = free_port()
    starting = asyncio.create_task(judge_up_after(port, DOWN_FOR_S))
    plain = JudgeClient(f"127.0.0.1:{port}", timeout_s=10)
    patient = JudgeClient(f"127.0.0.1:{port}", timeout_s=10, wait_for_ready=True)
    try:
        began = time.monotonic()
        with pytest.raises(JudgeUnavailable, match="UNAVAILABLE"):
            await plain.rank("p", ["a", "b"])
        assert time.monotonic() - began < DOWN_FOR_S  # gave up while the judge was still down

        scores = await patient.rank("p", ["a", "b"])
        assert scores == [1.0, 0.5]
        assert time.monotonic() - began >= DOWN_FOR_S  # it waited for the judge
    finally:
        server = await starting
        await plain.close()
        await patient.close()
        await server.stop(None)
