"""CPU of the optimizer's feedback path per applied update, without NATS, in one process.

    python bench/feedback/apply_micro.py [--batches 30] [--batch 1000]

Starts a real PostgreSQL (``flywheel.stack``), migrates the optimizer's schema, creates one
three-arm endpoint and its decisions, then applies batches of serialized ``FeedbackEvent``s
(four per decision, as in run.py) two ways, alternating, and prints the process CPU
(``time.process_time``, this process only; PostgreSQL's CPU is not in it) per update:

- ``flywheel``: decode + ``handlers.feedback_item`` + ``service.apply_feedback_batch`` with the
  posterior cache as the fold sink (its snapshot rebuilds run in its worker thread, counted);
- ``peer``: ``peers.apply_batch`` on one asyncpg connection (the raw batched peer's SQL).

It isolates the optimizer's own path (service, stats, fold, cache) from the bus consumer's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core.bus.consumer import Delivery
from flywheel.stack.services import migrate
from flywheel.stack.stack import Servers

sys.path.insert(0, str(Path(__file__).parent))
SCHEMA = "micro"
FOLD = not os.environ.get("MICRO_NO_FOLD")


def events_for(decisions: list[str], tag: str) -> list[bytes]:
    out = []
    for n, d in enumerate(decisions):
        for k in range(4):
            e = FeedbackEvent(decision_id=d, reward=((n + k) % 5) / 4)
            e.meta.event_id = f"{tag}-{d}-{k}"
            e.meta.time.GetCurrentTime()
            out.append(e.SerializeToString())
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30, help="per contestant")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="cProfile the flywheel side; print its top functions")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="flywheel-apply-micro-"))
    servers = Servers.create(root / "servers")
    servers.start()
    try:
        env = servers.env(namespace="micro", schema=SCHEMA, bucket_prefix="micro")
        migrate("optimizer", env)
        os.environ.update(env)
        return await measure(servers, args.batches, args.batch, profile=args.profile)
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)


async def measure(servers: Servers, batches: int, size: int, *, profile: bool = False) -> int:
    import peers  # the bench's raw peer (bench/feedback/peers.py)

    from flywheel.core.db import create_engine, session_factory
    from flywheel.core.settings import DatabaseSettings
    from flywheel.optimizer import service
    from flywheel.optimizer.cache import PosteriorCache
    from flywheel.optimizer.convert import endpoint_spec
    from flywheel.optimizer.handlers import FeedbackHandler, feedback_item
    from flywheel.optimizer.models import DecisionRow

    sys.path.insert(0, str(Path(__file__).parents[2] / "tests" / "integration"))
    from helpers import three_arm_endpoint

    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = session_factory(engine)
    decisions: dict[str, list[str]] = {}
    for name in ("fly", "peer"):
        async with sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(three_arm_endpoint(name).endpoint))
        rows = [
            DecisionRow(
                decision_id=f"{name}-{uuid.uuid4().hex}",
                endpoint=name,
                arm_id=("small", "large", "creative")[n % 3],
                segment="",
                features=None,
                probability=0.5,
                created_at=datetime.now(UTC),
            )
            for n in range(size // 4)
        ]
        async with sessions() as session:
            session.add_all(rows)
            await session.commit()
        decisions[name] = [r.decision_id for r in rows]
    cache = PosteriorCache(sessions, refresh_interval_s=0.5, replica="micro")
    await cache.refresh()
    window = timedelta(days=1)
    dsn = servers.database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    conn = await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA})

    handler = FeedbackHandler(sessions, window, None, cache if FOLD else None)
    # CPU seconds per stage of the flywheel side, summed over the measured batches.
    stages: dict[str, float] = defaultdict(float)
    measuring = False
    aside = [0.0]  # CPU the last batch spent on timing feedback_item apart: not the path's

    async def flywheel(bodies: list[bytes]) -> int:
        t0 = time.process_time()
        batch = [(FeedbackEvent.FromString(b), Delivery("fb", {}, n, 1)) for n, b in enumerate(bodies)]
        t1 = time.process_time()
        out = await handler(batch)  # feedback_item per event, then apply_feedback_batch
        t2 = time.process_time()
        if measuring:
            stages["decode"] += t1 - t0
            stages["handler"] += t2 - t1
            # The handler's first step again, timed apart (outside the totals).
            t3 = time.process_time()
            [feedback_item(e) for e, _ in batch]
            aside[0] = time.process_time() - t3
            stages["  of which feedback_item"] += aside[0]
        return sum(1 for o in out if o is None)

    async def peer(bodies: list[bytes]) -> int:
        return sum(1 for o in await peers.apply_batch(conn, bodies) if o)

    profiler = _profiler() if profile else None
    cpu: dict[str, list[float]] = {"flywheel": [], "peer": []}
    for b in range(batches + 2):  # the first two are warm-up (statements prepared, caches)
        measuring = b >= 2
        for label, fn, name in (("flywheel", flywheel, "fly"), ("peer", peer, "peer")):
            bodies = events_for(decisions[name], f"b{b}")
            on = profiler is not None and label == "flywheel" and b >= 2
            t0 = time.process_time()
            if on:
                profiler.enable()
            applied = await fn(bodies)
            await asyncio.sleep(0.06)  # the cache's snapshot rebuild after a commit counts too
            if on:
                profiler.disable()
            spent = time.process_time() - t0 - aside[0]
            aside[0] = 0.0
            assert applied == len(bodies), (label, applied)
            if b >= 2:
                cpu[label].append(1e6 * spent / applied)
                if label == "flywheel":
                    stages["total (with the fold's rebuild)"] += spent
    await conn.close()
    await engine.dispose()
    if profiler is not None:  # cProfile inflates Python-heavy code: read shares, not rates
        import pstats

        out = pstats.Stats(profiler).strip_dirs()
        out.sort_stats("tottime").print_stats(30)
        out.sort_stats("cumulative").print_stats(40)
    for label, values in cpu.items():
        print(
            f"{label:>9}: median {statistics.median(values):6.1f} CPU us/update "
            f"(min {min(values):.1f}, max {max(values):.1f}, {len(values)} batches of {size})"
        )
    for stage, seconds in stages.items():
        print(f"  flywheel {stage}: {1e6 * seconds / (batches * size):.1f} CPU us/update (mean)")
    return 0


def _profiler() -> Any:
    """A cProfile.Profile; this folder's profile.py would shadow the stdlib's ``profile``."""
    here = Path(__file__).parent.resolve()
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        import cProfile
    finally:
        sys.path[:] = saved
    return cProfile.Profile()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
