"""CPU time of one Select decision in process, unsegmented against segmented (issue 19).

Both run ``Selector.select_now`` (the sync server's path) on a cached endpoint snapshot of
three arms; the segmented endpoint's request names a segment whose snapshot the
``SegmentCache`` holds, so the difference is the segment lookup. No gRPC, no decision log.

    python bench/select/segment_cost.py [--calls 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import numpy as np

from flywheel.optimizer import snapshot
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.segment_cache import SegmentCache
from flywheel.optimizer.selector import Selector


class NoLog:
    def record(self, decision: Any) -> None:
        pass


def endpoint(name: str, policy: dict[str, Any]) -> snapshot.EndpointSnapshot:
    row = SimpleNamespace(
        policy_kind="thompson_beta",
        policy=policy,
        incumbent_arm_id=None,
        name=name,
        description="",
        reward_spec={},
        created_at=datetime.now(UTC),
    )
    arms = [
        SimpleNamespace(arm_id=a, status="active", traffic_cap=1.0, pulls=100, reward_sum=50, params={"model": a})
        for a in ("fast", "mid", "slow")
    ]
    stats = Stats.zeros(3)
    stats.w[:], stats.s[:] = 100, [50, 60, 40]
    return snapshot.build(row=row, arms=arms, stats=stats, now=datetime.now(UTC), rng=np.random.default_rng(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cache = PosteriorCache(sessions=None)  # type: ignore[arg-type]
    cache._snapshots["flat"] = endpoint("flat", {})  # what a refresh would have put there
    cache._snapshots["seg"] = seg = endpoint("seg", {"segment_key": "lang"})
    parts = SegmentCache(None, cache)  # type: ignore[arg-type]
    own = Stats(np.array([30.0, 30, 30]), np.array([10.0, 20, 15]), np.array([10.0, 20, 15]))
    prior = parts._prior_of(parts._table(seg, extra=own), 0)
    parts._put(parts._build(seg, "en", own, prior, time.monotonic()))  # what a first Select would load
    selector = Selector(cache, NoLog(), None, parts)  # type: ignore[arg-type]
    best: dict[str, float] = {}
    for _ in range(args.rounds):  # interleaved, best of the rounds
        for name in ("flat", "seg"):
            started = time.process_time()
            for _ in range(args.calls):
                decision = selector.select_now(endpoint=name, user_id="u-1", context={"lang": "en"})
            us = (time.process_time() - started) / args.calls * 1e6
            assert decision is not None and decision.segment == ("en" if name == "seg" else "")
            best[name] = min(best.get(name, us), us)
    print(f"select_now CPU per call, best of {args.rounds}: unsegmented {best['flat']:.2f} us, "
          f"segmented {best['seg']:.2f} us ({best['seg'] / best['flat']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
