"""PosteriorCache.fresh: concurrent Update calls share one reload, and none sees a read that
began before its own commit."""

from __future__ import annotations

import asyncio
import time

from flywheel.optimizer.cache import PosteriorCache


class CountingCache(PosteriorCache):
    """The real coalescing logic over a fake read that takes 50 ms."""

    def __init__(self) -> None:
        super().__init__(sessions=None)  # type: ignore[arg-type]
        self.reads = 0

    async def load(self, name: str):  # type: ignore[override]
        self.reads += 1
        started, n = time.monotonic(), self.reads
        await asyncio.sleep(0.05)
        self._snapshots[name] = f"read-{n}"  # type: ignore[assignment]
        self._read_at[name] = started
        return self._snapshots[name]


async def test_concurrent_callers_share_one_reload():
    cache = CountingCache()
    committed = time.monotonic()
    got = await asyncio.gather(*(cache.fresh("e", since=committed) for _ in range(50)))
    assert cache.reads == 1 and set(got) == {"read-1"}


async def test_a_commit_after_the_shared_read_began_gets_a_new_read():
    cache = CountingCache()
    first = asyncio.ensure_future(cache.fresh("e", since=time.monotonic()))
    await asyncio.sleep(0.01)  # the first read is under way
    later = await cache.fresh("e", since=time.monotonic())
    assert await first == "read-1" and later == "read-2" and cache.reads == 2
    # Nothing committed since: the last read is fresh enough.
    assert await cache.fresh("e", since=0.0) == "read-2" and cache.reads == 2


async def test_a_failed_reload_reaches_every_waiter_and_the_next_call_retries():
    cache = CountingCache()
    real_load = cache.load

    async def failing(name: str):
        cache.reads += 1
        await asyncio.sleep(0.02)
        raise RuntimeError("database away")

    cache.load = failing  # type: ignore[method-assign]
    since = time.monotonic()
    outcomes = await asyncio.gather(*(cache.fresh("e", since=since) for _ in range(5)), return_exceptions=True)
    assert cache.reads == 1 and all(isinstance(o, RuntimeError) for o in outcomes)
    cache.load = real_load  # type: ignore[method-assign]
    assert await cache.fresh("e", since=since) == "read-2"
