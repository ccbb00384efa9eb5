"""A durable pull consumer that never lets one bad message stop the ones behind it.

For each message: decode by Content-Type, run the handler, ack. A payload that does
not decode, or that the handler rejects with :class:`Reject`, is published to the
dead-letter subject with the reason and then acked. Any other exception is a
transient failure: the message is nak'ed with a backoff and redelivered, and after
``max_deliver`` attempts it is dead-lettered too. Handlers must therefore be
idempotent (the optimizer's dedups by event id inside the same transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from flywheel.api.common.v1.common_pb2 import DeadLetter
from flywheel.api.subjects import Catalogue, ConsumerSpec
from flywheel.core.bus.codec import MalformedEvent, decode
from flywheel.core.bus.connection import ensure_consumer
from flywheel.core.bus.publisher import Publisher
from flywheel.core.logging import bound, get_logger
from flywheel.core.metrics import EVENT_SECONDS, EVENTS_TOTAL

log = get_logger(__name__)
M = TypeVar("M", bound=Message)


class Reject(Exception):
    """Raised by a handler for an event that can never succeed (unknown decision, bad
    value): it is dead-lettered with this message as the reason, not retried."""


@dataclass(frozen=True)
class Delivery:
    """Transport facts about one message, handed to the handler beside the event."""

    subject: str
    headers: dict[str, str]
    stream_sequence: int
    num_delivered: int


Handler = Callable[[M, Delivery], Awaitable[None]]


class EventConsumer(Generic[M]):
    """Runs one handler over one durable consumer until stopped."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        catalogue: Catalogue,
        spec: ConsumerSpec,
        message_type: type[M],
        handler: Handler[M],
        batch_size: int = 64,
        fetch_timeout_s: float = 0.5,
    ) -> None:
        self._js = js
        self._catalogue = catalogue
        self._spec = spec
        self._message_type = message_type
        self._handler = handler
        self._publisher = Publisher(js)
        self._batch_size = batch_size
        self._fetch_timeout_s = fetch_timeout_s
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sub: JetStreamContext.PullSubscription | None = None

    @property
    def name(self) -> str:
        return self._spec.durable

    async def start(self) -> None:
        """Declare the durable consumer and start pulling."""
        await ensure_consumer(self._js, self._spec)
        self._sub = await self._js.pull_subscribe_bind(self._spec.durable, self._spec.stream)
        self._task = asyncio.create_task(self._run(self._sub), name=f"consumer:{self.name}")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop fetching; let the batch in hand finish (unacked ones are redelivered later)."""
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout_s)
            except TimeoutError:
                self._task.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await self._sub.unsubscribe()

    async def _run(self, sub: JetStreamContext.PullSubscription) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                messages = await sub.fetch(self._batch_size, timeout=self._fetch_timeout_s)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:  # noqa: BLE001 - NATS down or reconnecting; readiness reports it
                log.warning("fetch failed", consumer=self.name, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            for msg in messages:
                await self._process(msg)

    async def _process(self, msg: Msg) -> None:
        meta = msg.metadata
        delivery = Delivery(
            subject=msg.subject,
            headers=dict(msg.headers or {}),
            stream_sequence=meta.sequence.stream,
            num_delivered=meta.num_delivered,
        )
        started = time.perf_counter()
        with bound(consumer=self.name, subject=msg.subject, seq=delivery.stream_sequence):
            try:
                event = decode(msg.data, delivery.headers, self._message_type)
            except MalformedEvent as exc:
                await self._dead_letter(msg, delivery, str(exc))
                return
            try:
                await self._handler(event, delivery)
            except Reject as exc:
                await self._dead_letter(msg, delivery, str(exc))
                return
            except Exception as exc:  # noqa: BLE001 - a handler bug or an outage must not stop the loop
                if delivery.num_delivered >= self._spec.max_deliver:
                    await self._dead_letter(
                        msg, delivery, f"failed {delivery.num_delivered} times, last error: {exc!r}"
                    )
                    return
                log.warning("handler failed; will retry", error=repr(exc), attempt=delivery.num_delivered)
                EVENTS_TOTAL.labels(self.name, "retry").inc()
                await msg.nak(delay=min(0.2 * 2**delivery.num_delivered, 10.0))
                return
            await msg.ack()
            EVENTS_TOTAL.labels(self.name, "ack").inc()
            EVENT_SECONDS.labels(self.name).observe(time.perf_counter() - started)

    async def _dead_letter(self, msg: Msg, delivery: Delivery, reason: str) -> None:
        letter = DeadLetter(
            subject=delivery.subject,
            consumer=self.name,
            reason=reason,
            payload=msg.data,
            headers=delivery.headers,
            stream_sequence=delivery.stream_sequence,
        )
        now = Timestamp()
        now.GetCurrentTime()
        letter.time.CopyFrom(now)
        # The dedup id makes a redelivered message dead-letter once even if we die before acking.
        await self._publisher.publish(
            self._catalogue.dead_letter(self.name),
            letter,
            msg_id=f"{self.name}:{delivery.stream_sequence}",
        )
        await msg.ack()
        EVENTS_TOTAL.labels(self.name, "deadletter").inc()
        log.warning("dead-lettered", reason=reason)
