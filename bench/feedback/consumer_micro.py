"""CPU microseconds per message of the bus consumer's own work (decode, settle, ack), without NATS.

Runs ``EventConsumer._process`` over real nats-py ``Msg`` objects carrying the SDK's feedback
payload and a JetStream reply subject, with a no-op batch handler and a client whose publish
(the ack) does nothing; prints the median of 7 rounds of 20,000 messages in process CPU time
(valid on a loaded machine). Issue 19 took it from 17-19 to 6-7 us/message (``811f809``).

    python bench/feedback/consumer_micro.py
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.msg import Msg

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.consumer import EventConsumer

ROUNDS, BATCHES, BATCH = 7, 100, 200


class NoopClient:
    """Stands in for the NATS client: an ack is a publish to the reply subject, here a no-op."""

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "", headers: object = None) -> None:
        return None


async def noop(items: list) -> list:
    return [None] * len(items)


def batch(start: int, n: int, client: NoopClient) -> list[Msg]:
    now = time.time_ns()
    out = []
    for s in range(start, start + n):
        data = FeedbackEvent(
            meta=EventMeta(event_id=f"fb-{s}"), decision_id=f"{s:032x}", endpoint="bot", reward=1.0
        ).SerializeToString()
        reply = f"$JS.ACK.ns-product.optimizer-feedback.1.{s}.{s}.{now}.{n - s + start}"
        out.append(Msg(_client=client, subject="ns.product.feedback.bot", reply=reply, data=data, headers=None))
    return out


async def main() -> None:
    catalogue = Catalogue("bench")
    consumer = EventConsumer(
        js=None,  # type: ignore[arg-type]  # _process never fetches
        catalogue=catalogue,
        spec=catalogue.consumer("optimizer-feedback"),
        message_type=FeedbackEvent,
        batch_handler=noop,
    )
    client = NoopClient()
    per_message = []
    for _ in range(ROUNDS):
        batches = [batch(i * BATCH, BATCH, client) for i in range(BATCHES)]
        t0 = time.process_time()
        for b in batches:
            await consumer._process(b)
        per_message.append((time.process_time() - t0) / (BATCHES * BATCH) * 1e6)
    per_message.sort()
    rounds = ", ".join(f"{r:.2f}" for r in per_message)
    print(f"consumer CPU us/message: median {per_message[ROUNDS // 2]:.2f} of {ROUNDS} rounds ({rounds})")


if __name__ == "__main__":
    asyncio.run(main())
