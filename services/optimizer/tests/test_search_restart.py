"""Where a restarted epoch's population comes from (``restart_design``)."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.search import CONTINUOUS, Param, Search, SearchSettings, SearchSpace


def cube(dims: int) -> SearchSpace:
    return SearchSpace([Param(f"x{i}", CONTINUOUS, low=0.0, high=1.0) for i in range(dims)])


def first_restart(design: str, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Unit coordinates of the configs scored before the first restart, and of the restart's."""
    settings = SearchSettings(
        population_size=8,
        elite_size=2,
        generations=200,
        racing=False,
        seed=seed,
        restart_design=design,
        restart_after=3,  # restart soon: the test is about where the restart goes
        trust_region_min=0.3,
    )
    s = Search(cube(2), ["f"], settings)
    # a narrow basin in one corner: the first epoch crowds there, then collapses and restarts
    objective = lambda c: -((c["x0"] - 0.1) ** 2 + (c["x1"] - 0.1) ** 2)  # noqa: E731
    while s.restarts == 0 and not s.done:
        for cid, config, case in s.next_evaluations(100):
            s.record(cid, case, objective(config))
    assert s.restarts == 1
    cands = list(s.candidates.values())
    before = np.array([[c.config["x0"], c.config["x1"]] for c in cands[: s.epoch_start]])
    after = np.array([[c.config["x0"], c.config["x1"]] for c in cands[s.epoch_start :]])
    return before, after


def nearest(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)).min(axis=1)


def test_maximin_restarts_far_from_everything_scored():
    before, far = first_restart("maximin")
    _, uniform = first_restart("random")
    assert len(far) == 8
    # each maximin point keeps a wider berth from the scored configs than uniform draws do
    assert nearest(far, before).min() > nearest(uniform, before).min()
    assert np.median(nearest(far, before)) > np.median(nearest(uniform, before))
    # and they spread out among themselves
    spread = np.sqrt(((far[:, None] - far[None]) ** 2).sum(-1)) + np.eye(len(far))
    assert spread.min() > 0.05


def test_local_restarts_a_cloud_around_one_far_point():
    before, cloud = first_restart("local")
    assert len(cloud) == 8
    center = cloud[0]
    assert nearest(center[None], before)[0] > 0.2  # the center is far from the old basin
    assert np.sqrt(((cloud - center) ** 2).sum(-1)).max() < 6 * 0.2 * np.sqrt(2)
    assert np.std(cloud, axis=0).max() < 0.3  # a cloud, not the whole square


def test_restart_design_is_validated():
    with pytest.raises(ValueError, match="restart_design"):
        SearchSettings(restart_design="sobol")
    with pytest.raises(ValueError, match="restart_sigma"):
        SearchSettings(restart_sigma=0.0)


def test_trust_region_tol_ignores_gains_below_a_share_of_the_first_designs_spread():
    settings = SearchSettings(population_size=6, elite_size=2, racing=False, seed=4, trust_region_tol=0.01)
    s = Search(cube(2), ["f"], settings)
    s._update_trust_region = lambda gained: calls.append(gained)  # record what the epoch reports
    calls: list[bool] = []
    scores = iter([0.0, -10.0, -20.0, -30.0, -40.0, -50.0])  # first design: best 0, median -25
    for cid, _, case in s.next_evaluations(100):
        s.record(cid, case, next(scores))
    assert s.epoch_scale == pytest.approx(25.0)
    assert calls == []  # an epoch's first design is not a trust region step
    for step, expected in [(0.2, False), (0.3, True)]:  # the tolerance is 0.01 * 25 = 0.25
        best = s.epoch_best
        for cid, _, case in s.next_evaluations(100):
            s.record(cid, case, best + step if cid == s.population[-1] else -100.0)
        assert calls[-1] is expected
    assert s.epoch_best == pytest.approx(0.3)  # the small gain was not banked as the new bar


def test_trust_region_tol_is_validated():
    with pytest.raises(ValueError, match="trust_region_tol"):
        SearchSettings(trust_region_tol=1.0)
