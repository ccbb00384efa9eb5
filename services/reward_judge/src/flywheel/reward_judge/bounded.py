"""Blocking model calls (MiniLM embeddings, the learned reward model) with a deadline and
a cap on how many run at once.

A thread cannot be cancelled, so a call past its deadline keeps its slot until its thread
really finishes: the number of model threads stays at ``in_flight`` however many requests
time out, and later requests wait for a slot within their own deadline instead of piling
up work behind a stuck one.

Each call gets a daemon thread of its own rather than a ThreadPoolExecutor worker: the
interpreter joins executor threads at exit, so a model still loading (MiniLM takes 20 s on
a busy machine) would keep a SIGTERM'd judge alive past its grace period.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from flywheel.reward_judge.errors import JudgeTimedOut

T = TypeVar("T")


class ModelCalls:
    """Runs blocking model work on a small pool of its own, each call under a deadline."""

    def __init__(self, in_flight: int = 2) -> None:
        self._slots = asyncio.BoundedSemaphore(in_flight)

    async def run(self, fn: Callable[[], T], *, deadline_s: float, what: str, setting: str) -> T:
        """``fn()`` in a model thread, or JudgeTimedOut naming ``setting`` after ``deadline_s``."""
        started = time.monotonic()

        def timed_out() -> JudgeTimedOut:
            return JudgeTimedOut(
                f"the {what} did not answer within {deadline_s:g}s ({setting}); "
                "the model may still be loading or the judge is busy: retry shortly"
            )

        try:
            await asyncio.wait_for(self._slots.acquire(), deadline_s)
        except TimeoutError:
            raise timed_out() from None
        try:
            future = _in_daemon_thread(fn, asyncio.get_running_loop())
        except BaseException:
            self._slots.release()
            raise
        # The slot is given back when the thread is done, not when the caller stops waiting.
        future.add_done_callback(lambda _: self._slots.release())
        remaining = max(0.0, deadline_s - (time.monotonic() - started))
        try:
            return await asyncio.wait_for(asyncio.shield(future), remaining)
        except TimeoutError:
            future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
            raise timed_out() from None

    def close(self) -> None:
        """Nothing to join: model threads are daemons and end with the process."""


def _in_daemon_thread(fn: Callable[[], T], loop: asyncio.AbstractEventLoop) -> asyncio.Future[T]:
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def work() -> None:
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
            return
        loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=work, name="judge-model", daemon=True).start()
    return future
