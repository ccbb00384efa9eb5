"""CPU and wall time of the decision log's flush per 1,000 decisions, in one process.

    python bench/select/flush_micro.py [--batches 20] [--batch 1000] [--bus]

Starts a real PostgreSQL and NATS (``flywheel.stack``), migrates the optimizer's schema, creates
the bench's three-arm endpoint, then writes batches of decisions shaped like bench/select's
(context ``{"lang": "en"}``, a user id, prebuilt params Structs) several ways, alternating, each
batch new decisions:

- ``arrays``: the log's first try before issue 20 (one ``INSERT ... SELECT FROM unnest(...)`` of
  a text[]/float8[]/bool[]/timestamptz[] parameter per column, the contexts and features as one
  JSON array, the endpoint's decision clock advanced in the same statement), kept here as the
  reference: asyncpg's array encoder checks every element against ``collections.abc``;
- ``copy``: binary COPY (asyncpg's ``copy_records_to_table``) and the clock's UPDATE in one
  transaction, the log's write at ffcacc1, kept here as the second reference;
- ``json``: the log's first try statement as it is in the tree (``decisions._FIRST``, the rows
  as one JSON parameter), on the same connection as ``arrays``;
- ``log``: ``DecisionLog._insert`` as it is in the tree (PostgreSQL only: since issue 20 the
  rows go as one JSON parameter);
- ``log+bus`` (with ``--bus``): ``DecisionLog._write``, the whole flush: the rows, then the
  ``DecisionBatch`` messages on JetStream.

For each it prints the medians over the batches of the event loop thread's CPU
(``time.thread_time``: the flush runs there, asyncpg's and nats-py's work included),
PostgreSQL's CPU (every PostgreSQL process's user + system time, from psutil) and the wall
time, each per 1,000 decisions. CPU times hold on a loaded machine; wall time does not. The
decisions are built before the clock starts: making them is Select's cost, not the flush's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
from google.protobuf.struct_pb2 import Struct

from flywheel.stack.services import migrate
from flywheel.stack.stack import Servers

SCHEMA = "micro"
ENDPOINT = "bench"


# The first try's statement and parameters before issue 20 (decisions.py as of 399b462).
_ARRAYS_FIRST = """
WITH inserted AS (
INSERT INTO decisions (decision_id, endpoint, arm_id, probability, user_id, session_id, segment,
                       context, features, sticky, created_at)
SELECT r.decision_id, r.endpoint, r.arm_id, r.probability, r.user_id, r.session_id, r.segment,
       j.value -> 0,
       CASE WHEN json_typeof(j.value -> 1) = 'array'
            THEN ARRAY(SELECT json_array_elements_text(j.value -> 1)::float8) END,
       r.sticky, r.created_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::text[], $6::text[], $7::text[],
            $8::bool[], $9::timestamptz[])
     WITH ORDINALITY AS r(decision_id, endpoint, arm_id, probability, user_id, session_id, segment,
                          sticky, created_at, n)
JOIN json_array_elements($10::json) WITH ORDINALITY AS j(value, n) USING (n)
),
locked AS (SELECT e.name, c.n FROM endpoints e JOIN unnest($11::text[], $12::int8[]) AS c(name, n) USING (name)
           ORDER BY e.name FOR NO KEY UPDATE OF e)
UPDATE endpoints SET decisions_total = endpoints.decisions_total + locked.n
FROM locked WHERE endpoints.name = locked.name
"""


async def arrays_insert(conn, batch) -> None:
    """The reference: the log's first try before issue 20, a parameter array per column."""
    counts: dict[str, int] = {}
    for d in batch:
        counts[d.endpoint] = counts.get(d.endpoint, 0) + 1
    columns = (
        [d.decision_id for d in batch],
        [d.endpoint for d in batch],
        [d.arm_id for d in batch],
        [d.probability for d in batch],
        [d.user_id for d in batch],
        [d.session_id for d in batch],
        [d.segment for d in batch],
        [d.sticky for d in batch],
        [d.created_at for d in batch],
        json.dumps([(d.context, d.features) for d in batch]),
    )
    await conn.execute(_ARRAYS_FIRST, *columns, list(counts), list(counts.values()))


