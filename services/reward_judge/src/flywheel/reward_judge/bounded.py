"""Blocking model calls (MiniLM embeddings, the learned reward model) with a deadline and
a cap on how many run at once.

A thread cannot be cancelled, so a call past its deadline keeps its slot until its thread
really finishes: the number of model threads stays at ``in_flight`` however many requests
time out, and later requests wait for a slot within their own deadline instead of piling
up work behind a stuck one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from flywheel.reward_judge.errors import JudgeTimedOut

T = TypeVar("T")


class ModelCalls:
    """Runs blocking model work on a small pool of its own, each call under a deadline."""

    def __init__(self, in_flight: int = 2) -> None:
        self._slots = asyncio.BoundedSemaphore(in_flight)
        self._pool = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="judge-model")

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
            future = asyncio.get_running_loop().run_in_executor(self._pool, fn)
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
        self._pool.shutdown(wait=False, cancel_futures=True)
