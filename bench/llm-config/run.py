"""Test-case evaluations needed to reach 95% of the best config's true score: Flywheel's search
(racing across test cases) against Optuna 5's TPE with ``WilcoxonPruner`` (the headline peer,
as Optuna documents it for LLM configs over a set of questions), plain TPE with full
evaluations, and random search, on held-out tables.

    python bench/llm-config/run.py            # 7 tables x seeds 500-519 (see README.md)
    python bench/llm-config/run.py --quick    # 3 tables x seeds 500-503

Tables (world.py): ``tuning`` is table.csv (generate.py, seed 2024), the table Flywheel's
settings were tuned on, reported for continuity only; ``a-7101..7103`` are generate.py's model
with other seeds; ``b-7201..7203`` are generate_b.py's, a second generator with a different
structure (random effects, 40 cases, heteroscedastic and binary noise, a three-way interaction,
a plateau). The scored search seeds 500-519 were never used while tuning (tuning used 100-139,
and 0-19 were reported through the earlier rounds of changes; tune.py runs only on the
tuning table and seeds 100-139).

Each method's runs and protocols are in methods.py. Per table: the mean evaluations to target
(a run that never reaches it counts as the budget) and ratios peer / Flywheel with 95%
bootstrap intervals over seeds; over the held-out tables: the geometric mean of the per-table
ratios, its interval from resampling seeds within each table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import fast_wilcoxon
import methods
import numpy as np
import optuna
import world

from flywheel.stack.benchstamp import code_inputs, write_results

BUDGET = 4800
METHODS = ("flywheel", "flywheel_no_racing", "optuna_tpe_wilcoxon", "optuna_tpe", "random")
PEERS = ("optuna_tpe_wilcoxon", "optuna_tpe", "random")
QUICK_TABLES = ("tuning", "a-7101", "b-7201")
SCORING_SEEDS = "500-519"
TUNING_SEEDS = range(100, 140)
USED_SEEDS = set(range(0, 20)) | set(TUNING_SEEDS)  # search seeds seen while tuning (README.md)
# Goals (all on the held-out tables; a ratio is peer evaluations / Flywheel's, higher is better).
GOALS = {
    "heldout_tpe_wilcoxon_vs_flywheel": 2.0,  # the bench's old goal, now against the stronger peer
    "heldout_tpe_wilcoxon_vs_flywheel_ci_low": 1.0,  # Flywheel better with 95% confidence
    "heldout_tpe_vs_flywheel": 2.0,  # the old goal, against the old peer, on held-out tables
}
BOOTSTRAP = 10_000


def run_one(job: tuple[str, int, str]) -> tuple[str, int, str, dict[str, Any]]:
    name, seed, method = job
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    fast_wilcoxon.install()
    table = world.load(name)
    if method == "flywheel":
        out = methods.run_flywheel(table, seed, BUDGET, racing=True)
    elif method == "flywheel_no_racing":
        out = methods.run_flywheel(table, seed, BUDGET, racing=False)
    else:
        out = methods.run_optuna(table, seed, BUDGET, method)
    return name, seed, method, out


def parse_seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def ratio_ci(peer: np.ndarray, fly: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    """mean(peer) / mean(fly) with a 95% percentile bootstrap over seeds (resampled jointly)."""
    idx = rng.integers(0, len(fly), (BOOTSTRAP, len(fly)))
    boot = peer[idx].mean(1) / fly[idx].mean(1)
    return float(peer.mean() / fly.mean()), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def pooled_ci(pairs: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator) -> tuple[float, float, float]:
    """Geometric mean over tables of mean(peer) / mean(fly); seeds resampled within each table."""
    point = math.exp(statistics.fmean(math.log(p.mean() / f.mean()) for p, f in pairs))
    logs = np.zeros(BOOTSTRAP)
    for p, f in pairs:
        idx = rng.integers(0, len(f), (BOOTSTRAP, len(f)))
        logs += np.log(p[idx].mean(1) / f[idx].mean(1))
    boot = np.exp(logs / len(pairs))
    return point, float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def summarize(rows: dict[tuple[str, str], list[dict[str, Any]]], tables: list[str], seeds: list[int]) -> dict:
    rng = np.random.default_rng(0)
    per_table: dict[str, Any] = {}
    for name in tables:
        t = world.load(name)
        figs: dict[str, Any] = {"table": t.summary()}
        ev = {m: np.array([r["evaluations_to_target"] for r in rows[name, m]], dtype=float) for m in METHODS}
        for m in METHODS:
            rs = rows[name, m]
            figs[m] = {
                "mean_evaluations_to_target": round(float(ev[m].mean()), 1),
                "median_evaluations_to_target": float(np.median(ev[m])),
                "reached": sum(r["reached"] for r in rs),
                "mean_configs_tried": round(statistics.fmean(r["configs_tried"] for r in rs), 1),
                "mean_final_true_score": round(statistics.fmean(r["final_true_score"] for r in rs), 4),
                "overhead_ms_per_evaluation": round(statistics.fmean(r["overhead_ms_per_evaluation"] for r in rs), 2),
            }
            if m == "optuna_tpe_wilcoxon":
                figs[m]["mean_trials"] = round(statistics.fmean(r["trials"] for r in rs), 1)
                figs[m]["mean_pruned_trials"] = round(statistics.fmean(r["pruned_trials"] for r in rs), 1)
                figs[m]["best_trial_fully_evaluated"] = sum(r["best_trial_fully_evaluated"] for r in rs)
        figs["ratios"] = {}
        for peer in (*PEERS, "flywheel_no_racing"):
            r, lo, hi = ratio_ci(ev[peer], ev["flywheel"], rng)
            figs["ratios"][f"{peer}_vs_flywheel"] = {"ratio": round(r, 3), "ci95": [round(lo, 3), round(hi, 3)]}
        figs["flywheel_faster_than_tpe_wilcoxon_on_seeds"] = int((ev["flywheel"] < ev["optuna_tpe_wilcoxon"]).sum())
        per_table[name] = figs
    held = [n for n in tables if world.TABLES[n][2]]
    ratios: dict[str, Any] = {}
    for peer, key in (("optuna_tpe_wilcoxon", "tpe_wilcoxon"), ("optuna_tpe", "tpe"), ("random", "random")):
        pairs = [
            (
                np.array([r["evaluations_to_target"] for r in rows[n, peer]], float),
                np.array([r["evaluations_to_target"] for r in rows[n, "flywheel"]], float),
            )
            for n in held
        ]
        if pairs:
            r, lo, hi = pooled_ci(pairs, rng)
            ratios[f"heldout_{key}_vs_flywheel"] = round(r, 3)
            ratios[f"heldout_{key}_vs_flywheel_ci95"] = [round(lo, 3), round(hi, 3)]
    if "heldout_tpe_wilcoxon_vs_flywheel_ci95" in ratios:
        ratios["heldout_tpe_wilcoxon_vs_flywheel_ci_low"] = ratios["heldout_tpe_wilcoxon_vs_flywheel_ci95"][0]
    for gen in ("a", "b"):
        names = [n for n in held if world.TABLES[n][0] == gen]
        if names:
            pairs = [
                (
                    np.array([r["evaluations_to_target"] for r in rows[n, "optuna_tpe_wilcoxon"]], float),
                    np.array([r["evaluations_to_target"] for r in rows[n, "flywheel"]], float),
                )
                for n in names
            ]
            r, lo, hi = pooled_ci(pairs, rng)
            ratios[f"generator_{gen}_tpe_wilcoxon_vs_flywheel"] = round(r, 3)
            ratios[f"generator_{gen}_tpe_wilcoxon_vs_flywheel_ci95"] = [round(lo, 3), round(hi, 3)]
    goals_met = {k: bool(ratios[k] >= v) for k, v in GOALS.items() if k in ratios}
    return {"tables": per_table, "ratios": ratios, "goals_met": goals_met}


def render(result: dict[str, Any]) -> str:
    lines = []
    for name, f in result["figures"]["tables"].items():
        t = f["table"]
        lines += [
            "",
            f"{name}{'' if t['held_out'] else ' (TUNING table)'}: {t['configs']} configs x {t['test_cases']} cases, "
            f"target {t['target']:.3f}, {t['configs_within_target']} configs within it",
            f"  {'method':<22}{'mean evals':>11}{'median':>8}{'reached':>9}{'final true':>11}{'ms/eval':>9}",
        ]
        n = len(result["params"]["seeds"])
        for m in METHODS:
            r = f[m]
            lines.append(
                f"  {m:<22}{r['mean_evaluations_to_target']:>11.0f}{r['median_evaluations_to_target']:>8.0f}"
                f"{r['reached']:>6}/{n:<2}{r['mean_final_true_score']:>11.3f}{r['overhead_ms_per_evaluation']:>9.2f}"
            )
        for k, v in f["ratios"].items():
            lines.append(f"  {k:<40}{v['ratio']:>7.2f}  [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]")
    lines += ["", f"{'ratio (held-out tables)':<48}{'value':>7}{'goal':>7}  met"]
    ratios = result["ratios"]
    for k, v in ratios.items():
        if isinstance(v, list):
            continue
        goal = result["goals"].get(k)
        ci = ratios.get(f"{k}_ci95")
        met = "" if goal is None else ("yes" if v >= goal else "NO")
        goal_text = "" if goal is None else f"{goal:.2f}"
        ci_text = f"  [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        lines.append(f"{k:<48}{v:>7.2f}{goal_text:>7}  {met}{ci_text}")
    lines.append(f"({result['figures']['seconds']} s)")
    return "\n".join(lines)


def protocol() -> dict[str, Any]:
    """What a run's result depends on besides table, seed and method (checked by --reuse)."""
    return {
        "budget": BUDGET,
        "flywheel": methods.FLYWHEEL,
        "wilcoxon_p": methods.WILCOXON_P,
        "in_flight": methods.IN_FLIGHT,
    }


