"""Regret of the real service path beside the same policy in process, on the same reward streams.

    python bench/service-regret/run.py [--quick] [--keep]

bench/regret's worlds (stationary, delayed, drift) and a segmented one (see `worlds`), Bernoulli
arms with a gap of 0.1, played twice per (world, k, seed):

- in process (`inprocess`): ThompsonAgent updated after every decision, averaged over several
  sampling seeds (the reference);
- through the service (`service`): real NATS, PostgreSQL and S3, one or two optimizer processes,
  a product using the SDK (Select over gRPC, ``feedback_nowait`` over NATS JetStream), paced
  (200 decisions/s) and unpaced (as fast as the client goes, at most 8 Selects in flight).

Prints a table of service / in-process regret per world and mode (goals: <= 1.02 with one
replica, <= 1.05 with two) with the feedback bounces the replicas counted, writes
bench/results/service-regret.json (stamped by flywheel.stack.benchstamp) and a PNG of the
regret curves, and prints the JSON as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "regret")]  # this bench's modules, then bench/regret's
from inprocess import run_in_process  # noqa: E402
from report import aggregate, plot, table  # noqa: E402
from service import HALF_LIFE_DECISIONS, Mode, Stack, log, play_service, service_half_life  # noqa: E402
from tree import MARK, current, reexec_at  # noqa: E402
from worlds import WORLDS, make_world  # noqa: E402

from flywheel.stack.benchstamp import RESULTS, write_results  # noqa: E402

FULL: dict[str, Any] = {
    "arms": [2, 10],
    "rewards": ["bernoulli"],
    "worlds": list(WORLDS),
    "seeds": 3,
    "horizon": 2000,
    "gap": 0.1,
    "max_delay": 100,
    "rate": 200.0,
    "in_flight_paced": 32,
    "in_flight_unpaced": 8,
    "replicas": [1, 2],
    "reference_reps": 20,
    "checkpoints": 20,
    "seed_offset": 0,
}
QUICK: dict[str, Any] = {**FULL, "seeds": 1, "horizon": 1000, "reference_reps": 30}


def modes(params: dict[str, Any]) -> list[Mode]:
    out = []
    for replicas in params["replicas"]:
        out.append(Mode(replicas, params["rate"], params["in_flight_paced"]))
        out.append(Mode(replicas, None, params["in_flight_unpaced"]))
    return out


def seeds_of(params: dict[str, Any]) -> range:
    return range(params["seed_offset"], params["seed_offset"] + params["seeds"])


def half_life_of(world: str, params: dict[str, Any]) -> float:
    """The drift world's half-life in decisions (a quarter of the horizon, bench/regret's 500 of
    2000); the other worlds are stationary."""
    return params["horizon"] / 4 if world == "drift" else 0.0


def marks_of(params: dict[str, Any]) -> np.ndarray:
    n, horizon = params["checkpoints"], params["horizon"]
    return np.linspace(horizon / n, horizon, n).astype(int) - 1


def reference(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """In-process regrets per (world, k, seed), averaged over ``reference_reps`` sampling seeds."""
    out: dict[str, dict[str, Any]] = {}
    marks = marks_of(params)
    for reward in params["rewards"]:
        for k in params["arms"]:
            for seed in seeds_of(params):
                for name in params["worlds"]:
                    w = make_world(name, reward, k, seed, params["horizon"], params["gap"], params["max_delay"])
                    hl = half_life_of(name, params)
                    cums, batched = [], []
                    for rep in range(params["reference_reps"]):
                        cums.append(np.cumsum(w.regret(run_in_process(w, hl, seed=1000 * seed + rep))))
                        arms = run_in_process(w, hl, seed=1000 * seed + rep, batch=params["in_flight_unpaced"])
                        batched.append(float(w.regret(arms).sum()))
                    curve = np.mean(cums, axis=0)
                    out[f"{config_of(w)}/seed{seed}"] = {
                        "regret": float(curve[-1]),
                        # the spread of one run's regret: the noise of one service run, if it behaved alike
                        "regret_sd": float(np.std([c[-1] for c in cums], ddof=1)),
                        "reps": len(cums),
                        "regret_batched": float(np.mean(batched)),
                        "regret_uniform": float((w.means.max(axis=1) - w.means.mean(axis=1)).sum()),
                        "curve": curve[marks].tolist(),
                    }
    return out


def config_of(world: Any) -> str:
    return f"{world.reward}/k{world.k}/{world.name}"


async def serve(params: dict[str, Any], keep: bool) -> list[dict[str, Any]]:
    """Every service run, one endpoint each; one-replica modes first (a second replica would
    share the feedback consumer)."""
    stack = Stack(keep=keep)
    records: list[dict[str, Any]] = []
    marks = marks_of(params)
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        log("starting NATS, PostgreSQL and S3 ...")
        t0 = time.perf_counter()
        stack.start()
        log(f"  {time.perf_counter() - t0:.1f} s")
        n = 0
        for mode in modes(params):
            stack.scale(mode.replicas)
            log(f"mode {mode.name}: {len(stack.replicas)} optimizer replica(s)")
            for reward in params["rewards"]:
                for seed in seeds_of(params):
                    for k in params["arms"]:
                        for name in params["worlds"]:
                            w = make_world(name, reward, k, seed, params["horizon"], params["gap"], params["max_delay"])
                            seen = rates.get((mode.name, k))
                            # Without half_life_decisions the half-life is in seconds at the rate this
                            # mode ran so far (the paced rate, or the unpaced runs before the drift world).
                            rate = mode.rate or (float(np.mean(seen)) if seen else params["rate"])
                            hl = service_half_life(half_life_of(name, params), rate)
                            n += 1
                            endpoint = f"sr{n}-{mode.name}-k{k}-{name}-s{seed}"
                            t0 = time.perf_counter()
                            result = await play_service(stack, w, mode, endpoint, hl)
                            took = time.perf_counter() - t0
                            rates.setdefault((mode.name, k), []).append(result.rate)
                            cum = np.cumsum(w.regret(result.arms))
                            sample = result.select_ms[:: max(1, w.horizon // 500)]
                            records.append(
                                {
                                    "config": config_of(w),
                                    "mode": mode.name,
                                    "replicas": mode.replicas,
                                    "seed": seed,
                                    "regret": float(cum[-1]),
                                    "curve": cum[marks].tolist(),
                                    "decisions_per_s": round(result.rate, 1),
                                    "select_ms_sample": sample.round(3).tolist(),
                                    "bounces": result.bounces,
                                    "retries": result.retries,
                                    "applied": result.applied,
                                    "feedback_failed": result.feedback_failed,
                                    "half_life": hl,
                                    "arms": result.arms.tolist(),
                                }
                            )
                            log(
                                f"  {config_of(w):28s} seed {seed}: regret {cum[-1]:7.1f}  "
                                f"{result.rate:6.0f} dec/s  bounces {result.bounces:.0f}  "
                                f"applied {result.applied}/{w.horizon}  "
                                f"({result.seconds:.1f} s playing, {took:.1f} s in all)"
                            )
    finally:
        stack.stop()
    return records


def headline(figures: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """Per mode: the worst service / in-process ratio over worlds (goal: <= 1.02 with one
    replica, <= 1.05 with two) and the mean one; the feedback bounces (goal: 0)."""
    ratios: dict[str, float] = {}
    goals: dict[str, float] = {}
    for mode, m in figures["per_mode"].items():
        ratios[f"{mode}_worst"] = m["worst_ratio"]
        goals[f"{mode}_worst"] = m["goal"]
        ratios[f"{mode}_mean"] = m["mean_ratio"]
        ratios[f"{mode}_bounces"] = m["bounces"]
        goals[f"{mode}_bounces"] = 0
    return ratios, goals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one seed, T = 1000 (about 4 minutes)")
    ap.add_argument("--seeds", type=int, help="override the number of seeds")
    ap.add_argument("--horizon", type=int, help="override the horizon T")
    ap.add_argument("--rate", type=float, help="decisions/s of the paced modes (default 200)")
    ap.add_argument("--seed-offset", type=int, help="first world seed (runs with other seeds add evidence)")
    ap.add_argument("--arms", type=lambda s: [int(a) for a in s.split(",")], help="override the arm counts: 2,10")
    ap.add_argument("--worlds", type=lambda s: s.split(","), help=f"a subset of {','.join(WORLDS)}")
    ap.add_argument("--replicas", type=lambda s: [int(a) for a in s.split(",")], help="1,2")
    ap.add_argument("--gaussian", action="store_true", help="also Gaussian rewards (thompson_gaussian, unbounded)")
    ap.add_argument("--out", type=Path, default=RESULTS / "service-regret.json")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--records", type=Path, help="also write every run with the arm of each decision (JSON lines)")
    ap.add_argument(
        "--optimizer-commit",
        metavar="REV",
        help="run the optimizer (and the SDK) of this commit, not the working tree's (see tree.py)",
    )
    args = ap.parse_args(argv)
    if args.optimizer_commit and MARK not in os.environ:
        reexec_at(args.optimizer_commit)
    params: dict[str, Any] = dict(QUICK if args.quick else FULL)
    for key in ("seeds", "horizon", "arms", "worlds", "replicas", "seed_offset", "rate"):
        if getattr(args, key):
            params[key] = getattr(args, key)
    if args.gaussian:
        params["rewards"] = ["bernoulli", "gaussian"]
    unknown = set(params["worlds"]) - set(WORLDS)
    if unknown or not set(params["replicas"]) <= {1, 2}:
        ap.error(f"--worlds must be among {WORLDS} and --replicas among 1,2")
    params["quick"] = args.quick
    params.update(current())

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through the stack's cleanup

    signal.signal(signal.SIGTERM, on_term)
    started = time.perf_counter()
    log("in process ...")
    ref = reference(params)
    ref_s = time.perf_counter() - started
    records = asyncio.run(serve(params, args.keep))
    if args.records:  # every decision's arm, for looking into one run
        args.records.write_text("".join(json.dumps(r) + "\n" for r in records))
    for r in records:
        del r["arms"]
    figures = aggregate(records, ref)
    figures["seconds"] = {"total": round(time.perf_counter() - started, 1), "in_process": round(ref_s, 1)}
    figures["feedback_applied_all"] = all(r["applied"] >= params["horizon"] for r in records)
    figures["feedback_failed"] = sum(r["feedback_failed"] for r in records)
    figures["bounces_total"] = sum(r["bounces"] for r in records)
    params["drift_half_life"] = (
        "half_life_decisions (the service offers it)"
        if HALF_LIFE_DECISIONS
        else "half_life_s = half-life in decisions / rate (paced: 200/s; unpaced: this mode's measured rate "
        "before the drift world): the service has no half_life_decisions in this tree"
    )
    params["reference"] = "ThompsonAgent, batches of one (updated after every decision), reference_reps sampling seeds"
    params["cores"] = os.cpu_count()
    marks = (marks_of(params) + 1).tolist()
    params["curve_steps"] = marks
    plotted = False
    if not args.no_plot:
        try:
            plotted = plot(figures, marks, args.out.with_suffix(".png"))
        except (OSError, ValueError, RuntimeError) as exc:  # a plot is welcome, never required
            log(f"no plot: {exc}")
    print(table(figures))
    if plotted:
        print(f"plot: {args.out.with_suffix('.png')}")
    print(f"{figures['seconds']['total']} s; results in {args.out}")
    ratios, goals = headline(figures)
    figures["goals_met"] = {g: bool(ratios[g] <= t) for g, t in goals.items()}
    write_results(
        "service-regret",
        {"params": params, "figures": figures, "ratios": ratios, "goals": goals},
        out=args.out,
        packages=("numpy", "nats-py", "grpcio", "asyncpg"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
