"""The two peers of bench/feedback, each run as its own process by run.py:

    python bench/feedback/peers.py raw_natspy|faststream

Both apply the same exactly-once update as the optimizer to the optimizer's own tables,
one transaction per message, then ack:

    SELECT endpoint, arm_id FROM decisions WHERE decision_id = $1      (which arm)
    INSERT INTO applied_feedback ... ON CONFLICT (event_id) DO NOTHING RETURNING
    if inserted:  UPDATE arms        SET pulls + 1, reward_sum + r
                  INSERT INTO arm_stats ... ON CONFLICT DO UPDATE SET w + 1, s + r, ss + r*r

- raw_natspy: the most direct nats-py pull consumer: fetch a batch, then for each message
  one asyncpg transaction and an ack, one after another on one connection.
- faststream: a FastStream JetStream pull subscriber (PullSub) with a per-message handler;
  FastStream runs the handlers of a fetched batch concurrently, so it gets an asyncpg pool
  of the optimizer's size (10). Per-message logging is off (logger=None), which only helps it.

Connection details come from the FLYWHEEL_* variables run.py sets (never the command line);
BENCH_DURABLE, BENCH_BATCH and BENCH_POOL tune the consumer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import asyncpg
import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue

LOOKUP = "SELECT endpoint, arm_id FROM decisions WHERE decision_id = $1"
DEDUP = (
    "INSERT INTO applied_feedback (event_id, decision_id, reward) VALUES ($1, $2, $3) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
ARM = "UPDATE arms SET pulls = pulls + 1, reward_sum = reward_sum + $3::float8 WHERE endpoint = $1 AND arm_id = $2"
STATS = """
    INSERT INTO arm_stats AS st (endpoint, arm_id, segment, bucket, w, s, ss, as_of)
    VALUES ($1, $2, '', 0, 1.0, $3::float8, $3::float8 * $3::float8, now())
    ON CONFLICT (endpoint, arm_id, segment, bucket) DO UPDATE SET
        w = st.w + EXCLUDED.w, s = st.s + EXCLUDED.s, ss = st.ss + EXCLUDED.ss,
        as_of = greatest(st.as_of, EXCLUDED.as_of)
"""


class Unknown(Exception):
    """The decision is not in the log (never happens in the benchmark)."""


async def apply_one(conn: asyncpg.Connection, data: bytes) -> bool:
    """One event, one transaction; True when it changed the posterior (not a duplicate)."""
    event = FeedbackEvent.FromString(data)
    reward = min(1.0, max(0.0, event.reward))
    async with conn.transaction():
        row = await conn.fetchrow(LOOKUP, event.decision_id)
        if row is None:
            raise Unknown(event.decision_id)
        if await conn.fetchval(DEDUP, event.meta.event_id, event.decision_id, reward) is None:
            return False
        await conn.execute(ARM, row["endpoint"], row["arm_id"], reward)
        await conn.execute(STATS, row["endpoint"], row["arm_id"], reward)
    return True


def settings() -> dict[str, str]:
    env = os.environ
    catalogue = Catalogue(env["FLYWHEEL_NATS_NAMESPACE"])
    spec = catalogue.consumer("optimizer-feedback")  # same stream, filter and limits as the optimizer's
    return {
        "nats_url": env["FLYWHEEL_NATS_URL"],
        "user": env["FLYWHEEL_NATS_USER"],
        "password": env["FLYWHEEL_NATS_PASSWORD"],
        "dsn": env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://", 1),
        "schema": env["FLYWHEEL_DB_SCHEMA"],
        "stream": spec.stream,
        "subject": spec.filter_subject,
        "durable": env.get("BENCH_DURABLE", "bench-peer"),
        "ack_wait": str(spec.ack_wait.total_seconds()),
        "max_deliver": str(spec.max_deliver),
        "max_ack_pending": str(spec.max_ack_pending),
    }


def consumer_config(s: dict[str, str]) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=s["durable"],
        filter_subject=s["subject"],
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=float(s["ack_wait"]),
        max_deliver=int(s["max_deliver"]),
        max_ack_pending=int(s["max_ack_pending"]),
    )


def stop_event() -> asyncio.Event:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    return stopping


async def raw_natspy() -> None:
    s = settings()
    batch = int(os.environ.get("BENCH_BATCH", "256"))
    stopping = stop_event()
    nc = await nats.connect(s["nats_url"], user=s["user"], password=s["password"])
    conn = await asyncpg.connect(s["dsn"], server_settings={"search_path": s["schema"]})
    js = nc.jetstream()
    sub = await js.pull_subscribe(s["subject"], durable=s["durable"], stream=s["stream"], config=consumer_config(s))
    while not stopping.is_set():
        try:
            messages = await sub.fetch(batch, timeout=0.5)
        except (TimeoutError, NatsTimeoutError):
            continue
        for msg in messages:
            try:
                await apply_one(conn, msg.data)
            except Unknown:
                await msg.term()
                continue
            await msg.ack()
    await conn.close()
    await nc.close()


async def faststream() -> None:
    from faststream.nats import JStream, NatsBroker, PullSub
    from faststream.security import SASLPlaintext

    s = settings()
    batch = int(os.environ.get("BENCH_BATCH", "256"))
    pool_size = int(os.environ.get("BENCH_POOL", "10"))
    stopping = stop_event()
    pool = await asyncpg.create_pool(
        s["dsn"], min_size=pool_size, max_size=pool_size, server_settings={"search_path": s["schema"]}
    )
    broker = NatsBroker(s["nats_url"], security=SASLPlaintext(username=s["user"], password=s["password"]), logger=None)

    @broker.subscriber(
        s["subject"],
        stream=JStream(name=s["stream"], declare=False),
        durable=s["durable"],
        config=consumer_config(s),
        pull_sub=PullSub(batch_size=batch, timeout=0.5),
    )
    async def handle(body: bytes) -> None:
        async with pool.acquire() as conn:
            await apply_one(conn, body)  # returns: acked; raises: FastStream rejects/naks it

    await broker.start()
    await stopping.wait()
    await broker.stop()
    await pool.close()


if __name__ == "__main__":
    peers = {"raw_natspy": raw_natspy, "faststream": faststream}
    if len(sys.argv) != 2 or sys.argv[1] not in peers:
        raise SystemExit(f"usage: peers.py {'|'.join(peers)}")
    asyncio.run(peers[sys.argv[1]]())
