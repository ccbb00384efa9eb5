"""What one Select costs in Flywheel's own Python, without gRPC's transport around it.

    python bench/select/handler_cost.py [--calls 20000] [--reps 3] [--profile]

Builds the optimizer's real Select path in process: a three-arm Beta snapshot (as
`snapshot.build` makes it), the `Selector`, the `SelectionServicer`'s sync twin and the
`_Guard` wrapper the sync server puts around it (auth, metrics, log context), with a
`DecisionLog` that only buffers (no PostgreSQL, no JetStream: its flush is the event loop's
cost, measured by thread_cpu.py). Each call parses the bench's request bytes and serializes the
response, as grpcio does. "echo" does just that around a prebuilt response, like run.py's echo.
Prints thread CPU per call, best of ``--reps``; ``--profile`` adds a cProfile of the guarded path.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import numpy as np
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.subjects import Catalogue
from flywheel.core.grpc_server import _Guard
from flywheel.optimizer import snapshot
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.decisions import DecisionLog
from flywheel.optimizer.grpc_api import SelectionServicer
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.selector import Selector

TOKEN = "bench"  # noqa: S105 - compared in process only
METHOD = "/flywheel.api.optimizer.v1.SelectionService/Select"


class Context:
    """The three things the guarded path asks of grpc's ServicerContext."""

    def time_remaining(self) -> float | None:
        return None  # h2load's requests carry no deadline

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKEN}"), ("user-agent", "h2load"))

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def build() -> tuple[dict[str, Callable[[Any, Any], Any]], DecisionLog]:
    cache = PosteriorCache(sessions=None)  # type: ignore[arg-type]
    row = SimpleNamespace(
        policy_kind="thompson_beta",
        policy={},
        incumbent_arm_id=None,
        name="bench",
        description="",
        reward_spec={},
        created_at=datetime.now(UTC),
    )
    arms = [
        SimpleNamespace(
            arm_id=a, status="active", traffic_cap=1.0, pulls=100, reward_sum=50, params={"model": a, "t": 0.3}
        )
        for a in ("fast", "mid", "slow")
    ]
    stats = Stats.zeros(3, 0)
    stats.w[:], stats.s[:] = 100, [50, 60, 40]
    snap = snapshot.build(row=row, arms=arms, stats=stats, now=datetime.now(UTC), rng=np.random.default_rng(1))
    cache._snapshots["bench"] = snap  # what a refresh would have put there
    log = DecisionLog(None, None, Catalogue("bench"))  # type: ignore[arg-type]
    servicer = SelectionServicer(Selector(cache, log, None), None, log, cache, None)  # type: ignore[arg-type]
    guarded = _Guard(TOKEN)._wrap_unary_sync(servicer.Select_sync, METHOD)
    echo = sel_pb.SelectResponse(decision_id="0" * 32, arm_id="fast", params=snap.params_structs[0], probability=0.3)
    return {"echo": lambda r, c: echo, "Select_sync": servicer.Select_sync, "guarded Select": guarded}, log


def per_call_us(fn: Callable[[Any, Any], Any], log: DecisionLog, raw: bytes, calls: int) -> float:
    context = Context()
    started = time.thread_time()
    for _ in range(calls):
        fn(sel_pb.SelectRequest.FromString(raw), context).SerializeToString()
        if len(log._buffer) > 5000:  # nothing flushes here
            log._buffer.clear()
    return 1e6 * (time.thread_time() - started) / calls


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    paths, log = build()
    context = Struct()
    context.update({"lang": "en"})
    raw = sel_pb.SelectRequest(endpoint="bench", user_id="u-1", context=context).SerializeToString()
    best = {name: float("inf") for name in paths}
    for _ in range(args.reps):  # interleaved, so a noisy neighbour hits every path alike
        for name, fn in paths.items():
            best[name] = min(best[name], per_call_us(fn, log, raw, args.calls))
    for name, us in best.items():
        print(f"{name:16s} {us:6.1f} us of CPU per call (request parse and response serialize included)")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        per_call_us(paths["guarded Select"], log, raw, args.calls)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    asyncio.run(main())
