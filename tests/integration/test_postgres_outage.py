"""PostgreSQL stopped while Selects continue: the optimizer's decision log stops growing at
its high-water mark and answers RESOURCE_EXHAUSTED (memory stays bounded), and once
PostgreSQL is back every decision that was answered OK is in the ``decisions`` table."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator

import asyncpg
import grpc
import psutil
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.stack.servers import PostgresServer
from flywheel.stack.testing import Launcher, server_root

from .helpers import eventually, three_arm_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MAX_PENDING = 200
# Each Select carries ~20 KB of context, so a buffer that kept growing through the outage
# (3,000 Selects: ~60 MB of contexts) would show in the process's RSS; a bounded one holds
# at most MAX_PENDING of them (~4 MB).
CONTEXT = {f"note{i}": "x" * 200 for i in range(100)}
OUTAGE_SELECTS = 3000
RSS_GROWTH_BOUND = 30 * 1024 * 1024


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, which it stops and starts again."""
    root = server_root("pg-outage")
    server = PostgresServer(root / "postgres")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def optimizer(servers, isolation, private_postgres, tmp_path) -> Iterator:
    launcher = Launcher(servers, isolation, tmp_path / "services")
    proc = launcher(
        "optimizer",
        env={
            "FLYWHEEL_DB_URL": private_postgres.async_url(),  # migrated there too
            "FLYWHEEL_OPTIMIZER_DECISION_LOG_MAX_PENDING": str(MAX_PENDING),
            "FLYWHEEL_OPTIMIZER_READINESS_INTERVAL_S": "0.3",
        },
    )
    yield proc
    launcher.stop_all()


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


async def logged(postgres: PostgresServer, schema: str, ids: list[str]) -> set[str]:
    conn = await asyncpg.connect(postgres.url, server_settings={"search_path": schema})
    try:
        rows = await conn.fetch("SELECT decision_id FROM decisions WHERE decision_id = ANY($1::text[])", ids)
    finally:
        await conn.close()
    return {r["decision_id"] for r in rows}


async def test_selects_during_a_postgres_outage_are_bounded_and_every_ok_decision_is_logged(
    optimizer, private_postgres, isolation
):
    context = Struct()
    context.update(CONTEXT)
    request = sel_pb.SelectRequest(endpoint="outage", user_id="u1", context=context)
    answered_ok: list[str] = []
    codes: Counter[str] = Counter()

    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        await admin_grpc.EndpointAdminServiceStub(channel).CreateEndpoint(three_arm_endpoint("outage"))
        select = sel_grpc.SelectionServiceStub(channel).Select
        for _ in range(200):  # warm up: caches, pools and the allocator settle before the baseline
            answered_ok.append((await select(request, timeout=10)).decision_id)
        await eventually(lambda: logged(private_postgres, isolation["schema"], answered_ok), lambda s: len(s) == 200)
        baseline = rss(optimizer.pid)

        private_postgres.stop()
        peak = baseline
        during_ok = 0
        details: set[str] = set()
        for i in range(OUTAGE_SELECTS):
            try:
                answered_ok.append((await select(request, timeout=10)).decision_id)
                during_ok += 1
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
                details.add(exc.details() or "")
            if i % 250 == 0:
                peak = max(peak, rss(optimizer.pid))
        peak = max(peak, rss(optimizer.pid))

        # The refusal says what is full, so an operator can act on it.
        assert all("decision" in d for d in details), details
        print(f"outage: {dict(codes)}, RSS {baseline / 2**20:.1f} -> peak {peak / 2**20:.1f} MiB")
        # Bounded: Selects beyond the high-water mark are refused, never buffered.
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
        assert codes["RESOURCE_EXHAUSTED"] > 0, f"no Select was refused while PostgreSQL was down: {codes}"
        assert during_ok <= MAX_PENDING, f"{during_ok} decisions answered OK beyond a buffer of {MAX_PENDING}"
        assert peak - baseline < RSS_GROWTH_BOUND, f"RSS grew by {(peak - baseline) / 2**20:.1f} MiB during the outage"

        private_postgres.start()

        # Back: the buffer drains and Selects are answered again.
        async def select_ok() -> bool:
            try:
                answered_ok.append((await select(request, timeout=10)).decision_id)
                return True
            except grpc.aio.AioRpcError:
                return False

        await eventually(select_ok, bool, timeout_s=60, interval_s=0.5)

    async def missing() -> list[str]:
        found = await logged(private_postgres, isolation["schema"], answered_ok)
        return [d for d in answered_ok if d not in found]

    assert await eventually(missing, lambda m: not m, timeout_s=60, interval_s=0.5) == []
