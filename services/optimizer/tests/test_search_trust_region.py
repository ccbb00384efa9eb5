"""The GP surrogate (ARD fit, batch Thompson sampling) and the trust region of the search."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, DISCRETE, Param, Search, SearchSettings, SearchSpace
from flywheel.optimizer.search.surrogate import fit_surrogate


def cube(dims: int) -> SearchSpace:
    return SearchSpace([Param(f"x{i}", CONTINUOUS, low=-5.0, high=5.0) for i in range(dims)])


def run(search: Search, objective) -> Search:
    while not search.done:
        for cid, config, case in search.next_evaluations(100):
            search.record(cid, case, objective(config))
    return search


def test_gp_fit_finds_the_relevant_dimension_by_its_lengthscale():
    rng = np.random.default_rng(0)
    x = rng.random((60, 3))
    y = np.sin(6.0 * x[:, 0])  # only the first column matters
    model = fit_surrogate(x, y, np.zeros(len(y)))
    assert model is not None
    assert model.lengthscales[0] < 1.0
    assert model.lengthscales[1] > 3 * model.lengthscales[0]
    assert model.lengthscales[2] > 3 * model.lengthscales[0]
    mean, sd = model.predict(x[:5])
    assert np.allclose(mean, y[:5], atol=0.05)  # it interpolates what it has seen
    assert (sd < 0.1).all()


def test_batch_thompson_picks_distinct_candidates_near_the_optimum():
    rng = np.random.default_rng(1)
    x = rng.random((40, 2))
    y = -((x - 0.7) ** 2).sum(1)
    model = fit_surrogate(x, y, np.zeros(len(y)))
    pool = rng.random((300, 2))
    picks = model.batch_thompson(pool, 8, rng)
    assert len(set(picks)) == 8
    dist = np.sqrt(((pool[picks] - 0.7) ** 2).sum(1))
    assert np.median(dist) < np.median(np.sqrt(((pool - 0.7) ** 2).sum(1))) / 2


def test_trust_region_doubles_after_gains_and_halves_after_misses():
    s = Search(cube(4), ["f"], SearchSettings(population_size=6, elite_size=2, racing=False, seed=1))
    assert s._trust_region_on()
    start = s.tr_length
    for _ in range(3):
        s._update_trust_region(gained=True)
    assert s.tr_length == pytest.approx(min(2 * start, s.settings.trust_region_max))
    s._update_trust_region(gained=False)  # failure tolerance: ceil(max(4, 4) / 4) = 1
    assert s.tr_length == pytest.approx(min(2 * start, s.settings.trust_region_max) / 2)


def test_a_flat_objective_collapses_the_trust_region_and_restarts_from_fresh_configs():
    settings = SearchSettings(population_size=6, elite_size=2, generations=30, racing=False, seed=2)
    s = run(Search(cube(2), ["f"], settings), lambda c: 1.0)
    assert s.restarts >= 1
    restarted = [c for c in s.candidates.values() if c.origin == "restart"]
    assert len(restarted) >= settings.population_size - 1
    assert s.tr_length > settings.trust_region_min
    resumed = Search.from_state(json.loads(json.dumps(s.to_state())))
    assert (resumed.tr_length, resumed.restarts, resumed.epoch_start) == (s.tr_length, s.restarts, s.epoch_start)


def test_offspring_are_clipped_into_the_trust_region_around_the_best():
    settings = SearchSettings(
        population_size=8, elite_size=2, generations=3, racing=False, seed=3, trust_region_shape="box"
    )
    s = run(Search(cube(3), ["f"], settings), lambda c: -sum((c[f"x{i}"] - 2.0) ** 2 for i in range(3)))
    s.tr_length = 0.1
    model = s._fit_model()
    post, idx = s._posterior(), s._index()
    far = [({"x0": -5.0, "x1": -5.0, "x2": 5.0}, []), ({"x0": 5.0, "x1": 5.0, "x2": -5.0}, [])]
    out = s._into_trust_region(far, model, 50, post, idx)
    assert len(out) >= 40
    best = s.best()["config"]
    half = 10.0 * model.relevance() * s.tr_length / 2  # the box in the parameters' own units
    for config, _ in out:
        for i in range(3):
            assert abs(config[f"x{i}"] - best[f"x{i}"]) <= half[i] + 1e-9


def valley(c):
    """A narrow valley along the diagonal x0 = x1 of the unit-scaled plane: rotated, ill-conditioned."""
    u, v = (c["x0"] + 5.0) / 10.0, (c["x1"] + 5.0) / 10.0
    return -(400.0 * (u - v) ** 2 + (u + v - 1.2) ** 2)


def test_the_rotated_trust_region_lies_along_the_valley_the_best_candidates_trace():
    settings = SearchSettings(population_size=10, elite_size=2, generations=6, racing=False, seed=5)
    assert settings.trust_region_shape == "rotated"  # the default
    s = run(Search(cube(2), ["f"], settings), valley)
    model, post, idx = s._fit_model(), s._posterior(), s._index()
    numeric = [(p, col) for p, col in s.space.columns()]
    u0 = np.array([p.to_unit(s.best()["config"][p.name]) for p, _ in numeric])
    axes = s._trust_region_axes(numeric, model, u0, post, idx)
    assert abs(np.linalg.det(axes)) == pytest.approx(1.0)  # the side sets the volume, the shape only the aspect
    lengths = np.linalg.norm(axes, axis=0)
    long_axis = axes[:, np.argmax(lengths)] / lengths.max()
    assert abs(long_axis @ np.array([1.0, 1.0]) / np.sqrt(2.0)) > 0.9  # along the diagonal
    assert lengths.max() > 2.0 * lengths.min()

    # every child is placed inside that rotated box around the best candidate
    s.tr_length = 0.2
    far = [({"x0": -5.0, "x1": 5.0}, []), ({"x0": 5.0, "x1": -5.0}, [])]
    out = s._into_trust_region(far, model, 40, post, idx)
    assert len(out) >= 30
    inverse = np.linalg.inv(axes * s.tr_length / 2.0)
    for config, _ in out:
        u = np.array([p.to_unit(config[p.name]) for p, _ in numeric])
        assert np.abs(inverse @ (u - u0)).max() <= 1.0 + 1e-6


def test_search_beats_random_search_on_a_seeded_ellipsoid():
    def ellipsoid(c):
        return -sum(10 ** (3 * i / 5) * (c[f"x{i}"] - 1.5) ** 2 for i in range(6))

    budget = 120
    s = run(
        Search(cube(6), ["f"], SearchSettings(population_size=10, generations=1000, max_evaluations=budget, seed=4)),
        ellipsoid,
    )
    rng = np.random.default_rng(4)
    space = cube(6)
    random_best = max(ellipsoid(space.sample(rng)) for _ in range(budget))
    assert s.best()["score"] > random_best / 20  # both negative: at least 20x closer


def test_trust_region_auto_is_off_for_mostly_categorical_spaces():
    mixed = SearchSpace(
        [
            Param("model", CATEGORICAL, values=("a", "b", "c")),
            Param("prompt", CATEGORICAL, values=("p", "q")),
            Param("top_p", DISCRETE, values=(0.5, 0.9, 1.0)),
            Param("temperature", CONTINUOUS, low=0.0, high=1.0, step=0.1),
        ]
    )
    assert not Search(mixed, ["f"], SearchSettings())._trust_region_on()
    assert Search(mixed, ["f"], SearchSettings(trust_region=True))._trust_region_on()
    assert not Search(cube(3), ["f"], SearchSettings(trust_region=False))._trust_region_on()
    assert not Search(cube(3), ["f"], SearchSettings(algorithm="genetic"))._trust_region_on()


def test_trust_region_settings_are_validated():
    with pytest.raises(ValueError, match="trust region sides"):
        SearchSettings(trust_region_min=0.9, trust_region_init=0.8)
    with pytest.raises(ValueError, match="trust_region_failure"):
        SearchSettings(trust_region_failure=0)
    with pytest.raises(ValueError, match="trust_region_shape"):
        SearchSettings(trust_region_shape="sphere")
