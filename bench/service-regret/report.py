"""Aggregating the runs: regrets per (world, k, mode), service / in-process ratios, table, plot."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

# Service regret / in-process regret, per world and mode: goal <= this.
GOALS = {1: 1.02, 2: 1.05}


def _mean_se(values: list[float]) -> dict[str, float]:
    se = float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return {"mean": float(np.mean(values)), "se": se}


def _order(item: tuple[tuple[str, str], Any]) -> tuple:
    (config, mode), _ = item
    reward, k, world = config.split("/")
    worlds = ("stationary", "delayed", "drift", "segmented")
    return (reward, int(k[1:]), worlds.index(world) if world in worlds else 9, mode[0], "unpaced" in mode)


def aggregate(records: list[dict[str, Any]], reference: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``records``: one per service run; ``reference``: per world key, the in-process figures.

    The ratio is mean service regret over mean in-process regret across seeds. Its standard
    error is the one it would have if the service behaved like the policy in process: the
    spread of one in-process run's regret (over sampling seeds, per world seed), for one
    service run and the reference's mean of ``reps`` runs per seed, over the number of seeds,
    relative to the in-process mean. A ratio within about two of these of
    1.0 cannot tell the service from the policy in process."""
    groups: defaultdict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["config"], r["mode"])].append(r)
    rows: dict[str, dict[str, Any]] = {}
    for (config, mode), runs in sorted(groups.items(), key=_order):
        svc = [r["regret"] for r in runs]
        ref = [reference[f"{config}/seed{r['seed']}"]["regret"] for r in runs]
        ref_batched = [reference[f"{config}/seed{r['seed']}"]["regret_batched"] for r in runs]
        sds = [reference[f"{config}/seed{r['seed']}"]["regret_sd"] for r in runs]
        ref_mean = float(np.mean(ref))
        ratio = float(np.mean(svc)) / ref_mean if ref_mean > 0 else float("nan")
        reps = reference[f"{config}/seed{runs[0]['seed']}"]["reps"]
        # one service run per seed (variance sd^2) against a mean of ``reps`` in-process runs (sd^2 / reps)
        var = float(np.sum(np.square(sds))) * (1 + 1 / reps)
        se = float(np.sqrt(var)) / len(sds) / ref_mean if ref_mean > 0 else float("nan")
        replicas = runs[0]["replicas"]
        select_ms = np.concatenate([np.asarray(r["select_ms_sample"]) for r in runs])
        rows[f"{config}/{mode}"] = {
            "config": config,
            "mode": mode,
            "replicas": replicas,
            "seeds": len(runs),
            "service_regret": _mean_se(svc),
            "in_process_regret": _mean_se(ref),
            "in_process_batched_regret": _mean_se(ref_batched),
            "uniform_random_regret": float(
                np.mean([reference[f"{config}/seed{r['seed']}"]["regret_uniform"] for r in runs])
            ),
            "ratio": round(ratio, 4),
            "ratio_se": None if np.isnan(se) else round(float(se), 4),
            "goal": GOALS[replicas],
            "goal_met": bool(ratio <= GOALS[replicas]),
            "bounces": float(sum(r["bounces"] for r in runs)),
            "feedback_retries": float(sum(r["retries"] for r in runs)),
            "decisions_per_s": round(float(np.mean([r["decisions_per_s"] for r in runs])), 1),
            # Little's law: Selects outstanding on average (what a batch size is to the policy in process)
            "mean_in_flight": round(float(np.mean([r["decisions_per_s"] for r in runs]) * select_ms.mean() / 1e3), 1),
            "select_p50_ms": round(float(np.percentile(select_ms, 50)), 2),
            "select_p99_ms": round(float(np.percentile(select_ms, 99)), 2),
            "half_life": runs[0]["half_life"],
            "curve_service": np.mean([r["curve"] for r in runs], axis=0).round(2).tolist(),
            "curve_in_process": np.mean([reference[f"{config}/seed{r['seed']}"]["curve"] for r in runs], axis=0)
            .round(2)
            .tolist(),
        }
    per_mode: dict[str, dict[str, Any]] = {}
    for mode in sorted({r["mode"] for r in rows.values()}):
        these = [r for r in rows.values() if r["mode"] == mode]
        per_mode[mode] = {
            "mean_ratio": round(float(np.mean([r["ratio"] for r in these])), 4),
            "mean_ratio_se": round(float(np.sqrt(np.sum([(r["ratio_se"] or 0) ** 2 for r in these]))) / len(these), 4),
            "worst_ratio": round(float(max(r["ratio"] for r in these)), 4),
            "goal": these[0]["goal"],
            "configs_meeting_goal": f"{sum(r['goal_met'] for r in these)}/{len(these)}",
            "bounces": sum(r["bounces"] for r in these),
        }
    return {"rows": rows, "per_mode": per_mode}


