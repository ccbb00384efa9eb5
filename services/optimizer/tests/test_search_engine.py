"""The ask/tell search: racing, inject, persistence, warm start, patience."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace

import numpy as np
import pytest

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, Param, Search, SearchSettings, SearchSpace

CASES = [f"case-{i}" for i in range(20)]


def space() -> SearchSpace:
    return SearchSpace(
        [
            Param("prompt", CATEGORICAL, values=("bad", "ok", "good")),
            Param("temperature", CONTINUOUS, low=0.0, high=1.0, step=0.05),
        ]
    )


QUALITY = {"bad": 0.2, "ok": 0.6, "good": 0.8}


def score(config: dict, case: str) -> float:
    """Deterministic per (config, case): the prompt sets the level, temperature costs a little,
    and each case adds its own noise."""
    rng = np.random.default_rng(zlib.crc32(f"{config['prompt']}|{config['temperature']}|{case}".encode()))
    return QUALITY[config["prompt"]] - 0.1 * config["temperature"] + rng.normal(0, 0.1)


def drive(search: Search, steps: int | None = None, limit: int = 5) -> int:
    n = 0
    while not search.done and (steps is None or n < steps):
        batch = search.next_evaluations(limit)
        assert batch, "a running search with nothing pending always has work"
        for cid, config, case in batch:
            search.record(cid, case, score(config, case))
            n += 1
    return n


def test_racing_drops_a_clearly_worse_candidate_early():
    s = Search(space(), CASES, SearchSettings(population_size=4, generations=1, elite_size=0, seed=1))
    bad = s.inject([{"prompt": "bad", "temperature": 0.5}])[0]
    good = s.inject([{"prompt": "good", "temperature": 0.0}])[0]
    drive(s)
    assert s.candidates[bad].dropped
    assert len(s.candidates[bad].scores) <= 6  # dropped after the first rung or two, not after 20
    assert len(s.candidates[good].scores) == len(CASES)
    assert s.best()["config"]["prompt"] == "good"
    assert s.evaluations < len(s.population) * len(CASES)


def test_without_racing_everyone_is_scored_on_every_case():
    s = Search(space(), CASES, SearchSettings(population_size=4, generations=1, racing=False, seed=1))
    drive(s)
    assert all(len(s.candidates[c].scores) == len(CASES) for c in s.population)


def test_record_is_idempotent_and_checks_its_input():
    s = Search(space(), CASES, SearchSettings(population_size=3, elite_size=0, seed=2))
    cid, _config, case = s.next_evaluations(1)[0]
    assert s.record(cid, case, 0.5) is True
    assert s.record(cid, case, 0.9) is False
    assert s.candidates[cid].scores[case] == 0.5 and s.evaluations == 1
    with pytest.raises(KeyError, match="unknown test case"):
        s.record(cid, "nope", 0.1)
    with pytest.raises(ValueError, match="finite"):
        s.record(cid, CASES[1], float("nan"))


def test_inject_mid_generation_joins_the_race():
    s = Search(space(), CASES, SearchSettings(population_size=6, generations=3, elite_size=1, seed=3))
    drive(s, steps=10)
    generation = s.generation
    (cid,) = s.inject([{"prompt": "good", "temperature": 0.0}])
    assert cid in s.population and s.candidates[cid].origin in ("injected", "initial")
    issued = []
    while s.generation == generation:
        batch = s.next_evaluations(4)
        issued += [c for c, _, _ in batch]
        for c, config, case in batch:
            s.record(c, case, score(config, case))
    assert cid in issued
    assert len(s.candidates[cid].scores) == len(CASES)  # the best one survives every rung
    assert s.generations[generation]["best_candidate_id"] == cid
    with pytest.raises(ValueError, match="not one of"):
        s.inject([{"prompt": "excellent", "temperature": 0.1}])
    assert s.inject([{"prompt": "good", "temperature": 0.0}]) == [cid]  # known config, same id


def test_state_round_trips_and_resumes_exactly():
    settings = SearchSettings(population_size=6, generations=4, elite_size=1, seed=4)
    straight = Search(space(), CASES, settings)
    drive(straight, steps=37)
    resumed = Search.from_state(json.loads(json.dumps(straight.to_state())))
    assert resumed.to_state() == straight.to_state()
    for s in (straight, resumed):
        drive(s)
    assert resumed.history() == straight.history()
    assert resumed.best() == straight.best()


def test_pending_work_survives_a_restart_and_is_handed_out_again():
    s = Search(space(), CASES, SearchSettings(population_size=3, elite_size=0, seed=5))
    batch = s.next_evaluations(4)
    restored = Search.from_state(json.loads(json.dumps(s.to_state())))
    assert sorted(restored.pending()) == sorted((c, k) for c, _, k in batch)
    assert restored.requeue_pending() == len(batch)
    assert restored.pending() == []
    again = restored.next_evaluations(100)
    assert {(c, k) for c, _, k in batch} <= {(c, k) for c, _, k in again}


def test_warm_start_seeds_the_first_population_with_prior_winners():
    prior = [{"config": {"prompt": "good", "temperature": t}, "score": 0.8 - t / 10} for t in (0.0, 0.05, 0.1)]
    prior += [{"config": {"prompt": "bad", "temperature": 0.5}, "score": 0.1}]
    prior += [{"config": {"prompt": "gone", "temperature": 0.5}, "score": 0.9}]  # not in the space: skipped
    settings = SearchSettings(population_size=6, generations=1, elite_size=0, warm_start_fraction=0.5, seed=6)
    s = Search(space(), CASES, settings, prior=prior)
    warm = [s.candidates[c] for c in s.population if s.candidates[c].origin == "warm_start"]
    assert sorted(c.config["temperature"] for c in warm) == [0.0, 0.05, 0.1]
    assert all(c.config["prompt"] == "good" for c in warm)
    assert len(s.prior) == 4
    drive(s)
    assert s.best()["config"]["prompt"] == "good"


def test_patience_stops_when_nothing_improves():
    flat = SearchSpace([Param("prompt", CATEGORICAL, values=("a", "b", "c", "d"))])
    s = Search(flat, ["only"], SearchSettings(population_size=3, generations=50, elite_size=1, patience=2, seed=7))
    while not s.done:
        for cid, _config, case in s.next_evaluations(10):
            s.record(cid, case, 1.0)  # every config scores the same: no generation improves
    assert s.done_reason == "patience"
    assert s.generation == 3  # the first sets the baseline, two more without gain
    assert s.next_evaluations(10) == []


def test_budget_caps_evaluations_and_elites_are_not_re_evaluated():
    s = Search(space(), CASES, SearchSettings(population_size=5, generations=20, max_evaluations=150, seed=8))
    drive(s)
    assert s.done_reason == "budget" and s.evaluations == 150
    elite_scores = [len(c.scores) for c in s.candidates.values()]
    assert max(elite_scores) == len(CASES)  # every pair recorded once: no candidate has more than N


def test_search_finds_the_optimum_of_a_smooth_function():
    sp = SearchSpace([Param(f"x{i}", CONTINUOUS, low=-5.0, high=5.0) for i in range(4)])
    s = Search(sp, ["f"], SearchSettings(population_size=10, generations=100, max_evaluations=150, racing=False))
    while not s.done:
        for cid, config, case in s.next_evaluations(10):
            s.record(cid, case, -sum((config[f"x{i}"] - 1.0) ** 2 for i in range(4)))
    assert s.best()["score"] > -0.05  # random search with 150 draws gets about -10


def test_screen_pool_settings_are_validated():
    for name in ("surrogate_explore", "surrogate_gaussian"):
        with pytest.raises(ValueError, match=name):
            SearchSettings(**{name: 1.5})


def test_elite_distribution_proposes_new_configs_on_the_grid_near_the_best():
    sp = SearchSpace(
        [
            Param("prompt", CATEGORICAL, values=("bad", "ok", "good")),
            Param("x", CONTINUOUS, low=0.0, high=10.0, step=0.5),
            Param("y", CONTINUOUS, low=0.0, high=10.0, step=0.5),
        ]
    )
    s = Search(sp, ["f"], SearchSettings(population_size=10, generations=1, racing=False, seed=9))
    while not s.done:
        for cid, config, case in s.next_evaluations(10):
            s.record(cid, case, -((config["x"] - 8.0) ** 2) - (config["y"] - 8.0) ** 2)
    post, idx = s._posterior(), s._index()
    seen = set(s._by_key)
    proposals = s._from_elite_distribution(40, post, idx, set(seen))
    assert len(proposals) >= 30
    keys = [sp.key(c) for c, _ in proposals]
    assert len(set(keys)) == len(keys) and not set(keys) & seen  # new and distinct
    for config, parents in proposals:
        assert sp.coerce(config) == config  # inside the bounds and on the 0.5 grid
        assert config["prompt"] == s.candidates[parents[0]].config["prompt"]
    top = sorted(s.candidates.values(), key=lambda c: -c.scores["f"])[:5]
    centre = np.mean([[c.config["x"], c.config["y"]] for c in top], axis=0)
    drawn = np.mean([[c["x"], c["y"]] for c, _ in proposals], axis=0)
    assert np.linalg.norm(drawn - centre) < 2.5  # centred on the best ones, not on the whole box


def test_surrogate_training_set_is_capped_at_the_best_and_the_most_recent():
    sp = SearchSpace([Param(f"x{i}", CONTINUOUS, low=-5.0, high=5.0) for i in range(3)])
    settings = SearchSettings(population_size=10, generations=100, max_evaluations=120, racing=False)
    s = Search(sp, ["f"], replace(settings, surrogate_max_points=40))
    while not s.done:
        for cid, config, case in s.next_evaluations(10):
            s.record(cid, case, -sum(config[f"x{i}"] ** 2 for i in range(3)))
    rows = s._surrogate_rows()
    assert len(rows) == 40
    scored = [c for c in s.candidates.values() if c.scores]  # the last generation is cut by the budget
    assert len(scored) > 40
    best = max(scored, key=lambda c: c.scores["f"])
    newest = scored[-1]
    ids = {c.id for c in rows}
    assert best.id in ids and newest.id in ids
