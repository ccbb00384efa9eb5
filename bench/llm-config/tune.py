"""Tuning runs for bench/llm-config: only the tuning table (table.csv, seed 2024) and search
seeds 100-139, never the scored tables or seeds of run.py.

    python bench/llm-config/tune.py --out /tmp/tune.json                         # all methods
    python bench/llm-config/tune.py --peers-cache /tmp/tune.json \\
        --flywheel-settings '{"racing_confidence": 0.85}'                         # Flywheel only

Prints mean evaluations to target per method and TPE+Wilcoxon / Flywheel with a bootstrap
interval; ``--flywheel-settings`` overrides methods.FLYWHEEL for a variant; ``--peers-cache``
reuses the peers' runs from an earlier --out file (they do not depend on Flywheel's settings);
``--baseline`` compares this Flywheel variant with the Flywheel runs of an earlier --out file,
seed by seed (variant / baseline mean evaluations, paired bootstrap over seeds; seeds better /
worse); for Flywheel also how many runs' race dropped a config within the target before
scoring it on every case (``target_configs_dropped`` in each run's row).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import fast_wilcoxon
import methods
import numpy as np
import optuna
import world
from run import BUDGET, METHODS, TUNING_SEEDS, parse_seeds, ratio_ci


def _one(job: tuple[int, str, dict[str, Any], float]) -> tuple[int, str, dict[str, Any]]:
    seed, method, settings, p = job
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    fast_wilcoxon.install()
    table = world.load("tuning")
    if method.startswith("flywheel"):
        out = methods.run_flywheel(table, seed, BUDGET, racing=method == "flywheel", settings=settings)
    else:
        out = methods.run_optuna(table, seed, BUDGET, method, p_threshold=p)
    return seed, method, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="100-139")
    parser.add_argument("--flywheel-settings", default="{}", help="JSON overriding methods.FLYWHEEL")
    parser.add_argument("--wilcoxon-p", type=float, default=methods.WILCOXON_P)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--peers-cache", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--baseline", type=Path, default=None, help="an earlier --out file to compare Flywheel with")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if bad := sorted(set(seeds) - set(TUNING_SEEDS)):
        parser.error(f"--seeds: {bad} are not tuning seeds (100-139)")
    settings = {**methods.FLYWHEEL, **json.loads(args.flywheel_settings)}
    wanted = args.methods.split(",")
    runs: dict[str, dict[int, Any]] = {m: {} for m in wanted}
    if args.peers_cache:
        cached = json.loads(args.peers_cache.read_text())["runs"]
        for m in wanted:
            if not m.startswith("flywheel") and m in cached:
                runs[m] = {int(k): v for k, v in cached[m].items()}
    jobs = [(s, m, settings, args.wilcoxon_p) for m in wanted for s in seeds if s not in runs[m]]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for s, m, out in pool.map(_one, jobs):
            runs[m][s] = out
    ev = {m: np.array([runs[m][s]["evaluations_to_target"] for s in seeds], float) for m in wanted}
    for m in wanted:
        print(f"{m:<22}{ev[m].mean():>8.1f}  reached {sum(runs[m][s]['reached'] for s in seeds)}/{len(seeds)}")
    if "flywheel" in ev and all("target_configs_dropped" in runs["flywheel"][s] for s in seeds):
        lost = [runs["flywheel"][s]["target_configs_dropped"] for s in seeds]
        runs_lost = sum(n > 0 for n in lost)
        print(f"flywheel runs whose race dropped a target config: {runs_lost}/{len(seeds)} ({sum(lost)} configs)")
    if "flywheel" in ev:
        for peer in ("optuna_tpe_wilcoxon", "optuna_tpe"):
            if peer in ev:
                r, lo, hi = ratio_ci(ev[peer], ev["flywheel"], np.random.default_rng(0))
                print(f"{peer} / flywheel: {r:.3f} [{lo:.3f}, {hi:.3f}]")
    if args.baseline and "flywheel" in ev:
        base_runs = json.loads(args.baseline.read_text())["runs"]["flywheel"]
        base = np.array([base_runs[str(s)]["evaluations_to_target"] for s in seeds], float)
        r, lo, hi = ratio_ci(ev["flywheel"], base, np.random.default_rng(0))
        better, worse = int((ev["flywheel"] < base).sum()), int((ev["flywheel"] > base).sum())
        print(f"variant / baseline: {r:.3f} [{lo:.3f}, {hi:.3f}]  seeds better {better} / worse {worse}")
    if args.out:
        args.out.write_text(json.dumps({"settings": settings, "seeds": seeds, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
