"""The peers of bench/feedback, each run as its own process by run.py:

    python bench/feedback/peers.py raw_natspy_batch|faststream_batch|raw_natspy|faststream

All apply the same exactly-once update as the optimizer to the optimizer's own tables (a
dedup row in ``applied_feedback`` and the increments of ``arms`` and ``arm_stats``, committed
together), and ack a message only after its transaction committed.

Batched, one transaction per fetched batch, as the optimizer does (``apply_batch``):

    SELECT decision_id, endpoint, arm_id FROM decisions WHERE decision_id = ANY($1)
    INSERT INTO applied_feedback SELECT * FROM unnest($1, $2, $3)
        ON CONFLICT (event_id) DO NOTHING RETURNING event_id
    UPDATE arms ... FROM unnest(...)                      one statement, every arm touched
    INSERT INTO arm_stats SELECT ... FROM unnest(...) ON CONFLICT DO UPDATE   likewise

- raw_natspy_batch: nats-py's pull consumer, ``fetch(BENCH_BATCH)``, ``apply_batch`` on one
  connection, then an ack per message.
- faststream_batch: FastStream's batch pull subscriber (``PullSub(batch_size=BENCH_BATCH,
  timeout=BENCH_BATCH_TIMEOUT, batch=True)``) with ``AckPolicy.NACK_ON_ERROR``: the handler gets
  the batch's bodies, runs ``apply_batch``, and FastStream acks every message once it returns
  (naks them all if it raises, so they are redelivered: at-least-once plus the dedup row).

Per message, one transaction per message (``apply_one``), kept as the second rows:

- raw_natspy: fetch a batch, then per message one asyncpg transaction and an ack, one
  after another on one connection.
- faststream: FastStream's pull subscriber with a per-message handler; FastStream runs the
  handlers of a fetched batch concurrently, so it gets an asyncpg pool of the optimizer's
  size (10). ``AckPolicy.NACK_ON_ERROR`` as above.

FastStream's per-message log lines are off (``logger=None``), which only helps it.
Connection details come from the FLYWHEEL_* variables run.py sets (never the command line);
BENCH_DURABLE, BENCH_BATCH, BENCH_BATCH_TIMEOUT and BENCH_POOL tune the consumer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections import defaultdict
from typing import Any

import asyncpg
import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue

# --- one transaction per message -------------------------------------------------------------

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

# --- one transaction per batch: each statement takes arrays, so asyncpg prepares it once -------

LOOKUP_MANY = "SELECT decision_id, endpoint, arm_id FROM decisions WHERE decision_id = ANY($1::text[])"
DEDUP_MANY = (
    "INSERT INTO applied_feedback (event_id, decision_id, reward) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::float8[]) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
ARMS_MANY = """
    UPDATE arms AS a SET pulls = a.pulls + v.n, reward_sum = a.reward_sum + v.s
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[]) AS v(endpoint, arm_id, n, s)
    WHERE a.endpoint = v.endpoint AND a.arm_id = v.arm_id
"""
STATS_MANY = """
    INSERT INTO arm_stats AS st (endpoint, arm_id, segment, bucket, w, s, ss, as_of)
    SELECT v.endpoint, v.arm_id, '', 0, v.w, v.s, v.ss, now()
    FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[], $5::float8[]) AS v(endpoint, arm_id, w, s, ss)
    ON CONFLICT (endpoint, arm_id, segment, bucket) DO UPDATE SET
        w = st.w + EXCLUDED.w, s = st.s + EXCLUDED.s, ss = st.ss + EXCLUDED.ss,
        as_of = greatest(st.as_of, EXCLUDED.as_of)
