"""Publishing events to JetStream and waiting for the server's acknowledgement."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence

from google.protobuf.message import Message
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

from flywheel.core.bus.codec import CONTENT_TYPE as _CONTENT_TYPE
from flywheel.core.bus.codec import PROTOBUF, encode

MSG_ID = "Nats-Msg-Id"


class _Batch:
    __slots__ = ("done", "error", "left")

    def __init__(self, n: int) -> None:
        self.left = n
        self.error: Exception | None = None
        self.done = asyncio.get_running_loop().create_future()


class Publisher:
    """Publishes protobuf events; the event id doubles as JetStream's dedup id."""

    def __init__(self, js: JetStreamContext, *, timeout_s: float = 5.0) -> None:
        self._js = js
        self._timeout_s = timeout_s
        self._inbox: str | None = None
        self._batches: dict[str, _Batch] = {}
        self._ids = itertools.count()

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None, as_json: bool = False
    ) -> PubAck:
        """Publish and return once the stream has stored it (durable)."""
        payload, headers = encode(message, as_json=as_json)
        if msg_id is None:
            meta = getattr(message, "meta", None)
            msg_id = meta.event_id if meta is not None and meta.event_id else None
        if msg_id:
            headers[MSG_ID] = msg_id
        return await self._js.publish(subject, payload, headers=headers, timeout=self._timeout_s)

    async def publish_many(self, items: Sequence[tuple[str, Message, str]]) -> None:
        """Publish (subject, message, msg_id) items as binary protobuf and return once JetStream has
        stored them all (raise if any was refused or not acknowledged within the timeout).

        Same guarantee as awaiting ``publish`` for each, at a fraction of the CPU: the messages are
        pipelined with one reply subject per batch on a single inbox subscription, and the acks are
        counted instead of each getting its own request future, timer and PubAck.
        """
        if not items:
            return
        nc = self._js._nc
        if self._inbox is None:
            self._inbox = nc.new_inbox()
            await nc.subscribe(f"{self._inbox}.*.*", cb=self._on_ack)
        key = str(next(self._ids))
        batch = self._batches[key] = _Batch(len(items))
        try:
            for i, (subject, message, msg_id) in enumerate(items):
                headers = {_CONTENT_TYPE: PROTOBUF, MSG_ID: msg_id}
                reply = f"{self._inbox}.{key}.{i}"
                await nc.publish(subject, message.SerializeToString(), reply=reply, headers=headers)
            await asyncio.wait_for(asyncio.shield(batch.done), self._timeout_s)
        finally:
            self._batches.pop(key, None)
        if batch.error is not None:
            raise batch.error

    async def _on_ack(self, msg: Msg) -> None:
        batch = self._batches.get(msg.subject.rsplit(".", 2)[1])
        if batch is None or batch.done.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            batch.error = batch.error or NoStreamResponseError()
        elif b'"error"' in msg.data:
            try:
                APIError.from_error(json.loads(msg.data)["error"])  # raises the error's own class
            except APIError as exc:
                batch.error = batch.error or exc
        batch.left -= 1
        if batch.left == 0:
            batch.done.set_result(None)
