"""The posterior cache on a real PostgreSQL: a refresh that reads the same rows and statistics
keeps the endpoint's snapshot (no new posterior draws for an idle endpoint); any change to
them, or to the arms, builds a new one."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from flywheel.core.db import create_engine, session_factory
from flywheel.core.settings import DatabaseSettings
from flywheel.optimizer import service
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.convert import endpoint_spec
from flywheel.optimizer.spec import ArmSpec
from flywheel.stack.testing import migrate_in_process as migrate

from .helpers import three_arm_endpoint

pytestmark = pytest.mark.integration


async def test_an_unchanged_endpoint_keeps_its_snapshot_and_a_change_rebuilds_it(stack_env, monkeypatch):
    migrate("optimizer", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = session_factory(engine)
    try:
        async with sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(three_arm_endpoint("bot").endpoint))
            await service.create_endpoint(session, spec=endpoint_spec(three_arm_endpoint("other").endpoint))
        cache = PosteriorCache(sessions)
        await cache.refresh()
        bot, other = cache.cached("bot"), cache.cached("other")
        await cache.refresh()
        assert cache.cached("bot") is bot and cache.cached("other") is other

        # New evidence for one arm of one endpoint: only that endpoint is rebuilt.
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO arm_stats (endpoint, arm_id, segment, bucket, w, s, ss, as_of)"
                    " VALUES ('bot', 'small', '', 0, 1, 1, 1, now())"
                )
            )
        await cache.refresh()
        rebuilt = cache.cached("bot")
        assert rebuilt is not bot and cache.cached("other") is other
        assert rebuilt.stats.w[rebuilt.arm_ids.index("small")] == 1

        # A refresh that read before a concurrent load can put an older snapshot back; the next
        # read of the same rows must give the snapshot built from them, not keep the older one.
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE arm_stats SET w = w + 1 WHERE endpoint = 'bot'"))
        newer = await cache.load("bot")
        cache._snapshots["bot"] = rebuilt  # what the slower refresh leaves behind
        await cache.refresh()
        assert cache.cached("bot") is newer and newer.stats.w[newer.arm_ids.index("small")] == 2
        rebuilt = newer

        # A new arm is a change too.
        async with sessions() as session:
            await service.add_arm(session, endpoint="other", arm=ArmSpec(arm_id="extra", params={"model": "x"}))
        await cache.refresh()
        assert cache.cached("other") is not other and "extra" in cache.cached("other").arm_ids
        assert cache.cached("bot") is rebuilt
    finally:
        await engine.dispose()
