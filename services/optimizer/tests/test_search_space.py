"""Search space operators: mutation stays in bounds, on the step grid, and scales with log."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, DISCRETE, Param, SearchSpace


def space() -> SearchSpace:
    return SearchSpace(
        [
            Param("temperature", CONTINUOUS, low=0.0, high=1.5, step=0.1),
            Param("lr", CONTINUOUS, low=1e-5, high=1e-1, log=True),
            Param("k", CONTINUOUS, low=1, high=20, step=1, integer=True),
            Param("max_tokens", DISCRETE, values=(64, 128, 256, 512, 1024)),
            Param("model", CATEGORICAL, values=("a", "b", "c")),
        ]
    )


def test_mutation_respects_bounds_step_and_kinds():
    s, rng = space(), np.random.default_rng(3)
    config = {"temperature": 1.5, "lr": 1e-5, "k": 20, "max_tokens": 64, "model": "a"}
    for _ in range(2000):
        child = s.mutate(config, rng, rate=1.0, scale=0.5)
        t = child["temperature"]
        assert 0.0 <= t <= 1.5 and math.isclose(t * 10, round(t * 10), abs_tol=1e-9)
        assert 1e-5 <= child["lr"] <= 1e-1
        assert isinstance(child["k"], int) and 1 <= child["k"] <= 20
        assert child["max_tokens"] in (64, 128, 256, 512, 1024)
        assert child["model"] != config["model"]  # categorical mutation resamples among the others
        config = child


def test_gaussian_mutation_is_ten_percent_of_the_range_in_the_log_coordinate():
    s, rng = space(), np.random.default_rng(4)
    lr = s.params[1]
    start = {"temperature": 0.7, "lr": 1e-3, "k": 10, "max_tokens": 256, "model": "b"}
    moves = np.array([lr.to_unit(s.mutate(start, rng, rate=1.0, scale=0.1)["lr"]) - 0.5 for _ in range(4000)])
    # the log coordinate of 1e-3 in [1e-5, 1e-1] is 0.5; sigma 0.1 of the (log) range
    assert abs(moves.std() - 0.1) < 0.01
    assert abs(np.median(moves)) < 0.01  # symmetric in log space, not in linear space


def test_step_snapping_moves_at_least_one_grid_point():
    s = SearchSpace([Param("t", CONTINUOUS, low=0.0, high=1.0, step=0.25)])
    rng = np.random.default_rng(5)
    seen = {s.mutate({"t": 0.5}, rng, rate=1.0, scale=0.01)["t"] for _ in range(200)}
    assert seen <= {0.25, 0.75} and seen  # a tiny sigma still changes the value


def test_crossover_takes_each_gene_from_a_parent():
    s, rng = space(), np.random.default_rng(6)
    a = {"temperature": 0.1, "lr": 1e-4, "k": 2, "max_tokens": 64, "model": "a"}
    b = {"temperature": 1.2, "lr": 1e-2, "k": 9, "max_tokens": 1024, "model": "c"}
    mixed = 0
    for _ in range(100):
        child = s.crossover(a, b, rng)
        assert all(child[k] in (a[k], b[k]) for k in a)
        mixed += child != a and child != b
    assert mixed > 80


def test_coerce_validates_outside_configs():
    s = space()
    ok = s.coerce({"temperature": 0.33, "lr": 0.01, "k": 3.0, "max_tokens": 128, "model": "c"})
    assert ok["temperature"] == pytest.approx(0.3) and ok["k"] == 3
    with pytest.raises(ValueError, match="'d' is not one of"):
        s.coerce({**ok, "model": "d"})
    with pytest.raises(ValueError, match="outside"):
        s.coerce({**ok, "temperature": 3.0})
    with pytest.raises(ValueError, match="unknown parameters"):
        s.coerce({**ok, "top_p": 0.9})
    with pytest.raises(ValueError, match="'lr' is missing"):
        s.coerce({k: v for k, v in ok.items() if k != "lr"})


def test_fingerprint_identifies_the_space():
    assert space().fingerprint() == SearchSpace.from_json(space().to_json()).fingerprint()
    other = SearchSpace([*space().params[:4], Param("model", CATEGORICAL, values=("a", "b"))])
    assert other.fingerprint() != space().fingerprint()
