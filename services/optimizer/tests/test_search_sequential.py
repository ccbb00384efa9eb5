"""The racing test over repeated looks (racing_sequential, racing_margin): its error over all the
looks of a race, simulated, and its effect in the engine."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, Param, Search, SearchSettings, SearchSpace
from flywheel.optimizer.search.scores import (
    SEQUENTIAL,
    confidently_worse_sequential,
    look_confidence,
    mixture_margin,
    racing_looks,
)

N_CASES = 24
LOOKS = racing_looks(3, 2.0, N_CASES)


def test_the_rung_schedule_is_the_engines():
    assert LOOKS == [3, 6, 12]
    assert racing_looks(3, 2.0, 20) == [3, 6, 12]
    assert racing_looks(1, 1.5, 5) == [1, 2, 3]  # growth always adds at least one case
    assert racing_looks(30, 2.0, 24) == []  # every candidate scored on every case at once


def test_spending_is_strict_early_and_spends_the_whole_error_by_the_last_look():
    levels = [look_confidence(n, LOOKS, 0.8, "spending") for n in LOOKS]
    errors = [1 - c for c in levels]
    assert errors[0] < errors[1] < errors[2]
    assert errors[0] < 0.02  # an unlucky first 3 cases almost never drop a candidate
    assert sum(errors) == pytest.approx(0.2, abs=1e-9)
    assert [look_confidence(n, LOOKS, 0.8, "bonferroni") for n in LOOKS] == pytest.approx([1 - 0.2 / 3] * 3)
    assert [look_confidence(n, LOOKS, 0.8, "none") for n in LOOKS] == [0.8] * 3
    # a look between the scheduled ones (a revisited candidate) counts as the one below it
    assert look_confidence(8, LOOKS, 0.8, "spending") == look_confidence(6, LOOKS, 0.8, "spending")


def test_the_mixture_margin_shrinks_with_the_cases_and_scales_with_the_sd():
    margins = [mixture_margin(n, 1.0, 0.2, 12) for n in range(2, 24)]
    assert all(a > b for a, b in itertools.pairwise(margins))
    assert mixture_margin(6, 4.0, 0.2, 12) == pytest.approx(2 * mixture_margin(6, 1.0, 0.2, 12))


def ever_dropped(method: str, shift: float, races: int = 2000, seed: int = 0, margin: float = 0.0) -> float:
    """Share of simulated races in which a candidate is dropped at some look. Each race: 24 paired
    differences (candidate - leader) with mean exactly ``shift`` over the 24 cases (the candidate's
    true score minus the leader's), sd 1, in a random order, tested at 3, 6 and 12 cases."""
    rng = np.random.default_rng(seed)
    dropped = 0
    for _ in range(races):
        d = rng.normal(0.0, 1.0, N_CASES)
        d = d - d.mean() + shift
        for n in LOOKS:
            kwargs = {"confidence": 0.8, "pooled_var": 1.0, "n_cases": N_CASES, "looks": LOOKS}
            if confidently_worse_sequential(d[:n], method=method, margin=margin, **kwargs):
                dropped += 1
                break
    return dropped / races


@pytest.mark.parametrize("method", ["bonferroni", "spending", "mixture"])
def test_a_candidate_as_good_as_the_leader_is_rarely_dropped_over_all_the_looks(method: str):
    # the worst case for the candidate that is truly best: exactly tied with the leader
    assert ever_dropped(method, 0.0) <= 0.2
    assert ever_dropped(method, 0.3) <= 0.05  # truly better: dropped even more rarely


def test_without_a_correction_the_error_over_the_looks_exceeds_its_level():
    """What the correction is for: at 80% per look, a tied candidate is dropped in about a third of
    the races, not a fifth."""
    assert ever_dropped("none", 0.0) > 0.28


@pytest.mark.parametrize("method", SEQUENTIAL)
def test_a_clearly_worse_candidate_is_dropped_before_it_has_every_case(method: str):
    assert ever_dropped(method, -1.5, races=500) >= 0.99


def test_the_margin_keeps_a_candidate_behind_by_less_than_it():
    rng = np.random.default_rng(3)
    d = -0.1 + rng.normal(0.0, 0.02, 12)  # clearly behind, by 0.1
    kwargs = {"confidence": 0.8, "pooled_var": 0.0004, "n_cases": N_CASES, "looks": LOOKS, "method": "none"}
    assert confidently_worse_sequential(d, margin=0.0, **kwargs)
    assert not confidently_worse_sequential(d, margin=0.15, **kwargs)
    assert confidently_worse_sequential(d, margin=0.05, **kwargs)
    # scored on every case, two candidates are compared exactly (no margin)
    full = np.full(N_CASES, -0.01)
    assert confidently_worse_sequential(full, margin=0.15, **kwargs)


CASES = [f"case-{i}" for i in range(20)]
SPACE = SearchSpace(
    [
        Param("prompt", CATEGORICAL, values=("bad", "ok", "good")),
        Param("temperature", CONTINUOUS, low=0.0, high=1.0, step=0.05),
    ]
)


@pytest.mark.parametrize(("sequential", "dropped"), [("none", True), ("spending", False), ("mixture", False)])
def test_the_engine_races_with_the_chosen_rule(sequential: str, dropped: bool):
    """A newcomer behind the incumbent on its first 3 cases by a margin that an uncorrected 80% test
    acts on at once; the corrected rules wait for more cases."""
    s = Search(
        SPACE,
        CASES,
        SearchSettings(population_size=4, elite_size=1, seed=5, racing_incumbent=True, racing_sequential=sequential),
    )
    (inc,) = s.inject([{"prompt": "good", "temperature": 0.0}])
    level = 0.7 + np.random.default_rng(0).normal(0, 0.1, len(CASES))
    for case, x in zip(s.case_order, level, strict=True):
        s.record(inc, case, float(x))
    (new,) = s.inject([{"prompt": "ok", "temperature": 0.5}])
    behind = [0.12, 0.07, 0.02] * 6  # 0.07 behind on average
    for j, case in enumerate(s.case_order[:3]):
        s.record(new, case, float(level[j] - behind[j]))
    assert s.candidates[new].dropped is dropped
    for j, case in enumerate(s.case_order[3:18], start=3):
        if s.candidates[new].dropped:
            break
        s.record(new, case, float(level[j] - behind[j]))
    assert s.candidates[new].dropped, "the corrected rules drop it too, with more cases"
    assert len(s.candidates[new].scores) < len(CASES) - 2


def test_sequential_settings_are_validated_and_round_trip():
    with pytest.raises(ValueError, match="racing_sequential"):
        SearchSettings(racing_sequential="pocock")
    with pytest.raises(ValueError, match="racing_margin"):
        SearchSettings(racing_margin=-0.1)
    settings = SearchSettings(racing_sequential="spending", racing_margin=0.02)
    again = SearchSettings.from_json(settings.to_json())
    assert (again.racing_sequential, again.racing_margin) == ("spending", 0.02)
    assert SearchSettings().racing_sequential == "none"
