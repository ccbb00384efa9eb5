"""A client that hangs up stops its generation: the one generation thread is free for the
next request at once (not after the departed request's max_tokens), and the server logs it.

Served as ``python -m flywheel.modelserver`` serves (an AppRunner with ``SERVER_OPTIONS``:
handler_cancellation, which aiohttp's TestServer would turn on by itself, hiding its absence);
the tiny random model needs minutes on a loaded CPU for the 3900 tokens asked here."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import pytest
from aiohttp import web

from flywheel.modelserver.app import SERVER_OPTIONS, build_app
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import TINY_NAME, load_base

pytestmark = pytest.mark.timeout(120)
LONG = {"model": TINY_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3900, "temperature": 1.0}
SHORT = {**LONG, "max_tokens": 4}


@pytest.fixture(scope="module")
def base():
    return load_base("tiny", device="cpu")


@pytest.fixture
async def url(base):
    """The chat completions URL of the server, run as the CLI runs it."""
    runner = web.AppRunner(build_app(Engine(base, {}, max_tokens_cap=4000)), **SERVER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        await runner.cleanup()


async def post_all(url: str, body: dict, timeout_s: float) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp,
    ):
        async for _ in resp.content:  # streamed chunks arrive; the whole answer does not in time
            pass


async def hang_up(url: str, *, stream: bool, after_s: float = 2.0) -> None:
    """Start a long generation, then go away (a client-side timeout closes the connection)."""
    with pytest.raises(asyncio.TimeoutError):
        await post_all(url, {**LONG, "stream": stream}, after_s)


async def timed_short(url: str) -> tuple[float, dict]:
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, session.post(url, json=SHORT) as resp:
        got = await resp.json()
        assert resp.status == 200, got
    return time.monotonic() - started, got


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_hangs_up_frees_the_generation_thread(url, caplog, stream):
    caplog.set_level(logging.INFO, logger="flywheel.modelserver.engine")
    await hang_up(url, stream=stream)
    seconds, got = await timed_short(url)
    assert got["usage"]["completion_tokens"] <= 4
    # Uncancelled, the 3900-token generation would hold the thread for minutes.
    assert seconds < 10, f"the next request waited {seconds:.1f} s"
    assert any("was cancelled: its client went away" in r.getMessage() for r in caplog.records), caplog.text
    stopped = [r.getMessage() for r in caplog.records if "stopped generating" in r.getMessage()]
    assert stopped, caplog.text
    assert "stopped generating for tiny-random after" in stopped[0], stopped
    tokens = int(stopped[0].split(" after ")[1].split(" of ")[0])
    assert 0 < tokens < 3900


async def test_a_queued_request_whose_client_left_is_skipped(url, caplog):
    caplog.set_level(logging.INFO, logger="flywheel.modelserver.engine")
    first = asyncio.ensure_future(hang_up(url, stream=False, after_s=4.0))
    await asyncio.sleep(0.5)  # the first is generating; the second waits its turn, and leaves first
    await hang_up(url, stream=False, after_s=1.0)
    await first
    seconds, _ = await timed_short(url)
    assert seconds < 10, f"the next request waited {seconds:.1f} s"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("was cancelled: its client went away" in m for m in messages) == 2, messages
    # Only the first one ever generated: the second left the queue without running.
    assert sum("stopped generating" in m for m in messages) == 1, messages
