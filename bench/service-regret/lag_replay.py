"""What regret ratio a feedback lag implies: the in-process policy with its feedback held back.

The service runs the policy of `inprocess.py`; what differs is when feedback reaches the
posterior Select samples from. This script plays the bench's worlds in process twice with the
same world and sampling seeds (common random numbers): once as the reference (feedback after
the world's own delay) and once with every reward held back ``lag`` more decisions. The ratio of
the two mean regrets is what that lag alone costs. Because both sides share every random draw,
a few hundred seeds give a standard error near 0.01, which service runs (about 3 minutes of
service time per world seed) cannot reach. So it answers two questions the noisy service runs
cannot: how small must the decision -> applied lag be for the 1.02 goal, and does the lag
measured in the service (`lag.py`, or the README's hand measurement) explain its ratio.

    python bench/service-regret/lag_replay.py                     # lags 0,5,10,20,50,100; 200 seeds
    python bench/service-regret/lag_replay.py --lags 15,25 --seeds 400 --out /tmp/replay.json

Lags are constants in decisions (a lag of L at R decisions/s is L/R seconds); ``--jitter``
draws each reward's lag uniformly on [0, 2L] instead (same mean). ``--measured`` adds, per mode
of a `lag.py` results file, a lag drawn for every reward from the distribution that mode measured
in the service: the publish (`sdk` stage) plus stored -> applied (`total`), each drawn from the
piecewise-linear quantile function through 0, its p50, p90 and p99 (in decisions; the top 1% held
at p99, so the tail is, if anything, understated), plus the commit -> the replica's snapshot
(`fold_own`) when the file has it. That prices the lag as it varies, not only its median. A
two-replica mode is played as two replicas of the policy (`inprocess.run_replicas`): decision t
by replica t % 2, each reward applied by one of them drawn at random (their shared consumer
splits the feedback) and reaching the other one `fold_peer` later instead of `fold_own` (the
NOTIFY hop: sent just before the commit -> the other's snapshot has it). When the mode measured
provisional folds (`provisional` stage: published -> the deciding replica's snapshot has it), the
replica that made a decision gets its reward after that draw instead, for the measured share of
the events; when it measured peer folds (`prov_peer`: published -> the other replica's snapshot
has it), the other replica gets it after that draw, for its share. Every path starts at the
publish, so when the file measured `pre_publish` (the decisions sampled between a decision and
its feedback's publish: the concurrent Selects) a draw of it is added to every reward's lag, for
every replica. Results are stamped
with `flywheel.stack.benchstamp` (commit, date, machine, command).

    python bench/service-regret/lag_replay.py --lags 10 --seeds 100 --measured bench/results/service-regret-lag.json

``--floors`` adds, for each measured mode with provisional folds, two lower bounds (``floors``):
``+delivered`` (every reward folded the moment the deciding replica received it: rebuilds for
free) and ``+instant`` (every reward in every posterior the moment it is published: only the
product's own concurrency, ``pre_publish``, is left), so that what a faster service could still
gain is priced beside what it cannot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "regret"))  # bench/regret's loop
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this bench's modules
from inprocess import run_in_process, run_replicas
from worlds import WORLDS, World, make_world

from flywheel.stack.benchstamp import write_results

RESULTS = Path(__file__).resolve().parents[1] / "results"


def lagged(world: World, lag: int, jitter: bool, rng: np.random.Generator) -> World:
    """The same world with every reward published ``lag`` more decisions later (mean ``lag``)."""
    extra = rng.integers(0, 2 * lag + 1, size=world.horizon) if jitter and lag else np.full(world.horizon, lag)
    return dataclasses.replace(world, delays=world.delays + extra.astype(np.int64))


def quantile_sampler(stage: dict[str, float]) -> Any:
    """Draws from the piecewise-linear quantile function through (0, 0), (.5, p50), (.9, p90),
    (.99, p99) and (1, p99) of one `lag.py` stage, in decisions."""
    levels = [0.0, 0.5, 0.9, 0.99, 1.0]
    values = [0.0, stage["p50_decisions"], stage["p90_decisions"], stage["p99_decisions"], stage["p99_decisions"]]
    if not all(np.isfinite(v) for v in values) or values != sorted(values):
        raise ValueError(f"quantiles must be finite numbers that do not decrease: {values}")
    return lambda rng, n: np.interp(rng.random(n), levels, values)


def measured_lags(path: Path) -> dict[str, dict[str, Any]]:
    """{mode: {"replicas": n, "stages": {"sdk": stage, "total": stage, ["fold_own": stage,]
    ["fold_peer": stage]}}} from a `lag.py` results file: its repeats pooled, for its default
    variant; a file of several named variants (``lag.py --variant``) gives every variant's modes,
    as ``variant:mode``. ``fold_own`` is kept when the file measured it (older files did not),
    ``fold_peer`` for the two-replica modes, which need it, ``provisional`` when measured."""
    rows = json.loads(path.read_text())["pooled"]
    variants = {r["variant"] for r in rows}
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if "default" in variants and r["variant"] != "default":
            continue
        name = r["mode"] if len(variants) == 1 or "default" in variants else f"{r['variant']}:{r['mode']}"
        replicas = int(r.get("replicas") or (2 if str(r["mode"]).startswith("2rep") else 1))
        names = ["sdk", "total"]
        if (r["stages"].get("fold_own") or {}).get("count"):
            names.append("fold_own")
        if replicas > 1:
            names.append("fold_peer")  # a KeyError when missing: not a two-replica lag.py row
        if (r["stages"].get("pre_publish") or {}).get("count"):
            names.append("pre_publish")  # lag.py files from before it was measured lack it
        found: dict[str, Any] = {"replicas": replicas, "stages": {k: r["stages"][k] for k in names}}
        if (r["stages"].get("delivered") or {}).get("count"):
            found["delivered"] = r["stages"]["delivered"]  # not a lag of its own: what ``floors`` uses
        for stage in ("provisional", "prov_segment", "prov_peer", "prov_peer_segment"):
            provisional = r["stages"].get(stage) or {}
            if provisional.get("count"):
                found["stages"][stage] = provisional
                # The share of the events folded provisionally (each event's publish is one sdk count).
                found[f"{stage}_share"] = min(1.0, provisional["count"] / max(1.0, r["stages"]["sdk"]["count"]))
        out[name] = found
    return out


EARLY_STAGES = ("provisional", "prov_segment", "prov_peer", "prov_peer_segment")


def floors(measured: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Two lower bounds per measured mode that folds provisionally, to price what is left:
    ``<mode>+delivered``, every replica folds each reward (its segment's too) the moment the
    deciding replica received it (the mode's measured ``delivered`` stage: the SDK's publish,
    NATS and the event loop running the callback), as if rebuilds cost nothing; and
    ``<mode>+instant``, every replica has each reward the moment it is published, so only the
    decisions sampled before the publish (``pre_publish``: the product's own concurrent
    Selects) remain. Every event is folded early in both."""
    out: dict[str, dict[str, Any]] = {}
    for name, mode in measured.items():
        stages = mode["stages"]
        if "provisional" not in stages:
            continue
        zero = {**stages["provisional"], "p50_decisions": 0.0, "p90_decisions": 0.0, "p99_decisions": 0.0}
        for floor, stage in (("delivered", mode.get("delivered")), ("instant", zero)):
            if stage is None:
                continue
            early = [s for s in EARLY_STAGES if mode["replicas"] > 1 or not s.startswith("prov_peer")]
            out[f"{name}+{floor}"] = {
                "replicas": mode["replicas"],
                "stages": {**stages, **{s: stage for s in early}},
                **{f"{s}_share": 1.0 for s in early},
            }
    return out


