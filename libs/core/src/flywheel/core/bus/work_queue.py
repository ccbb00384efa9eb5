"""The work-queue consumer of evaluators and trainers: the core pull loop (decode,
dead-letter, settle), but with each request handled on its own as soon as it arrives, up to ``concurrency`` at once, and
kept alive with in-progress acks while a slow target answers.

The core loop settles a fetched batch together, so one slow LLM call would hold back the
fast ones and the batch's ack deadline; evaluations vary in length, so here every
message is settled the moment its own evaluation ends."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, TypeVar

from google.protobuf.message import Message
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from flywheel.core.bus.consumer import EventConsumer
from flywheel.core.logging import get_logger

log = get_logger(__name__)
M = TypeVar("M", bound=Message)


class WorkQueueConsumer(EventConsumer[M]):
    """An :class:`EventConsumer` that runs up to ``concurrency`` messages at once."""

    def __init__(self, *, concurrency: int, heartbeat_s: float, **kwargs: Any) -> None:
        super().__init__(batch_size=concurrency, **kwargs)
        self._concurrency = concurrency
        self._heartbeat_s = heartbeat_s
        self._inflight: set[asyncio.Task[None]] = set()

    async def _run(self, sub: JetStreamContext.PullSubscription) -> None:
        try:
            while not self._stopping.is_set():
                free = self._concurrency - len(self._inflight)
                if free <= 0:
                    await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                parcel = await self._fetch(sub, free)  # None: nothing came, or NATS away (backed off)
                for msg in parcel.messages if parcel is not None else ():
                    task = asyncio.create_task(self._one(msg))
                    self._inflight.add(task)
                    task.add_done_callback(self._inflight.discard)
            if self._inflight:  # finish what is in hand; stop() bounds the wait
                await asyncio.wait(self._inflight)
        finally:
            for task in self._inflight:  # cancelled by stop()'s timeout: unacked, so redelivered
                task.cancel()

    async def _one(self, msg: Msg) -> None:
        beat = asyncio.create_task(self._keep_alive(msg))
        try:
            await self._process([msg])
        except Exception as exc:  # noqa: BLE001 - settling failed (NATS away): redelivered after ack_wait
            log.warning("settling failed", consumer=self.name, error=repr(exc))
        finally:
            beat.cancel()

    async def _keep_alive(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            with contextlib.suppress(Exception):
                await msg.in_progress()