def reused(path: Path, tables: list[str], seeds: list[int]) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Runs of an earlier results file with the same protocol, for the tables and seeds asked."""
    old = json.loads(path.read_text())
    if old["params"].get("protocol") != protocol():
        raise SystemExit(f"--reuse: {path} was run with another protocol: {old['params'].get('protocol')}")
    out = {}
    for key, runs in old["figures"]["runs"].items():
        name, method = key.split("/")
        for r in runs:
            if name in tables and r["seed"] in seeds:
                out[name, r["seed"], method] = {k: v for k, v in r.items() if k != "seed"}
    return out


def rows_done(path: Path | None, code: str, tables: list[str], seeds: list[int]) -> dict[tuple[str, int, str], Any]:
    """Finished runs from a ``--rows`` file (one JSON line per (table, seed, method)), only those
    of the same code (``benchstamp.code_inputs`` digest) and protocol: a run stopped at the end
    of a sitting resumes without mixing in runs of other code."""
    if path is None or not path.exists():
        return {}
    out, other = {}, 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("code") != code or r.get("protocol") != json.loads(json.dumps(protocol())):
            other += 1
        elif r["table"] in tables and r["seed"] in seeds:
            out[r["table"], r["seed"], r["method"]] = r["out"]
    if other:
        print(f"{path}: {other} runs of other code or protocol are not reused", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"tables {', '.join(QUICK_TABLES)}, seeds 500-503")
    parser.add_argument("--seeds", default=None, help=f"scoring seeds (default {SCORING_SEEDS})")
    parser.add_argument("--tables", default=None, help=f"comma-separated, of {', '.join(world.TABLES)}")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="an earlier results JSON of the same protocol: its (table, seed, method) runs are not run again",
    )
    parser.add_argument(
        "--rows",
        type=Path,
        default=None,
        help="JSON-lines file of finished runs: those of the same code are not run again, new ones appended",
    )
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds or ("500-503" if args.quick else SCORING_SEEDS))
    if used := sorted(set(seeds) & USED_SEEDS):
        parser.error(f"--seeds: {used} were used while tuning; score on others (tune.py runs those)")
    tables = args.tables.split(",") if args.tables else list(QUICK_TABLES if args.quick else world.TABLES)
    for name in tables:
        world.load(name)  # unknown names fail here
    checked = fast_wilcoxon.check()
    t0 = time.perf_counter()
    # Slowest jobs first so the pool's tail stays short.
    order = {"optuna_tpe_wilcoxon": 0, "flywheel": 1, "flywheel_no_racing": 2, "optuna_tpe": 3, "random": 4}
    done = reused(args.reuse, tables, seeds) if args.reuse else {}
    code = code_inputs()["digest"]
    done.update(rows_done(args.rows, code, tables, seeds))
    jobs = sorted(
        ((n, s, m) for n in tables for s in seeds for m in METHODS if (n, s, m) not in done),
        key=lambda j: order[j[2]],
    )
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {(n, m): [] for n in tables for m in METHODS}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for n, s, m, out in pool.map(run_one, jobs):
            done[n, s, m] = out
            if args.rows:
                line = {"table": n, "seed": s, "method": m, "code": code, "protocol": protocol(), "out": out}
                with args.rows.open("a") as fh:
                    fh.write(json.dumps(line) + "\n")
    for n in tables:
        for m in METHODS:
            rows[n, m] = [{"seed": s, **done[n, s, m]} for s in seeds]
    figures = summarize(rows, tables, seeds)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    figures["runs"] = {f"{n}/{m}": rows[n, m] for n in tables for m in METHODS}
    result = {
        "params": {
            "quick": args.quick,
            "seeds": seeds,
            "seeds_used_while_tuning": "0-19 (reported in earlier rounds), 100-139 (tuning); table seed 2024",
            "tables": {n: {"generator": world.TABLES[n][0], "seed": world.TABLES[n][1]} for n in tables},
            "protocol": protocol(),
            "reused_from": str(args.reuse) if args.reuse else None,
            "runs_reused": len(done) - len(jobs),
            "budget": BUDGET,
            "in_flight_flywheel": methods.IN_FLIGHT,
            "flywheel": methods.FLYWHEEL,
            "optuna_tpe_wilcoxon": (
                f"TPESampler(multivariate=True) + WilcoxonPruner(p_threshold={methods.WILCOXON_P}); cases in a "
                "shuffled order per trial, report(score, case_index), a pruned trial returns its mean so far"
            ),
            "optuna_tpe": "TPESampler(multivariate=True); every trial on every case",
            "cost": "one unit per (config, case) first evaluated in a run; repeats free",
            "censoring": "a run that never reaches the target counts as the budget",
            "bootstrap": f"{BOOTSTRAP} resamples of seeds, percentile 95% interval",
            "wilcoxon_batched_check": f"{checked} p-values equal to scipy's unbatched ones",
        },
        "figures": figures,
        "ratios": figures.pop("ratios"),
        "goals": GOALS,
    }
    result["figures"]["goals_met"] = figures.pop("goals_met")
    print(render(result))
    out = args.out or (world.HERE.parents[1] / "bench" / "results" / "llm-config-quick.json" if args.quick else None)
    write_results("llm-config", result, out=out, packages=("optuna", "numpy", "scipy"), argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
