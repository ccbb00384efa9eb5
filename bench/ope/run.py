"""Off-policy evaluation on the Open Bandit Dataset sample shipped inside the obp wheel.

ZOZOTOWN logged the same fashion-recommendation slots (80 items, 3 positions) under two
policies during the same week: uniform random and Bernoulli Thompson sampling (BTS). We
estimate the BTS policy's click rate from the *random* log with flywheel.optimizer.ope
(IPS, SNIPS, DR) and compare with the BTS log's own mean click, the on-policy ground truth.
The BTS evaluation policy is the one OBP replicates: Bernoulli TS with the ZOZOTOWN prior
(`obp/policy/conf/prior_bts.yaml`), whose per-position action distribution is estimated by
Monte Carlo exactly as `obp.policy.BernoulliTS.compute_batch_action_dist` does (sample
Beta(alpha_i, beta_i) per item, rank descending, item at rank p goes to position p).

Two checks per estimate, both goals that can fail: the relative error against that ground
truth (|estimate / on-policy - 1| <= 0.5; an estimate of 0 fails it), and agreement with obp's
own IPW / SNIPW / DR run in the same process on the same logs, action distribution and reward
model (|ours / obp - 1| <= 1e-6). obp's own BernoulliTS replica (its README's example) is run
too, against our replica. See bench/ope/README.md for the choice of bounds.

    python bench/ope/run.py [--quick]

obp itself is never installed: its wheel is downloaded with `pip download --no-deps` into
bench/.cache/, read with zipfile, and its estimator and policy modules imported from the
extracted wheel (bench/ope/obp_peer.py).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import math
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
from scipy.stats import norm

from flywheel.optimizer.ope import (
    Estimate,
    LoggedData,
    doubly_robust,
    effective_sample_size,
    fixed_distribution,
    importance_weights,
    ips,
    on_policy_value,
    per_arm_mean_model,
    snips,
)
from flywheel.stack import benchstamp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import obp_peer

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "bench" / ".cache"
RESULTS = ROOT / "bench" / "results" / "ope.json"

# The newest obp release published as a wheel (0.5.x are sdists that require Python < 3.11).
OBP_VERSION = "0.4.1"
OBP_WHEEL = f"obp-{OBP_VERSION}-py3-none-any.whl"
OBP_SHA256 = "87dec9caf4283c25ab13036532e0a24566f1c7bdcad1653a8ded43b2f5ef8208"
CAMPAIGN = "all"
# obp's README, "Example with Open Bandit Dataset": IPW estimate of BernoulliTS (ZOZOTOWN prior,
# n_sim=100000, random_state=12345) on the random log, divided by the random log's mean click.
# Kept only to show whether obp, run here with the same settings, reproduces its own README.
OBP_README_RELATIVE_VALUE = 1.198126
OBP_README_N_SIM = 100_000
OBP_README_SEED = 12345

# |our IPS relative value / obp's - 1|, both BTS replicas run here: both action distributions
# are Monte Carlo estimates, so they agree to within simulation noise, not exactly (about 3
# standard deviations of the noise of two 1e5-draw simulations).
GOAL_OBP_BTS_MAX_ABS_REL_ERROR = 0.02
# |estimate / on-policy - 1|: see bench/ope/README.md. Below 1, so an estimate of 0 fails.
GOAL_MAX_ABS_REL_ERROR = 0.5
# |ours / obp's - 1| on the same logs, action distribution and reward model: the same sums in
# another order, so only floating-point rounding may differ.
GOAL_OBP_AGREEMENT = 1e-6

ESTIMATORS = ("ips", "snips", "dr")
# Versions recorded with the results (obp's own version is in figures.obp_version).
PACKAGES = ("numpy", "scipy", "torch", "pandas", "scikit-learn")


# --- data -----------------------------------------------------------------------------------


def obp_wheel() -> Path:
    path = CACHE / OBP_WHEEL
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", f"obp=={OBP_VERSION}", "--no-deps"]
        cmd += ["--only-binary=:all:", "-d", str(CACHE)]
        print("fetching the obp wheel:", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != OBP_SHA256:
        raise SystemExit(f"{path}: sha256 {digest} is not the pinned {OBP_SHA256}; delete it and rerun")
    return path


def read_log(zf: zipfile.ZipFile, policy: str) -> dict[str, np.ndarray]:
    """One logged campaign: item, position (0-based, dense rank as obp does), click, propensity."""
    name = f"obp/dataset/obd/{policy}/{CAMPAIGN}/{CAMPAIGN}.csv"
    with zf.open(name) as raw:
        rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")))
    _, position = np.unique(np.array([int(r["position"]) for r in rows]), return_inverse=True)
    return {
        "item": np.array([int(r["item_id"]) for r in rows]),
        "position": position.astype(np.int64),
        "click": np.array([float(r["click"]) for r in rows]),
        "propensity": np.array([float(r["propensity_score"]) for r in rows]),
    }


def read_prior(zf: zipfile.ZipFile, campaign: str) -> tuple[np.ndarray, np.ndarray]:
    """alpha and beta of the ZOZOTOWN BTS prior from prior_bts.yaml (a fixed three-level layout:
    campaign -> alpha|beta -> list of floats; parsed by hand so the bench needs no YAML library)."""
    text = zf.read("obp/policy/conf/prior_bts.yaml").decode()
    prior: dict[str, dict[str, list[float]]] = {}
    camp = key = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not line.startswith(" ") and line.endswith(":"):
            camp, key = line[:-1], None
            prior[camp] = {}
        elif line.startswith("  ") and not line.startswith("   ") and line.endswith(":") and camp:
            key = line.strip()[:-1]
            prior[camp][key] = []
        elif line.strip().startswith("- ") and camp and key:
            prior[camp][key].append(float(line.strip()[2:]))
        else:
            raise ValueError(f"prior_bts.yaml line {lineno}: unexpected {line!r}")
    alpha, beta = np.array(prior[campaign]["alpha"]), np.array(prior[campaign]["beta"])
    if alpha.shape != beta.shape or np.any(alpha <= 0) or np.any(beta <= 0):
        raise ValueError(f"prior_bts.yaml: bad prior for {campaign!r}")
    return alpha, beta


def bts_action_dist(
    alpha: np.ndarray, beta: np.ndarray, len_list: int, n_sim: int, rng: np.random.Generator
) -> np.ndarray:
    """(n_items, len_list): probability that BTS puts item a at position p.

    obp's BernoulliTS.select_action draws Beta(alpha + clicks, beta + misses) per item and
    returns `argsort()[::-1][:len_list]`; compute_batch_action_dist counts, over n_sim draws,
    how often each item lands at each position. With no updates, the counts are the prior's.
    """
    k = alpha.shape[0]
    counts = np.zeros((k, len_list))
    chunk = 20_000
    for start in range(0, n_sim, chunk):
        m = min(chunk, n_sim - start)
        draws = rng.beta(alpha, beta, size=(m, k))
        top = np.argpartition(-draws, len_list - 1, axis=1)[:, :len_list]
        order = np.argsort(-np.take_along_axis(draws, top, axis=1), axis=1)
        ranked = np.take_along_axis(top, order, axis=1)
        for p in range(len_list):
            counts[:, p] += np.bincount(ranked[:, p], minlength=k)
    return counts / n_sim


# --- evaluation -----------------------------------------------------------------------------


def estimate_all(
    data: LoggedData, target: np.ndarray, model: np.ndarray, n_bootstrap: int, seed: int
) -> dict[str, dict[str, Estimate]]:
    out: dict[str, dict[str, Estimate]] = {}
    for method in ("normal", "bootstrap"):
        kw = {"method": method, "n_bootstrap": n_bootstrap, "seed": seed}
        out[method] = {
            "ips": ips(data, target, **kw),
            "snips": snips(data, target, **kw),
            "dr": doubly_robust(data, target, model, **kw),
        }
    return out


def ips_mc_std_error(data: LoggedData, dist: np.ndarray, positions: np.ndarray, n_sim: int) -> float:
    """Standard error the Monte Carlo action distribution adds to IPS (cells treated as independent)."""
    clicked = np.zeros_like(dist)
    np.add.at(clicked, (data.actions, positions), data.rewards / data.propensities / data.n)
    return float(math.sqrt(float((clicked**2 * dist * (1 - dist)).sum()) / n_sim))


def subsample(log: dict[str, np.ndarray], fraction: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = log["item"].shape[0]
    keep = np.sort(rng.choice(n, size=round(n * fraction), replace=False))
    return {k: v[keep] for k, v in log.items()}


def compare(est: Estimate, truth: Estimate) -> dict[str, float | bool]:
    ratio = est.value / truth.value
    return {
        "value": est.value,
        "ci_low": est.ci_low,
        "ci_high": est.ci_high,
        "std_error": est.std_error,
        "ratio_vs_on_policy": ratio,
        "abs_rel_error": abs(ratio - 1),
        "interval_covers_on_policy": bool(est.ci_low <= truth.value <= est.ci_high),
        # (estimate - truth) / combined standard error: both are noisy.
        "z_vs_on_policy": (est.value - truth.value) / math.hypot(est.std_error, truth.std_error),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="half of each log, 1e5 simulations, 500 resamples")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = time.perf_counter()

    fraction, n_sim, n_bootstrap = (0.5, 100_000, 500) if args.quick else (1.0, 1_000_000, 2000)
    rng = np.random.default_rng(args.seed)

    with zipfile.ZipFile(obp_wheel()) as zf:
        full_random, full_bts = read_log(zf, "random"), read_log(zf, "bts")
        alpha, beta = read_prior(zf, CAMPAIGN)
    n_items = alpha.shape[0]
    len_list = int(full_random["position"].max()) + 1
    for name, log in (("random", full_random), ("bts", full_bts)):
        if log["item"].max() >= n_items:
            raise SystemExit(f"{name} log has item ids beyond the prior's {n_items} items")

    dist = bts_action_dist(alpha, beta, len_list, n_sim, rng)
    obp = obp_peer.load(obp_wheel())
    obp_dist = obp_peer.bts_action_dist(obp, n_items, len_list, CAMPAIGN, OBP_README_N_SIM, OBP_README_SEED)
    random_log = subsample(full_random, fraction, rng) if fraction < 1 else full_random
    bts_log = subsample(full_bts, fraction, rng) if fraction < 1 else full_bts

    random_data = LoggedData(random_log["item"], random_log["click"], random_log["propensity"], n_items)
    bts_data = LoggedData(bts_log["item"], bts_log["click"], bts_log["propensity"], n_items)
    bts_truth = on_policy_value(bts_log["click"])
    random_truth = on_policy_value(random_log["click"])
    # The BTS log's item frequencies per position: an unbiased estimate of the time-averaged
    # policy that actually logged it (uses its actions, never its clicks).
    freq = np.zeros((n_items, len_list))
    np.add.at(freq, (bts_log["item"], bts_log["position"]), 1.0)
    freq /= freq.sum(axis=0)

    studies = {
        # The benchmark proper: BTS as OBP replicates it (ZOZOTOWN prior), on the random log.
        "": ("BTS (ZOZOTOWN prior replica) on the random log", random_data, dist, random_log, bts_truth, True),
        # Diagnostic: the BTS log's own time-averaged policy, on the random log.
        "freq_": ("BTS log's item frequencies on the random log", random_data, freq, random_log, bts_truth, False),
        # Reverse: the uniform policy on the BTS log, whose propensities are far from uniform.
        "reverse_": ("Uniform policy on the BTS log", bts_data, None, bts_log, random_truth, True),
    }
    z95 = float(norm.ppf(0.975))
    figures: dict[str, object] = {
        "random_log": _log_summary(random_data, random_truth),
        "bts_log": _log_summary(bts_data, bts_truth),
        "n_items": n_items,
        "len_list": len_list,
    }
    ratios: dict[str, float] = {}
    goals: dict[str, float] = {}
    tolerance: dict[str, float] = {}
    tables = []
    for prefix, (title, data, dist_by_position, log, truth, has_goal) in studies.items():
        if dist_by_position is None:
            dist_by_position = np.full((n_items, len_list), 1 / n_items)
            target = fixed_distribution(np.full(n_items, 1 / n_items), data.n)
        else:
            target = dist_by_position[:, log["position"]].T  # row i: the policy's distribution at i's position
        model = per_arm_mean_model(data)  # the service's direct model (default shrinkage)
        results = estimate_all(data, target, model, n_bootstrap, args.seed)
        peer = obp_peer.estimate(
            obp,
            items=log["item"],
            positions=log["position"],
            clicks=log["click"],
            pscore=log["propensity"],
            dist_by_position=dist_by_position,
            reward_model=model,
        )
        weights = importance_weights(data, target)
        study = {
            "title": title,
            "on_policy": asdict(truth),
            "estimates": {m: {e: compare(est, truth) for e, est in ests.items()} for m, ests in results.items()},
            "effective_sample_size": effective_sample_size(weights),
            "max_weight": float(weights.max()),
        }
        study["obp"] = peer
        if prefix == "":
            study["ips_mc_std_error"] = ips_mc_std_error(data, dist, log["position"], n_sim)
        figures[(prefix or "main_") + "study"] = study
        tables.append((title, results, truth, study))
        for e in ESTIMATORS:
            name = f"{prefix}{e}_estimate_vs_on_policy"
            ratios[name] = results["normal"][e].value / truth.value
            # Both sides are noisy: the combined relative standard error, and whether the two
            # are consistent at 95% (1.96 of it), are recorded; the goal is the fixed bound.
            rel_se = math.hypot(results["normal"][e].std_error, truth.std_error) / truth.value
            study["estimates"]["normal"][e]["combined_relative_std_error"] = rel_se
            study["estimates"]["normal"][e]["consistent_at_95"] = bool(abs(ratios[name] - 1) <= z95 * rel_se)
            if has_goal:
                goals[name] = 1.0
                tolerance[name] = GOAL_MAX_ABS_REL_ERROR
            agree = f"{prefix}{e}_vs_obp"
            ratios[agree] = results["normal"][e].value / peer[e]
            goals[agree] = 1.0
            tolerance[agree] = GOAL_OBP_AGREEMENT

    # obp's README example, run here: obp's BernoulliTS replica and obp's IPW on the full random
    # log, against our replica and our IPS (always the full log, as the README does).
    full_data = LoggedData(full_random["item"], full_random["click"], full_random["propensity"], n_items)
    mean_click = float(full_random["click"].mean())
    readme_ratio = ips(full_data, dist[:, full_random["position"]].T).value / mean_click
    obp_full = obp_peer.estimate(
        obp,
        items=full_random["item"],
        positions=full_random["position"],
        clicks=full_random["click"],
        pscore=full_random["propensity"],
        dist_by_position=obp_dist,
        reward_model=per_arm_mean_model(full_data),
    )
    obp_ratio = obp_full["ips"] / mean_click
    figures["ips_relative_value_full_random_log"] = readme_ratio
    figures["obp_bts_relative_value_full_random_log"] = obp_ratio
    figures["obp_readme_relative_value"] = OBP_README_RELATIVE_VALUE
    figures["obp_reproduces_its_readme"] = bool(abs(obp_ratio / OBP_README_RELATIVE_VALUE - 1) <= 1e-6)
    figures["obp_version"] = obp.version
    ratios["ips_relative_value_vs_obp_bts"] = readme_ratio / obp_ratio
    goals["ips_relative_value_vs_obp_bts"] = 1.0
    tolerance["ips_relative_value_vs_obp_bts"] = GOAL_OBP_BTS_MAX_ABS_REL_ERROR
    # Informational: against the README's printed figure (no goal: obp run here is the peer).
    ratios["ips_relative_value_vs_obp_readme"] = readme_ratio / OBP_README_RELATIVE_VALUE

    # How close is the prior replica to the policy that actually logged the BTS data?
    replica_at_logged = dist[bts_log["item"], bts_log["position"]]
    figures["prior_replica_vs_bts_log"] = {
        "pearson_r_with_logged_propensity": float(np.corrcoef(replica_at_logged, bts_log["propensity"])[0, 1]),
        "median_ratio_to_logged_propensity": float(np.median(replica_at_logged / bts_log["propensity"])),
        "total_variation_vs_item_frequencies": float(0.5 * np.abs(dist - freq).sum(axis=0).mean()),
        "top_item_per_position_replica": [int(i) for i in dist.argmax(axis=0)],
        "top_item_per_position_logged": [int(i) for i in freq.argmax(axis=0)],
    }
    figures["goals_met"] = {name: bool(abs(ratios[name] - goals[name]) <= tolerance[name]) for name in goals}
    # Every goal against the truth must be able to fail: an estimate of 0 (ratio 0) must miss it.
    figures["zero_estimate_fails"] = {
        name: bool(abs(0.0 - goals[name]) > tolerance[name]) for name in goals if name.endswith("_vs_on_policy")
    }
    if not all(figures["zero_estimate_fails"].values()):
        raise SystemExit(f"a goal an estimate of 0 would meet: {figures['zero_estimate_fails']}")
    figures["seconds"] = round(time.perf_counter() - started, 2)
    result = {
        "name": "ope",
        "machine": benchstamp.machine(PACKAGES),
        "params": {
            "quick": args.quick,
            "seed": args.seed,
            "obp_wheel": OBP_WHEEL,
            "campaign": CAMPAIGN,
            "subsample_fraction": fraction,
            "n_sim": n_sim,
            "n_bootstrap": n_bootstrap,
            "confidence": 0.95,
            "dr_reward_model": "per_arm_mean_model(prior_mean=overall mean, prior_strength=1)",
            "goal_rule": "|ratio - goal| <= tolerance; estimate / on-policy: tolerance 0.5 (an estimate of 0 fails;"
            " bench/ope/README.md); ours / obp's estimator on the same logs, action distribution and reward model:"
            " 1e-6; our BTS replica's IPS / obp's BernoulliTS replica's (1e5 draws): 0.02",
            "obp_bts": {"n_sim": OBP_README_N_SIM, "random_state": OBP_README_SEED, "campaign": CAMPAIGN},
            "goal_tolerance_abs": tolerance,
        },
        "figures": figures,
        "ratios": ratios,
        "goals": goals,
    }
    print(render(result, tables))
    benchstamp.write_results("ope", result, out=args.out, packages=PACKAGES)
    return 0


def asdict(e: Estimate) -> dict[str, float]:
    return {"value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "std_error": e.std_error}


def _log_summary(data: LoggedData, truth: Estimate) -> dict[str, object]:
    return {"impressions": data.n, "clicks": int(data.rewards.sum()), "on_policy": asdict(truth)}


def render(result, tables) -> str:
    f = result["figures"]
    p = result["params"]
    lines = [
        f"Open Bandit Dataset ({p['obp_wheel']}, campaign {p['campaign']}), subsample {p['subsample_fraction']}, "
        f"n_sim {p['n_sim']:,}, bootstrap {p['n_bootstrap']}, 95% intervals",
        f"random log: {f['random_log']['impressions']:,} impressions, {f['random_log']['clicks']} clicks; "
        f"BTS log: {f['bts_log']['impressions']:,} impressions, {f['bts_log']['clicks']} clicks",
    ]
    for title, results, truth, study in tables:
        lines += ["", f"{title}; on-policy truth {truth.value:.5f} [{truth.ci_low:.5f}, {truth.ci_high:.5f}]"]
        lines += _table(results, truth)
        extra = f", Monte Carlo s.e. of IPS {study['ips_mc_std_error']:.1e}" if "ips_mc_std_error" in study else ""
        lines.append(
            f"  effective sample size {study['effective_sample_size']:.0f}, max weight {study['max_weight']:.1f}{extra}"
        )
    rep = f["prior_replica_vs_bts_log"]
    lines += [
        "",
        f"IPS(BTS replica) / random CTR on the full random log: {f['ips_relative_value_full_random_log']:.4f}; "
        f"obp {f['obp_version']}'s BernoulliTS + IPW run here: {f['obp_bts_relative_value_full_random_log']:.6f} "
        f"(its README: {OBP_README_RELATIVE_VALUE})",
        f"prior replica vs the BTS log: r = {rep['pearson_r_with_logged_propensity']:.2f} with its propensities, "
        f"total variation {rep['total_variation_vs_item_frequencies']:.2f} from its item frequencies; top item per "
        f"position {rep['top_item_per_position_replica']} (replica) vs {rep['top_item_per_position_logged']} (logged)",
        "",
        "ratio                                           value   goal  tolerance  met",
    ]
    for name, value in result["ratios"].items():
        goal = result["goals"].get(name)
        if goal is None:
            lines.append(f"{name:<43} {value:9.6f}      -          -    -")
        else:
            tol = p["goal_tolerance_abs"][name]
            met = "yes" if f["goals_met"][name] else "NO"
            lines.append(f"{name:<43} {value:9.6f}  {goal:5.2f}  {tol:9.2g}  {met}")
    lines.append(f"({f['seconds']} s)")
    return "\n".join(lines)


def _table(results, truth: Estimate) -> list[str]:
    rows = ["  estimator  interval    value     95% interval            ratio   |rel err|  covers truth"]
    for method, ests in results.items():
        for name, est in ests.items():
            c = compare(est, truth)
            rows.append(
                f"  {name:<9}  {method:<9}  {est.value:.5f}  [{est.ci_low:+.5f}, {est.ci_high:.5f}]  "
                f"{c['ratio_vs_on_policy']:6.3f}  {c['abs_rel_error']:8.3f}   "
                f"{'yes' if c['interval_covers_on_policy'] else 'NO'}"
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