def table(figures: dict[str, Any]) -> str:
    head = (
        f"{'config':34s}{'mode':>15s}{'service':>9s}{'in-proc':>9s}{'ratio':>8s}{'+-se':>7s}{'goal':>6s}"
        f"{'met':>5s}{'inproc_b':>9s}{'random':>8s}{'dec/s':>7s}{'p50ms':>7s}{'p99ms':>7s}{'bounce':>7s}"
    )
    lines = [
        "mean cumulative pseudo-regret over seeds; ratio = service / in process (same reward streams);",
        "inproc_b: in process with batches of the unpaced in-flight bound (the cost of concurrency alone);",
        "random: the regret of uniform random choice (a row whose regrets are near it has not learned yet)",
        head,
    ]
    for r in figures["rows"].values():
        se = f"{r['ratio_se']:7.3f}" if r["ratio_se"] is not None else f"{'-':>7s}"
        lines.append(
            f"{r['config']:34s}{r['mode']:>15s}{r['service_regret']['mean']:9.1f}{r['in_process_regret']['mean']:9.1f}"
            f"{r['ratio']:8.3f}{se}{r['goal']:6.2f}{'yes' if r['goal_met'] else 'NO':>5s}"
            f"{r['in_process_batched_regret']['mean']:9.1f}{r['uniform_random_regret']:8.1f}{r['decisions_per_s']:7.0f}{r['select_p50_ms']:7.1f}"
            f"{r['select_p99_ms']:7.1f}{r['bounces']:7.0f}"
        )
    lines += [
        "(+-se: the ratio's standard error if the service behaved like the policy in process)",
        "",
        f"{'mode':15s}{'mean ratio':>11s}{'+-se':>7s}{'worst':>8s}{'goal':>6s}{'met':>8s}{'bounces':>9s}",
    ]
    for mode, m in figures["per_mode"].items():
        lines.append(
            f"{mode:15s}{m['mean_ratio']:11.3f}{m['mean_ratio_se']:7.3f}{m['worst_ratio']:8.3f}{m['goal']:6.2f}"
            f"{m['configs_meeting_goal']:>8s}{m['bounces']:9.0f}"
        )
    return "\n".join(lines)


def plot(figures: dict[str, Any], marks: list[int], path: Path) -> bool:
    """Regret curves, service (one line per mode) against in process, one panel per config."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    configs = list(dict.fromkeys(r["config"] for r in figures["rows"].values()))  # the table's order
    cols = 4
    nrows = (len(configs) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    colors = {
        "1rep-paced": "tab:blue",
        "1rep-unpaced": "tab:cyan",
        "2rep-paced": "tab:red",
        "2rep-unpaced": "tab:orange",
    }
    for ax, config in zip(axes.flat, configs, strict=False):
        rows = [r for r in figures["rows"].values() if r["config"] == config]
        ax.plot(marks, rows[0]["curve_in_process"], color="black", lw=2.2, label="in process")
        for r in rows:
            ax.plot(marks, r["curve_service"], color=colors.get(r["mode"]), lw=1.3, label=f"service {r['mode']}")
        ax.set_title(config, fontsize=9)
        ax.set_xlabel("decision")
        ax.set_ylabel("cumulative regret")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(configs) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
