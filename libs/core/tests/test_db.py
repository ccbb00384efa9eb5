"""flywheel.core.db's pool on a real PostgreSQL: a connection checked in moments ago is handed
out again without a ping (no round trips in front of a busy consumer's transactions); one idle
longer than ``ping_idle_s`` is pinged first; and a pooled connection that PostgreSQL ended
(``pg_terminate_backend``, as a restart does) is replaced, whether the driver already knows it
is closed or only the ping finds out, so the next session works."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from flywheel.core.db import create_engine
from flywheel.core.settings import DatabaseSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PID = text("SELECT pg_backend_pid()")


@pytest.fixture
async def engines(stack_env, monkeypatch) -> AsyncIterator[Callable[..., AsyncEngine]]:
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    made: list[AsyncEngine] = []

    def make(settings: DatabaseSettings | None = None, **kwargs: object) -> AsyncEngine:
        engine = create_engine(settings or DatabaseSettings(), **kwargs)  # type: ignore[call-arg, arg-type]
        made.append(engine)
        return engine

    try:
        yield make
    finally:
        for engine in made:
            await engine.dispose()


def count_pings(engine: AsyncEngine) -> list[int]:
    """Counts the dialect's pings (each still goes to PostgreSQL)."""
    dialect = engine.sync_engine.dialect
    ping = dialect.do_ping
    pings = [0]

    def counted(dbapi_connection: object) -> bool:
        pings[0] += 1
        return ping(dbapi_connection)

    dialect.do_ping = counted  # type: ignore[method-assign]
    return pings


async def backend_pid(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(PID)).scalar_one()


async def terminate(engine: AsyncEngine, pid: int) -> None:
    """End backend ``pid`` from another connection, outside ``engine``'s pool."""
    other = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    try:
        async with other.connect() as conn:
            assert (await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})).scalar_one()
    finally:
        await other.dispose()


async def test_a_busy_connection_is_not_pinged_and_an_idle_one_is(engines) -> None:
    engine = engines(ping_idle_s=0.3)
    pings = count_pings(engine)
    first = await backend_pid(engine)
    for _ in range(20):  # checked out again at once, as a consumer does batch after batch
        assert await backend_pid(engine) == first
    assert pings[0] == 0
    await asyncio.sleep(0.5)
    assert await backend_pid(engine) == first  # pinged, alive, and handed out
    assert pings[0] == 1


async def test_zero_pings_at_every_checkout(engines) -> None:
    engine = engines(ping_idle_s=0)
    pings = count_pings(engine)
    await backend_pid(engine)
    for _ in range(5):
        await backend_pid(engine)
    assert pings[0] == 5


async def test_a_connection_postgresql_ended_is_replaced_without_a_ping(engines) -> None:
    engine = engines(ping_idle_s=None)  # never pinged: the driver's closed flag alone
    pings = count_pings(engine)
    old = await backend_pid(engine)
    await terminate(engine, old)
    await asyncio.sleep(0.2)  # the event loop reads the server's goodbye and the closed socket
    new = await backend_pid(engine)
    assert new != old
    assert pings[0] == 0


class SilentCut:
    """A TCP proxy to PostgreSQL that can cut its connections the way a network does: the
    server's side is gone, while the client's socket stays open until the client writes."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._links: list[
            tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.StreamWriter, list[asyncio.Task[None]]]
        ] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        pipes = [asyncio.create_task(_pipe(reader, up_writer)), asyncio.create_task(_pipe(up_reader, writer))]
        self._links.append((reader, writer, up_writer, pipes))

    async def cut(self) -> None:
        """Cut every connection so far: the client learns of it only when it next writes."""
        for reader, client, upstream, pipes in self._links:
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            upstream.close()
            task = asyncio.create_task(_close_when_written(reader, client))
            self._tasks.add(task)
        self._links.clear()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.cut()
        if self.server is not None:
            self.server.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _close_when_written(reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
    await reader.read(1)
    client.transport.abort()


async def test_an_idle_connection_that_died_unnoticed_is_replaced_by_the_ping(engines) -> None:
    url = make_url(DatabaseSettings().url.get_secret_value())  # type: ignore[call-arg]
    proxy = SilentCut(url.host or "127.0.0.1", url.port or 5432)
    port = await proxy.start()
    try:
        through = url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
        engine = engines(ping_idle_s=0.2, settings=DatabaseSettings(url=through))  # type: ignore[call-arg]
        pings = count_pings(engine)
        old = await backend_pid(engine)
        await proxy.cut()
        await asyncio.sleep(0.4)  # idle past ping_idle_s; the driver has heard nothing
        new = await backend_pid(engine)  # the ping fails, a new connection answers
        assert new != old
        assert pings[0] == 1
    finally:
        await proxy.stop()