async def json_insert(conn, batch) -> None:
    """The log's first try as it is in the tree, on the given connection."""
    from flywheel.optimizer.decisions import _FIRST, _rows

    counts: dict[str, int] = {}
    for d in batch:
        counts[d.endpoint] = counts.get(d.endpoint, 0) + 1
    await conn.execute(_FIRST, *_rows(batch), list(counts), list(counts.values()))


_COLUMNS = (
    "decision_id",
    "endpoint",
    "arm_id",
    "probability",
    "user_id",
    "session_id",
    "segment",
    "context",
    "features",
    "sticky",
    "created_at",
)
_COUNT = """
UPDATE endpoints SET decisions_total = endpoints.decisions_total + c.n
FROM (SELECT name, n FROM unnest($1::text[], $2::int8[]) AS c(name, n)
      JOIN endpoints e USING (name) ORDER BY name FOR NO KEY UPDATE OF e) AS c
WHERE endpoints.name = c.name
"""


async def copy_insert(conn, batch) -> None:
    """Binary COPY and the clock's UPDATE in one transaction (the log's write at ffcacc1)."""
    records = [
        (
            d.decision_id,
            d.endpoint,
            d.arm_id,
            d.probability,
            d.user_id,
            d.session_id,
            d.segment,
            json.dumps(d.context),
            d.features,
            d.sticky,
            d.created_at,
        )
        for d in batch
    ]
    counts: dict[str, int] = {}
    for d in batch:
        counts[d.endpoint] = counts.get(d.endpoint, 0) + 1
    async with conn.transaction():
        await conn.copy_records_to_table("decisions", records=records, columns=_COLUMNS)
        await conn.execute(_COUNT, list(counts), list(counts.values()))


def postgres_cpu(postmaster: psutil.Process) -> float:
    """User + system seconds of the postmaster and every PostgreSQL process it started."""
    total = 0.0
    for proc in [postmaster, *postmaster.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:  # a backend that ended meanwhile
            continue
    return total


def decisions_for(n: int, tag: str, params: dict[str, Struct]):
    from flywheel.optimizer.decisions import Decision, new_decision_id

    arms = ("small", "large", "creative")
    context = Struct()
    context.update({"lang": "en"})
    out = []
    for k in range(n):
        arm = arms[k % 3]
        out.append(
            Decision(
                decision_id=new_decision_id(),
                endpoint=ENDPOINT,
                arm_id=arm,
                params={},
                probability=0.34,
                user_id=f"u-{tag}-{k}",
                context={"lang": "en"},
                created_at=datetime.now(UTC),
                params_struct=params[arm],
                context_struct=context,
            )
        )
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20, help="measured batches per contestant")
    parser.add_argument("--batch", type=int, default=1000, help="decisions per batch")
    parser.add_argument("--bus", action="store_true", help="also time the whole flush with JetStream")
    parser.add_argument(
        "--busy-threads",
        type=int,
        default=0,
        help="threads spinning Python meanwhile, as the sync server's workers do under load (GIL contention)",
    )
    parser.add_argument(
        "--core", type=int, default=None, help="pin this process (not PostgreSQL or NATS) to this core, as run.py does"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="flywheel-flush-micro-"))
    servers = Servers.create(root / "servers")
    servers.start()
    try:
        env = servers.env(namespace="micro", schema=SCHEMA, bucket_prefix="micro")
        migrate("optimizer", env)
        os.environ.update(env)
        if args.core is not None:  # after the servers started: they keep their own affinity
            os.sched_setaffinity(0, {args.core})
        return await measure(servers, args)
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)


