"""Where the feedback lag goes: decision -> feedback applied, stage by stage, through the real service.

    python bench/service-regret/lag.py [--horizon 2000] [--modes paced,unpaced] [--replicas 1,2] [--repeats N]
    python bench/service-regret/lag.py --variant off:FEEDBACK_PREFETCH=false --variant on:FEEDBACK_PREFETCH=true

One, then two optimizer replicas on real NATS, PostgreSQL and S3 (``service.Stack``), a product
playing the stationary world (k = 10) through the SDK as ``run.py`` does (``service.play_service``:
Select, then ``feedback_nowait`` at once; with two replicas decision t goes to replica t % 2 and
their shared durable consumer splits the feedback between them), paced at 200 decisions/s and
unpaced (at most 8 Selects in flight). Per mode it reports p50/p90/p99 of each stage, in
milliseconds and in decisions served meanwhile (ms x the mode's measured rate, both replicas'
decisions together):

- ``pre_publish``: the decision made (its ``created_at``, when Select sampled it) -> its feedback
  published, and in decisions the count of decisions made in between (read back from PostgreSQL,
  not derived from the rate): those the concurrent Selects sampled before any fold could start;
- ``sdk``: ``feedback_nowait`` -> JetStream acknowledged the publish (the SDK's
  ``FeedbackQueueStats.ack_seconds``; includes the store and the acknowledgement's way back);
- ``busy``: stored in the stream -> the consumer sent the fetch that took it (it waited while
  earlier batches were handled);
- ``fetch``: the later of stored and that fetch request -> fetched;
- ``queue``: fetched -> its batch's handling began (held while earlier batches were handled);
- ``handle``: -> the handler returned (one transaction applied, committed, folded);
- ``ack``: handler returned -> acked; ``total``: stored -> acked (for an event deferred because
  its decision was still in the other replica's buffer, the deferral included; ``deferred`` counts them);
- ``fold_own``: the replica's commit -> the snapshot its Select samples from has the increments;
- ``fold_peer`` (two replicas): the other replica's NOTIFY sent (its transaction's last
  statement, just before its commit) -> this replica's snapshot has them: the cross-replica hop;
- ``provisional``: the SDK published the feedback (its ``meta.time``) -> the snapshot of the
  replica that made the decision has it folded provisionally (``provisional.py``), before any
  transaction: what that replica's Select waits for when the provisional fold is on;
  ``delivered``, its first part: published -> received on that replica's subscription;
  ``prov_segment`` (``--world segmented``): the same for the segment's snapshot;
- ``prov_peer`` (two replicas): the same publish -> the *other* replica's snapshot has it, folded
  when the deciding replica told it (``peer_folds.py``); ``prov_peer_segment`` for the segment's.

The consumer's stages come from the replicas' ``flywheel_event_lag_seconds`` histogram (one event
in 8), the folds from ``flywheel_optimizer_posterior_fold_lag_seconds{source}`` (one observation
per transaction and endpoint), both summed over the mode's replicas (scraped before and after
each mode; quantiles interpolated within buckets as PromQL's ``histogram_quantile`` does); each
row also has every replica's own ``total`` and ``fold_peer`` (``per_replica``).
- ``tapped`` (``--tap``): the same publish -> an idle bystander process has it (``tap.py``, a plain
  subscription beside the replicas): the product's publish and NATS alone, so ``delivered`` less
  ``tapped`` is the replica's own wait to read the message.

Each row also has ``cpu_cores``: the CPU each process used over the mode's run, in cores (user +
system seconds over the wall seconds): every optimizer replica, the product (this process),
nats-server, and PostgreSQL with its backends.

``--variant NAME:KEY=VALUE[,KEY=VALUE]`` (repeatable) runs the replicas with those
``FLYWHEEL_OPTIMIZER_*`` settings; the variants take turns within each repeat (fresh replicas
each time), so that a comparison on a busy machine is paired, run for run.
``--optimizer-commit REV`` runs that commit's optimizer and SDK whatever is uncommitted
(``tree.py``, as ``run.py``). Writes ``bench/results/service-regret-lag.json`` (stamped by
``flywheel.stack.benchstamp``; ``params.optimizer_code`` says which code ran) and prints it as the
last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "regret")]
from service import NAMESPACE, Mode, Stack, log, metric_sum, play_service, scrape  # noqa: E402
from tree import MARK, current, reexec_at  # noqa: E402
from worlds import make_world  # noqa: E402

from flywheel.api.subjects import Catalogue  # noqa: E402
from flywheel.sdk import FlywheelClient  # noqa: E402
from flywheel.stack.benchstamp import RESULTS, write_results  # noqa: E402
from flywheel.stack.servers import cpu_seconds as process_cpu_seconds  # noqa: E402

CONSUMER = "optimizer-feedback"
INF = float("inf")
LAG = "flywheel_event_lag_seconds"
FOLD_LAG = "flywheel_optimizer_posterior_fold_lag_seconds"
DELIVERED = "flywheel_optimizer_provisional_delivery_seconds"
STAGES = ("busy", "fetch", "queue", "handle", "ack", "total")
# stage name -> the fold histogram's source
FOLDS = {
    "fold_own": "own",
    "fold_peer": "peer",
    "provisional": "provisional",
    "prov_segment": "provisional_segment",
    "prov_peer": "provisional_peer",
    "prov_peer_segment": "provisional_peer_segment",
}
DEFERRED = "flywheel_optimizer_feedback_deferred_total"
QUANTILES = (0.5, 0.9, 0.99)


def buckets(text: str, stage: str, consumer: str = CONSUMER) -> dict[float, float]:
    """Cumulative bucket counts {upper bound: count} of one stage: of ``flywheel_event_lag_seconds``,
    or for ``fold_own`` / ``fold_peer`` of ``flywheel_optimizer_posterior_fold_lag_seconds``."""
    if stage == "delivered":
        name, want = DELIVERED, {}
    elif stage in FOLDS:
        name, want = FOLD_LAG, {"source": FOLDS[stage]}
    else:
        name, want = LAG, {"consumer": consumer, "stage": stage}
    out: dict[float, float] = {}
    for labels, value in re.findall(rf"^{name}_bucket\{{([^}}]*)\}} (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if all(got.get(k) == v for k, v in want.items()):
            out[float(got["le"])] = out.get(float(got["le"]), 0.0) + float(value)
    return out


def scrape_all(ports: list[int]) -> list[dict[str, dict[float, float]]]:
    """Every stage's cumulative buckets, per replica."""
    texts = [scrape(port) for port in ports]
    return [{s: buckets(text, s) for s in (*STAGES, *FOLDS, "delivered")} for text in texts]


