"""The search as an ask/tell state machine (see the package docstring for the protocol)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from .scores import Posterior, confidently_worse_sequential, posterior, racing_looks
from .settings import SearchSettings
from .space import CATEGORICAL, CONTINUOUS, SearchSpace
from .surrogate import Surrogate, fit_surrogate, single_threaded

STATE_VERSION = 1
FINE_SCALES = (1.0, 1.0 / 3.0, 0.1)  # the surrogate's pool also holds finer mutants to refine with
FINE_WEIGHTS = (0.5, 0.25, 0.25)


def _rank_weights(n: int) -> np.ndarray:
    """CMA-ES's recombination weights for the n best, best first, summing to 1."""
    w = np.log(n + 0.5) - np.log(np.arange(1, n + 1))
    return w / w.sum()


def _unit_geomean(x: np.ndarray) -> np.ndarray:
    """x scaled so that its geometric mean is 1."""
    return x / math.exp(float(np.log(x).mean()))


@dataclass
class Candidate:
    id: str
    config: dict[str, Any]
    key: str
    origin: str  # initial | warm_start | offspring | injected | restart
    generation: int
    parents: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    target: int = 0
    dropped: bool = False
    drop_reason: str = ""
    revisits: int = 0  # times it re-entered the race after a drop (racing_revisit)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "pending": sorted(self.pending)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Candidate:
        return cls(**{**d, "pending": set(d["pending"])})