async def measure(servers: Servers, args: argparse.Namespace) -> int:
    import asyncpg

    from flywheel.api.subjects import Catalogue
    from flywheel.core.bus.connection import connect, ensure_topology
    from flywheel.core.bus.publisher import Publisher
    from flywheel.core.db import create_engine, session_factory
    from flywheel.core.settings import DatabaseSettings, NatsSettings
    from flywheel.optimizer import service
    from flywheel.optimizer.convert import endpoint_spec
    from flywheel.optimizer.decisions import DecisionLog

    sys.path.insert(0, str(Path(__file__).parents[2] / "tests" / "integration"))
    from helpers import three_arm_endpoint

    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = session_factory(engine)
    request = three_arm_endpoint(ENDPOINT)
    async with sessions() as session:
        await service.create_endpoint(session, spec=endpoint_spec(request.endpoint))
    params = {arm.arm_id: arm.params for arm in request.endpoint.arms}

    nc = await connect(NatsSettings(), name="flush-micro")  # type: ignore[call-arg]
    js = nc.jetstream()
    catalogue = Catalogue("micro")
    await ensure_topology(js, catalogue)
    log = DecisionLog(engine, Publisher(js), catalogue, max_batch=args.batch)
    dsn = servers.database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA})
    assert servers.postgres is not None and servers.postgres.pid is not None
    postmaster = psutil.Process(servers.postgres.pid)

    async def reference(batch) -> None:
        await arrays_insert(conn, batch)

    async def tree(batch) -> None:
        assert await log._insert(batch) == []

    async def whole(batch) -> None:
        await log._write(batch)

    stop = threading.Event()

    def spin() -> None:  # pure Python: holds the GIL but for the interpreter's switch interval
        while not stop.is_set():
            sum(range(200))

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(args.busy_threads)]
    for thread in spinners:
        thread.start()

    async def copy(batch) -> None:
        await copy_insert(conn, batch)

    async def as_json(batch) -> None:
        await json_insert(conn, batch)

    contestants = [("arrays", reference), ("json", as_json), ("copy", copy), ("log", tree)]
    if args.bus:
        contestants.append(("log+bus", whole))
    results: dict[str, dict[str, list[float]]] = {n: {"cpu": [], "pg": [], "wall": []} for n, _ in contestants}
    written = 0
    for b in range(args.batches + 2):  # the first two warm up (statements prepared, caches)
        for label, fn in contestants:
            batch = decisions_for(args.batch, f"{label}{b}", params)
            pg0, cpu0, wall0 = postgres_cpu(postmaster), time.thread_time(), time.perf_counter()
            await fn(batch)
            wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
            pg = postgres_cpu(postmaster) - pg0
            written += len(batch)
            if b >= 2:
                per = 1000 / len(batch)
                results[label]["cpu"].append(1e3 * cpu * per)
                results[label]["pg"].append(1e3 * pg * per)
                results[label]["wall"].append(1e3 * wall * per)
    stop.set()
    for thread in spinners:
        thread.join()
    rows = await conn.fetchval("SELECT count(*) FROM decisions")
    clock = await conn.fetchval("SELECT decisions_total FROM endpoints WHERE name = $1", ENDPOINT)
    await conn.close()
    await log.close()
    await nc.close()
    await engine.dispose()
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {rows} rows for {written} decisions; "
        f"{args.busy_threads} busy threads"
    )
    print(f"{'':>8}  ms per 1,000 decisions (median, min-max of {args.batches} batches of {args.batch})")
    print(f"{'':>8}  {'loop thread CPU':>20}  {'PostgreSQL CPU':>20}  {'wall':>20}")
    summary = {}
    for label, values in results.items():
        cells = []
        for key in ("cpu", "pg", "wall"):
            v = values[key]
            cells.append(f"{statistics.median(v):6.2f} ({min(v):5.2f}-{max(v):5.2f})")
        print(
            f"{label:>8}  "
            + "  ".join(f"{c:>20}" for c in cells)
            + f"  PostgreSQL mean {statistics.mean(values['pg']):.2f}"
        )
        summary[label] = {k: round(statistics.median(v), 3) for k, v in values.items()}
        summary[label]["pg_mean"] = round(statistics.mean(values["pg"]), 3)
    # Every contestant advances the endpoint's decision clock by the rows it wrote.
    print(json.dumps({"rows": rows, "decisions": written, "decision_clock": clock, "ms_per_1000": summary}))
    return 0 if rows == written == clock else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
