"""Profile the consumers of bench/feedback: the throughput phase only, under cProfile.

    python bench/feedback/profile.py [--events N] [--only flywheel,raw_natspy_batch] [--out DIR]
    python bench/feedback/profile.py --cpu [--rounds 3]   # no cProfile: CPU us per update only

Every Python process the run starts (the optimizer, the peers) runs under cProfile through a
``sitecustomize`` put first on PYTHONPATH, and writes ``<pid>-<argv>.prof`` into ``--out``
when it exits (the bench stops them with SIGTERM, so they exit normally). It prints the top
functions by cumulative and by own time for each consumer. cProfile slows every process by
a factor, so compare the shares of time, not the rates.

With ``--cpu`` nothing is profiled: each round prints every consumer's process CPU time per
applied update (user + system, between the first and the last change of the applied count),
the figure that stays meaningful on a loaded machine where wall-clock rates do not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import sys
import tempfile
from pathlib import Path

import run as bench

SITECUSTOMIZE = """
import os
if os.environ.get("FB_PROFILE_DIR") and not os.environ.get("FB_PROFILE_SKIP"):
    import atexit, cProfile, sys
    _profile = cProfile.Profile()
    _profile.enable()

    def _dump():
        _profile.disable()
        name = "_".join(a.replace("/", "_") for a in sys.argv)[-60:]
        _profile.dump_stats(os.path.join(os.environ["FB_PROFILE_DIR"], f"{os.getpid()}-{name}.prof"))

    atexit.register(_dump)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="per contestant, one round")
    parser.add_argument("--only", default="flywheel,raw_natspy_batch,faststream_batch")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "feedback-profiles")
    parser.add_argument("--cpu", action="store_true", help="no cProfile: CPU us per update only")
    parser.add_argument("--rounds", type=int, default=1, help="throughput rounds (order reversed every other)")
    args = parser.parse_args()
    bench.CONTESTANTS = tuple(bench.BY_NAME[n] for n in args.only.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.prof"):
        old.unlink()
    site = Path(tempfile.mkdtemp(prefix="feedback-sitecustomize-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    if not args.cpu:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        os.environ["FB_PROFILE_DIR"] = str(args.out)
    params = {**bench.QUICK, "events": args.events, "peer_events": args.events, "rounds": args.rounds}
    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-feedback-profile-"))
    run = bench.ThroughputOnly(root, params, seed=7)
    try:
        asyncio.run(run.main())
    finally:
        run.cleanup()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
    for name, row in run.figures["throughput"].items():
        print(
            f"{name}: {row['updates_per_s']:,.0f} updates/s{'' if args.cpu else ' under cProfile'}, "
            f"exactly once: {row['exactly_once']}"
        )
        for r in row.get("rounds", [row]):
            print(f"  round {r.get('round', 1)}: {r['consumer_cpu_us_per_update']} CPU us/update")
    if args.cpu:
        return 0
    for prof in sorted(args.out.glob("*.prof")):
        if "optimizer___main__" not in prof.name and "peers.py" not in prof.name:
            continue
        print(f"\n=== {prof.name}")
        stats = pstats.Stats(str(prof))
        stats.sort_stats("cumulative").print_stats(35)
        stats.sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
