"""The search core on COCO/BBOB (noiseless) against Optuna 5's TPE (multivariate), CMA-ES and
random sampling, in the same run.

    python bench/bbob/run.py [--quick | --full] [--jobs 2]

Each problem (function f, dimension d, instance i) gives every method the same budget of
evaluations (200). A method's normalized regret on a problem is
(best f found - f_opt) / (best f of random search - f_opt): 0 is the optimum, 1 is random's
best (Optuna's RandomSampler with the same seed). The figure per method is the mean over
problems; the ratio is Flywheel's over the best Optuna sampler's (TPE or CMA-ES).

Sizes: ``--full`` is the issue's suite, 24 functions x dims {5, 10} x instances 1-10 (480
problems; hours on 2 shared cores, mostly TPE). The default is 24 functions x dims {5, 10} x
instance 1 (48 problems, about 4 min with 2 workers). ``--quick`` is functions {1, 6, 10, 15, 20} x dim 5 x instance 1.

Flywheel runs ``flywheel.optimizer.search.Search`` with one "test case" (racing has nothing to
do on a deterministic function), population 10, elite 2 and otherwise the defaults: mutation
(rate 0.2, 10% of the range), crossover 0.7, the surrogate screen (its pool joined by draws
from a Gaussian fitted to the best candidates, ``surrogate_gaussian`` 0.5; an ARD Matern-5/2 GP
with hyperparameters fitted by marginal likelihood, learning from at most 150 candidates,
picking each generation by batch Thompson sampling) and the trust region (on by default for an
all-continuous space, turned onto the principal axes of the epoch's best candidates: side 0.8
of the unit cube at first, doubled after 3 improving
generations in a row, halved after each generation without a gain here, restart from fresh
configs below 0.5**7). The GP, the trust region and their defaults were developed on instances
11-12 (``--instances 11-12``, the trust region's first measurement on instance 11 alone), never
on the reported instance 1. ``--peers-cache FILE`` (tuning only) reads the peers' results from
a file written by an earlier run and runs only Flywheel; reported runs run every method.
Overhead per suggestion is the wall time a method spends outside the objective, per
evaluation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from flywheel.optimizer.search import CONTINUOUS, Param, Search, SearchSettings, SearchSpace

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bbob.json"
BUDGET = 200
METHODS = ("flywheel", "optuna_tpe", "optuna_cmaes", "random")
OPTUNA = ("optuna_tpe", "optuna_cmaes")
GOALS = {"flywheel_vs_best_optuna": 0.85}
FLYWHEEL = {"population_size": 10, "elite_size": 2}


_SUITES: list[Any] = []


def problem(fid: int, dim: int, inst: int):
    import cocoex

    suite = cocoex.Suite("bbob", "", f"function_indices:{fid} dimensions:{dim} instance_indices:{inst}")
    _SUITES.append(suite)  # a problem must not outlive its suite (cocoex frees it with the suite)
    return next(iter(suite))


def f_opt(fid: int, dim: int, inst: int) -> float:
    """The problem's optimal value. cocoex does not expose it; its bbob logger writes it in the
    header of the data file ("... - Fopt (77.66) ..."), so one logged evaluation reveals it."""
    import cocoex

    cocoex.log_level("warning")
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="bbob-fopt-") as tmp:
        os.chdir(tmp)
        try:
            observer = cocoex.Observer("bbob", "result_folder: probe")
            p = problem(fid, dim, inst)
            p.observe_with(observer)
            p(np.zeros(dim))
            p.free()
            del observer
            header = next(Path(tmp).rglob("*.dat")).read_text().splitlines()[0]
        finally:
            os.chdir(here)
    return float(re.search(r"Fopt \(([^)]+)\)", header).group(1))


def flywheel_settings(seed: int, overrides: dict[str, Any] | None = None) -> SearchSettings:
    """Flywheel's settings on one problem: the service defaults, the bench's population, no racing."""
    return SearchSettings(
        **{**FLYWHEEL, **(overrides or {})}, generations=10_000, max_evaluations=BUDGET, racing=False, seed=seed
    )


def run_flywheel(p, seed: int, overrides: dict[str, Any] | None = None) -> tuple[float, float]:
    lo, hi = p.lower_bounds, p.upper_bounds
    space = SearchSpace([Param(f"x{i}", CONTINUOUS, low=float(lo[i]), high=float(hi[i])) for i in range(p.dimension)])
    search = Search(space, ["f"], flywheel_settings(seed, overrides))
    best, f_time, t0 = np.inf, 0.0, time.perf_counter()
    while not search.done:
        for cid, config, case in search.next_evaluations(BUDGET):
            t = time.perf_counter()
            y = float(p([config[f"x{i}"] for i in range(p.dimension)]))
            f_time += time.perf_counter() - t
            best = min(best, y)
            search.record(cid, case, -y)
    return best, time.perf_counter() - t0 - f_time


def run_optuna(kind: str, p, seed: int) -> tuple[float, float]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if kind == "optuna_tpe":
        sampler = optuna.samplers.TPESampler(multivariate=True, seed=seed)
    elif kind == "optuna_cmaes":
        sampler = optuna.samplers.CmaEsSampler(seed=seed)
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(sampler=sampler, direction="minimize")
    lo, hi = p.lower_bounds, p.upper_bounds
    f_time, t0 = 0.0, time.perf_counter()
    for _ in range(BUDGET):
        trial = study.ask()
        x = [trial.suggest_float(f"x{i}", float(lo[i]), float(hi[i])) for i in range(p.dimension)]
        t = time.perf_counter()
        y = float(p(x))
        f_time += time.perf_counter() - t
        study.tell(trial, y)
    return study.best_value, time.perf_counter() - t0 - f_time


def run_problem(task: tuple[int, int, int, dict[str, Any] | None, dict[str, Any]]) -> dict[str, Any]:
    fid, dim, inst, cached, overrides = task
    out: dict[str, Any] = {"f": fid, "dim": dim, "instance": inst}
    optimum = f_opt(fid, dim, inst)
    for m in METHODS:
        if cached and m in cached:  # --peers-cache: a peer's result is deterministic per problem
            out[m] = {k: v for k, v in cached[m].items() if k != "normalized_regret"}
            continue
        p = problem(fid, dim, inst)  # fresh: cocoex counts evaluations per problem object
        best, overhead = run_flywheel(p, inst, overrides) if m == "flywheel" else run_optuna(m, p, inst)
        out[m] = {"best": best, "regret": best - optimum, "overhead_ms_per_suggestion": 1000 * overhead / BUDGET}
    base = max(out["random"]["regret"], 1e-12)
    for m in METHODS:
        out[m]["normalized_regret"] = out[m]["regret"] / base
    return out


def parse_range(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    pkgs = {k: metadata.version(k) for k in ("optuna", "cmaes", "coco-experiment", "numpy", "scipy")}
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": pkgs,
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    fig: dict[str, Any] = {"problems": len(rows)}
    for m in METHODS:
        nr = [r[m]["normalized_regret"] for r in rows]
        fig[m] = {
            "mean_normalized_regret": round(statistics.fmean(nr), 4),
            "median_normalized_regret": round(statistics.median(nr), 4),
            "overhead_ms_per_suggestion": round(statistics.fmean(r[m]["overhead_ms_per_suggestion"] for r in rows), 3),
        }
    for dim in sorted({r["dim"] for r in rows}):
        fig[f"dim{dim}"] = {
            m: round(statistics.fmean(r[m]["normalized_regret"] for r in rows if r["dim"] == dim), 4) for m in METHODS
        }
    fig["per_function"] = {
        str(f): {m: round(statistics.fmean(r[m]["normalized_regret"] for r in rows if r["f"] == f), 4) for m in METHODS}
        for f in sorted({r["f"] for r in rows})
    }
    wins = {m: 0 for m in METHODS}
    for r in rows:
        wins[min(METHODS, key=lambda m: r[m]["regret"])] += 1
    fig["problems_won"] = wins
    return fig


def render(result: dict[str, Any]) -> str:
    f, p = result["figures"], result["params"]
    lines = [
        f"bbob: {f['problems']} problems (functions {p['functions']}, dims {p['dims']}, instances {p['instances']}), "
        f"{p['budget']} evaluations each",
        "",
        f"{'method':<14}{'mean nreg':>10}{'median':>9}{'won':>6}{'overhead ms':>13}"
        + "".join(f"{'dim' + str(d):>9}" for d in p["dims"]),
    ]
    for m in METHODS:
        lines.append(
            f"{m:<14}{f[m]['mean_normalized_regret']:>10.3f}{f[m]['median_normalized_regret']:>9.3f}"
            f"{f['problems_won'][m]:>6}{f[m]['overhead_ms_per_suggestion']:>13.2f}"
            + "".join(f"{f['dim' + str(d)][m]:>9.3f}" for d in p["dims"])
        )
    lines += ["", "per function (mean normalized regret):", f"{'f':>4}" + "".join(f"{m:>14}" for m in METHODS)]
    for fid, row in f["per_function"].items():
        lines.append(f"{fid:>4}" + "".join(f"{row[m]:>14.3f}" for m in METHODS))
    lines += ["", f"{'ratio':<28}{'value':>8}{'goal':>8}  met"]
    for name, value in result["ratios"].items():
        if name in result["goals"]:
            goal = result["goals"][name]
            lines.append(f"{name:<28}{value:>8.3f}{goal:>8.2f}  {'yes' if value <= goal else 'NO'}")
        else:
            lines.append(f"{name:<28}{value:>8.3f}")
    lines.append(f"({f['seconds']} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="functions 1,6,10,15,20, dim 5, instance 1")
    size.add_argument("--full", action="store_true", help="24 functions x dims 5,10 x instances 1-10")
    parser.add_argument("--functions", default=None, help="e.g. 1-24 or 1,6,10")
    parser.add_argument("--dims", default=None, help="e.g. 5,10")
    parser.add_argument("--instances", default=None, help="e.g. 1-2 (11-15 for tuning)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--peers-cache",
        type=Path,
        default=None,
        help="tuning only: read the peers' results per problem from this JSON file (written on the "
        "first run), so only Flywheel runs; reported runs never use it",
    )
    parser.add_argument(
        "--flywheel-settings",
        type=json.loads,
        default={},
        help="tuning only: SearchSettings fields to override, as JSON, e.g. '{\"trust_region_init\": 0.5}'",
    )
    args = parser.parse_args(argv)
    if args.quick:
        functions, dims, instances = [1, 6, 10, 15, 20], [5], [1]
    elif args.full:
        functions, dims, instances = list(range(1, 25)), [5, 10], list(range(1, 11))
    else:
        functions, dims, instances = list(range(1, 25)), [5, 10], [1]
    if args.functions:
        functions = [x for part in args.functions.split(",") for x in parse_range(part)]
    if args.dims:
        dims = [int(x) for x in args.dims.split(",")]
    if args.instances:
        instances = [x for part in args.instances.split(",") for x in parse_range(part)]
    cache: dict[str, Any] = {}
    if args.peers_cache and args.peers_cache.exists():
        cache = json.loads(args.peers_cache.read_text())
    overrides = args.flywheel_settings
    flywheel_settings(0, overrides)  # fail fast on a bad override
    tasks = [(f, d, i, cache.get(f"{f},{d},{i}"), overrides) for d in dims for f in functions for i in instances]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = []
        for n, row in enumerate(pool.map(run_problem, tasks), 1):
            rows.append(row)
            print(
                f"[{n}/{len(tasks)}] f{row['f']} d{row['dim']} i{row['instance']}: "
                + " ".join(f"{m}={row[m]['normalized_regret']:.3f}" for m in METHODS),
                file=sys.stderr,
                flush=True,
            )
    if args.peers_cache:
        for r in rows:
            cache[f"{r['f']},{r['dim']},{r['instance']}"] = {m: r[m] for m in METHODS if m != "flywheel"}
        args.peers_cache.write_text(json.dumps(cache))
    figures = summarise(rows)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    best_optuna = min(OPTUNA, key=lambda m: figures[m]["mean_normalized_regret"])
    fly = figures["flywheel"]["mean_normalized_regret"]
    ratios = {
        "flywheel_vs_best_optuna": round(fly / figures[best_optuna]["mean_normalized_regret"], 3),
        **{f"flywheel_vs_{m}": round(fly / figures[m]["mean_normalized_regret"], 3) for m in OPTUNA},
        "overhead_flywheel_vs_optuna_tpe": round(
            figures["flywheel"]["overhead_ms_per_suggestion"] / figures["optuna_tpe"]["overhead_ms_per_suggestion"], 3
        ),
    }
    figures["best_optuna_sampler"] = best_optuna
    figures["goals_met"] = {k: bool(ratios[k] <= v) for k, v in GOALS.items()}
    figures["rows"] = rows
    result = {
        "name": "bbob",
        "machine": machine(),
        "params": {
            "quick": args.quick,
            "full": args.full,
            "functions": functions,
            "dims": dims,
            "instances": instances,
            "budget": BUDGET,
            "seed": "the instance index seeds every method",
            "flywheel": {
                **{k: v for k, v in flywheel_settings(0, overrides).to_json().items() if k != "seed"},
                "overrides": overrides,
                "surrogate_model": "ARD Matern-5/2 GP, marginal-likelihood hyperparameters, batch Thompson",
            },
            "peers": {
                "optuna_tpe": "TPESampler(multivariate=True)",
                "optuna_cmaes": "CmaEsSampler()",
                "random": "RandomSampler()",
            },
            "normalized_regret": "(best - f_opt) / (random's best - f_opt), mean over problems",
        },
        "figures": figures,
        "ratios": ratios,
        "goals": GOALS,
    }
    print(render(result))
    out = args.out or (RESULTS.with_name("bbob-quick.json") if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
