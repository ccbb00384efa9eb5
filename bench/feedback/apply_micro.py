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
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
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
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="flywheel-apply-micro-"))
    servers = Servers.create(root / "servers")
    servers.start()
    try:
        env = servers.env(namespace="micro", schema=SCHEMA, bucket_prefix="micro")
        migrate("optimizer", env)
        os.environ.update(env)
        return await measure(servers, args.batches, args.batch)
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)


async def measure(servers: Servers, batches: int, size: int) -> int:
    import peers  # the bench's raw peer (bench/feedback/peers.py)

    from flywheel.core.db import create_engine, session_factory
    from flywheel.core.settings import DatabaseSettings
    from flywheel.optimizer import service
    from flywheel.optimizer.cache import PosteriorCache
    from flywheel.optimizer.convert import endpoint_spec
    from flywheel.optimizer.handlers import feedback_item
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

    async def flywheel(bodies: list[bytes]) -> int:
        items = [feedback_item(FeedbackEvent.FromString(b)) for b in bodies]
        async with sessions() as session:
            out = await service.apply_feedback_batch(session, items=items, window=window, folds=cache if FOLD else None)
        return sum(1 for o in out if getattr(o, "applied", False))

    async def peer(bodies: list[bytes]) -> int:
        return sum(1 for o in await peers.apply_batch(conn, bodies) if o)

    cpu: dict[str, list[float]] = {"flywheel": [], "peer": []}
    for b in range(batches + 2):  # the first two are warm-up (statements prepared, caches)
        for label, fn, name in (("flywheel", flywheel, "fly"), ("peer", peer, "peer")):
            bodies = events_for(decisions[name], f"b{b}")
            t0 = time.process_time()
            applied = await fn(bodies)
            await asyncio.sleep(0.06)  # the cache's snapshot rebuild after a commit counts too
            spent = time.process_time() - t0
            assert applied == len(bodies), (label, applied)
            if b >= 2:
                cpu[label].append(1e6 * spent / applied)
    await conn.close()
    await engine.dispose()
    for label, values in cpu.items():
        print(
            f"{label:>9}: median {statistics.median(values):6.1f} CPU us/update "
            f"(min {min(values):.1f}, max {max(values):.1f}, {len(values)} batches of {size})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
