"""Span ingest: the trace store (segments in S3 + bulk index rows in PostgreSQL) against the
naive path (one S3 PUT and one INSERT per span), in the same run on the same servers.

    python bench/ingest/run.py [--quick]

Real NATS (JetStream), PostgreSQL and S3 start under a temporary folder and the trace
store's schema is migrated.

1. Throughput. N spans (batches of 100 spans, 20 traces of 5 spans) are published to
   JetStream before the trace store starts, so it starts with a backlog; then
   ``python -m flywheel.trace_store`` starts and the committed span count (the sum over the
   small ``segments`` table, written in the same transaction as the index rows) is polled
   every 20 ms. The rate is spans indexed between the first and the last poll at which the
   count changed, over that time. At the end every span is checked to be indexed exactly
   once (``count(*)`` of the index and the traces' span counts).
2. Naive peer. The same kind of spans, each written as its own S3 object (PUT) and its own
   INSERT (autocommit), 8 in flight (asyncio + threads), in the same process layout a
   simple consumer would use.
3. Latency. While a background load publishes at about a quarter of the measured rate,
   single-trace batches are published one at a time and ``QueryTraces`` (by the trace's
   decision id) is polled every 10 ms until it is found: ingest -> queryable.
4. Storage. Segment bytes per span (gzip JSONL) and PostgreSQL bytes per span (spans +
   traces tables with their indexes), against the naive peer's bytes per span.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import nats
from minio import Minio

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind
from flywheel.stack import benchstamp
from flywheel.stack.services import ServiceProcess, migrate
from flywheel.stack.stack import Servers
from flywheel.trace_store import segments
from flywheel.trace_store.spans import to_record

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "bench" / "results" / "ingest.json"
NS, SCHEMA, PREFIX = "bingest", "bench_ingest", "bingest"
COLUMNS = ("spans_per_s", "object_bytes_per_span", "postgres_bytes_per_span")
GOALS = {"flywheel_vs_naive": 20.0, "p99_ingest_to_queryable_s_max": 2.0}
# Versions recorded with the results.
PACKAGES = ("asyncpg", "nats-py", "grpcio", "minio", "protobuf")
KINDS = [SpanKind.SPAN_KIND_PROMPT, SpanKind.SPAN_KIND_TOOL, SpanKind.SPAN_KIND_REASONING,
         SpanKind.SPAN_KIND_CONTENT, SpanKind.SPAN_KIND_REWARD]  # fmt: skip


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def make_trace(i: int, decision_id: str = "") -> list[Span]:
    """A 5-span agent trace with realistic text sizes (a ~300-char prompt, ~400-char answer)."""
    tid = secrets.token_hex(16)
    now = datetime.now(UTC)
    spans = []
    root = ""
    for k, kind in enumerate(KINDS):
        s = Span(trace_id=tid, span_id=secrets.token_hex(8), parent_span_id=root, kind=kind, agent="bench",
                 name=f"step-{k}", model="gpt-4o-mini", input_tokens=120, output_tokens=80, cost_usd=0.0004,
                 decision_id=decision_id, user_id=f"user-{i % 97}")  # fmt: skip
        s.start_time.FromDatetime(now)
        s.end_time.FromDatetime(now)
        if kind == SpanKind.SPAN_KIND_PROMPT:
            s.input = f"Customer {i} asks: how do I reset my router model X{i % 13}? " * 5
            s.output = "Unplug it for ten seconds, then hold the reset button. " * 7
        elif kind == SpanKind.SPAN_KIND_REWARD:
            s.reward, s.reward_min, s.reward_max = (i % 10), 0, 10
        else:
            s.output = f"{kind} output {i} " * 6
            s.attributes.update({"tool.name": "kb_search", "k": 5})
        spans.append(s)
        root = root or s.span_id
    return spans


def batches(n_spans: int) -> list[SpanBatch]:
    out, i = [], 0
    while i * 5 < n_spans:
        spans: list[Span] = []
        for _ in range(20):
            spans += make_trace(i)
            i += 1
        out.append(SpanBatch(meta=EventMeta(event_id=secrets.token_hex(16)), spans=spans))
    return out


async def publish_all(js: Any, subject: str, items: list[SpanBatch], in_flight: int = 500) -> None:
    for k in range(0, len(items), in_flight):
        chunk = items[k : k + in_flight]
        await asyncio.gather(
            *(js.publish(subject, b.SerializeToString(), headers={"Nats-Msg-Id": b.meta.event_id}) for b in chunk)
        )


async def watch_count(pool: asyncpg.Pool, target: int, timeout_s: float) -> dict[str, float]:
    first = last = None
    first_n = last_n = 0
    prev = -1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Spans committed so far: a segment row is written in the same transaction as its
        # spans' index rows. count(*) over the growing spans table would cost PostgreSQL
        # more CPU than the ingest itself on 2 cores by the end of the run.
        n = await pool.fetchval("SELECT coalesce(sum(spans), 0) FROM segments")
        now = time.perf_counter()
        if n != prev:
            if prev >= 0 and first is None:
                first, first_n = now, prev
            if first is not None:
                last, last_n = now, n
            prev = n
        if n >= target:
            break
        await asyncio.sleep(0.02)
    if first is None or last is None or last == first:
        raise RuntimeError(f"trace store indexed {prev} of {target} spans")
    return {
        "spans": last_n - first_n,
        "seconds": round(last - first, 3),
        "spans_per_s": round((last_n - first_n) / (last - first), 1),
    }


async def naive(pool: asyncpg.Pool, s3: Minio, bucket: str, n_spans: int, in_flight: int = 8) -> dict[str, Any]:
    """One PUT and one INSERT per span."""
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS naive_spans (trace_id text, span_id text, kind int, agent text, "
        "start_time timestamptz, object_key text, PRIMARY KEY (trace_id, span_id))"
    )
    spans = [s for b in batches(n_spans) for s in b.spans][:n_spans]
    queue: asyncio.Queue[Span] = asyncio.Queue()
    for s in spans:
        queue.put_nowait(s)
    bytes_put = 0

    async def worker() -> None:
        nonlocal bytes_put
        while not queue.empty():
            s = queue.get_nowait()
            data = segments.dumps(to_record(s))
            key = f"naive/{s.trace_id}/{s.span_id}.json"
            await asyncio.to_thread(s3.put_object, bucket, key, io.BytesIO(data), len(data))
            await pool.execute(
                "INSERT INTO naive_spans VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                s.trace_id, s.span_id, int(s.kind), s.agent, s.start_time.ToDatetime(tzinfo=UTC), key,
            )  # fmt: skip
            bytes_put += len(data)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    seconds = time.perf_counter() - started
    pg_bytes = await pool.fetchval("SELECT pg_total_relation_size('naive_spans')")
    return {
        "spans": len(spans),
        "seconds": round(seconds, 3),
        "spans_per_s": round(len(spans) / seconds, 1),
        "object_bytes_per_span": round(bytes_put / len(spans), 1),
        "postgres_bytes_per_span": round(pg_bytes / len(spans), 1),
    }


async def latency(js: Any, subject: str, address: str, samples: int, background_rate: float) -> dict[str, Any]:
    stop = asyncio.Event()

    async def load() -> None:
        i = 0
        while not stop.is_set():
            b = batches(100)[0]
            await js.publish(subject, b.SerializeToString(), headers={"Nats-Msg-Id": b.meta.event_id})
            i += 1
            await asyncio.sleep(100 / max(background_rate, 1.0))

    bg = asyncio.create_task(load())
    seconds: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        for k in range(samples):
            decision = f"lat-{k}-{secrets.token_hex(4)}"
            b = SpanBatch(meta=EventMeta(event_id=secrets.token_hex(16)), spans=make_trace(k, decision))
            started = time.perf_counter()
            await js.publish(subject, b.SerializeToString(), headers={"Nats-Msg-Id": b.meta.event_id})
            while not (await stub.QueryTraces(pb.QueryTracesRequest(decision_id=decision))).traces:
                if time.perf_counter() - started > 30:
                    raise RuntimeError(f"sample {k} not queryable after 30 s")
                await asyncio.sleep(0.01)
            seconds.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)
    stop.set()
    await bg
    seconds.sort()
    return {
        "samples": samples,
        "background_spans_per_s": round(background_rate, 1),
        "p50_s": round(statistics.median(seconds), 3),
        "p99_s": round(seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))], 3),
        "max_s": round(seconds[-1], 3),
    }


async def run(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    servers = Servers.create(root / "servers")
    procs: list[ServiceProcess] = []
    try:
        log(f"starting NATS, PostgreSQL and S3 under {root}")
        servers.start()
        env = servers.env(namespace=NS, schema=SCHEMA, bucket_prefix=PREFIX)
        migrate("trace_store", env)
        dsn = servers.database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=10, server_settings={"search_path": SCHEMA})
        nc = await nats.connect(servers.nats.url, user=servers.nats.user, password=servers.nats.password)
        js = nc.jetstream()
        subject = Catalogue(NS).traces("bench")
        figures: dict[str, Any] = {}
        try:
            # Declare the streams (the service does so at start; publish needs them first).
            from flywheel.core.bus.connection import ensure_topology

            await ensure_topology(js, Catalogue(NS))
            items = batches(params["spans"])
            total = sum(len(b.spans) for b in items)
            log(f"publishing {total} spans in {len(items)} batches (backlog)")
            await publish_all(js, subject, items)
            proc = ServiceProcess("trace_store", env=env, log_dir=root / "logs")
            procs.append(proc)
            proc.start()
            # Watch from the start: the consumer may drain much of the backlog before SERVING.
            watcher = asyncio.create_task(watch_count(pool, total, timeout_s=600))
            await asyncio.to_thread(proc.wait_serving)
            figures["flywheel"] = await watcher
            figures["flywheel"]["indexed_once"] = (
                await pool.fetchval("SELECT count(*) FROM spans") == total
                and await pool.fetchval("SELECT sum(span_count) FROM traces") == total
            )
            seg_bytes, seg_spans = await pool.fetchrow("SELECT sum(bytes), sum(spans) FROM segments")
            pg_bytes = await pool.fetchval(
                "SELECT pg_total_relation_size('spans') + pg_total_relation_size('traces')"
                " + pg_total_relation_size('segments')"
            )
            figures["flywheel"]["object_bytes_per_span"] = round(float(seg_bytes) / float(seg_spans), 1)
            figures["flywheel"]["postgres_bytes_per_span"] = round(pg_bytes / total, 1)
            figures["flywheel"]["segments"] = await pool.fetchval("SELECT count(*) FROM segments")

            log(f"naive peer: {params['naive_spans']} spans, one PUT + one INSERT each")
            s3 = Minio(
                servers.s3.endpoint, access_key=servers.s3.access_key, secret_key=servers.s3.secret_key, secure=False
            )
            bucket = f"{PREFIX}-naive"
            if not s3.bucket_exists(bucket):
                s3.make_bucket(bucket)
            figures["naive"] = await naive(pool, s3, bucket, params["naive_spans"])

            log(f"latency: {params['latency_samples']} samples under background load")
            figures["latency"] = await latency(
                js, subject, proc.address, params["latency_samples"], figures["flywheel"]["spans_per_s"] / 4
            )
            figures["pg_version"] = await pool.fetchval("SHOW server_version")
        finally:
            await nc.close()
            await pool.close()
        return figures
    finally:
        for p in procs:
            p.stop()
        servers.stop()


def render(result: dict[str, Any]) -> str:
    f = result["figures"]
    fly, nai, lat = f["flywheel"], f["naive"], f["latency"]
    rows = [
        ("", "spans/s", "object B/span", "PostgreSQL B/span"),
        ("flywheel (segments + bulk index)", *(fly[k] for k in COLUMNS)),
        ("naive (PUT + INSERT per span)", *(nai[k] for k in COLUMNS)),
    ]
    lines = ["\n".join(f"{a:<34}{b!s:>10}{c!s:>15}{d!s:>20}" for a, b, c, d in rows)]
    lines.append(
        f"ratio flywheel/naive: {result['ratios']['flywheel_vs_naive']}x (goal >= {GOALS['flywheel_vs_naive']})"
    )
    lines.append(
        f"ingest -> queryable: p50 {lat['p50_s']} s, p99 {lat['p99_s']} s, max {lat['max_s']} s over {lat['samples']}"
        f" samples at {lat['background_spans_per_s']} spans/s background"
        f" (goal p99 <= {GOALS['p99_ingest_to_queryable_s_max']} s)"
    )
    lines.append(f"every span indexed exactly once: {fly['indexed_once']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (about a minute)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    params = (
        {"spans": 60_000, "naive_spans": 1_000, "latency_samples": 40}
        if args.quick
        else {"spans": 200_000, "naive_spans": 5_000, "latency_samples": 200}
    )
    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-ingest-"))
    try:
        figures = asyncio.run(run(root, params))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    pg_version = figures.pop("pg_version", "")
    ratio = round(figures["flywheel"]["spans_per_s"] / figures["naive"]["spans_per_s"], 2)
    figures["goals_met"] = {
        "flywheel_vs_naive": ratio >= GOALS["flywheel_vs_naive"],
        "p99_ingest_to_queryable_s_max": figures["latency"]["p99_s"] <= GOALS["p99_ingest_to_queryable_s_max"],
    }
    result = {
        "name": "ingest",
        "machine": {**benchstamp.machine(PACKAGES), "postgres": pg_version},
        "params": {
            "quick": args.quick,
            **params,
            "spans_per_batch": 100,
            "spans_per_trace": 5,
            "naive_in_flight": 8,
            "trace_store_fetch_batch": 256,
            "rate": (
                "spans committed (sum of segments.spans) between the first and last 20 ms poll"
                " at which it changed, over that time"
            ),
        },
        "figures": figures,
        "ratios": {"flywheel_vs_naive": ratio},
        "goals": GOALS,
    }
    print(render(result))
    benchstamp.write_results("ingest", result, out=args.out, packages=PACKAGES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
