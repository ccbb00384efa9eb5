"""One run of each method on one table: test-case evaluations until its recommendation reaches
the target (95% of the best config's true score).

Every method pays one unit per (config, test case) it has not evaluated before in the run; a
cell already paid for is free (a cached, temperature-0 call). A run that never reaches the
target within ``budget`` evaluations counts as the budget (``reached`` False).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import optuna
from world import CONTINUOUS, Table

from flywheel.optimizer.search import Search, SearchSettings

IN_FLIGHT = 8
# Chosen on the tuning table with seeds 100-139 (bench/llm-config/README.md); not changed since.
FLYWHEEL = {
    "population_size": 12,
    "elite_size": 2,
    "racing_min_cases": 3,
    "racing_growth": 2.0,
    "racing_confidence": 0.8,
    "surrogate_explore": 0.25,
}
# Optuna's documented default for WilcoxonPruner (and the value in its docstring example).
WILCOXON_P = 0.1


def run_flywheel(
    table: Table, seed: int, budget: int, racing: bool = True, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Flywheel's batch search, ``IN_FLIGHT`` evaluations outstanding, results back oldest first.
    Its recommendation is ``best()`` once that is scored on every case."""
    search = Search(
        table.space(),
        table.cases,
        SearchSettings(**(settings or FLYWHEEL), racing=racing, generations=10_000, max_evaluations=budget, seed=seed),
    )
    col = {c: j for j, c in enumerate(table.cases)}
    reached, spent, t_search = None, 0, 0.0
    in_flight: list[tuple[str, dict[str, Any], str]] = []
    while not search.done and reached is None:
        t = time.perf_counter()
        in_flight += search.next_evaluations(IN_FLIGHT - len(in_flight))
        t_search += time.perf_counter() - t
        if not in_flight:
            break
        cid, config, case = in_flight.pop(0)
        t = time.perf_counter()
        search.record(cid, case, float(table.scores[table.index(config), col[case]]))
        best = search.best()
        t_search += time.perf_counter() - t
        spent += 1
        if best and best["complete"] and table.true[table.index(best["config"])] >= table.target:
            reached = spent
    best = search.best()
    n_cases = len(table.cases)
    # target configs (true score >= target) the race dropped before scoring them on every case
    lost = [
        len(c.scores)
        for c in search.candidates.values()
        if c.dropped and len(c.scores) < n_cases and table.true[table.index(c.config)] >= table.target
    ]
    return {
        "evaluations_to_target": reached if reached is not None else budget,
        "reached": reached is not None,
        "final_true_score": float(table.true[table.index(best["config"])]) if best else None,
        "configs_tried": len(search.candidates),
        "target_configs_dropped": len(lost),
        "target_configs_dropped_after_cases": sorted(lost),
        "overhead_ms_per_evaluation": 1000 * t_search / max(spent, 1),
    }


def _suggest(trial: optuna.Trial, table: Table) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind, values in table.params:
        if kind == CONTINUOUS:
            out[name] = trial.suggest_float(name, values[0], values[-1], step=round(values[1] - values[0], 10))
        else:
            out[name] = trial.suggest_categorical(name, list(values))
    return out


def run_optuna(table: Table, seed: int, budget: int, kind: str, p_threshold: float = WILCOXON_P) -> dict[str, Any]:
    """``kind``:

    - ``optuna_tpe_wilcoxon``: as Optuna documents ``WilcoxonPruner`` for "the accuracy of
      outputs of a large language model on a set of questions": ``TPESampler(multivariate=True)``
      with ``WilcoxonPruner(p_threshold=0.1)``; each trial evaluates its config's cases in a fresh
      shuffled order, reports each score with ``trial.report(score, case_index)``, and when
      ``trial.should_prune()`` returns the mean so far (the docstring's workaround so that TPE
      learns from pruned trials; a ``TrialPruned`` would be ranked by its last step, here a case
      index). The pruner never prunes a trial whose partial mean beats the best trial's, so the
      best trial is always fully evaluated.
    - ``optuna_tpe``: the same sampler, every trial evaluated on every case in a fixed order.
    - ``random``: ``RandomSampler`` with full evaluations.

    Recommendation: ``study.best_trial``.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if kind == "random":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(multivariate=True, seed=seed)
    pruner = optuna.pruners.WilcoxonPruner(p_threshold=p_threshold) if kind == "optuna_tpe_wilcoxon" else None
    study = optuna.create_study(sampler=sampler, pruner=pruner, direction="maximize")
    order_rng = np.random.default_rng(seed)
    n_cases = len(table.cases)
    paid = np.zeros(table.scores.shape, dtype=bool)
    spent, reached, trials, pruned, t_search = 0, None, 0, 0, 0.0
    while spent < budget and reached is None:
        t = time.perf_counter()
        trial = study.ask()
        row = table.index(_suggest(trial, table))
        t_search += time.perf_counter() - t
        cases = order_rng.permutation(n_cases) if pruner else range(n_cases)
        values = []
        for j in cases:
            if not paid[row, j]:
                if spent >= budget:
                    break
                paid[row, j] = True
                spent += 1
            values.append(float(table.scores[row, j]))
            if pruner:
                t = time.perf_counter()
                trial.report(values[-1], int(j))
                stop = trial.should_prune()
                t_search += time.perf_counter() - t
                if stop:
                    pruned += 1
                    break
        t = time.perf_counter()
        study.tell(trial, sum(values) / len(values) if values else 0.0)
        best_row = table.index(study.best_trial.params)
        t_search += time.perf_counter() - t
        trials += 1
        if table.true[best_row] >= table.target:
            reached = spent
    best_row = table.index(study.best_trial.params)
    return {
        "evaluations_to_target": reached if reached is not None else budget,
        "reached": reached is not None,
        "final_true_score": float(table.true[best_row]),
        "best_trial_fully_evaluated": bool(paid[best_row].all()),
        "configs_tried": int(paid.any(1).sum()),
        "trials": trials,
        "pruned_trials": pruned,
        "overhead_ms_per_evaluation": 1000 * t_search / max(spent, 1),
    }