class Search:
    """Thompson sampling + evolution + racing over one search space and one set of test cases."""

    def __init__(
        self,
        space: SearchSpace,
        test_case_ids: list[str],
        settings: SearchSettings | None = None,
        *,
        prior: list[dict[str, Any]] | None = None,
    ) -> None:
        """``prior``: results of earlier runs on the same space, ``[{"config": {...}, "score": x}]``.
        The best of them seed the first population and all of them inform the surrogate."""
        if not test_case_ids:
            raise ValueError("the search needs at least one test case")
        if len(set(test_case_ids)) != len(test_case_ids):
            raise ValueError("test case ids must be unique")
        self.space = space
        self.settings = settings or SearchSettings()
        self._rng = np.random.default_rng(self.settings.seed)
        # one shared random order: every candidate is scored on a prefix of it (paired comparisons)
        self.case_order = [test_case_ids[i] for i in self._rng.permutation(len(test_case_ids))]
        self.candidates: dict[str, Candidate] = {}
        self._by_key: dict[str, str] = {}
        self.population: list[str] = []
        self.generation = 0
        self.generations: list[dict[str, Any]] = []
        self.evaluations = 0
        self.best_score: float | None = None
        self.stale = 0
        # A restart opens a new epoch: breeding then draws only on candidates added since.
        self.epoch_start = 0
        self.epoch_best: float | None = None
        self.epoch_stale = 0
        self.epoch_scale = 0.0  # the spread (best - median) of the epoch's first design
        self.restarts = 0
        self.tr_length = self.settings.trust_region_init
        self.tr_success = 0
        self.tr_failure = 0
        self.done = False
        self.done_reason = ""
        self.prior = self._valid_prior(prior or [])
        self._post: tuple[int, Posterior] | None = None
        self._version = 0
        self._start()

    # --- the protocol ------------------------------------------------------------------------

    def next_evaluations(self, limit: int) -> list[tuple[str, dict[str, Any], str]]:
        """Up to ``limit`` (candidate_id, config, test_case_id) to evaluate now; each is marked
        pending until recorded. Empty when the current rung waits for pending results, or done."""
        if self.done or limit <= 0:
            return []
        room = limit
        if self.settings.max_evaluations is not None:
            room = min(room, self.settings.max_evaluations - self.evaluations - self._pending_count())
        alive = [self.candidates[c] for c in self.population if not self.candidates[c].dropped]
        wants = {c.id: self._missing(c) for c in alive}
        alive = [c for c in alive if wants[c.id]]
        if room <= 0 or not alive:
            return []
        # Thompson sampling decides who goes first when the limit cannot cover everyone
        post = self._posterior()
        idx = self._index()
        draws = {c.id: self._rng.normal(post.mean[idx[c.id]], math.sqrt(post.var[idx[c.id]])) for c in alive}
        alive.sort(key=lambda c: -draws[c.id])
        out: list[tuple[str, dict[str, Any], str]] = []
        while room > 0 and any(wants[c.id] for c in alive):
            for c in alive:
                if room > 0 and wants[c.id]:
                    case = wants[c.id].pop(0)
                    c.pending.add(case)
                    out.append((c.id, dict(c.config), case))
                    room -= 1
        return out

    def record(self, candidate_id: str, test_case_id: str, score: float) -> bool:
        """Store one score (higher is better). Idempotent per (candidate, test case): a repeat is
        ignored and returns False. May close a rung or a generation."""
        cand = self.candidates.get(candidate_id)
        if cand is None:
            raise KeyError(f"unknown candidate {candidate_id!r}")
        if test_case_id not in self._case_index():
            raise KeyError(f"unknown test case {test_case_id!r}")
        if not math.isfinite(score):
            raise ValueError(f"score for {candidate_id}/{test_case_id} must be finite, got {score}")
        if test_case_id in cand.scores:
            return False
        cand.scores[test_case_id] = float(score)
        cand.pending.discard(test_case_id)
        self.evaluations += 1
        self._version += 1
        if self.settings.racing and self.settings.racing_incumbent:
            self._race_incumbent(cand)
        self._advance()
        return True

    def inject(self, configs: list[dict[str, Any]], *, origin: str = "injected") -> list[str]:
        """Add outside proposals to the running generation; they are raced like the rest. A config
        already known returns its existing id. Raises ValueError for a config outside the space."""
        if self.done:
            raise ValueError("the search is finished; start a new run to evaluate more configs")
        coerced = [self.space.coerce(c) for c in configs]  # all or nothing
        ids = []
        for config in coerced:
            cid = self._add(config, origin, parents=[])
            cand = self.candidates[cid]
            if cid not in self.population:
                self.population.append(cid)
                cand.dropped, cand.drop_reason = False, ""
                cand.target = max(cand.target, len(cand.scores), self._first_target())
            ids.append(cid)
        self._version += 1
        return ids

    def best(self) -> dict[str, Any] | None:
        """The best candidate scored on every test case (else the best partly scored one)."""
        scored = [c for c in self.candidates.values() if c.scores]
        if not scored:
            return None
        full = [c for c in scored if len(c.scores) == len(self.case_order)]
        post, idx = self._posterior(), self._index()
        top = max(full or scored, key=lambda c: post.mean[idx[c.id]])
        return {
            "candidate_id": top.id,
            "config": dict(top.config),
            "score": float(post.mean[idx[top.id]]),
            "mean_score": float(np.mean(list(top.scores.values()))),
            "cases": len(top.scores),
            "complete": len(top.scores) == len(self.case_order),
        }

    def history(self) -> dict[str, Any]:
        """Per-generation summaries and every candidate with its scores and fate."""
        post, idx = self._posterior(), self._index()
        return {
            "generations": [dict(g) for g in self.generations],
            "candidates": [
                {
                    "candidate_id": c.id,
                    "config": dict(c.config),
                    "origin": c.origin,
                    "generation": c.generation,
                    "parents": list(c.parents),
                    "scores": dict(c.scores),
                    "estimate": float(post.mean[idx[c.id]]),
                    "dropped": c.dropped,
                    "drop_reason": c.drop_reason,
                }
                for c in self.candidates.values()
            ],
            "evaluations": self.evaluations,
            "done": self.done,
            "done_reason": self.done_reason,
        }

    def pending(self) -> list[tuple[str, str]]:
        """(candidate_id, test_case_id) handed out and not yet recorded."""
        return [(c.id, case) for c in self.candidates.values() for case in sorted(c.pending)]

    def requeue_pending(self) -> int:
        """Forget what was handed out, so next_evaluations hands it out again (after a restart)."""
        n = self._pending_count()
        for c in self.candidates.values():
            c.pending.clear()
        return n

    # --- persistence -------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Everything needed to resume exactly, as JSON-serialisable values."""
        return {
            "version": STATE_VERSION,
            "settings": self.settings.to_json(),
            "space": self.space.to_json(),
            "case_order": list(self.case_order),
            "rng": self._rng.bit_generator.state,
            "candidates": [c.to_json() for c in self.candidates.values()],
            "population": list(self.population),
            "generation": self.generation,
            "generations": [dict(g) for g in self.generations],
            "evaluations": self.evaluations,
            "best_score": self.best_score,
            "stale": self.stale,
            "epoch": {
                "start": self.epoch_start,
                "best": self.epoch_best,
                "stale": self.epoch_stale,
                "scale": self.epoch_scale,
                "restarts": self.restarts,
                "trust_region": [self.tr_length, self.tr_success, self.tr_failure],
            },
            "done": self.done,
            "done_reason": self.done_reason,
            "prior": self.prior,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Search:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"search state version {state.get('version')!r} is not {STATE_VERSION}")
        self = cls.__new__(cls)
        self.space = SearchSpace.from_json(state["space"])
        self.settings = SearchSettings.from_json(state["settings"])
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]
        self.case_order = list(state["case_order"])
        self.candidates = {d["id"]: Candidate.from_json(d) for d in state["candidates"]}
        self._by_key = {c.key: c.id for c in self.candidates.values()}
        self.population = list(state["population"])
        self.generation = state["generation"]
        self.generations = [dict(g) for g in state["generations"]]
        self.evaluations = state["evaluations"]
        self.best_score = state["best_score"]
        self.stale = state["stale"]
        epoch = state.get("epoch", {})  # states saved before restarts existed have one epoch
        self.epoch_start = epoch.get("start", 0)
        self.epoch_best = epoch.get("best")
        self.epoch_stale = epoch.get("stale", 0)
        self.epoch_scale = float(epoch.get("scale", 0.0))
        self.restarts = epoch.get("restarts", 0)
        tr = epoch.get("trust_region", [self.settings.trust_region_init, 0, 0])
        self.tr_length, self.tr_success, self.tr_failure = float(tr[0]), int(tr[1]), int(tr[2])
        self.done = state["done"]
        self.done_reason = state["done_reason"]
        self.prior = list(state["prior"])
        self._post = None
        self._version = 0
        return self

    # --- internals: candidates and scores ----------------------------------------------------

    def _valid_prior(self, prior: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for p in prior:
            try:
                config = self.space.coerce(p["config"])
                score = float(p["score"])
            except (KeyError, TypeError, ValueError):
                continue  # an earlier run's config that no longer fits the space
            if math.isfinite(score):
                out.append({"config": config, "score": score})
        return out

    def _add(self, config: dict[str, Any], origin: str, parents: list[str]) -> str:
        key = self.space.key(config)
        if key in self._by_key:
            return self._by_key[key]
        cid = f"c{len(self.candidates):05d}"
        self.candidates[cid] = Candidate(
            id=cid, config=config, key=key, origin=origin, generation=self.generation, parents=parents
        )
        self._by_key[key] = cid
        return cid

    def _first_target(self) -> int:
        n = len(self.case_order)
        return min(n, self.settings.racing_min_cases) if self.settings.racing else n

    def _missing(self, c: Candidate) -> list[str]:
        return [k for k in self.case_order[: c.target] if k not in c.scores and k not in c.pending]

    def _pending_count(self) -> int:
        return sum(len(c.pending) for c in self.candidates.values())

    def _case_index(self) -> dict[str, int]:
        return {k: j for j, k in enumerate(self.case_order)}

    def _index(self) -> dict[str, int]:
        return {cid: i for i, cid in enumerate(self.candidates)}

    def _posterior(self) -> Posterior:
        version = self._version * 1_000_003 + len(self.candidates)
        if self._post is None or self._post[0] != version:
            cols = self._case_index()
            m = np.zeros((len(self.candidates), len(cols)))
            mask = np.zeros_like(m, dtype=bool)
            for i, c in enumerate(self.candidates.values()):
                for case, s in c.scores.items():
                    m[i, cols[case]] = s
                    mask[i, cols[case]] = True
            self._post = (version, posterior(m, mask, len(cols)))
        return self._post[1]

    # --- internals: the generation cycle -----------------------------------------------------

    def _start(self) -> None:
        size = self.settings.population_size
        n_warm = round(size * self.settings.warm_start_fraction) if self.prior else 0
        for p in sorted(self.prior, key=lambda p: -p["score"])[:n_warm]:
            self.population.append(self._add(p["config"], "warm_start", []))
        self.population = list(dict.fromkeys(self.population))
        for _ in range(50 * size):
            if len(self.population) >= size:
                break
            cid = self._add(self.space.sample(self._rng), "initial", [])
            if cid not in self.population:
                self.population.append(cid)
        for cid in self.population:
            self.candidates[cid].target = self._first_target()

    def _advance(self) -> None:
        """Close rungs and generations while nothing in the population is waiting."""
        while not self.done:
            if self.settings.max_evaluations is not None and self.evaluations >= self.settings.max_evaluations:
                if self._pending_count() == 0:
                    self._close_generation(final_reason="budget")
                return
            alive = [self.candidates[c] for c in self.population if not self.candidates[c].dropped]
            if any(c.pending or self._missing(c) for c in alive):
                return
            if not self._race(alive):
                self._close_generation()

    def _race(self, alive: list[Candidate]) -> bool:
        """At a rung's end: drop candidates confidently worse than the leader, then grow the
        survivors' targets. False when every survivor is scored on every case."""
        n_cases = len(self.case_order)
        if len(alive) > 1 and self.settings.racing:
            post, idx = self._posterior(), self._index()
            leader = max(alive, key=lambda c: (post.mean[idx[c.id]], len(c.scores)))
            for c in alive:
                if c is leader:
                    continue
                common = [k for k in self.case_order if k in c.scores and k in leader.scores]
                diffs = np.array([c.scores[k] - leader.scores[k] for k in common])
                if len(diffs) and self._worse(
                    diffs, self.settings.racing_confidence, 2.0 * post.noise_var, self._rung_looks()
                ):
                    c.dropped = True
                    c.drop_reason = f"worse than {leader.id} on {len(diffs)} paired cases"
        grew = False
        for c in alive:
            n = len(c.scores)
            if not c.dropped and n < n_cases:
                c.target = min(n_cases, max(n + 1, math.ceil(n * self.settings.racing_growth)))
                grew = True
        self._version += 1
        return grew

    def _rung_looks(self) -> list[int]:
        s = self.settings
        return racing_looks(s.racing_min_cases, s.racing_growth, len(self.case_order))

    def _worse(self, diffs: np.ndarray, confidence: float, pooled_var: float, looks: list[int]) -> bool:
        """The racing test, its repeated looks treated as ``racing_sequential`` says."""
        return confidently_worse_sequential(
            diffs,
            confidence=confidence,
            pooled_var=pooled_var,
            n_cases=len(self.case_order),
            looks=looks,
            method=self.settings.racing_sequential,
            margin=self.settings.racing_margin,
        )

    def _incumbent(self) -> Candidate | None:
        """The best candidate scored on every case so far (its mean is its true score)."""
        n_cases = len(self.case_order)
        full = [c for c in self.candidates.values() if len(c.scores) == n_cases]
        return max(full, key=lambda c: sum(c.scores.values())) if full else None

    def _race_incumbent(self, cand: Candidate) -> None:
        """``racing_incumbent``: drop a racing candidate as soon as it is confidently behind the
        incumbent on the cases it has (all of them shared: the incumbent has every case)."""
        n_cases = len(self.case_order)
        n = len(cand.scores)
        if cand.dropped or cand.id not in self.population or n >= n_cases or n < self.settings.racing_min_cases:
            return
        inc = self._incumbent()
        if inc is None or inc is cand:
            return
        diffs = np.array([s - inc.scores[k] for k, s in cand.scores.items()])
        confidence = self.settings.racing_incumbent_confidence or self.settings.racing_confidence
        post = self._posterior()
        looks = list(range(self.settings.racing_min_cases, n_cases))  # a look after every case
        if self._worse(diffs, confidence, 2.0 * post.noise_var, looks):
            cand.dropped = True
            cand.drop_reason = f"worse than the incumbent {inc.id} on {n} paired cases"

    def _revisits(self, post: Posterior, idx: dict[str, int], taken: set[str]) -> list[Candidate]:
        """``racing_revisit``: dropped, partly scored candidates (never revisited before) whose
        posterior mean plus one standard deviation is above the incumbent's score, best first."""
        k = self.settings.racing_revisit
        inc = self._incumbent()
        if k <= 0 or inc is None:
            return []
        n_cases = len(self.case_order)
        bar = float(np.mean(list(inc.scores.values())))

        def upper(c: Candidate) -> float:
            return float(post.mean[idx[c.id]] + math.sqrt(post.var[idx[c.id]]))

        pool = [
            c
            for c in self.candidates.values()
            if c.dropped and 0 < len(c.scores) < n_cases and c.revisits == 0 and c.id not in taken and upper(c) > bar
        ]
        return sorted(pool, key=lambda c: -upper(c))[:k]

    def _close_generation(self, final_reason: str = "") -> None:
        best = self.best()
        score = best["score"] if best and best["complete"] else None
        improved = score is not None and (
            self.best_score is None or score > self.best_score + self.settings.min_improvement
        )
        if improved:
            self.best_score, self.stale = score, 0
        else:
            self.stale += 1
        self._track_epoch()
        self.generations.append(
            {
                "generation": self.generation,
                "candidates": list(self.population),
                "dropped": sum(self.candidates[c].dropped for c in self.population),
                "best_candidate_id": best["candidate_id"] if best else None,
                "best_score": self.best_score,
                "evaluations": self.evaluations,
            }
        )
        self.generation += 1
        if final_reason:
            self.done, self.done_reason = True, final_reason
        elif self.generation >= self.settings.generations:
            self.done, self.done_reason = True, "generations"
        elif self.settings.patience is not None and self.stale >= self.settings.patience:
            self.done, self.done_reason = True, "patience"
        else:
            self._breed()

    def _epoch_candidates(self) -> list[Candidate]:
        return list(self.candidates.values())[self.epoch_start :]

    def _epoch_ranked(self, post: Posterior, idx: dict[str, int]) -> list[Candidate]:
        """The current epoch's scored candidates, best posterior mean first."""
        return sorted((c for c in self._epoch_candidates() if c.scores), key=lambda c: -post.mean[idx[c.id]])

    def _track_epoch(self) -> None:
        """The current epoch's best fully scored mean, and generations without a gain on it."""
        post, idx = self._posterior(), self._index()
        n_cases = len(self.case_order)
        means = [post.mean[idx[c.id]] for c in self._epoch_candidates() if len(c.scores) == n_cases]
        best = max(means) if means else None
        first = self.epoch_best is None
        if first and means:
            self.epoch_scale = best - float(np.median(means))
        # a gain must beat min_improvement and, with trust_region_tol, a share of the spread of
        # the epoch's first design: creeping up a poor local peak does not keep the region open
        tol = self.settings.trust_region_tol * self.epoch_scale
        if best is not None and (first or best > self.epoch_best + max(self.settings.min_improvement, tol)):
            self.epoch_best, self.epoch_stale = best, 0
            gained = not first  # an epoch's first design is not a step of the trust region
        else:
            self.epoch_stale += 1
            gained = False
        if self._trust_region_on() and not first:
            self._update_trust_region(gained)

    def _trust_region_on(self) -> bool:
        s = self.settings
        if s.algorithm != "mab_evolution" or not s.surrogate:
            return False
        if s.trust_region is not None:
            return s.trust_region
        continuous = sum(p.kind == CONTINUOUS for p in self.space.params)
        return 2 * continuous >= len(self.space.params)

    def _update_trust_region(self, gained: bool) -> None:
        """TuRBO's rule: a run of gains doubles the side, a run of misses halves it."""
        s = self.settings
        batch = max(1, s.population_size - s.elite_size)
        numeric = sum(p.kind != CATEGORICAL for p in self.space.params)
        failure = s.trust_region_failure or math.ceil(max(4, numeric) / batch)
        if gained:
            self.tr_success, self.tr_failure = self.tr_success + 1, 0
        else:
            self.tr_success, self.tr_failure = 0, self.tr_failure + 1
        if self.tr_success >= s.trust_region_success:
            self.tr_length, self.tr_success = min(2.0 * self.tr_length, s.trust_region_max), 0
        elif self.tr_failure >= failure:
            self.tr_length, self.tr_failure = self.tr_length / 2.0, 0

    def _trust_region_axes(
        self, numeric: list[tuple[Any, int]], model: Surrogate, u0: np.ndarray, post: Posterior, idx: dict[str, int]
    ) -> np.ndarray:
        """The trust region's half-axes for a side of 2, as columns, with a volume of 1."""
        box = np.diag(_unit_geomean(model.relevance()[[col for _, col in numeric]]))
        d = len(numeric)
        if self.settings.trust_region_shape != "rotated" or d < 2:
            return box
        top = self._epoch_ranked(post, idx)[: max(self.settings.population_size // 2, d + 1)]
        if len(top) < 3:
            return box
        u = np.array([[p.to_unit(c.config[p.name]) for p, _ in numeric] for c in top])
        rank_w = _rank_weights(len(top))
        dev = u - u0  # spread around the center, as CMA-ES's rank-mu update measures steps
        cov = dev.T @ (dev * rank_w[:, None])
        values, vectors = np.linalg.eigh(cov)
        if not np.isfinite(values).all() or values.max() <= 0.0:
            return box
        # Floor the thin directions (few points span few of them) and blend in the GP's box.
        values = np.maximum(values, values.max() * 1e-2)
        shape = (vectors * _unit_geomean(values)) @ vectors.T
        values, vectors = np.linalg.eigh(0.5 * shape + 0.5 * box @ box)
        return vectors * np.sqrt(_unit_geomean(values))  # columns: the principal axes, scaled

    def _restart(self) -> None:
        """Re-seed the population from fresh configs: the old basin stays known (best(), the
        surrogate's data) but no longer breeds."""
        self.epoch_start = len(self.candidates)
        self.epoch_best, self.epoch_stale, self.epoch_scale = None, 0, 0.0
        self.restarts += 1
        self.tr_length, self.tr_success, self.tr_failure = self.settings.trust_region_init, 0, 0
        population: list[str] = []
        for config, _ in self._restart_design(self.settings.population_size):
            cid = self._add(config, "restart", [])
            if cid not in population:
                population.append(cid)
        for cid in population:
            self.candidates[cid].target = self._first_target()
        self.population = population
        self._version += 1

    def _restart_design(self, needed: int) -> list[tuple[dict[str, Any], list[str]]]:
        """A restarted epoch's first configs, as ``restart_design`` says (see SearchSettings)."""
        s = self.settings
        numeric = [p for p in self.space.params if p.kind != CATEGORICAL]
        if s.restart_design == "random" or not numeric:
            return self._fresh(needed)
        scored = np.array([[p.to_unit(c.config[p.name]) for p in numeric] for c in self.candidates.values()])
        far = self._far_points(self._fresh(max(20 * needed, 200)), numeric, scored, needed)
        if s.restart_design == "maximin" or not far:
            return far
        # "local": a Gaussian cloud around the one config farthest from everything scored
        center = far[0][0]
        u0 = np.array([p.to_unit(center[p.name]) for p in numeric])
        out, seen = [(center, [])], set(self._by_key) | {self.space.key(center)}
        for _ in range(50 * needed):
            if len(out) >= needed:
                break
            u = np.clip(u0 + s.restart_sigma * self._rng.standard_normal(len(numeric)), 0.0, 1.0)
            config = self.space.sample(self._rng)  # categorical genes drawn fresh
            for p, v in zip(numeric, u, strict=True):
                config[p.name] = p.from_unit(v)
            if self.space.key(config) not in seen:
                seen.add(self.space.key(config))
                out.append((config, []))
        return out

    @staticmethod
    def _far_points(
        pool: list[tuple[dict[str, Any], list[str]]], numeric: list[Any], scored: np.ndarray, needed: int
    ) -> list[tuple[dict[str, Any], list[str]]]:
        """Greedy maximin: ``needed`` of ``pool``, each the farthest from the scored configs and
        the ones already picked (unit coordinates of the numeric parameters), farthest first."""
        if not pool:
            return []
        u = np.array([[p.to_unit(c[p.name]) for p in numeric] for c, _ in pool])
        if len(scored):
            nearest = np.sqrt(((u[:, None, :] - scored[None, :, :]) ** 2).sum(-1)).min(axis=1)
        else:
            nearest = np.full(len(u), np.inf)
        picked: list[int] = []
        for _ in range(min(needed, len(pool))):
            i = int(np.argmax(nearest))
            picked.append(i)
            nearest = np.minimum(nearest, np.sqrt(((u - u[i]) ** 2).sum(-1)))
            nearest[i] = -1.0
        return [pool[i] for i in picked]

    def _breed(self) -> None:
        """The next population: elites (cached fitness, not re-evaluated) plus offspring."""
        s = self.settings
        collapsed = self._trust_region_on() and self.tr_length < s.trust_region_min
        if collapsed or (s.restart_after is not None and self.epoch_stale >= s.restart_after):
            self._restart()
            return
        post, idx = self._posterior(), self._index()
        n_cases = len(self.case_order)
        full = [c for c in self._epoch_candidates() if len(c.scores) == n_cases]
        elites = sorted(full, key=lambda c: -post.mean[idx[c.id]])[: s.elite_size]
        population = [c.id for c in elites]
        revisited = self._revisits(post, idx, set(population))
        population += [c.id for c in revisited]
        needed = s.population_size - len(population)
        if s.algorithm in ("random", "mab_only"):
            children = self._fresh(needed)
        else:
            children = self._offspring(needed, post, idx, elites)
        for config, parents in children:
            cid = self._add(config, "offspring", parents)
            if cid not in population:
                population.append(cid)
        for cid in population:
            c = self.candidates[cid]
            c.dropped, c.drop_reason = False, ""
            c.target = max(len(c.scores), self._first_target())
        for c in revisited:  # one rung on from the cases it has
            c.revisits += 1
            c.target = min(n_cases, max(c.target, math.ceil(len(c.scores) * s.racing_growth)))
        self.population = population
        self._version += 1

    def _fresh(self, needed: int, exclude: set[str] | None = None) -> list[tuple[dict[str, Any], list[str]]]:
        out: list[tuple[dict[str, Any], list[str]]] = []
        seen = set(self._by_key) | (exclude or set())
        for _ in range(50 * needed):
            if len(out) >= needed:
                break
            config = self.space.sample(self._rng)
            if self.space.key(config) not in seen:
                seen.add(self.space.key(config))
                out.append((config, []))
        return out

    def _offspring(
        self, needed: int, post: Posterior, idx: dict[str, int], elites: list[Candidate]
    ) -> list[tuple[dict[str, Any], list[str]]]:
        s = self.settings
        pool = list(dict.fromkeys([c.id for c in elites] + [c for c in self.population]))
        pool = [cid for cid in pool if self.candidates[cid].scores] or pool
        thompson = s.algorithm == "mab_evolution"
        use_surrogate = thompson and s.surrogate
        n_children = needed * (s.surrogate_pool if use_surrogate else 1)

        def tournament(fitness: np.ndarray) -> str:
            k = min(s.tournament, len(pool))
            entrants = self._rng.choice(len(pool), size=k, replace=False)
            return pool[int(entrants[np.argmax(fitness[entrants])])]

        children: list[tuple[dict[str, Any], list[str]]] = []
        seen = set(self._by_key)
        for _ in range(20 * n_children):
            if len(children) >= n_children:
                break
            means = np.array([post.mean[idx[c]] for c in pool])
            sds = np.sqrt([post.var[idx[c]] for c in pool])
            # a fresh Thompson draw per tournament: uncertain candidates get their fair chance
            fitness = means + sds * self._rng.standard_normal(len(pool)) if thompson else means
            a = tournament(fitness)
            parents = [a]
            config = dict(self.candidates[a].config)
            if self._rng.random() < s.crossover_rate:
                b = tournament(fitness)
                parents.append(b)
                config = self.space.crossover(config, self.candidates[b].config, self._rng)
            scale = s.mutation_scale
            if use_surrogate:
                scale *= FINE_SCALES[int(self._rng.choice(len(FINE_SCALES), p=FINE_WEIGHTS))]
            config = self.space.mutate(config, self._rng, rate=s.mutation_rate, scale=scale)
            key = self.space.key(config)
            if key not in seen:
                seen.add(key)
                children.append((config, parents))
        if use_surrogate and len(children) > needed:
            with single_threaded():
                children = self._screen(children, needed, n_children, seen, post, idx)
        if len(children) < needed:
            children += self._fresh(needed - len(children))
        return children[:needed]

    def _from_elite_distribution(
        self, n: int, post: Posterior, idx: dict[str, int], seen: set[str]
    ) -> list[tuple[dict[str, Any], list[str]]]:
        """Draws from a Gaussian fitted to the best scored candidates in the unit coordinates of the
        numeric parameters (an estimation-of-distribution step, as in CMA-ES's recombination): it
        follows the global trend of the best ones where mutating single parents stays local.
        Categorical genes come from one of those candidates."""
        numeric = [p for p in self.space.params if p.kind != CATEGORICAL]
        top = self._epoch_ranked(post, idx)[: max(self.settings.population_size // 2, 2)]
        if n <= 0 or not numeric or len(top) < 2:
            return []
        u = np.array([[p.to_unit(c.config[p.name]) for p in numeric] for c in top])
        weights = _rank_weights(len(top))
        mean = weights @ u
        cov = (u - mean).T @ np.diag(weights) @ (u - mean) + np.eye(len(numeric)) * 1e-4
        out: list[tuple[dict[str, Any], list[str]]] = []
        for _ in range(3 * n):
            if len(out) >= n:
                break
            donor = top[int(self._rng.integers(len(top)))]
            x = self._rng.multivariate_normal(mean, cov * 2.0)
            config = dict(donor.config)
            for p, v in zip(numeric, x, strict=True):
                config[p.name] = p.from_unit(v)
            key = self.space.key(config)
            if key not in seen:
                seen.add(key)
                out.append((config, [donor.id]))
        return out

    def _surrogate_rows(self) -> list[Candidate]:
        """The scored candidates the surrogate learns from: all of them up to
        ``surrogate_max_points``, else the best half of that cap plus the most recent (the fit is
        cubic in the rows; the best and the newest are where the next children come from)."""
        seen = [c for c in self.candidates.values() if c.scores]
        cap = self.settings.surrogate_max_points
        if len(seen) <= cap:
            return seen
        post, idx = self._posterior(), self._index()
        best = sorted(seen, key=lambda c: -post.mean[idx[c.id]])[: cap // 2]
        keep = {c.id for c in best}
        recent = [c for c in reversed(seen) if c.id not in keep][: cap - len(best)]
        keep |= {c.id for c in recent}
        return [c for c in seen if c.id in keep]

    def _screen(
        self,
        children: list[tuple[dict[str, Any], list[str]]],
        needed: int,
        n_children: int,
        seen: set[str],
        post: Posterior,
        idx: dict[str, int],
    ) -> list[tuple[dict[str, Any], list[str]]]:
        """The ``needed`` children picked by batch Thompson sampling from the surrogate, out of the
        bred ones plus fresh configs, elite-distribution draws and (with the trust region on) its
        perturbations; every numeric gene clipped into the trust region."""
        s = self.settings
        model = self._fit_model()
        if model is None:
            return children[:needed]
        # fresh configs from the whole space compete in the screen: where the surrogate knows
        # little, their draws are wide, so a population stuck in one basin can leave it
        children += self._fresh(round(n_children * s.surrogate_explore), exclude=seen)
        children += self._from_elite_distribution(round(n_children * s.surrogate_gaussian), post, idx, seen)
        if self._trust_region_on():
            children = self._into_trust_region(children, model, n_children, post, idx)
        picks = model.batch_thompson(self.space.encode([c for c, _ in children]), needed, self._rng)
        return [children[i] for i in picks]

    def _fit_model(self) -> Surrogate | None:
        """The GP surrogate on the scored candidates (and the warm-start prior), on rank-warped
        scores: robust to the heavy tails of raw objective values. None with too little data."""
        post, idx = self._posterior(), self._index()
        seen = self._surrogate_rows()
        prior = sorted(self.prior, key=lambda p: -p["score"])[: self.settings.surrogate_max_points // 2]
        configs = [c.config for c in seen] + [p["config"] for p in prior]
        y = np.array([post.mean[idx[c.id]] for c in seen] + [p["score"] for p in prior])
        noise = np.array([post.var[idx[c.id]] for c in seen] + [float(np.var(y)) * 0.25] * len(prior))
        if len(y) < 4:
            return None
        ranks = np.empty(len(y))
        ranks[np.argsort(y, kind="stable")] = np.arange(1, len(y) + 1)
        z = special.ndtri((ranks - 0.5) / len(y))
        scale = float(np.var(y)) or 1.0
        return fit_surrogate(self.space.encode(configs), z, noise / scale)

    def _into_trust_region(
        self,
        children: list[tuple[dict[str, Any], list[str]]],
        model: Surrogate,
        n_perturb: int,
        post: Posterior,
        idx: dict[str, int],
    ) -> list[tuple[dict[str, Any], list[str]]]:
        """Clip the children's numeric genes into the trust region around the epoch's best
        candidate and add ``n_perturb`` TuRBO perturbations of that candidate (a random subset of
        its numeric genes redrawn uniformly inside the box). Duplicates are dropped."""
        scored = [c for c in self._epoch_candidates() if c.scores]
        if not scored:
            return children
        n_cases = len(self.case_order)
        center = max(scored, key=lambda c: (len(c.scores) == n_cases, post.mean[idx[c.id]]))
        numeric = [(p, col) for p, col in self.space.columns() if p.kind != CATEGORICAL]
        if not numeric:
            return children
        u0 = np.array([p.to_unit(center.config[p.name]) for p, _ in numeric])
        # The region is a box in coordinates z: u = u0 + axes @ z, z in [-1, 1]^d. Axis-aligned
        # with the GP's lengthscales as its aspect ratio, or rotated onto the principal axes of the
        # epoch's best candidates (a CMA-like shape for rotated, ill-conditioned objectives).
        axes = self._trust_region_axes(numeric, model, u0, post, idx) * (self.tr_length / 2.0)
        inverse = np.linalg.inv(axes)
        z_lo, z_hi = -np.ones(len(numeric)), np.ones(len(numeric))
        if np.count_nonzero(axes - np.diag(np.diag(axes))) == 0:
            # an axis-aligned box: perturbations stay inside the unit cube's part of it
            a = np.diag(axes)
            z_lo, z_hi = np.maximum(z_lo, -u0 / a), np.minimum(z_hi, (1.0 - u0) / a)

        def into(u: np.ndarray) -> np.ndarray:
            return np.clip(u0 + axes @ np.clip(inverse @ (u - u0), -1.0, 1.0), 0.0, 1.0)

        def place(config: dict[str, Any], u: np.ndarray) -> dict[str, Any]:
            out = dict(config)
            for (p, _), v in zip(numeric, u, strict=True):
                out[p.name] = p.from_unit(v)
            return out

        out: list[tuple[dict[str, Any], list[str]]] = []
        keys = set(self._by_key)
        for config, parents in children:
            u = np.array([p.to_unit(config[p.name]) for p, _ in numeric])
            config = place(config, into(u))
            key = self.space.key(config)
            if key not in keys:
                keys.add(key)
                out.append((config, parents))
        prob = min(1.0, 20.0 / len(numeric))
        for _ in range(n_perturb):
            mask = self._rng.random(len(numeric)) < prob
            if not mask.any():
                mask[int(self._rng.integers(len(numeric)))] = True
            z = np.where(mask, z_lo + (z_hi - z_lo) * self._rng.random(len(numeric)), 0.0)
            config = place(center.config, np.clip(u0 + axes @ z, 0.0, 1.0))
            key = self.space.key(config)
            if key not in keys:
                keys.add(key)
                out.append((config, [center.id]))
        return out or children
