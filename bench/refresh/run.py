"""Posterior refresh cost with many idle endpoints: reusing unchanged snapshots vs rebuilding.

    python bench/refresh/run.py [--endpoints 100] [--refreshes 10]

Each optimizer replica reloads every endpoint every ``refresh_interval_s`` (0.5 s). Building a
snapshot draws its posteriors (selection probabilities, P(best)), so a replica that rebuilt
every endpoint on every refresh would spend CPU in proportion to the number of endpoints even
when none of them gets traffic. The cache keeps a snapshot whose rows and statistics have not
changed (``cache.snapshot_inputs``). This measures a refresh's CPU on a real PostgreSQL with N
idle three-arm endpoints, both ways in the same run, and prints the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.core.db import create_engine, session_factory
from flywheel.core.settings import DatabaseSettings
from flywheel.optimizer import service
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.convert import endpoint_spec
from flywheel.stack import benchstamp
from flywheel.stack.services import migrate
from flywheel.stack.stack import Servers

ROOT = Path(__file__).resolve().parents[2]


def endpoint(name: str) -> ep_pb.Endpoint:
    arms = []
    for arm_id, temperature in (("cool", 0.2), ("warm", 0.7), ("hot", 1.0)):
        params = Struct()
        params.update({"model": "chat", "temperature": temperature})
        arms.append(ep_pb.Arm(arm_id=arm_id, params=params))
    return ep_pb.Endpoint(name=name, arms=arms)


async def measure(n_endpoints: int, refreshes: int) -> dict[str, float]:
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = session_factory(engine)
    try:
        async with sessions() as session:
            for i in range(n_endpoints):
                await service.create_endpoint(session, spec=endpoint_spec(endpoint(f"ep{i}")))
        cache = PosteriorCache(sessions)
        await cache.refresh()
        out = {}
        for mode in ("reuse", "rebuild"):
            started = time.process_time()
            for _ in range(refreshes):
                if mode == "rebuild":
                    cache._built.clear()  # what every refresh did before the reuse
                await cache.refresh()
            out[mode] = 1000 * (time.process_time() - started) / refreshes
        return out
    finally:
        await engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--refreshes", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "refresh.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-refresh-"))
    work.chmod(0o755)  # PostgreSQL's unprivileged system user must reach its data folder
    servers = Servers.create(work / "stack")
    try:
        servers.start()
        env = servers.env(namespace="brefresh", schema="bench_refresh", bucket_prefix="brefresh")
        migrate("optimizer", env)
        os.environ.update(env)
        ms = asyncio.run(measure(args.endpoints, args.refreshes))
    finally:
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)
    ratio = ms["reuse"] / ms["rebuild"]
    print(
        f"{args.endpoints} idle endpoints, CPU per refresh: reuse {ms['reuse']:.1f} ms, rebuild {ms['rebuild']:.1f} ms"
    )
    print(
        f"reuse / rebuild: {ratio:.3f}; at one refresh per 0.5 s that is {2 * ms['reuse'] / 10:.1f}% of a core"
        f" instead of {2 * ms['rebuild'] / 10:.1f}%"
    )
    result = {
        "name": "refresh",
        "params": {"endpoints": args.endpoints, "refreshes": args.refreshes},
        "figures": {"cpu_ms_per_refresh": ms},
        "ratios": {"reuse_vs_rebuild": ratio},
    }
    benchstamp.write_results("refresh", result, out=args.out, packages=("sqlalchemy", "asyncpg"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