def measured_extra(stages: dict[str, dict[str, float]], horizon: int, rng: np.random.Generator) -> np.ndarray:
    """Each reward's extra lag in whole decisions: a publish draw plus a stored -> applied draw
    (plus a commit -> folded draw when ``fold_own`` was measured)."""
    total = quantile_sampler(stages["sdk"])(rng, horizon) + quantile_sampler(stages["total"])(rng, horizon)
    if "fold_own" in stages:
        total = total + quantile_sampler(stages["fold_own"])(rng, horizon)
    return np.rint(total).astype(np.int64)


def measured_extras(
    mode: dict[str, Any], horizon: int, rng: np.random.Generator, *, segmented: bool = False
) -> np.ndarray:
    """Each replica's extra lag for each reward, shape (replicas, T). One replica: as
    `measured_extra`. Two: the replica that applies a reward (drawn at random) gets it as one
    replica would; the other one gets it ``fold_peer`` after the stored -> applied instead of
    ``fold_own``. When the mode measured provisional folds, the replica that made the decision
    (decision t: replica t % 2) gets its reward after a ``provisional`` draw instead, for the
    measured share of the events (the rest as above), and the other replica after a ``prov_peer``
    draw (the deciding replica told it of its fold, ``peer_folds.py``) for that stage's share. A
    ``segmented`` world's decisions sample their segment's posterior, so there the segment's
    stages (``prov_segment``, ``prov_peer_segment``, measured by ``lag.py --world segmented``)
    are used, and none when the file lacks them."""
    stages = mode["stages"]
    if mode["replicas"] == 1:
        extra = measured_extra(stages, horizon, rng)[None, :]
    else:
        applied = quantile_sampler(stages["sdk"])(rng, horizon) + quantile_sampler(stages["total"])(rng, horizon)
        own = applied + (quantile_sampler(stages["fold_own"])(rng, horizon) if "fold_own" in stages else 0.0)
        peer = applied + quantile_sampler(stages["fold_peer"])(rng, horizon)
        applier = rng.integers(0, 2, size=horizon)
        extra = np.rint(np.where(applier == 0, [own, peer], [peer, own])).astype(np.int64)
    decider = np.arange(horizon) % extra.shape[0]
    mine = decider[None, :] == np.arange(extra.shape[0])[:, None]
    stage = "prov_segment" if segmented else "provisional"
    if stage in stages:
        early = np.rint(quantile_sampler(stages[stage])(rng, horizon)).astype(np.int64)
        folded = rng.random(horizon) < mode.get(f"{stage}_share", 1.0)
        extra = np.where(mine & folded[None, :], np.minimum(extra, early[None, :]), extra)
    peer_stage = "prov_peer_segment" if segmented else "prov_peer"
    if extra.shape[0] > 1 and peer_stage in stages:
        early = np.rint(quantile_sampler(stages[peer_stage])(rng, horizon)).astype(np.int64)
        folded = rng.random(horizon) < mode.get(f"{peer_stage}_share", 1.0)
        extra = np.where(~mine & folded[None, :], np.minimum(extra, early[None, :]), extra)
    if "pre_publish" in stages:  # every path starts at the publish: the decisions sampled before it
        extra = extra + count_sampler(stages["pre_publish"])(rng, horizon)[None, :]
    return extra


