"""Folds and full reads interleaved at random on a real PostgreSQL (issue 19): the cached
counts Select samples from never hold more evidence than was sent nor less than was
committed, and end equal to what PostgreSQL holds. A fold counted twice (a refresh and a
fold both adding one transaction) would make the posterior overconfident; one lost would
make it lag until the next refresh.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from flywheel.core.db import create_engine, session_factory
from flywheel.core.settings import DatabaseSettings
from flywheel.optimizer import service
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.convert import endpoint_spec
from flywheel.optimizer.decisions import new_decision_id
from flywheel.optimizer.models import DecisionRow
from flywheel.optimizer.service import FeedbackItem
from flywheel.stack.testing import migrate_in_process as migrate

from .helpers import three_arm_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EVENTS = 240
WRITERS = 4


async def test_concurrent_folds_refreshes_and_loads_count_every_transaction_once(stack_env, monkeypatch):
    migrate("optimizer", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = session_factory(engine)
    rand = random.Random(19)
    try:
        async with sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(three_arm_endpoint("bot").endpoint))
        # A refresh every 20 ms, so full reads land between, before and after folds.
        cache = PosteriorCache(sessions, refresh_interval_s=0.02)
        await cache.refresh()
        arms = cache.cached("bot").arm_ids
        ids = [new_decision_id() for _ in range(EVENTS)]
        async with sessions() as session:
            session.add_all(
                DecisionRow(decision_id=d, endpoint="bot", arm_id=arm, probability=0.5, created_at=datetime.now(UTC))
                for d, arm in zip(ids, [rand.choice(arms) for _ in ids], strict=True)
            )
            await session.commit()

        sent = committed = 0  # feedback transactions begun, and returned (committed and folded)
        violations: list[tuple[int, float, float, int]] = []

        async def watch() -> None:
            while True:
                low, entry, snap = committed, cache._entries["bot"], cache.cached("bot")
                assert snap is not None
                counted, shown = float(entry.counts.stats.w.sum()), float(snap.stats.w.sum())
                if not low <= counted <= sent or shown > sent:
                    violations.append((low, counted, shown, sent))
                await asyncio.sleep(0)

        async def writer(first: int) -> None:
            nonlocal sent, committed
            for j in range(first, EVENTS, WRITERS):
                sent += 1
                async with sessions() as session:
                    [outcome] = await service.apply_feedback_batch(
                        session,
                        items=[FeedbackItem(f"fb-{ids[j]}", ids[j], float(rand.random() < 0.5), {})],
                        window=timedelta(days=1),
                        folds=cache,
                    )
                assert outcome.applied
                committed += 1
                if rand.random() < 0.05:
                    await cache.load("bot")  # an administrative reload, racing the refreshes

        refresher, watcher = asyncio.create_task(cache.run()), asyncio.create_task(watch())
        try:
            await asyncio.gather(*(writer(k) for k in range(WRITERS)))
            snap = await cache.caught_up("bot")
        finally:
            refresher.cancel()
            watcher.cancel()
        assert not violations, f"(committed, cached w, shown w, sent) out of bounds: {violations[:10]}"
        stored = await cache.read("bot")
        assert snap is not None and stored.stats.w.sum() == EVENTS
        np.testing.assert_allclose(snap.stats.w, stored.stats.w)
        np.testing.assert_allclose(snap.stats.s, stored.stats.s)
        np.testing.assert_allclose(snap.pulls, stored.pulls)
    finally:
        await engine.dispose()
