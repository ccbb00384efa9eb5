"""Cumulative regret of Flywheel's Thompson sampling and IDS against MABWiser and Vowpal Wabbit.

    python bench/regret/run.py [--quick] [--jobs N]

Simulated Bernoulli and Gaussian bandits (see `envs`), three scenarios (stationary,
delayed feedback, drift), every policy fed the same reward streams through the same
batched loop (see `loop`). Prints a table, writes bench/results/regret.json (and a PNG of
regret curves if matplotlib is installed), and prints that JSON as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections import defaultdict
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from envs import REWARDS, SCENARIOS, environment, make_base
from loop import play
from peers import Flywheel, Mabwiser, VowpalWabbit

from flywheel.stack import benchstamp

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"

FULL = {
    "arms": [2, 10, 100],
    "gaps": [0.01, 0.1],
    "seeds": 50,
    "horizon": 5000,
    "batch": 20,
    "max_delay": 100,
    "half_life": 500.0,
    "checkpoints": 50,
}
QUICK = {**FULL, "arms": [2, 10], "seeds": 10, "horizon": 2000}
PEERS = ("mabwiser_ts", "mabwiser_ucb1", "mabwiser_eps_greedy", "vw_cb_explore")
GOALS = {"flywheel_vs_best_peer": 0.9, "delayed_vs_undelayed": 1.1, "drift_discounted_vs_stationary_ts": 0.5}
# The same goals for the endpoints that choose allocation: ids.
GOALS |= {"ids_vs_best_peer": 0.9, "ids_delayed_vs_undelayed": 1.1, "drift_ids_discounted_vs_stationary_ts": 0.5}
# Versions recorded with the results.
PACKAGES = ("numpy", "scipy", "mabwiser", "vowpalwabbit")


def have_vw() -> bool:
    try:
        import vowpalwabbit  # noqa: F401
    except ImportError:
        return False
    return True


def _seed(*parts: object) -> int:
    return int(np.random.SeedSequence([zlib.crc32(str(p).encode()) for p in parts]).generate_state(1)[0])


def make_policies(reward: str, scenario: str, k: int, seed: int, params: dict, vw: bool) -> dict:
    """The policies of one run; Flywheel variants share a generator seed (common random numbers)."""
    kind = "beta" if reward == "bernoulli" else "gaussian"
    fw_seed = _seed("flywheel", k, seed, reward, scenario)
    hl = params["half_life"]
    out: dict = {}
    if scenario == "drift":
        out["flywheel"] = Flywheel(k, kind, fw_seed, half_life=hl)
        out["flywheel_stationary"] = Flywheel(k, kind, fw_seed)
        out["flywheel_ids"] = Flywheel(k, kind, fw_seed, half_life=hl, allocation="ids")
    else:
        out["flywheel"] = Flywheel(k, kind, fw_seed)
        out["flywheel_ids"] = Flywheel(k, kind, fw_seed, allocation="ids")
        if scenario == "stationary":
            out["flywheel_discounted"] = Flywheel(k, kind, fw_seed, half_life=hl)
    for which in ("ts", "ucb1", "eps_greedy"):
        out[f"mabwiser_{which}"] = Mabwiser(k, which, reward, _seed("mabwiser", which, k, seed, reward, scenario))
    if vw:
        out["vw_cb_explore"] = VowpalWabbit(k, _seed("vw", k, seed, reward, scenario) % 2**31, params["horizon"])
    return out


def run_unit(job: tuple[int, int, dict, bool]) -> list[dict]:
    """Every reward type, gap, scenario and policy for one (k, seed)."""
    k, seed, params, vw = job
    horizon = params["horizon"]
    base = make_base(k, seed, horizon, params["max_delay"])
    marks = np.linspace(horizon / params["checkpoints"], horizon, params["checkpoints"]).astype(int) - 1
    records = []
    for reward in REWARDS:
        for gap in params["gaps"]:
            for scenario in SCENARIOS:
                env = environment(base, reward, gap, scenario)
                for name, policy in make_policies(reward, scenario, k, seed, params, vw).items():
                    t0 = time.process_time()
                    arms = play(policy, env, params["batch"])
                    cpu = time.process_time() - t0
                    if hasattr(policy, "close"):
                        policy.close()
                    cum = np.cumsum(env.regret(arms))
                    records.append(
                        {
                            "config": f"{reward}/k{k}/gap{gap}/{scenario}",
                            "policy": name,
                            "seed": seed,
                            "regret": float(cum[-1]),
                            "curve": cum[marks].tolist(),
                            "cpu_s": cpu,
                        }
                    )
    return records


def _mean_se(values: list[float]) -> dict[str, float]:
    se = float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0
    return {"mean": float(np.mean(values)), "se": se}


def _mean_ratio(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def aggregate(records: list[dict], params: dict) -> tuple[dict, dict]:
    """Per-config regrets and ratios, and the headline ratios."""
    by: defaultdict[str, defaultdict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    curves: defaultdict[str, defaultdict[str, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
    cpu: defaultdict[str, float] = defaultdict(float)
    for r in records:
        by[r["config"]][r["policy"]].append(r["regret"])
        curves[r["config"]][r["policy"]].append(r["curve"])
        cpu[r["policy"]] += r["cpu_s"]
    per_config = {}
    vs_peer: dict[str, list[float]] = defaultdict(list)
    delayed: dict[str, list[float]] = defaultdict(list)
    drift: dict[str, list[float]] = defaultdict(list)
    for config in sorted(by, key=_config_key):
        reward, karms, gap, scenario = config.split("/")
        pols = by[config]
        regret = {p: _mean_se(v) for p, v in pols.items()}
        peers = {p: regret[p]["mean"] for p in PEERS if p in regret}
        best_peer = min(peers, key=peers.__getitem__)
        entry: dict[str, Any] = {
            "regret": regret,
            "best_peer": best_peer,
            "flywheel_vs_best_peer": regret["flywheel"]["mean"] / peers[best_peer],
            "curves": {p: np.mean(c, axis=0).round(3).tolist() for p, c in curves[config].items()},
            "flywheel_vs_mabwiser_ts": regret["flywheel"]["mean"] / regret["mabwiser_ts"]["mean"],
        }
        group = "drift" if scenario == "drift" else "stationary_and_delayed"
        vs_peer[group].append(entry["flywheel_vs_best_peer"])
        vs_peer[f"{group}/{gap}"].append(entry["flywheel_vs_best_peer"])
        if "flywheel_ids" in regret:
            entry["ids_vs_best_peer"] = regret["flywheel_ids"]["mean"] / peers[best_peer]
            vs_peer[f"ids/{group}"].append(entry["ids_vs_best_peer"])
            vs_peer[f"ids/{group}/{gap}"].append(entry["ids_vs_best_peer"])
        if group != "drift":
            vs_peer[f"ts/{reward}"].append(entry["flywheel_vs_mabwiser_ts"])
        if scenario == "delayed":
            undelayed = by[f"{reward}/{karms}/{gap}/stationary"]["flywheel"]
            entry["delayed_vs_undelayed"] = regret["flywheel"]["mean"] / float(np.mean(undelayed))
            delayed["all"].append(entry["delayed_vs_undelayed"])
            delayed[gap].append(entry["delayed_vs_undelayed"])
            if "flywheel_ids" in regret:
                undelayed_ids = by[f"{reward}/{karms}/{gap}/stationary"]["flywheel_ids"]
                delayed["ids"].append(regret["flywheel_ids"]["mean"] / float(np.mean(undelayed_ids)))
        if scenario == "drift":
            entry["drift_discounted_vs_stationary_ts"] = (
                regret["flywheel"]["mean"] / regret["flywheel_stationary"]["mean"]
            )
            drift["all"].append(entry["drift_discounted_vs_stationary_ts"])
            drift[gap].append(entry["drift_discounted_vs_stationary_ts"])
            if "flywheel_ids" in regret:
                drift["ids"].append(regret["flywheel_ids"]["mean"] / regret["flywheel_stationary"]["mean"])
                drift[f"ids/{gap}"].append(drift["ids"][-1])
        per_config[config] = entry
    ratios = {
        "flywheel_vs_best_peer": _mean_ratio(vs_peer["stationary_and_delayed"]),
        "delayed_vs_undelayed": _mean_ratio(delayed["all"]),
        "drift_discounted_vs_stationary_ts": _mean_ratio(drift["all"]),
        "flywheel_vs_best_peer_under_drift": _mean_ratio(vs_peer["drift"]),
        "ids_vs_best_peer": _mean_ratio(vs_peer["ids/stationary_and_delayed"]),
        "ids_delayed_vs_undelayed": _mean_ratio(delayed["ids"]),
        "drift_ids_discounted_vs_stationary_ts": _mean_ratio(drift["ids"]),
        "ids_vs_best_peer_under_drift": _mean_ratio(vs_peer["ids/drift"]),
    }
    for reward in REWARDS:
        ratios[f"flywheel_vs_mabwiser_ts_{reward}"] = _mean_ratio(vs_peer[f"ts/{reward}"])
    for gap in params["gaps"]:
        g = f"gap{gap}"
        ratios[f"flywheel_vs_best_peer_{g}"] = _mean_ratio(vs_peer[f"stationary_and_delayed/{g}"])
        ratios[f"delayed_vs_undelayed_{g}"] = _mean_ratio(delayed[g])
        ratios[f"drift_discounted_vs_stationary_ts_{g}"] = _mean_ratio(drift[g])
        ratios[f"ids_vs_best_peer_{g}"] = _mean_ratio(vs_peer[f"ids/stationary_and_delayed/{g}"])
        ratios[f"drift_ids_discounted_vs_stationary_ts_{g}"] = _mean_ratio(drift[f"ids/{g}"])
    steps: defaultdict[str, int] = defaultdict(int)
    for r in records:
        steps[r["policy"]] += params["horizon"]
    figures = {
        "per_config": per_config,
        "cpu_us_per_step": {p: round(cpu[p] / steps[p] * 1e6, 2) for p in sorted(cpu)},
    }
    return figures, ratios


def _config_key(config: str) -> tuple:
    reward, karms, gap, scenario = config.split("/")
    return (REWARDS.index(reward), int(karms[1:]), float(gap[3:]), SCENARIOS.index(scenario))


def table(figures: dict, ratios: dict, vw: bool) -> str:
    cols = ["flywheel", *[p for p in PEERS if vw or p != "vw_cb_explore"]]
    short = {
        "flywheel": "flywheel",
        "mabwiser_ts": "mw_ts",
        "mabwiser_ucb1": "mw_ucb1",
        "mabwiser_eps_greedy": "mw_egreedy",
        "vw_cb_explore": "vw_cb",
    }
    head = f"{'config':36s}" + "".join(f"{short[c]:>11s}" for c in cols)
    head += f"{'fw_alt':>9s}{'fw_ids':>9s}{'fw/best':>9s}{'ids/best':>9s}"
    lines = [
        "mean cumulative pseudo-regret over seeds. flywheel: stationary TS, or TS with the half-life under drift;",
        "fw_alt: Flywheel with the half-life (stationary rows) or without it (drift rows); fw_ids: allocation ids",
        "(with the half-life under drift); fw/best, ids/best: vs the best peer",
        head,
    ]
    for config, e in figures["per_config"].items():
        reg = e["regret"]
        row = f"{config:36s}" + "".join(f"{reg[c]['mean']:11.1f}" for c in cols)
        alt = reg.get("flywheel_stationary", reg.get("flywheel_discounted"))
        row += f"{alt['mean']:9.1f}" if alt else f"{'':9s}"
        row += f"{reg['flywheel_ids']['mean']:9.1f}" if "flywheel_ids" in reg else f"{'':9s}"
        row += f"{e['flywheel_vs_best_peer']:9.3f}"
        row += f"{e['ids_vs_best_peer']:9.3f}" if "ids_vs_best_peer" in e else ""
        lines.append(row)
    lines.append("")
    lines.append("ratios (goal: <= target)")
    for name, value in ratios.items():
        goal = GOALS.get(name)
        mark = "" if goal is None or value is None else ("  ok" if value <= goal else "  MISSED")
        target = f" (goal <= {goal})" if goal is not None else ""
        lines.append(f"  {name:48s} {value if value is None else round(value, 3)}{target}{mark}")
    lines.append("cpu us per step: " + ", ".join(f"{p}={v}" for p, v in figures["cpu_us_per_step"].items()))
    return "\n".join(lines)


def plot(figures: dict, params: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ks = [a for a in params["arms"] if a <= 10]
    rows = [(reward, k) for reward in REWARDS for k in ks]
    colors = {
        "flywheel": "tab:blue",
        "flywheel_discounted": "tab:cyan",
        "flywheel_stationary": "tab:cyan",
        "flywheel_ids": "tab:green",
        "mabwiser_ts": "tab:orange",
        "mabwiser_ucb1": "tab:red",
        "mabwiser_eps_greedy": "tab:purple",
        "vw_cb_explore": "tab:brown",
    }
    fig, axes = plt.subplots(len(rows), 3, figsize=(15, 3.6 * len(rows)), sharex=True, squeeze=False)
    x = np.linspace(params["horizon"] / params["checkpoints"], params["horizon"], params["checkpoints"])
    for i, (reward, k) in enumerate(rows):
        for j, scenario in enumerate(SCENARIOS):
            ax = axes[i][j]
            config = f"{reward}/k{k}/gap0.1/{scenario}"
            for name, curve in figures["per_config"].get(config, {}).get("curves", {}).items():
                lw = 2.2 if name.startswith("flywheel") else 1.2
                ax.plot(x, curve, label=name, lw=lw, color=colors.get(name))
            ax.set_title(config, fontsize=10)
            ax.set_ylabel("cumulative regret")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="k in {2, 10}, 10 seeds, T = 2000 (about a minute)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    ap.add_argument("--seeds", type=int, help="override the number of seeds")
    ap.add_argument("--seed-offset", type=int, default=0, help="first seed (use another range to experiment)")
    ap.add_argument("--arms", type=lambda s: [int(a) for a in s.split(",")], help="override the arm counts: 2,10")
    ap.add_argument("--horizon", type=int, help="override the horizon T")
    ap.add_argument("--out", type=Path, default=RESULTS / "regret.json")
    ap.add_argument("--records", type=Path, help="also save the per-seed records here (JSON lines)")
    ap.add_argument("--replay", type=Path, help="aggregate saved --records instead of running")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)

    params: dict[str, Any] = dict(QUICK if args.quick else FULL)
    for key in ("seeds", "arms", "horizon"):
        if getattr(args, key):
            params[key] = getattr(args, key)
    params.update(quick=args.quick, seed_offset=args.seed_offset, jobs=args.jobs)
    vw = have_vw()
    if not vw:
        print("vowpalwabbit is not installed: running without the Vowpal Wabbit peer", file=sys.stderr)
    seeds = range(args.seed_offset, args.seed_offset + params["seeds"])
    jobs = [(k, s, params, vw) for k in sorted(params["arms"], reverse=True) for s in seeds]
    start = time.perf_counter()
    if args.replay:
        lines = [json.loads(line) for line in args.replay.read_text().splitlines() if line]
        records = [r for r in lines if "config" in r]
        wall = next((r["wall_s"] for r in lines if "wall_s" in r), None)
    else:
        records = simulate(jobs, args.jobs, start)
        wall = round(time.perf_counter() - start, 1)
    if args.records and not args.replay:
        args.records.write_text("".join(json.dumps(r) + "\n" for r in [*records, {"wall_s": wall}]))
    figures, ratios = aggregate(records, params)
    figures["wall_s"] = wall
    figures["vowpalwabbit"] = "included" if vw else "not installed, skipped"
    figures["goals_met"] = {g: (ratios[g] is not None and ratios[g] <= t) for g, t in GOALS.items()}
    params["peers"] = [p for p in PEERS if vw or p != "vw_cb_explore"]
    result = {
        "name": "regret",
        "machine": benchstamp.machine(PACKAGES),
        "params": params,
        "figures": figures,
        "ratios": ratios,
        "goals": GOALS,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        plotted = not args.no_plot and plot(figures, params, args.out.with_suffix(".png"))
    except (OSError, ValueError, RuntimeError) as exc:  # a plot is welcome, never required
        print(f"no plot: {exc}", file=sys.stderr)
        plotted = False
    step = max(1, params["checkpoints"] // 10)  # the JSON keeps the curves at every tenth of T
    marks = [int(params["horizon"] * (i + 1) / params["checkpoints"]) for i in range(params["checkpoints"])]
    params["curve_steps"] = marks[step - 1 :: step]
    for entry in figures["per_config"].values():
        entry["curves"] = {p: c[step - 1 :: step] for p, c in entry["curves"].items()}
    if plotted:
        print(f"plot: {args.out.with_suffix('.png')}")
    print(table(figures, ratios, vw))
    print(f"wall time {wall} s with {params['jobs']} worker(s); results in {args.out}")
    benchstamp.write_results(
        "regret",
        result,
        out=args.out,
        packages=PACKAGES,
        argv=[sys.argv[0], *(argv if argv is not None else sys.argv[1:])],
    )
    return 0


def simulate(jobs: list, workers: int, start: float) -> list[dict]:
    """Run every unit, in ``workers`` processes, with a progress line on stderr."""
    records: list[dict] = []
    cost = {k: k + 20 for k, *_ in jobs}  # rough relative cost of a unit, for the ETA
    total, done = sum(cost[j[0]] for j in jobs), 0
    with get_context("fork").Pool(workers) if workers > 1 else _Serial() as pool:
        for job, recs in zip(jobs, pool.imap(run_unit, jobs), strict=True):
            records.extend(recs)
            done += cost[job[0]]
            elapsed = time.perf_counter() - start
            print(
                f"\r{done / total:6.1%} done, {elapsed:6.0f} s elapsed, ~{elapsed * (total - done) / done:5.0f} s left",
                end="",
                file=sys.stderr,
                flush=True,
            )
    print(file=sys.stderr)
    return records


class _Serial:
    """Stands in for a Pool when --jobs 1."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def imap(self, fn, items):
        return map(fn, items)


if __name__ == "__main__":
    sys.exit(main())
