"""gRPC Update under concurrency, on the real optimizer and PostgreSQL: concurrent calls are
group-committed (several per feedback transaction), and every event still counts exactly once,
duplicates inside one batch included, with each caller told whether its own event applied."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import grpc
import pytest

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc

from .helpers import eventually, three_arm_endpoint

pytestmark = pytest.mark.integration


def feedback_transactions(metrics_port: int) -> float:
    """How many feedback transactions committed, from the optimizer's own metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    found = re.search(r"^flywheel_optimizer_feedback_batches_total (\S+)$", text, re.M)
    assert found, "the optimizer exports flywheel_optimizer_feedback_batches_total"
    return float(found.group(1))


@pytest.mark.parametrize("server", ["sync", "aio"])
async def test_concurrent_updates_share_transactions_and_each_event_counts_once(launch, server):
    optimizer = launch("optimizer", env={"FLYWHEEL_OPTIMIZER_GRPC_SERVER": server})
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("hot"))
        sel = sel_grpc.SelectionServiceStub(channel)
        decisions = [await sel.Select(sel_pb.SelectRequest(endpoint="hot")) for _ in range(20)]
        await asyncio.sleep(0.3)  # the decision log's flush
        before = feedback_transactions(optimizer.metrics_port)

        # 300 events for 20 decisions, each sent twice at once: 600 calls in flight together.
        events = [(f"fb-{i}", decisions[i % 20].decision_id) for i in range(300)]
        calls = [
            sel.Update(sel_pb.UpdateRequest(decision_id=d, reward=1.0, feedback_id=fb), timeout=60)
            for fb, d in events + events
        ]
        replies = await asyncio.gather(*calls)

        applied = [r.applied for r in replies]
        # Each event applied exactly once, whichever of its two calls got there first.
        assert sum(applied) == 300
        assert all(a != b for a, b in zip(applied[:300], applied[300:], strict=True))
        transactions = feedback_transactions(optimizer.metrics_port) - before
        assert 1 <= transactions < 300, f"{transactions} transactions for 600 concurrent Updates"

        # The posterior holds the 300 events, not 600 and not fewer.
        got = await eventually(
            lambda: admin.GetEndpoint(admin_pb.GetEndpointRequest(name="hot")),
            lambda r: sum(s.pulls for s in r.endpoint.stats) >= 300,
        )
        assert sum(s.pulls for s in got.endpoint.stats) == 300
