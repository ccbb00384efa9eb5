"""Does RLP help the batch search? Test-case evaluations to 95% of the best config's true score on
the llm-config world, the search alone against the search with the society's RLP step before
each generation: same seeds, same evaluation budget, same racing search.

    python bench/rlp/run.py [--quick] [--seeds 0-19] [--jobs 2]

The world is bench/llm-config/table.csv (1,584 configs x 24 test cases; see
bench/llm-config/generate.py). Both arms run ``flywheel.optimizer.search.Search`` with
llm-config's settings (racing from 3 cases, growth x2, confidence 0.8, population 12, elite 2,
``surrogate_explore`` 0.25, 8 evaluations in flight) and pay one unit per (config, test case).

The RLP arm, before each generation after the first (the first has no history to reason about):

1. ``build_prompt`` (flywheel.society.rlp.thoughts) from the run's scored candidates (params and
   mean score so far, rounded to 3 decimals, as the society reads ``ListRunCandidates``) and the
   search space as a run YAML declares it;
2. the reasoning model answers (``--model scripted``: bench/rlp/scripted.py, which reads only
   the prompt text);
3. ``parse_thoughts`` then ``choose_proposals`` (flywheel.society.rlp.propose): the k
   best-predicted new configs;
4. ``Search.inject(configs, origin="rlp")``: they are raced with the generation.

After the generation: each thought's reward by ``thought_reward`` (information gain; a scripted
model has no token log-probabilities, so the prediction fallback: log-likelihood of the observed
mean scores under the thought's stated predictions minus under a no-think prediction, the mean
score of the run so far, sigma 0.1), the group advantages A = G/(G-1)(r - mean r) over the
thoughts that have a reward, and each proposal's hit (its mean score above its generation's
median).

A run reaches the target at the first evaluation after which ``best()`` (complete) has a true
score >= 95% of the best; never within the budget (4,800) counts as the budget. Each run goes on
to at least ``--horizon`` evaluations for the best-so-far curves. Seeds 0-19 are reported;
100-119 are the tuning seeds (see README.md for what was tuned there)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, DISCRETE, Param, Search, SearchSettings, SearchSpace
from flywheel.society.rlp import RLPConfig, ScoringError, Thought, group_advantages, parse_thoughts
from flywheel.society.rlp.context import build_context
from flywheel.society.rlp.information_gain import config_key, render_outcome
from flywheel.society.rlp.propose import choose_proposals, read_space, validate_params
from flywheel.society.rlp.reward import thought_reward

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from scripted import OPENINGS, ScriptedReasoner  # noqa: E402

from flywheel.stack import benchstamp  # noqa: E402

TABLE = ROOT / "bench" / "llm-config" / "table.csv"
RESULTS = ROOT / "bench" / "results" / "rlp.json"
BUDGET = 4800
IN_FLIGHT = 8
# bench/llm-config's tuned settings: the search without RLP at its best on this world.
FLYWHEEL = {
    "population_size": 12,
    "elite_size": 2,
    "racing_min_cases": 3,
    "racing_growth": 2.0,
    "racing_confidence": 0.8,
    "surrogate_explore": 0.25,
}
ARMS = ("search", "search_rlp")


class Table:
    """table.csv: every (config, case) score; a config's true score is its row mean."""

    def __init__(self, path: Path) -> None:
        with path.open() as f:
            rows = list(csv.reader(f))
        header, body = rows[0], rows[1:]
        self.cases = header[5:]
        self.scores: dict[tuple, np.ndarray] = {}
        for r in body:
            self.scores[(r[0], r[1], float(r[2]), int(r[3]), float(r[4]))] = np.array([float(x) for x in r[5:]])
        self.true = {k: float(v.mean()) for k, v in self.scores.items()}
        self.best_true = max(self.true.values())
        self.target = 0.95 * self.best_true
        self.models = sorted({k[0] for k in self.scores})
        self.prompts = sorted({k[1] for k in self.scores})
        self.max_tokens = sorted({k[3] for k in self.scores})
        self.top_p = sorted({k[4] for k in self.scores})

    @staticmethod
    def key(config: dict[str, Any]) -> tuple:
        return (
            config["model"],
            config["prompt"],
            round(float(config["temperature"]), 1),
            int(config["max_tokens"]),
            float(config["top_p"]),
        )

    def space(self) -> SearchSpace:
        return SearchSpace(
            [
                Param("model", CATEGORICAL, values=tuple(self.models)),
                Param("prompt", CATEGORICAL, values=tuple(self.prompts)),
                Param("temperature", CONTINUOUS, low=0.0, high=1.0, step=0.1),
                Param("max_tokens", DISCRETE, values=tuple(self.max_tokens)),
                Param("top_p", DISCRETE, values=tuple(self.top_p)),
            ]
        )

    def space_yaml(self) -> dict[str, Any]:
        """The same space as a run YAML's ``search_space`` section declares it."""
        return {
            "parameters": {
                "model": {"type": "categorical", "values": self.models},
                "prompt": {"type": "categorical", "values": self.prompts},
                "temperature": {"type": "continuous", "min": 0.0, "max": 1.0, "step": 0.1},
                "max_tokens": {"type": "discrete", "values": self.max_tokens},
                "top_p": {"type": "discrete", "values": self.top_p},
            }
        }


