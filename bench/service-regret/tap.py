"""A bystander on the feedback subjects: how long a published event takes to reach an idle process.

    FLYWHEEL_NATS_URL=... FLYWHEEL_NATS_USER=... FLYWHEEL_NATS_PASSWORD=... \
        python bench/service-regret/tap.py SUBJECT OUT.json   # until SIGTERM

``lag.py --tap`` runs it beside the replicas during each mode. It subscribes (plain NATS, as
the replicas' provisional folds do) and records, per event, the seconds from its ``meta.time``
(the SDK's clock, when it published) to its arrival here. Its own event loop does nothing else,
so that time is the product's publish plus NATS: what the replica's ``delivered`` stage adds on
top of it is the replica's own wait to read the message. On SIGTERM it writes the list of
seconds to OUT.json and exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from nats.aio.msg import Msg

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.connection import connect
from flywheel.core.settings import NatsSettings


async def tap(subject: str) -> list[float]:
    """Seconds from publish to arrival of every event on ``subject`` until SIGTERM."""
    nc = await connect(NatsSettings(), name="bench-tap")  # FLYWHEEL_NATS_* from the environment
    seconds: list[float] = []

    async def received(msg: Msg) -> None:
        event = FeedbackEvent()
        event.ParseFromString(msg.data)
        sent = event.meta.time.seconds + event.meta.time.nanos / 1e9
        if sent > 0:
            seconds.append(time.time() - sent)

    await nc.subscribe(subject, cb=received)
    await nc.flush()  # the server has the subscription before we say so
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await nc.drain()
    return seconds


if __name__ == "__main__":
    subject, out = sys.argv[1:3]
    Path(out).write_text(json.dumps(asyncio.run(tap(subject))))
