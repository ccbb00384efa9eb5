"""Paired A/B of the optimizer's feedback consumer: the optimizer from several trees (and/or with
other settings) and the raw nats-py batched peer, side by side in the same run.

    python bench/feedback/ab.py --tree old=/tmp/export-old --tree new=/tmp/export-new \\
        [--env new:FLYWHEEL_OPTIMIZER_FEEDBACK_MAX_BATCHES=2] [--events 100000] [--rounds 4] [--no-raw]

A tree is a checkout or a ``git archive`` export (``git archive REV libs services | tar -x -C
DIR``): its ``libs/api``, ``libs/core`` and ``services/optimizer`` go first on that optimizer's
``PYTHONPATH``; the same tree may be named twice with different ``--env``. Only run.py's
throughput phase runs (``run.ThroughputOnly``): each contestant's events are published while
nothing consumes, then its consumer process starts on the backlog; rounds alternate the order.
``--events`` is per contestant over all rounds. It prints each contestant's updates/s and
process CPU µs per update by round, and the geometric mean over the rounds of each one's rate
over the first tree's and over the raw peer's, with the per-round ratios. Exactly once is
checked after every round, as in run.py.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import run as bench

SOURCES = ("libs/api/src", "libs/core/src", "services/optimizer/src")


class AB(bench.ThroughputOnly):
    """run.py's throughput phase with one optimizer contestant per tree."""

    trees: dict[str, Path] = {}  # contestant name -> tree
    envs: dict[str, dict[str, str]] = {}  # contestant name -> extra environment

    def consumer(self, c: bench.Contestant) -> Any:
        tree = self.trees.get(c.name)
        if tree is None:
            return super().consumer(c)
        path = os.pathsep.join(str(tree / s) for s in SOURCES)
        env = {**self.env(c.namespace), "PYTHONPATH": path, **self.envs.get(c.name, {})}
        proc = bench.Optimizer(env=env, log_dir=self.root / "services" / c.namespace)
        self.procs.append(proc)
        return proc


def durable_of(c: bench.Contestant) -> str:
    """Every optimizer contestant uses the optimizer's own durable consumer (in its namespace)."""
    return bench.DURABLE if c.name in AB.trees else _peer_durable(c)


_peer_durable = bench.durable_of
bench.durable_of = durable_of  # run.py's phases look it up at call time


def geomean_ratio(rows: dict[str, Any], x: str, y: str) -> tuple[float, list[float]]:
    per_round = [a / b for a, b in zip(rows[x]["updates_per_s_rounds"], rows[y]["updates_per_s_rounds"], strict=True)]
    return math.exp(sum(map(math.log, per_round)) / len(per_round)), [round(r, 2) for r in per_round]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR (the first is the baseline)")
    parser.add_argument("--env", action="append", default=[], help="NAME:KEY=VALUE for that contestant")
    parser.add_argument("--events", type=int, default=100_000, help="per contestant, over all rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--no-raw", action="store_true", help="without the raw nats-py batched peer")
    args = parser.parse_args()
    trees: dict[str, Path] = {}
    for spec in args.tree:
        name, _, tree = spec.partition("=")
        if not name.isidentifier() or not tree or not (Path(tree) / SOURCES[1]).is_dir():
            parser.error(f"--tree {spec!r}: want NAME=DIR, DIR holding {', '.join(SOURCES)}")
        trees[name] = Path(tree).resolve()
    envs: dict[str, dict[str, str]] = {name: {} for name in trees}
    for spec in args.env:
        name, _, kv = spec.partition(":")
        key, eq, value = kv.partition("=")
        if name not in trees or not eq or not key:
            parser.error(f"--env {spec!r}: want NAME:KEY=VALUE for a NAME given with --tree")
        envs[name][key] = value
    contestants = [bench.Contestant(name, f"bab{i}", True) for i, name in enumerate(trees)]
    if not args.no_raw:
        contestants.append(bench.BY_NAME["raw_natspy_batch"])
    bench.CONTESTANTS = tuple(contestants)
    AB.trees, AB.envs = trees, envs
    params = {**bench.QUICK, "events": args.events, "peer_events": args.events, "rounds": args.rounds}
    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-feedback-ab-"))
    load = os.getloadavg()
    run = AB(root, params, seed=7)
    try:
        asyncio.run(run.main())
    finally:
        run.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    rows = run.figures["throughput"]
    print(f"load average at the start {load[0]:.2f}, at the end {os.getloadavg()[0]:.2f}")
    for name, row in rows.items():
        cpu = [r["consumer_cpu_us_per_update"] for r in row["rounds"]]
        print(
            f"{name}: updates/s {row['updates_per_s_rounds']}, CPU us/update {cpu}, exactly once {row['exactly_once']}"
        )
    first = next(iter(trees))
    for name in trees:
        versus = [y for y in (first, "raw_natspy_batch") if y in rows and y != name]
        for y in versus:
            mean, per_round = geomean_ratio(rows, name, y)
            print(f"{name} / {y}: {mean:.3f} (rounds {per_round})")
    return 0 if all(row["exactly_once"] for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
