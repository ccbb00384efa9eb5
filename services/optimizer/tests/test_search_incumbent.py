"""Racing against the incumbent (racing_incumbent) and revisiting dropped candidates
(racing_revisit)."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, Param, Search, SearchSettings, SearchSpace

CASES = [f"case-{i}" for i in range(20)]
SPACE = SearchSpace(
    [
        Param("prompt", CATEGORICAL, values=("bad", "ok", "good")),
        Param("temperature", CONTINUOUS, low=0.0, high=1.0, step=0.05),
    ]
)


def with_incumbent(**settings: object) -> tuple[Search, str, np.ndarray]:
    """A search whose injected incumbent is scored on every case (about 0.7, case noise 0.1);
    the initial population is never handed out, so the generation stays open."""
    s = Search(SPACE, CASES, SearchSettings(population_size=4, elite_size=1, seed=5, **settings))
    (inc,) = s.inject([{"prompt": "good", "temperature": 0.0}])
    level = 0.7 + np.random.default_rng(0).normal(0, 0.1, len(CASES))
    for case, x in zip(s.case_order, level, strict=True):
        s.record(inc, case, float(x))
    assert len(s.candidates[inc].scores) == len(CASES)
    return s, inc, level


def test_a_newcomer_clearly_behind_the_incumbent_is_dropped_after_a_few_cases():
    s, inc, level = with_incumbent(racing_incumbent=True, racing_min_cases=3)
    (new,) = s.inject([{"prompt": "bad", "temperature": 0.5}])
    for j, case in enumerate(s.case_order[:3]):
        assert not s.candidates[new].dropped  # not before racing_min_cases
        s.record(new, case, float(level[j] - 0.4))
    assert s.candidates[new].dropped
    assert f"incumbent {inc}" in s.candidates[new].drop_reason
    assert all(c != new for c, _, _ in s.next_evaluations(50))  # no more cases handed out


def test_a_newcomer_level_with_the_incumbent_is_not_dropped():
    s, _, level = with_incumbent(racing_incumbent=True, racing_min_cases=3)
    (new,) = s.inject([{"prompt": "good", "temperature": 0.05}])
    for j, case in enumerate(s.case_order[:10]):
        s.record(new, case, float(level[j] + (0.02 if j % 2 else -0.02)))
        assert not s.candidates[new].dropped, f"dropped after {j + 1} cases"


def test_without_racing_incumbent_the_newcomer_waits_for_the_rung_end():
    s, _, level = with_incumbent(racing_min_cases=3)
    (new,) = s.inject([{"prompt": "bad", "temperature": 0.5}])
    for j, case in enumerate(s.case_order[:3]):
        s.record(new, case, float(level[j] - 0.4))
    assert not s.candidates[new].dropped  # the initial population's rung is still open


def test_incumbent_settings_are_validated():
    with pytest.raises(ValueError, match="racing_incumbent_confidence"):
        SearchSettings(racing_incumbent_confidence=0.4)
    with pytest.raises(ValueError, match="racing_revisit"):
        SearchSettings(racing_revisit=-1)
    assert SearchSettings.from_json(SearchSettings(racing_revisit=2).to_json()).racing_revisit == 2


def finish_generation(s: Search, score: float = 0.6) -> None:
    generation = s.generation
    while s.generation == generation:
        batch = s.next_evaluations(8)
        assert batch
        for cid, _, case in batch:
            s.record(cid, case, score)


@pytest.mark.parametrize("revisit", [0, 1])
def test_a_dropped_candidate_that_may_beat_the_incumbent_re_enters_the_race(revisit: int):
    s = Search(SPACE, CASES, SearchSettings(population_size=4, elite_size=1, racing_revisit=revisit, seed=2))
    hopeful, hopeless = s.inject([{"prompt": "good", "temperature": 0.3}, {"prompt": "bad", "temperature": 0.3}])
    for case in s.case_order[:3]:
        s.record(hopeful, case, 0.95)  # far above everything else (0.6) on its three cases
        s.record(hopeless, case, 0.0)
    for cid in (hopeful, hopeless):  # as an unlucky race would have left them
        s.candidates[cid].dropped, s.candidates[cid].drop_reason = True, "test"
    finish_generation(s)
    h = s.candidates[hopeful]
    assert not s.candidates[hopeless].revisits and hopeless not in s.population
    if not revisit:
        assert hopeful not in s.population and h.revisits == 0
        return
    assert hopeful in s.population and not h.dropped and h.revisits == 1
    assert h.target == 6  # one rung on from its three cases
    issued = [case for cid, _, case in s.next_evaluations(50) if cid == hopeful]
    assert issued == s.case_order[3:6]
    # state round trip keeps the revisit count (a candidate re-enters at most once)
    again = Search.from_state(s.to_state())
    assert again.candidates[hopeful].revisits == 1