class RlpStep:
    """The society's RLP step for one run, against an in-process Search."""

    def __init__(self, search: Search, table: Table, args: argparse.Namespace, model: Any) -> None:
        self.search, self.table, self.model = search, table, model
        self.k, self.max_history, self.few_shot = args.k, args.max_history, args.few_shot
        self.rank, self.gate, self.max_steps = args.rank, args.gate, args.max_steps
        self.buffer: list[tuple[float, str, str]] = []  # (reward, thought, outcome): this run's experiences
        self.config = RLPConfig(
            rlp_enabled=True,
            use_logprobs=False,
            num_thoughts=args.thoughts,
            proposals_per_thought=args.per_thought,
            model_name=model.name,
        )
        self.space = table.space_yaml()
        self.specs = read_space(self.space)
        self.open: dict[str, Any] | None = None  # the step whose generation is running
        self.steps: list[dict[str, Any]] = []

    def history(self) -> list[dict[str, Any]]:
        return [
            {"params": dict(c.config), "score": round(float(np.mean(list(c.scores.values()))), 3)}
            for c in self.search.candidates.values()
            if c.scores
        ]

    def before_generation(self) -> None:
        history = self.history()
        if not history or (self.max_steps and len(self.steps) >= self.max_steps):
            return
        # the society's few-shot examples (buffer.few_shot): the best-rewarded distinct thoughts
        # of this run so far with what happened, shown as the service shows them (build_context)
        examples, texts = [], set()
        for _, text, outcome in sorted(self.buffer, key=lambda e: -e[0]):
            if len(examples) == self.few_shot:
                break
            if text not in texts:
                texts.add(text)
                examples.append({"thought": text, "outcome": outcome})
        messages, _ = build_context(
            history=history,
            search_space=self.space["parameters"],
            n_thoughts=self.config.num_thoughts,
            proposals_per_thought=self.config.proposals_per_thought,
            examples=examples,
            max_history=self.max_history,
        )
        try:
            answer = self.model.complete(messages)
        except Exception as exc:  # noqa: BLE001 - a provider error or timeout is this step's failure
            self.steps.append(
                {
                    "generation": self.search.generation,
                    "evaluations": self.search.evaluations,
                    "thoughts": 0,
                    "thought_heads": [],
                    "failure": f"model error: {type(exc).__name__}",
                }
            )
            return
        parsed = parse_thoughts(answer, max_thoughts=self.config.num_thoughts)
        step: dict[str, Any] = {
            "generation": self.search.generation,
            "evaluations": self.search.evaluations,
            "thoughts": len(parsed.thoughts),
            "thought_heads": [t.text[:20] for t in parsed.thoughts],
            "failure": parsed.failure,
        }
        self.steps.append(step)
        if not parsed.ok:
            step["answer_head"] = answer[:200]  # what the model wrote instead (a sample for the README)
            return
        seen = {config_key(c.config) for c in self.search.candidates.values()}
        if self.rank == "predicted":
            chosen = choose_proposals(parsed, seen=seen, space=self.space, k=self.k)
        else:  # tuning only: every valid new proposal, re-ranked by expected improvement
            every = choose_proposals(parsed, seen=seen, space=self.space, k=10_000)
            best = max(h["score"] for h in history) if self.rank == "ei-best" else None
            chosen = rank_by_ei(every, self.k, best)
        if self.gate is not None:  # tuning only: the incumbent is the best shown mean score
            incumbent = max(h["score"] for h in history)
            chosen = [(i, p) for i, p in chosen if p.predicted_score >= incumbent + self.gate]
        ids = self.search.inject([dict(p.params) for _, p in chosen], origin="rlp") if chosen else []
        step["proposals"] = [
            {"thought": i, "candidate_id": cid, "predicted": p.predicted_score}
            for (i, p), cid in zip(chosen, ids, strict=True)
        ]
        self.open = {
            "step": step,
            "context": messages[1]["content"],
            "thoughts": [self._canonical(t) for t in parsed.thoughts],
            "baseline_mean": statistics.fmean(h["score"] for h in history),
        }

    def _canonical(self, thought: Thought) -> Thought:
        """The thought with its proposals put onto the space, so their keys match the run's."""
        out = []
        for p in thought.proposals:
            params, _ = validate_params(p.params, self.specs)
            if params is not None:
                out.append(type(p)(params, p.predicted_score, p.sigma))
        return Thought(thought.text, out)

    def after_generation(self) -> None:
        if self.open is None:
            return
        opened, self.open = self.open, None
        step = opened["step"]
        gen = self.search.generations[-1]
        means = {
            cid: float(np.mean(list(self.search.candidates[cid].scores.values())))
            for cid in gen["candidates"]
            if self.search.candidates[cid].scores
        }
        median = statistics.median(means.values()) if means else float("nan")
        for prop in step.get("proposals", []):
            score = means.get(prop["candidate_id"])
            prop["observed"] = score
            prop["hit"] = score is not None and score > median
            prop["true"] = self.table.true[self.table.key(self.search.candidates[prop["candidate_id"]].config)]
        others = [s for cid, s in means.items() if self.search.candidates[cid].origin != "rlp"]
        step["others_hit"] = [s > median for s in others]
        # the observed outcome: every config a thought predicted that the run has scored
        by_key = {config_key(c.config): c for c in self.search.candidates.values() if c.scores}
        rewards: list[float | None] = []
        for thought in opened["thoughts"]:
            observed = {
                p.key: round(float(np.mean(list(by_key[p.key].scores.values()))), 3)
                for p in thought.proposals
                if p.key in by_key
            }
            try:
                gain = asyncio.run(
                    thought_reward(
                        self.config,
                        context=opened["context"],
                        thought=thought,
                        observed=observed,
                        scorer=None,
                        baseline_mean=opened["baseline_mean"],
                    )
                )
                rewards.append(gain.reward)
                self.buffer.append((gain.reward, thought.text, render_outcome(observed)))
                step["definition"] = gain.definition
            except ScoringError:
                rewards.append(None)  # nothing this thought predicted was evaluated
        step["rewards"] = rewards
        scored = [r for r in rewards if r is not None]
        step["advantages"] = group_advantages(scored) if len(scored) >= 2 else []