"""


class Unknown(Exception):
    """The decision is not in the log (never happens in the benchmark)."""


def reward_of(event: FeedbackEvent) -> float:
    return min(1.0, max(0.0, event.reward))  # bounded endpoints, as the optimizer clips them


async def apply_one(conn: asyncpg.Connection, data: bytes) -> bool:
    """One event, one transaction; True when it changed the posterior (not a duplicate)."""
    event = FeedbackEvent.FromString(data)
    reward = reward_of(event)
    async with conn.transaction():
        row = await conn.fetchrow(LOOKUP, event.decision_id)
        if row is None:
            raise Unknown(event.decision_id)
        if await conn.fetchval(DEDUP, event.meta.event_id, event.decision_id, reward) is None:
            return False
        await conn.execute(ARM, row["endpoint"], row["arm_id"], reward)
        await conn.execute(STATS, row["endpoint"], row["arm_id"], reward)
    return True


async def apply_batch(conn: asyncpg.Connection, bodies: list[bytes]) -> list[bool | None]:
    """A batch of events in one transaction of four statements, whatever its size.

    Per event: True when applied, False for a duplicate (of an earlier delivery or of an
    event earlier in the same batch), None when its decision is unknown."""
    events = [FeedbackEvent.FromString(b) for b in bodies]
    out: list[bool | None] = [None] * len(events)
    async with conn.transaction():
        ids = list({e.decision_id for e in events})
        arm_of = {r["decision_id"]: (r["endpoint"], r["arm_id"]) for r in await conn.fetch(LOOKUP_MANY, ids)}
        known = [i for i, e in enumerate(events) if e.decision_id in arm_of]
        if not known:
            return out
        rows = await conn.fetch(
            DEDUP_MANY,
            [events[i].meta.event_id for i in known],
            [events[i].decision_id for i in known],
            [reward_of(events[i]) for i in known],
        )
        inserted = {r["event_id"] for r in rows}
        sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for i in known:
            event = events[i]
            out[i] = event.meta.event_id in inserted
            if out[i]:
                inserted.discard(event.meta.event_id)  # a repeat inside the batch is a duplicate too
                r = reward_of(event)
                acc = sums[arm_of[event.decision_id]]
                acc[0] += 1
                acc[1] += r
                acc[2] += r * r
        if sums:
            keys = sorted(sums)  # one lock order for every writer
            endpoints, arms = [k[0] for k in keys], [k[1] for k in keys]
            await conn.execute(ARMS_MANY, endpoints, arms, [int(sums[k][0]) for k in keys], [sums[k][1] for k in keys])
            await conn.execute(
                STATS_MANY,
                endpoints,
                arms,
                [float(sums[k][0]) for k in keys],
                [sums[k][1] for k in keys],
                [sums[k][2] for k in keys],
            )
    return out


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
        "batch": env.get("BENCH_BATCH", "256"),
        "batch_timeout": env.get("BENCH_BATCH_TIMEOUT", "0.5"),
        "pool": env.get("BENCH_POOL", "10"),
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


async def _raw(per_batch: bool) -> None:
    s = settings()
    stopping = stop_event()
    nc = await nats.connect(s["nats_url"], user=s["user"], password=s["password"])
    conn = await asyncpg.connect(s["dsn"], server_settings={"search_path": s["schema"]})
    js = nc.jetstream()
    sub = await js.pull_subscribe(s["subject"], durable=s["durable"], stream=s["stream"], config=consumer_config(s))
    while not stopping.is_set():
        try:
            messages = await sub.fetch(int(s["batch"]), timeout=float(s["batch_timeout"]))
        except (TimeoutError, NatsTimeoutError):
            continue
        if per_batch:
            try:
                outcomes = await apply_batch(conn, [m.data for m in messages])
            except Exception as exc:  # noqa: BLE001 - nothing committed: every message comes back
                print(f"batch failed, nak'ed: {exc!r}", file=sys.stderr, flush=True)
                for msg in messages:
                    await msg.nak(delay=1.0)
                continue
            for msg, outcome in zip(messages, outcomes, strict=True):
                await (msg.term() if outcome is None else msg.ack())
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


async def raw_natspy() -> None:
    await _raw(per_batch=False)


async def raw_natspy_batch() -> None:
    await _raw(per_batch=True)


async def _faststream(per_batch: bool) -> None:
    from faststream import AckPolicy as FsAckPolicy
    from faststream.nats import JStream, NatsBroker, PullSub
    from faststream.security import SASLPlaintext

    s = settings()
    stopping = stop_event()
    pool_size = int(s["pool"])
    pool = await asyncpg.create_pool(
        s["dsn"], min_size=pool_size, max_size=pool_size, server_settings={"search_path": s["schema"]}
    )
    # BENCH_FS_LOG=1 keeps FastStream's own logging (per-message lines: for diagnosis only).
    logger: dict[str, Any] = {} if os.environ.get("BENCH_FS_LOG") else {"logger": None}
    if logger == {}:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout)
    broker = NatsBroker(s["nats_url"], security=SASLPlaintext(username=s["user"], password=s["password"]), **logger)
    subscriber = broker.subscriber(
        s["subject"],
        stream=JStream(name=s["stream"], declare=False),
        durable=s["durable"],
        config=consumer_config(s),
        pull_sub=PullSub(batch_size=int(s["batch"]), timeout=float(s["batch_timeout"]), batch=per_batch),
        ack_policy=FsAckPolicy.NACK_ON_ERROR,  # redeliver what did not commit (at-least-once)
    )

    if per_batch:

        @subscriber
        async def handle_batch(bodies: list[bytes]) -> None:
            try:
                async with pool.acquire() as conn:
                    await apply_batch(conn, bodies)  # returns: all acked; raises: all nak'ed
            except Exception as exc:
                print(f"batch of {len(bodies)} failed, nak'ed: {exc!r}", file=sys.stderr, flush=True)
                raise

    else:

        @subscriber
        async def handle(body: bytes) -> None:
            async with pool.acquire() as conn:
                await apply_one(conn, body)  # returns: acked; raises: nak'ed

    await broker.start()
    await stopping.wait()
    await broker.stop()
    await pool.close()


async def faststream() -> None:
    await _faststream(per_batch=False)


async def faststream_batch() -> None:
    await _faststream(per_batch=True)


PEERS = {
    "raw_natspy_batch": raw_natspy_batch,
    "faststream_batch": faststream_batch,
    "raw_natspy": raw_natspy,
    "faststream": faststream,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PEERS:
        raise SystemExit(f"usage: peers.py {'|'.join(PEERS)}")
    asyncio.run(PEERS[sys.argv[1]]())
