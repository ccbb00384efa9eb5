"""Publishing events to JetStream and waiting for the server's acknowledgement."""

from __future__ import annotations

from google.protobuf.message import Message
from nats.js import JetStreamContext
from nats.js.api import PubAck

from flywheel.core.bus.codec import encode

MSG_ID = "Nats-Msg-Id"


class Publisher:
    """Publishes protobuf events; the event id doubles as JetStream's dedup id."""

    def __init__(self, js: JetStreamContext, *, timeout_s: float = 5.0) -> None:
        self._js = js
        self._timeout_s = timeout_s

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
