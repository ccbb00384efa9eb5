"""Select on a segmented endpoint, on a real PostgreSQL and through a real optimizer: decisions
come from the segment's cached snapshot (their probability is exactly its distribution's), a
new segment is read once however many Selects ask for it at once, a refresh and a fold change
what is served, and a segmented Select costs about what an unsegmented one does."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import grpc
import numpy as np
import pytest
from google.protobuf.struct_pb2 import Struct
from sqlalchemy import text

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.core.db import create_engine, session_factory
from flywheel.core.settings import DatabaseSettings
from flywheel.optimizer import service
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.convert import endpoint_spec
from flywheel.optimizer.segment_cache import SegmentCache
from flywheel.optimizer.selector import Selector
from flywheel.optimizer.stats import Increment
from flywheel.stack.testing import migrate_in_process as migrate

from .helpers import three_arm_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ARMS = ("small", "large", "creative")


def segmented(name: str, key: str = "country") -> object:
    request = three_arm_endpoint(name)
    request.endpoint.policy.CopyFrom(ep_pb.PolicySpec(segment_key=key))
    return request


class Recorded:
    """Stands in for the DecisionLog: what Select would log."""

    def __init__(self) -> None:
        self.decisions: list = []

    def record(self, decision) -> None:
        self.decisions.append(decision)


async def add_stats(engine, endpoint: str, segment: str, pulls: dict[str, tuple[float, float]]) -> None:
    async with engine.begin() as conn:
        for arm, (w, s) in pulls.items():
            await conn.execute(
                text(
                    "INSERT INTO arm_stats (endpoint, arm_id, segment, bucket, w, s, ss, as_of)"
                    " VALUES (:e, :a, :seg, 0, :w, :s, :s, now())"
                    " ON CONFLICT (endpoint, arm_id, segment, bucket) DO UPDATE"
                    " SET w = arm_stats.w + EXCLUDED.w, s = arm_stats.s + EXCLUDED.s, ss = arm_stats.ss + EXCLUDED.ss"
                ),
                {"e": endpoint, "a": arm, "seg": segment, "w": w, "s": s},
            )


async def test_segment_snapshots_are_cached_loaded_once_refreshed_and_folded(stack_env, monkeypatch):
    migrate("optimizer", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = session_factory(engine)
    try:
        async with sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(segmented("greet").endpoint))
        # France prefers "small", the US "creative"; the endpoint-wide row holds both.
        fr = {"small": (200.0, 170.0), "large": (20.0, 4.0), "creative": (20.0, 4.0)}
        us = {"small": (20.0, 4.0), "large": (20.0, 4.0), "creative": (200.0, 170.0)}
        await add_stats(engine, "greet", "fr", fr)
        await add_stats(engine, "greet", "us", us)
        await add_stats(engine, "greet", "", {a: (fr[a][0] + us[a][0], fr[a][1] + us[a][1]) for a in ARMS})
        cache = PosteriorCache(sessions)
        await cache.refresh()
        parts = SegmentCache(sessions, cache, refresh_interval_s=3600, max_segments=3)
        log = Recorded()
        selector = Selector(cache, log, None, parts)  # type: ignore[arg-type]

        # Twenty concurrent first Selects of one segment: one read, one distribution.
        got = await asyncio.gather(
            *(selector.select(endpoint="greet", context={"country": "fr"}, user_id=f"u{i}") for i in range(20))
        )
        assert parts.loads == 1
        snap = cache.cached("greet")
        fr_entry = parts.peek(snap, "fr")
        assert fr_entry is not None
        for d in got:
            assert d.arm_id in ARMS and d.decision_id and d.segment == "fr"
            assert d.probability == fr_entry.probabilities[ARMS.index(d.arm_id)]
        assert [d.decision_id for d in log.decisions] == [d.decision_id for d in got]
        assert fr_entry.probabilities[0] > 0.9  # its own data rule: "small"

        # Later Selects of a cached segment never wait: the sync path serves them.
        now = selector.select_now(endpoint="greet", context={"country": "fr"})
        assert now is not None and now.probability == fr_entry.probabilities[ARMS.index(now.arm_id)]
        assert parts.loads == 1

        # A second segment is a second read, and learns its own best arm.
        await selector.select(endpoint="greet", context={"country": "us"})
        assert parts.loads == 2
        us_entry = parts.peek(snap, "us")
        assert us_entry is not None and us_entry.probabilities[2] > 0.9
        # No segment value: the endpoint's own snapshot, as unsegmented.
        plain = selector.select_now(endpoint="greet", context={})
        assert (
            plain is not None
            and plain.segment == ""
            and plain.probability == snap.probabilities[ARMS.index(plain.arm_id)]
        )

        # A refresh reloads the used segments: new evidence for France turns it to "creative".
        await add_stats(engine, "greet", "fr", {"creative": (2000.0, 1900.0)})
        assert await parts.refresh() == 2
        turned, us_entry = parts.peek(snap, "fr"), parts.peek(snap, "us")
        assert turned is not fr_entry and turned.probabilities[2] > 0.9
        # Unchanged since the last pass: the same distribution is kept, not drawn again.
        assert await parts.refresh() == 2
        assert parts.peek(snap, "us").probabilities is us_entry.probabilities

        # A fold changes a cached segment at once, without a read.
        parts.fold("greet", "us", {"large": Increment(w=5000.0, s=4900.0, ss=4900.0)})
        folded = parts.peek(snap, "us")
        assert folded.own.w[1] == 5020.0 and folded.probabilities[1] > 0.9
        assert not parts.fold("greet", "nowhere", {"large": Increment(w=1.0, s=1.0, ss=1.0)})
        one = Increment(w=1.0, s=1.0, ss=1.0)
        batch = {("greet", "small", "us"): one, ("greet", "large", "us"): one, ("x", "a", "y"): one}
        assert parts.fold_many(batch) == 1
        assert parts.peek(snap, "us").own.w[1] == 5021.0
        # A fold the entry's read already saw (committed before that read began) is not added twice.
        assert not parts.fold("greet", "us", {"large": one}, committed_at=parts.peek(snap, "us").read_at - 1.0)

        # Bounded: a fourth segment evicts the least recently refreshed one.
        for country in ("de", "it"):
            await selector.select(endpoint="greet", context={"country": country})
        assert len(parts) == 3 and parts.loads == 4
    finally:
        await engine.dispose()


async def timed_selects(stub, requests: list[sel_pb.SelectRequest]) -> tuple[list[float], list]:
    latencies, answers = [], []
    for request in requests:
        started = time.perf_counter()
        answers.append(await stub.Select(request))
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies, answers


def request(endpoint: str, country: str | None = None) -> sel_pb.SelectRequest:
    context = Struct()
    if country:
        context.update({"country": country})
    return sel_pb.SelectRequest(endpoint=endpoint, user_id="u-1", context=context)


async def test_segmented_select_is_about_as_fast_as_unsegmented(launch):
    proc = launch("optimizer", env={"FLYWHEEL_OPTIMIZER_REFRESH_INTERVAL_S": "0.2"})
    countries = ["fr", "us", "de", "it", "es"]
    async with grpc.aio.insecure_channel(proc.address) as channel:
        admin, sel = admin_grpc.EndpointAdminServiceStub(channel), sel_grpc.SelectionServiceStub(channel)
        await admin.CreateEndpoint(segmented("seg"))
        await admin.CreateEndpoint(three_arm_endpoint("flat"))
        rng = random.Random(5)
        for i in range(100):  # some evidence in every segment, and in the flat endpoint
            for name, country in (("seg", countries[i % 5]), ("flat", None)):
                d = await sel.Select(request(name, country))
                reward = float(rng.random() < (0.7 if d.arm_id == "small" else 0.4))
                await sel.Update(sel_pb.UpdateRequest(decision_id=d.decision_id, reward=reward))
        await asyncio.sleep(1.0)  # the last feedback in
        # A pass that read a segment while a fold was committing can miss that fold until the
        # segment's next pass (segment_cache.SegmentCache.fold): use every segment once more and
        # let a pass re-read them all, so the timed Selects below see settled segments.
        for country in countries:
            await sel.Select(request("seg", country))
        await asyncio.sleep(1.0)
        seg_ms: list[float] = []
        flat_ms: list[float] = []
        probabilities: dict[tuple[str, str], set[float]] = {}
        for block in range(6):  # alternate, so that both see the same machine
            lat, answers = await timed_selects(sel, [request("seg", countries[j % 5]) for j in range(50)])
            seg_ms += lat
            for j, d in enumerate(answers):
                assert d.arm_id in ARMS and d.decision_id and 0 < d.probability <= 1
                probabilities.setdefault((countries[j % 5], d.arm_id), set()).add(d.probability)
            flat_ms += (await timed_selects(sel, [request("flat") for _ in range(50)]))[0]
            del block
    seg_p50, flat_p50 = statistics.median(seg_ms), statistics.median(flat_ms)
    print(
        f"Select p50: segmented {seg_p50:.2f} ms, unsegmented {flat_p50:.2f} ms ({seg_p50 / flat_p50:.2f}x); "
        f"p99 {np.percentile(seg_ms, 99):.2f} / {np.percentile(flat_ms, 99):.2f} ms over {len(seg_ms)} calls each"
    )
    assert seg_p50 < 2.0 * flat_p50
    # With no feedback coming in, each segment serves one cached distribution: a probability
    # per arm, not a fresh Monte Carlo estimate per call.
    assert all(len(values) == 1 for values in probabilities.values()), probabilities