def count_sampler(stage: dict[str, Any]) -> Any:
    """Draws from a stage measured as counts (``histogram``: {decisions: times seen}), exactly
    as seen; from its quantiles (``quantile_sampler``) when it has none."""
    histogram = stage.get("histogram")
    if not histogram:
        quantiles = quantile_sampler(stage)
        return lambda rng, n: np.rint(quantiles(rng, n)).astype(np.int64)
    values = np.array([int(v) for v in histogram], dtype=np.int64)
    weights = np.array(list(histogram.values()), dtype=float)
    return lambda rng, n: rng.choice(values, size=n, p=weights / weights.sum())


def paired_ratio(lagged_regret: np.ndarray, reference: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """Ratio of mean regrets with a 95% paired bootstrap interval over seeds."""
    n = len(reference)
    idx = rng.integers(0, n, size=(2000, n))
    boot = lagged_regret[idx].mean(axis=1) / reference[idx].mean(axis=1)
    return {
        "ratio": float(lagged_regret.mean() / reference.mean()),
        "ci_low": float(np.quantile(boot, 0.025)),
        "ci_high": float(np.quantile(boot, 0.975)),
    }


def replay(params: dict[str, Any]) -> dict[str, Any]:
    """Regret of every (world, k) at every lag, paired with lag 0, over ``params['seeds']`` seeds."""
    rows = []
    measured: dict[str, Any] = params.get("measured") or {}
    lags: list[int | str] = [*params["lags"], *measured]
    for name in params["worlds"]:
        for k in params["arms"]:
            started = time.perf_counter()
            regrets = np.zeros((len(lags), params["seeds"]))
            for seed in range(params["seeds"]):
                world = make_world(name, "bernoulli", k, seed, params["horizon"], params["gap"], params["max_delay"])
                half_life = params["horizon"] / 4 if name == "drift" else 0.0
                for i, lag in enumerate(lags):
                    if isinstance(lag, str):  # a mode measured by lag.py
                        rng = np.random.default_rng([seed, i, 11])
                        extras = measured_extras(measured[lag], world.horizon, rng, segmented=world.segmented)
                        arms = run_replicas(world, half_life, 10_000 + seed, extras)
                    else:
                        shifted = lagged(world, lag, params["jitter"], np.random.default_rng([seed, lag, 7]))
                        arms = run_in_process(shifted, half_life, seed=10_000 + seed)
                    regrets[i, seed] = world.regret(arms).sum()
            boot_rng = np.random.default_rng(0)
            for i, lag in enumerate(lags):
                row = {"world": name, "k": k, "lag": lag, "regret": float(regrets[i].mean())}
                row.update(paired_ratio(regrets[i], regrets[0], boot_rng))
                rows.append(row)
            print(
                f"{name:<10} k={k:<2} "
                + "  ".join(f"L{lag}:{r['ratio']:.3f}" for lag, r in zip(lags, rows[-len(lags) :], strict=True))
                + f"  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    pooled = {}
    for lag in lags:
        mine = [r["ratio"] for r in rows if r["lag"] == lag]
        pooled[str(lag)] = float(np.mean(mine))
    return {"rows": rows, "mean_ratio_by_lag": pooled}


def _ints(text: str, *, least: int, what: str) -> list[int]:
    """A comma-separated list of integers >= ``least``, or a clear argparse error."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers, got {text!r}") from None
    if any(v < least for v in values):
        raise argparse.ArgumentTypeError(f"{what} must be >= {least}, got {text!r}")
    return values


def _at_least(least: int):
    def parse(text: str) -> int:
        value = _ints(text, least=least, what="the value")
        if len(value) != 1:
            raise argparse.ArgumentTypeError(f"one integer expected, got {text!r}")
        return value[0]

    return parse


def _worlds(text: str) -> list[str]:
    names = text.split(",")
    unknown = [n for n in names if n not in WORLDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown world(s) {', '.join(unknown)}; choose from {', '.join(WORLDS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    """Play the worlds in process at each lag and print the ratio each lag implies."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--lags",
        type=lambda s: _ints(s, least=0, what="--lags"),
        default=[0, 5, 10, 20, 50, 100],
        help="lags in decisions (comma-separated, >= 0); 0 is added if missing",
    )
    # Two seeds at least: the ratio's interval is a bootstrap over seeds.
    ap.add_argument("--seeds", type=_at_least(2), default=200, help="world seeds, each with its own sampling seed")
    ap.add_argument("--horizon", type=_at_least(10), default=1000)
    ap.add_argument("--arms", type=lambda s: _ints(s, least=2, what="--arms"), default=[2, 10])
    ap.add_argument("--worlds", type=_worlds, default=list(WORLDS))
    ap.add_argument("--jitter", action="store_true", help="lag uniform on [0, 2L] per reward instead of constant")
    ap.add_argument(
        "--measured",
        type=Path,
        default=None,
        help="a lag.py results file: also replay each of its modes' measured lag distribution",
    )
    ap.add_argument(
        "--measured-segmented",
        type=Path,
        default=None,
        help="a lag.py --world segmented results file: its modes' prov_segment stage prices the segmented worlds",
    )
    ap.add_argument(
        "--floors",
        action="store_true",
        help="with --measured: also replay each mode's two lower bounds (`floors`: +delivered, +instant)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "service-regret-lag-replay.json")
    args = ap.parse_args(argv)
    measured = None
    if args.measured is not None:
        try:
            measured = measured_lags(args.measured)
            if args.measured_segmented is not None:
                for name, mode in measured_lags(args.measured_segmented).items():
                    if name in measured and "prov_segment" in mode["stages"]:
                        measured[name]["stages"]["prov_segment"] = mode["stages"]["prov_segment"]
                        measured[name]["prov_segment_share"] = mode["prov_segment_share"]
            if args.floors:
                measured.update(floors(measured))
            for mode in measured.values():
                for stage in mode["stages"].values():
                    quantile_sampler(stage)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"--measured {args.measured}: not a lag.py results file ({type(exc).__name__}: {exc})")
    if args.floors and measured is None:
        ap.error("--floors needs --measured")
    lags = sorted({0, *args.lags})
    params = {
        "lags": lags,
        "seeds": args.seeds,
        "horizon": args.horizon,
        "gap": 0.1,
        "max_delay": 100,
        "arms": args.arms,
        "worlds": args.worlds,
        "jitter": args.jitter,
        "measured": measured,
        "measured_from": str(args.measured) if args.measured else None,
        "measured_segmented_from": str(args.measured_segmented) if args.measured_segmented else None,
    }
    figures = replay(params)
    by_lag = figures["mean_ratio_by_lag"].items()
    print("mean ratio over worlds, by lag: " + ", ".join(f"{lag}: {ratio:.3f}" for lag, ratio in by_lag))
    write_results("service-regret-lag-replay", {"params": params, "figures": figures}, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