def minus(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: n - before.get(le, 0.0) for le, n in after.items()}


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The ``q`` quantile of the observations between two scrapes, interpolated linearly within its
    bucket (PromQL's rule; the last finite bound when it falls in +Inf). None when nothing was seen."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


def row(seconds: dict[float, float | None], rate: float, count: float) -> dict[str, Any]:
    """{"p50_ms": ..., "p50_decisions": ..., ..., "count": n} for one stage."""
    out: dict[str, Any] = {"count": int(count)}
    for q, s in seconds.items():
        name = f"p{round(q * 100)}"
        out[f"{name}_ms"] = None if s is None else round(s * 1e3, 2)
        out[f"{name}_decisions"] = None if s is None else round(s * rate, 1)
    return out


class RecordingStack(Stack):
    """A ``Stack`` that keeps the SDK clients it hands out, to read their feedback queues' stats."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__(keep=keep)
        self.handed: list[FlywheelClient] = []

    def clients(self) -> list[FlywheelClient]:
        got = super().clients()
        self.handed += got
        return got


class Tap:
    """``tap.py`` in a process of its own, subscribed to every feedback subject of the bench."""

    def __init__(self, stack: Stack) -> None:
        env = stack.servers.env(namespace=NAMESPACE)  # the admin NATS user: it may subscribe anywhere
        self._out = out = Path(tempfile.mkstemp(prefix="lag-tap-", suffix=".json")[1])
        nats_env = {k: v for k, v in env.items() if k.startswith("FLYWHEEL_NATS_")}  # not on its command line
        self._proc = subprocess.Popen(
            [sys.executable, str(HERE / "tap.py"), Catalogue(NAMESPACE).consumer(CONSUMER).filter_subject, str(out)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **nats_env},
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            raise RuntimeError("tap.py did not subscribe")

    def stop(self) -> list[float]:
        """Stop it; the seconds from publish to arrival of every event it saw."""
        self._proc.terminate()
        self._proc.wait(timeout=30)
        try:
            return list(json.loads(self._out.read_text() or "[]"))
        finally:
            self._out.unlink(missing_ok=True)


def cpu_seconds(stack: Stack) -> dict[str, float]:
    """User + system CPU seconds so far of every process the bench runs (PostgreSQL's backends
    included; a backend that exited meanwhile is not counted; a process that is gone counts 0)."""
    pg = stack.servers.postgres.pid if stack.servers.postgres else None
    pids = {f"optimizer{i}": (proc.pid, False) for i, proc in enumerate(stack.replicas)}
    pids |= {"product": (os.getpid(), False), "nats": (stack.servers.nats.pid, False), "postgres": (pg, True)}
    out = {}
    for name, (pid, children) in pids.items():
        seconds = process_cpu_seconds(pid, children=children)
        out[name] = 0.0 if math.isnan(seconds) else seconds
    return out


async def measure(
    stack: RecordingStack,
    mode: Mode,
    horizon: int,
    k: int,
    seed: int,
    run: int,
    variant: str,
    world_name: str,
    tap: bool = False,
) -> tuple[dict[str, Any], Raw]:
    """One run of ``mode`` on the running replica: its row, and the raw samples to pool."""
    world = make_world(world_name, "bernoulli", k, seed, horizon, 0.1, 100)
    ports = [proc.metrics_port for proc in stack.replicas]
    before = scrape_all(ports)
    deferred = sum(metric_sum(scrape(port), DEFERRED) for port in ports)
    stack.handed = []
    name, published = f"lag-{variant}-{mode.name}-{run}", {}
    bystander = Tap(stack) if tap else None
    cpu_before, wall_before = cpu_seconds(stack), time.perf_counter()
    try:
        result = await play_service(stack, world, mode, name, {}, published=published)
    finally:
        tapped = bystander.stop() if bystander is not None else []
    cpu_after, wall = cpu_seconds(stack), time.perf_counter() - wall_before
    await asyncio.sleep(0.5)  # the last acks and rebuilds observed
    after = scrape_all(ports)
    deferred = sum(metric_sum(scrape(port), DEFERRED) for port in ports) - deferred
    queues = [c._feedback_queue for c in stack.handed if c._feedback_queue is not None]
    # Per replica, then summed: the mode's events (and folds) wherever they were handled.
    mine = [{s: minus(a[s], b[s]) for s in a} for a, b in zip(after, before, strict=True)]
    raw = Raw(sdk=[x for q in queues for x in q.stats.ack_seconds], rates=[result.rate], tapped=tapped)
    raw.pre_publish = await pre_publish(stack, name, published)
    for replica in mine:
        raw.add(Raw(stages=replica))
    return {
        "variant": variant,
        "mode": mode.name,
        "rate": round(result.rate, 1),
        "seconds": round(result.seconds, 2),
        "applied": result.applied,
        "bounces": result.bounces,
        "retries": result.retries,
        "deferred": deferred,
        "select_p50_ms": round(float(np.median(result.select_ms)), 2),
        "cpu_cores": {p: round((cpu_after[p] - cpu_before.get(p, 0.0)) / wall, 2) for p in cpu_after},
        "stages": raw.summary(),
        "per_replica": [
            {
                s: Raw(stages={s: replica[s]}, rates=[result.rate]).summary()[s]
                for s in ("total", "fold_own", "fold_peer", "provisional", "prov_peer")
            }
            for replica in mine
        ],
    }, raw


async def pre_publish(stack: RecordingStack, endpoint: str, published: dict[str, float]) -> list[tuple[float, int]]:
    """Per decision: (seconds, decisions) from its making (``decisions.created_at``, stamped when
    Select sampled it) to its feedback's publish, and how many decisions of the endpoint (every
    replica's) were made in between: what the concurrent Selects sampled without its reward
    before any fold could start. Read back from PostgreSQL (one clock: this machine's)."""
    url = stack.env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(url, server_settings={"search_path": stack.env.get("FLYWHEEL_DB_SCHEMA", "public")})
    try:
        rows = await conn.fetch(
            "SELECT decision_id, extract(epoch FROM created_at)::float8 AS t FROM decisions WHERE endpoint = $1",
            endpoint,
        )
    finally:
        await conn.close()
    made = {r["decision_id"]: r["t"] for r in rows}
    times = np.sort(np.fromiter(made.values(), dtype=float, count=len(made)))
    out = []
    for decision_id, at in published.items():
        if decision_id in made:
            between = np.searchsorted(times, at, "right") - np.searchsorted(times, made[decision_id], "right")
            out.append((at - made[decision_id], int(between)))
    return out


@dataclass
class Raw:
    """What one run (or several, pooled) observed: the SDK's ack latencies, each stage's bucket
    counts between the scrapes, the runs' decision rates, and each decision's pre-publish lag."""

    sdk: list[float] = field(default_factory=list)
    stages: dict[str, dict[float, float]] = field(default_factory=dict)
    rates: list[float] = field(default_factory=list)
    pre_publish: list[tuple[float, int]] = field(default_factory=list)
    tapped: list[float] = field(default_factory=list)  # publish -> tap.py has it (--tap)

    def add(self, other: Raw) -> None:
        self.sdk += other.sdk
        self.tapped += other.tapped
        self.rates += other.rates
        self.pre_publish += other.pre_publish
        for stage, counts in other.stages.items():
            mine = self.stages.setdefault(stage, {})
            for le, n in counts.items():
                mine[le] = mine.get(le, 0.0) + n

    def summary(self) -> dict[str, Any]:
        """Per stage: p50/p90/p99 in ms and in decisions (at the runs' mean rate), and the count."""
        rate = float(np.mean(self.rates)) if self.rates else float("nan")
        sdk = np.array(self.sdk)
        out = {"sdk": row({q: float(np.quantile(sdk, q)) if sdk.size else None for q in QUANTILES}, rate, sdk.size)}
        if self.tapped:
            tapped = np.array(self.tapped)
            out["tapped"] = row({q: float(np.quantile(tapped, q)) for q in QUANTILES}, rate, tapped.size)
        if self.pre_publish:
            seconds, between = (np.array(x, dtype=float) for x in zip(*self.pre_publish, strict=True))
            pre = row({q: float(np.quantile(seconds, q)) for q in QUANTILES}, rate, seconds.size)
            for q in QUANTILES:  # counted, not derived from the rate
                pre[f"p{round(q * 100)}_decisions"] = round(float(np.quantile(between, q)), 1)
            values, counts = np.unique(between.astype(int), return_counts=True)
            pre["histogram"] = {str(v): int(n) for v, n in zip(values, counts, strict=True)}  # for lag_replay.py
            out["pre_publish"] = pre
        for stage, counts in self.stages.items():
            out[stage] = row({q: histogram_quantile(q, {}, counts) for q in QUANTILES}, rate, counts.get(INF, 0.0))
        return out


def table(rows: list[dict[str, Any]]) -> str:
    """One line per (variant, mode, stage): the quantiles in ms and in decisions, and the count."""
    lines = [
        f"{'variant':<10}{'mode':<14}{'rate/s':>8}  {'stage':<12}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
        f"{'p50 dec':>9}{'p90 dec':>9}{'p99 dec':>9}{'n':>7}"
    ]
    for r in rows:
        for stage, st in r["stages"].items():
            cells = [st.get(f"p{p}_{u}") for u in ("ms", "decisions") for p in (50, 90, 99)]
            text = "".join(f"{'-' if c is None else c:>9}" for c in cells)
            lines.append(f"{r['variant']:<10}{r['mode']:<14}{r['rate']:>8}  {stage:<12}{text}{st['count']:>7}")
        if r.get("cpu_cores"):
            cores = ", ".join(f"{p} {c}" for p, c in r["cpu_cores"].items())
            lines.append(f"{r['variant']:<10}{r['mode']:<14}{r['rate']:>8}  cpu cores: {cores}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    stack = RecordingStack(keep=args.keep)
    rows: list[dict[str, Any]] = []
    pooled: dict[tuple[str, str], Raw] = {}
    try:
        stack.start()
        base = dict(stack.env)
        for run in range(args.repeats):
            for variant, settings in args.variants:
                if len(args.variants) > 1 or not stack.replicas:
                    stack.scale(0)
                    stack.env = {**base, **settings}
                for replicas in args.replicas:
                    # A second replica joins the first (as in run.py); the variants' replicas are fresh.
                    stack.scale(replicas)
                    for name in args.modes.split(","):
                        mode = Mode(replicas, args.rate, 32) if name == "paced" else Mode(replicas, None, 8)
                        started = time.perf_counter()
                        r, raw = await measure(
                            stack, mode, args.horizon, args.k, args.seed + run, run, variant, args.world, args.tap
                        )
                        pooled.setdefault((variant, r["mode"]), Raw()).add(raw)
                        log(f"{variant} {r['mode']}: {r['rate']}/s, {time.perf_counter() - started:.0f} s")
                        rows.append(r)
    finally:
        stack.stop()
    return {
        "params": {
            "horizon": args.horizon,
            "k": args.k,
            "rate": args.rate,
            "modes": args.modes,
            "repeats": args.repeats,
            "seed": args.seed,
            "replicas": args.replicas,
            "world": args.world,
            "tap": args.tap,
            "variants": {name: settings for name, settings in args.variants},
            **current(),
        },
        "rows": rows,
        "pooled": [
            {
                "variant": v,
                "mode": m,
                "replicas": int(m.split("rep-")[0]),
                "runs": len(raw.rates),
                "rate": round(float(np.mean(raw.rates)), 1),
                "stages": raw.summary(),
            }
            for (v, m), raw in pooled.items()
        ],
    }


def variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE[,KEY=VALUE]`` -> (NAME, {"FLYWHEEL_OPTIMIZER_KEY": VALUE, ...})."""
    name, _, pairs = text.partition(":")
    settings: dict[str, str] = {}
    for pair in filter(None, pairs.split(",")):
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise argparse.ArgumentTypeError(f"--variant {text!r}: want NAME:KEY=VALUE[,KEY=VALUE]")
        settings[f"FLYWHEEL_OPTIMIZER_{key.strip().upper()}"] = value.strip()
    if not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: the name before ':' is empty")
    return name, settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=2000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--modes", default="paced,unpaced")
    parser.add_argument("--replicas", default="1,2", help="1, 2 or 1,2: the one-replica modes run first")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--world", choices=("stationary", "segmented"), default="stationary", help="segmented: times prov_segment"
    )
    parser.add_argument("--variant", dest="variants", type=variant, action="append", default=[])
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--tap", action="store_true", help="also time each publish to an idle bystander (tap.py)")
    parser.add_argument(
        "--optimizer-commit",
        metavar="REV",
        help="run the optimizer (and the SDK) of this commit, not the working tree's (see tree.py)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "service-regret-lag.json")
    args = parser.parse_args()
    if args.horizon < 1 or args.rate <= 0 or args.repeats < 1:
        parser.error("--horizon and --repeats must be >= 1 and --rate > 0")
    if set(args.modes.split(",")) - {"paced", "unpaced"}:
        parser.error(f"--modes: paced and/or unpaced, got {args.modes!r}")
    if args.replicas not in ("1", "2", "1,2"):
        parser.error(f"--replicas: 1, 2 or 1,2, got {args.replicas!r}")
    args.replicas = [int(r) for r in args.replicas.split(",")]
    args.variants = args.variants or [("default", {})]
    if args.optimizer_commit and MARK not in os.environ:
        reexec_at(args.optimizer_commit)
    result = asyncio.run(main_async(args))
    log(table(result["rows"]))
    log("pooled over the repeats:")
    log(table(result["pooled"]))
    write_results("service-regret-lag", result, out=args.out)


if __name__ == "__main__":
    main()