def rank_by_ei(chosen: list[tuple[int, Any]], k: int, incumbent: float | None) -> list[tuple[int, Any]]:
    """The k proposals with the highest expected improvement over ``incumbent`` (None: the best
    predicted score among them), sigma 0.1 where none is stated."""
    if not chosen:
        return []
    tau = max(p.predicted_score for _, p in chosen) if incumbent is None else incumbent

    def ei(p: Any) -> float:
        s = p.sigma or 0.1
        z = (p.predicted_score - tau) / s
        return s * (math.exp(-z * z / 2) / math.sqrt(2 * math.pi)) + (p.predicted_score - tau) * 0.5 * math.erfc(
            -z / math.sqrt(2)
        )

    return sorted(chosen, key=lambda row: -ei(row[1]))[:k]


def run_arm(table: Table, seed: int, rlp: bool, args: argparse.Namespace) -> dict[str, Any]:
    search = Search(
        table.space(),
        table.cases,
        SearchSettings(**FLYWHEEL, racing=True, generations=10_000, max_evaluations=BUDGET, seed=seed),
    )
    if args.model == "local":
        from local import LocalReasoner

        model: Any = LocalReasoner(args.api_base, args.api_key)
    else:
        model = ScriptedReasoner(calibrate=args.calibrate, imitate=args.imitate)
    step = RlpStep(search, table, args, model) if rlp else None
    col = {c: j for j, c in enumerate(table.cases)}
    reached, spent, generation, rec_true = None, 0, 0, None
    curve: list[tuple[int, float]] = []
    reached_origin = None
    in_flight: list[tuple[str, dict[str, Any], str]] = []
    t0 = time.perf_counter()
    while not search.done and (reached is None or spent < args.horizon):
        if step is not None and search.generation != generation:
            step.after_generation()  # the last generation's results: rewards, hits
            generation = search.generation
            step.before_generation()  # the next one's proposals
        in_flight += search.next_evaluations(IN_FLIGHT - len(in_flight))
        if not in_flight:
            break
        cid, config, case = in_flight.pop(0)  # results come back one at a time, oldest first
        search.record(cid, case, float(table.scores[table.key(config)][col[case]]))
        spent += 1
        best = search.best()
        if best and best["complete"]:
            t = table.true[table.key(best["config"])]
            if t != rec_true:
                rec_true = t
                curve.append((spent, round(t, 4)))
            if reached is None and t >= table.target:
                reached = spent
                reached_origin = search.candidates[best["candidate_id"]].origin
    if step is not None and search.generation != generation:
        step.after_generation()
    out: dict[str, Any] = {
        "evaluations_to_target": reached if reached is not None else BUDGET,
        "reached": reached is not None,
        "reached_by_origin": reached_origin,
        "evaluations_run": spent,
        "configs_tried": len(search.candidates),
        "curve": curve,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if step is not None:
        out["steps"] = step.steps
        out["served_model"] = getattr(model, "served", model.name)
    return out


def run_seed(job: tuple[int, argparse.Namespace]) -> dict[str, Any]:
    seed, args = job
    table = Table(TABLE)
    cached = _cached_search(args.search_cache, seed)
    search = cached if cached is not None else run_arm(table, seed, False, args)
    return {"seed": seed, "search": search, "search_rlp": run_arm(table, seed, True, args)}


def _cached_search(path: Path | None, seed: int) -> dict[str, Any] | None:
    """The search-alone arm of ``seed`` from an earlier results JSON (tuning only: it is
    deterministic per seed and horizon, so re-running it would only cost time)."""
    if path is None:
        return None
    for run in json.loads(path.read_text())["figures"]["runs"]:
        if run["seed"] == seed:
            return run["search"]
    return None


def bootstrap_mean_ci(values: list[float], *, n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    x = np.asarray(values, dtype=float)
    means = x[rng.integers(0, len(x), (n, len(x)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def curve_mean(rows: list[dict[str, Any]], arm: str, grid: np.ndarray) -> list[float | None]:
    """Mean over seeds of the recommendation's true score after each grid point's evaluations
    (a seed with no complete candidate yet counts as missing)."""
    out = []
    for g in grid:
        vals = []
        for r in rows:
            pts = [t for e, t in r[arm]["curve"] if e <= g]
            if pts:
                vals.append(pts[-1])
        out.append(round(statistics.fmean(vals), 4) if len(vals) == len(rows) else None)
    return out


def summarise(rows: list[dict[str, Any]], table: Table, horizon: int) -> tuple[dict[str, Any], dict[str, Any]]:
    figures: dict[str, Any] = {}
    for arm in ARMS:
        ev = [r[arm]["evaluations_to_target"] for r in rows]
        figures[arm] = {
            "mean_evaluations_to_target": statistics.fmean(ev),
            "median_evaluations_to_target": statistics.median(ev),
            "reached": sum(r[arm]["reached"] for r in rows),
            "mean_configs_tried": round(statistics.fmean(r[arm]["configs_tried"] for r in rows), 1),
            "seconds_per_run": round(statistics.fmean(r[arm]["seconds"] for r in rows), 2),
        }
    diffs = [r["search_rlp"]["evaluations_to_target"] - r["search"]["evaluations_to_target"] for r in rows]
    lo, hi = bootstrap_mean_ci(diffs)
    steps = [s for r in rows for s in r["search_rlp"]["steps"]]
    props = [p for s in steps for p in s.get("proposals", []) if "hit" in p]
    others = [h for s in steps for h in s.get("others_hit", [])]
    rewards = [(s["generation"], x) for s in steps for x in s.get("rewards", []) if x is not None]
    slope = float(np.polyfit([g for g, _ in rewards], [x for _, x in rewards], 1)[0]) if len(rewards) > 2 else None
    by_gen: dict[int, list[float]] = {}
    for g, x in rewards:
        by_gen.setdefault(g, []).append(x)
    half = len(rewards) // 2
    ordered = [x for _, x in sorted(rewards, key=lambda t: t[0])]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for s in steps:
        for p in s.get("proposals", []):
            if "hit" in p:
                head = s["thought_heads"][p["thought"]]
                kind = next((k for k, o in OPENINGS.items() if o.startswith(head) or head.startswith(o[:20])), "?")
                by_kind.setdefault(kind, []).append(p)
    figures["rlp"] = {
        "paired_difference_mean": statistics.fmean(diffs),
        "paired_difference_ci95": [round(lo, 1), round(hi, 1)],
        "paired_difference_median": statistics.median(diffs),
        "seeds_rlp_faster": sum(d < 0 for d in diffs),
        "seeds_rlp_slower": sum(d > 0 for d in diffs),
        "steps": len(steps),
        "steps_failed": sum(s["failure"] is not None for s in steps),
        "failure_reasons": sorted({s["failure"] for s in steps if s["failure"]})[:5],
        "proposals": len(props),
        "proposal_hit_rate": round(statistics.fmean(p["hit"] for p in props), 4) if props else None,
        "other_candidates_hit_rate": round(statistics.fmean(others), 4) if others else None,
        "proposal_mean_true_score": round(statistics.fmean(p["true"] for p in props), 4) if props else None,
        "proposals_by_thought": {
            k: {
                "proposals": len(v),
                "hit_rate": round(statistics.fmean(p["hit"] for p in v), 3),
                "mean_true": round(statistics.fmean(p["true"] for p in v), 3),
                "mean_predicted_minus_observed": _mean_or_none(
                    [p["predicted"] - p["observed"] for p in v if p["observed"] is not None]
                ),
            }
            for k, v in sorted(by_kind.items())
        },
        "runs_where_target_reached_by_rlp_proposal": sum(r["search_rlp"]["reached_by_origin"] == "rlp" for r in rows),
        "reward_definition": next((s["definition"] for s in steps if "definition" in s), None),
        "thought_rewards": len(rewards),
        "thoughts_without_reward": sum(x is None for s in steps for x in s.get("rewards", [])),
        "mean_reward": round(statistics.fmean(x for _, x in rewards), 4) if rewards else None,
        "mean_reward_first_half": round(statistics.fmean(ordered[:half]), 4) if half else None,
        "mean_reward_second_half": round(statistics.fmean(ordered[half:]), 4) if half else None,
        "reward_slope_per_generation": round(slope, 5) if slope is not None else None,
        "mean_reward_by_generation": {
            str(g): [round(statistics.fmean(v), 4), len(v)] for g, v in sorted(by_gen.items()) if len(v) >= 3
        },
        "mean_abs_advantage": round(statistics.fmean(abs(a) for s in steps for a in s.get("advantages", [])), 4)
        if any(s.get("advantages") for s in steps)
        else None,
    }
    grid = np.arange(0, horizon + 1, 24)
    figures["curves"] = {"evaluations": grid.tolist(), **{arm: curve_mean(rows, arm, grid) for arm in ARMS}}
    ratios = {
        "search_vs_rlp_evaluations": round(
            figures["search"]["mean_evaluations_to_target"] / figures["search_rlp"]["mean_evaluations_to_target"], 3
        ),
        "search_vs_rlp_median_evaluations": round(
            figures["search"]["median_evaluations_to_target"] / figures["search_rlp"]["median_evaluations_to_target"], 3
        ),
    }
    return figures, ratios


def _mean_or_none(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def plot(figures: dict[str, Any], table: Table, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    c = figures["curves"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm, label in (("search", "search (racing)"), ("search_rlp", "search + RLP (scripted reasoner)")):
        pts = [(e, v) for e, v in zip(c["evaluations"], c[arm], strict=True) if v is not None]
        ax.plot([e for e, _ in pts], [v for _, v in pts], label=label)
    ax.axhline(table.target, color="grey", ls="--", lw=1, label="target (95% of best)")
    ax.set_xlabel("test-case evaluations")
    ax.set_ylabel("true score of the recommendation (mean over seeds)")
    ax.set_title("llm-config world: best-so-far with and without RLP")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def machine() -> dict[str, Any]:
    """The machine (``benchstamp.machine``) plus the load at the end (the seeds run in parallel)."""
    return {**benchstamp.machine(("numpy", "scipy")), "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}


def parse_seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def render(result: dict[str, Any]) -> str:
    f, p = result["figures"], result["params"]
    r = f["rlp"]
    lines = [
        f"rlp on llm-config: target {p['target']:.4f} (95% of {p['best_true_score']:.4f}), {len(p['seeds'])} seeds, "
        f"budget {p['budget']}, RLP: G={p['rlp']['thoughts']} thoughts x {p['rlp']['per_thought']}, "
        f"k={p['rlp']['k']} injected per generation, model {p['rlp']['model']}",
        "",
        f"{'arm':<14}{'mean evals':>11}{'median':>8}{'reached':>9}{'configs':>9}{'s/run':>7}",
    ]
    for arm in ARMS:
        a = f[arm]
        lines.append(
            f"{arm:<14}{a['mean_evaluations_to_target']:>11.1f}{a['median_evaluations_to_target']:>8.0f}"
            f"{a['reached']:>6}/{len(p['seeds']):<2}{a['mean_configs_tried']:>9.1f}{a['seconds_per_run']:>7.2f}"
        )
    lines += [
        "",
        f"paired difference (RLP - search), mean {r['paired_difference_mean']:+.1f} evaluations, "
        f"95% bootstrap CI [{r['paired_difference_ci95'][0]:+.1f}, {r['paired_difference_ci95'][1]:+.1f}], "
        f"median {r['paired_difference_median']:+.1f}; RLP faster on {r['seeds_rlp_faster']}, "
        f"slower on {r['seeds_rlp_slower']} seeds",
        f"ratio search / search+RLP (mean evaluations): {result['ratios']['search_vs_rlp_evaluations']:.3f} "
        f"(median: {result['ratios']['search_vs_rlp_median_evaluations']:.3f})",
        f"RLP steps {r['steps']} ({r['steps_failed']} failed), proposals {r['proposals']}, hit rate "
        f"{r['proposal_hit_rate']} (other candidates: {r['other_candidates_hit_rate']}), target reached by an "
        f"RLP proposal in {r['runs_where_target_reached_by_rlp_proposal']} runs",
        f"information gain ({r['reward_definition']}): mean {r['mean_reward']} over {r['thought_rewards']} thoughts "
        f"({r['thoughts_without_reward']} without an observed prediction), first half {r['mean_reward_first_half']}, "
        f"second half {r['mean_reward_second_half']}, slope {r['reward_slope_per_generation']} per generation",
        f"({f['seconds']} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seeds 0-3, horizon 480 (< 2 min)")
    parser.add_argument("--seeds", default=None, help="e.g. 0-19 (reported); 100-119 for tuning")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--model", choices=("scripted", "local"), default="scripted", help="local: the local model server"
    )
    parser.add_argument("--thoughts", type=int, default=4, help="G, thoughts per RLP step")
    parser.add_argument("--per-thought", type=int, default=2, help="configs proposed per thought")
    parser.add_argument("--k", type=int, default=1, help="proposals injected per generation")
    parser.add_argument("--max-history", type=int, default=50, help="history lines in the prompt")
    parser.add_argument("--few-shot", type=int, default=0, help="best-rewarded thoughts shown in the prompt")
    parser.add_argument("--rank", choices=("predicted", "ei", "ei-best"), default="predicted", help="tuning")
    parser.add_argument("--max-steps", type=int, default=0, help="RLP steps per run at most (0: no limit)")
    parser.add_argument("--gate", type=float, default=None, help="tuning: inject only above best shown + this")
    parser.add_argument("--calibrate", action="store_true", help="the model learns from the examples' errors")
    parser.add_argument("--imitate", action="store_true", help="the model writes only the examples' kinds")
    parser.add_argument("--horizon", type=int, default=None, help="evaluations run at least (curves)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--search-cache", type=Path, default=None, help="tuning: reuse the search arm of a results JSON"
    )
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds) if args.seeds else list(range(4 if args.quick else 20))
    if args.horizon is None:
        args.horizon = 480 if args.quick else 1200
    server = None
    if args.model == "local":
        from local import start_server

        server = start_server()
        args.api_base, args.api_key = server.url, server.api_key
    t0 = time.perf_counter()
    try:
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(run_seed, [(s, args) for s in seeds]))
    finally:
        if server is not None:
            server.stop()
    table = Table(TABLE)
    figures, ratios = summarise(rows, table, args.horizon)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    figures["runs"] = [
        {
            "seed": r["seed"],
            **{
                arm: {k: v for k, v in r[arm].items() if k not in ("steps", "curve")} | {"curve": r[arm]["curve"]}
                for arm in ARMS
            },
        }
        for r in rows
    ]
    # per-step records of the first seeds only, as a sample: the figures above cover every step
    figures["rlp_steps_sample"] = {
        str(r["seed"]): [{k: v for k, v in s.items() if k != "evaluations"} for s in r["search_rlp"]["steps"]]
        for r in rows[:2]
    }
    result = {
        "name": "rlp",
        "machine": machine(),
        "params": {
            "quick": args.quick,
            "seeds": seeds,
            "configs": len(table.scores),
            "test_cases": len(table.cases),
            "best_true_score": round(table.best_true, 4),
            "target": round(table.target, 4),
            "budget": BUDGET,
            "horizon": args.horizon,
            "in_flight": IN_FLIGHT,
            "flywheel": FLYWHEEL,
            "rlp": {
                "model": args.model,
                "thoughts": args.thoughts,
                "per_thought": args.per_thought,
                "k": args.k,
                "max_history": args.max_history,
                "few_shot": args.few_shot,
                "calibrate": args.calibrate,
                "imitate": args.imitate,
                "rank": args.rank,
                "gate": args.gate,
                "max_steps": args.max_steps,
                "reward": "thought_reward with use_logprobs off: prediction information gain against "
                "N(mean score so far, 0.1)",
                "first_step": "before generation 1 (generation 0 has no history)",
            },
            "censoring": "a run that never reaches the target counts as the budget",
        },
        "figures": figures,
        "ratios": ratios,
        "goals": {"search_vs_rlp_evaluations": 1.0},
    }
    figures["goals_met"] = {"search_vs_rlp_evaluations": bool(ratios["search_vs_rlp_evaluations"] > 1.0)}
    print(render(result))
    # a quick run goes to the cache, so it never replaces the reported results
    out = args.out or (ROOT / "bench" / ".cache" / "rlp-quick.json" if args.quick else RESULTS)
    if not args.quick and args.out is None:
        note = plot(figures, table, RESULTS.with_suffix(".png"))
        if note:
            print(note)
    command = [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]
    benchstamp.write_results("rlp", result, out=out, packages=("numpy", "scipy"), argv=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
