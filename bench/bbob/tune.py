"""Tuning Flywheel's search on BBOB: only on the tuning problems, never on the scored ones.

    python bench/bbob/tune.py [--instances 11-15] [--dims 5,10] [--functions 1-24]
        [--peers-cache /tmp/bbob-peers.json] [--flywheel-settings '{"trust_region_min": 0.03}']

Tuning problems are instances 11-15 at dimensions 5 and 10 (where the GP and trust region
were developed); ``bench/bbob/run.py`` scores on instances 16 and up at other dimensions and
refuses these, and this script refuses those. ``--peers-cache`` keeps the peers' results per
problem (deterministic given the instance seed) in a file written on the first run, so later
runs rerun only Flywheel; ``--flywheel-settings`` overrides SearchSettings fields. The output
(a render on stderr, JSON on stdout and in ``--out``) is marked as tuning, never as a score.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # bench/bbob/run.py, beside this file

TUNING_INSTANCES = frozenset(run.TUNING_INSTANCES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default="1-24")
    parser.add_argument("--dims", default="5,10", help="tuning dims: 5,10")
    parser.add_argument("--instances", default="11-15", help="tuning instances: within 11-15")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "bbob-tune.json")
    parser.add_argument("--peers-cache", type=Path, default=None, help="peers' results per problem (JSON file)")
    parser.add_argument("--flywheel-settings", type=json.loads, default={}, help="SearchSettings overrides, JSON")
    parser.add_argument(
        "--no-gp", action="store_true", help="leave GPSampler out (the slow peer) when no cache holds it"
    )
    args = parser.parse_args(argv)
    functions, dims, instances = (run.parse_ints(x) for x in (args.functions, args.dims, args.instances))
    if bad := sorted(set(instances) - TUNING_INSTANCES):
        parser.error(f"--instances: {bad} are not tuning instances {sorted(TUNING_INSTANCES)}")
    if bad := sorted(set(dims) - set(run.TUNING_DIMS)):
        parser.error(f"--dims: {bad} are not tuning dims {run.TUNING_DIMS}")
    methods = tuple(m for m in run.METHODS if not (args.no_gp and m == "optuna_gp"))
    cache = json.loads(args.peers_cache.read_text()) if args.peers_cache and args.peers_cache.exists() else {}
    rows, seconds, _ = run.run_suite(
        functions, dims, instances, jobs=args.jobs, cache=cache, overrides=args.flywheel_settings, methods=methods
    )
    if args.peers_cache:
        for r in rows:
            cache[f"{r['f']},{r['dim']},{r['instance']}"] = {m: r[m] for m in methods if m != "flywheel"}
        args.peers_cache.write_text(json.dumps(cache))
    peers = tuple(m for m in run.PEERS if m in methods)
    figures = run.summarise(rows, methods)
    figures["seconds"] = round(seconds, 1)
    ratios = run.ratios_with_ci(rows, peers)
    result = {
        "name": "bbob-tuning",
        "tuning": True,
        "params": {"functions": functions, "dims": dims, "instances": instances, "overrides": args.flywheel_settings},
        "figures": figures,
        "ratios": ratios,
    }
    print(f"TUNING ({len(rows)} problems, {seconds:.0f} s), not a score", file=sys.stderr)
    for m in methods:
        print(f"{m:<14}{figures[m]['mean_normalized_regret']:>8.3f}", file=sys.stderr)
    for name, r in ratios.items():
        print(f"{name:<28}{r['value']:>8.3f} [{r['ci95_low']:.3f}, {r['ci95_high']:.3f}]", file=sys.stderr)
    args.out.write_text(json.dumps({**result, "rows": rows}, indent=2) + "\n")
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
