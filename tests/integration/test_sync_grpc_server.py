"""The optimizer on grpcio's thread-pool server (FLYWHEEL_OPTIMIZER_GRPC_SERVER=sync): Select
from many threads at once logs every decision exactly once, SIGTERM still drains and flushes,
and streams (WatchRun) are capped so they cannot take every worker thread, with a cancelled
stream giving its thread back. The error contract is covered for both servers in
test_grpc_contract.py."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import grpc
import pytest

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import run_service_pb2 as run_pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as run_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc

from .helpers import three_arm_endpoint
from .test_runs import run_config, struct

pytestmark = pytest.mark.integration

SYNC = {"FLYWHEEL_OPTIMIZER_GRPC_SERVER": "sync", "FLYWHEEL_OPTIMIZER_GRPC_WORKERS": "4"}


def select_many(address: str, n: int) -> list[str]:
    """n decisions from one thread: Selects, then one SelectBatch for the rest."""
    with grpc.insecure_channel(address) as channel:
        stub = sel_grpc.SelectionServiceStub(channel)
        ids = [stub.Select(sel_pb.SelectRequest(endpoint="bot", user_id="u")).decision_id for _ in range(n // 2)]
        batch = stub.SelectBatch(
            sel_pb.SelectBatchRequest(requests=[sel_pb.SelectRequest(endpoint="bot")] * (n - n // 2))
        )
        return ids + [d.decision_id for d in batch.decisions]


async def decision_ids(env: dict[str, str], schema: str) -> list[str]:
    url = env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        return [r["decision_id"] for r in await conn.fetch("SELECT decision_id FROM decisions")]
    finally:
        await conn.close()


async def test_concurrent_selects_are_each_logged_once_and_sigterm_flushes(launch, stack_env, isolation):
    optimizer = launch("optimizer", env=SYNC)
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        await admin_grpc.EndpointAdminServiceStub(channel).CreateEndpoint(three_arm_endpoint("bot"))

    with ThreadPoolExecutor(8) as pool:
        made = [i for ids in pool.map(lambda _: select_many(optimizer.address, 400), range(8)) for i in ids]
    assert len(made) == len(set(made)) == 3200

    started = time.monotonic()
    assert optimizer.stop(timeout_s=10.0) == 0
    assert time.monotonic() - started < 10.0
    logged = await decision_ids(stack_env, isolation["schema"])
    assert sorted(logged) == sorted(made)  # none lost at shutdown, none written twice


async def test_streams_are_capped_and_a_cancelled_stream_frees_its_thread(launch):
    # No evaluator runs, so the run stays RUNNING and WatchRun streams stay open.
    optimizer = launch("optimizer", env=SYNC)  # 4 workers: at most 2 streams
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        runs = run_grpc.RunServiceStub(channel)
        run_id = (await runs.StartRun(run_pb.StartRunRequest(config=struct(run_config())))).run.run_id
        await admin_grpc.EndpointAdminServiceStub(channel).CreateEndpoint(three_arm_endpoint("bot"))
        sel = sel_grpc.SelectionServiceStub(channel)

        watchers = [runs.WatchRun(run_pb.WatchRunRequest(run_id=run_id)) for _ in range(2)]
        for w in watchers:
            assert (await w.read()).progress.run_id == run_id  # open, holding a worker each
        refused = runs.WatchRun(run_pb.WatchRunRequest(run_id=run_id))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await refused.read()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 streams are open" in info.value.details()
        # The other workers still serve Select.
        assert (await sel.Select(sel_pb.SelectRequest(endpoint="bot"), timeout=5)).arm_id

        watchers[0].cancel()

        async def reopened() -> bool:
            again = runs.WatchRun(run_pb.WatchRunRequest(run_id=run_id))
            try:
                await again.read()
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                return False
            again.cancel()
            return True

        deadline = time.monotonic() + 10
        while not await reopened():
            assert time.monotonic() < deadline, "the cancelled stream's slot was never given back"
            await asyncio.sleep(0.5)  # the watch loop notices the cancellation within its interval
        watchers[1].cancel()
